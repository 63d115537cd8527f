"""The "hopline — engine" dashboard: vLLM's own metrics beside hopline's view of the same replicas.

vLLM measures queue, prefill, decode and TTFT inside the engine; hopline measures them per request
from the client's side too. Side by side (matched on the ``replica`` label that the Prometheus
scrape job gives each vLLM server) they show whether a slow request was slow in the engine or on
the way to it.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from hopline.collector import metric_names as m

from . import panels as p
from . import promql as q
from . import vllm_metrics as vllm
from .base import dashboard
from .layout import Layout

TITLE = "hopline — engine"
UID = "hopline-engine"
DESCRIPTION = (
    "vLLM's own metrics (scheduler, KV cache, queue / prefill / decode, TTFT) beside hopline's view "
    "of the same replicas, matched on the replica label: slow in the engine, or on the way to it?"
)
BY = ("replica",)
PHASES = (  # (title, vLLM histogram, hopline stage)
    ("Queue", vllm.QUEUE_TIME, "queue"),
    ("Prefill", vllm.PREFILL_TIME, "prefill"),
    ("Decode", vllm.DECODE_TIME, "decode"),
)


def _scheduler(lay: Layout) -> None:
    lay.row("Scheduler and KV cache").line(
        8,
        (
            p.graph(
                "Running, waiting (vLLM) and in flight (hopline)",
                "vLLM's running batch and waiting "
                "queue beside the requests hopline saw arrive and not finish; in flight should be running + "
                "waiting.",
                "short",
                [
                    (q.gauge(vllm.NUM_REQUESTS_RUNNING, BY), "running {{replica}}"),
                    (q.gauge(vllm.NUM_REQUESTS_WAITING, BY), "waiting {{replica}}"),
                    (q.gauge(m.IN_FLIGHT, BY), "hopline in flight {{replica}}"),
                ],
            ),
            12,
        ),
        (
            p.graph(
                "KV cache in use (vLLM)",
                "Share of KV-cache blocks in use.",
                "percentunit",
                [(q.gauge(vllm.KV_CACHE_USAGE, BY), "{{replica}}")],
            ),
            6,
        ),
        (
            p.graph(
                "KV-cache bytes held (hopline)",
                "KV cache held by the requests in flight, from their prompt and output tokens.",
                "bytes",
                [(q.gauge(m.KV_CACHE_BYTES, BY), "{{replica}}")],
            ),
            6,
        ),
    )


def _phases(lay: Layout) -> None:
    lay.row("Queue, prefill, decode: vLLM beside hopline")
    lay.line(
        8,
        *(
            (
                p.latency(
                    f"{title} time (means)",
                    f"Mean {title.lower()} time per request: vLLM's histogram and hopline's "
                    f"{stage} stage. They should agree; hopline's comes from the same engine, joined to "
                    "the request.",
                    [
                        (q.mean(metric, BY), "vLLM {{replica}}"),
                        (q.mean(m.STAGE_SECONDS, BY, stage=stage), "hopline {{replica}}"),
                    ],
                ),
                8,
            )
            for title, metric, stage in PHASES
        ),
    )
    lay.line(
        8,
        *(
            (
                p.latency(
                    f"{title} time p90",
                    f"p90 {title.lower()} time per replica, vLLM beside hopline (exemplars link "
                    "hopline's to request IDs).",
                    [
                        (q.quantile(0.9, metric, BY), "vLLM {{replica}}"),
                        (q.quantile(0.9, m.STAGE_SECONDS, BY, stage=stage), "hopline {{replica}}"),
                    ],
                ),
                8,
            )
            for title, metric, stage in PHASES
        ),
    )


def _ttft(lay: Layout) -> None:
    lay.row("Time to first token: inside vLLM vs what clients see")
    lay.line(
        8,
        *(
            (
                p.latency(
                    f"TTFT p{quantile * 100:g}",
                    "vLLM's TTFT (inside the engine) beside hopline's engine and client "
                    "views of the same replica. The client line includes connect, network and gateway.",
                    [
                        (q.quantile(quantile, vllm.TTFT, BY), "vLLM {{replica}}"),
                        (q.quantile(quantile, m.TTFT_SECONDS, BY, view="engine"), "engine {{replica}}"),
                        (q.quantile(quantile, m.TTFT_SECONDS, BY, view="client"), "client {{replica}}"),
                    ],
                ),
                12,
            )
            for quantile in (0.5, 0.9)
        ),
    )
    lay.line(
        8,
        (
            p.latency(
                "Client TTFT outside vLLM (mean)",
                "Mean client TTFT minus vLLM's mean TTFT, per "
                "replica: what users wait for beyond the engine.",
                [(f"{q.mean(m.TTFT_SECONDS, BY, view='client')} - {q.mean(vllm.TTFT, BY)}", "{{replica}}")],
            ),
            8,
        ),
        (
            p.bucket_heatmap(
                "vLLM TTFT distribution",
                "Requests per TTFT bucket as vLLM measures it.",
                q.bucket_increase(vllm.TTFT),
            ),
            8,
        ),
        (
            p.bucket_heatmap(
                "Client TTFT distribution",
                "Requests per TTFT bucket as clients measure it.",
                q.bucket_increase(m.TTFT_SECONDS, view="client"),
            ),
            8,
        ),
    )


def _prefix_cache(lay: Layout) -> None:
    """vLLM's prefix-cache hit share beside hopline's prefill of the same replica: a fall of one
    with a rise of the other is the prefix_cache_miss finding."""
    lay.row("Prefix cache: vLLM's hits beside hopline's prefill").line(
        8,
        (
            p.graph(
                "Prefix-cache hit share (vLLM)",
                "Share of the prompt tokens vLLM looked up in its prefix cache that it found there, per "
                "replica: when it falls, the replica's prefills compute what the cache used to hold "
                "(traffic that shared a prefix went elsewhere, or the prompts stopped sharing one).",
                "percentunit",
                [(q.ratio(q.rate(vllm.PREFIX_CACHE_HITS, BY), q.rate(vllm.PREFIX_CACHE_QUERIES, BY)), "{{replica}}")],
            ),
            12,
        ),
        (
            p.latency(
                "Prefill p50 (hopline)",
                "hopline's prefill stage per replica, beside the hit share.",
                [(q.quantile(0.5, m.STAGE_SECONDS, BY, stage="prefill"), "{{replica}}")],
            ),
            12,
        ),
    )


def build() -> Dashboard:
    lay = Layout(dashboard(TITLE, UID, DESCRIPTION))
    _scheduler(lay)
    _phases(lay)
    _ttft(lay)
    _prefix_cache(lay)
    return lay.dashboard
