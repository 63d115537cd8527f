"""The "hopline — request lifecycle" dashboard: where each request's time goes, hop by hop.

What vLLM's own dashboards cannot show, because they only see inside the engine: TTFT split into
its stages, TTFT as the client, the gateway and the engine see it side by side, exemplars leading
from a latency spike to request IDs, and hopline's firing alerts as annotations.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders.dashboard import Dashboard

from hopline.collector import metric_names as m
from hopline.middleware.contract import TTFT_STAGES, VIEWS
from hopline.middleware.contract import live_metrics as live
from hopline.middleware.contract.rules import LOOK, TTFT_PARTS

from . import panels as p
from . import promql as q
from .base import dashboard
from .layout import Layout
from .rules import LIFECYCLE_UID

TITLE = "hopline — request lifecycle"
DESCRIPTION = (
    "Where each request's time goes: TTFT split into connect, network, gateway, frontend, queue and "
    "prefill; TTFT as the client, the gateway and the engine see it; exemplars lead to request IDs."
)
# Where hops are missing, a fallback stage stands in for the terms it cannot split (the contract's
# stage table): `engine` for frontend + queue + prefill, `upstream` for everything beyond the
# gateway, `upstream_network` for the network behind the gateway. Stacked in the rule book's order
# (each fallback next to what it replaces), so the stack meets the total in every deployment shape;
# labels and colours are the rule book's, as in the terminal and HTML reports.
STACKED_STAGES = TTFT_PARTS
QUANTILES = (0.5, 0.9, 0.99)
TOKENS_PER_SECOND = "suffix: tok/s"


def _pct(quantile: float) -> str:
    return f"p{quantile * 100:g}"


def _overview(lay: Layout) -> None:
    not_ok = f"({q.rate(m.REQUESTS, outcome='!ok')} or vector(0))"
    lay.row("Overview").line(
        4,
        (
            p.single_stat(
                "Requests/s", "Requests the collector joined, all outcomes.", "reqps", q.rate(m.REQUESTS)
            ),
            4,
        ),
        (
            p.single_stat(
                "Client TTFT p90",
                "Time to first token as the client sees it.",
                "s",
                q.quantile(0.9, m.TTFT_SECONDS, view="client"),
                exemplar=True,
            ),
            4,
        ),
        (
            p.single_stat(
                "Engine TTFT p90",
                "Time to first token inside the engine (received to first token).",
                "s",
                q.quantile(0.9, m.TTFT_SECONDS, view="engine"),
                exemplar=True,
            ),
            4,
        ),
        (
            p.single_stat(
                "Client end-to-end p90",
                "Whole request as the client sees it.",
                "s",
                q.quantile(0.9, m.E2E_SECONDS, view="client"),
                exemplar=True,
            ),
            4,
        ),
        (
            p.single_stat(
                "Not ok",
                "Share of requests that ended in error, rejection, disconnect or incomplete.",
                "percentunit",
                q.ratio(not_ok, q.rate(m.REQUESTS)),
                red_above=0.05,
            ),
            4,
        ),
        (
            p.single_stat(
                "In flight",
                "Requests the engines received and have not finished.",
                "short",
                q.gauge(m.IN_FLIGHT),
            ),
            4,
        ),
    )


def _ttft(lay: Layout) -> None:
    terms = [(q.mean(m.STAGE_SECONDS, stage=stage), LOOK[stage].label) for stage in STACKED_STAGES]
    lay.row("Where time to first token goes").line(
        10,
        (
            p.stacked_means(
                "TTFT by stage (means, stacked)",
                "Mean seconds per request in each stage, in the order a request meets them: "
                f"client TTFT = {' + '.join(TTFT_STAGES)}. Where hops are missing, a fallback stands "
                "in for what cannot be split (engine = frontend + queue + prefill; upstream = all beyond "
                "the gateway). The dashed line is the mean client TTFT; the stack should meet it. Means "
                "add up, quantiles do not: the quantiles are in the panels below.",
                terms,
                (q.mean(m.TTFT_SECONDS, view="client"), "client TTFT (mean)"),
                colours=[LOOK[stage].colour for stage in STACKED_STAGES],
            ),
            24,
        ),
    )
    lay.line(
        8,
        *(
            (
                p.latency(
                    f"TTFT {_pct(quantile)}: client, gateway, engine",
                    f"The {_pct(quantile)} time to first token as each component sees it. The gap between "
                    "client and engine is connect + network + gateway; between gateway and engine, the "
                    "upstream network.",
                    [
                        (
                            q.quantile(quantile, m.TTFT_SECONDS, ("view",), view=f"~{'|'.join(VIEWS)}"),
                            "{{view}}",
                        )
                    ],
                ),
                8,
            )
            for quantile in QUANTILES
        ),
    )
    lay.line(
        8,
        (
            p.latency(
                "End-to-end latency",
                "p50 and p99 of the whole request per view (streaming: until the last token).",
                [
                    (q.quantile(quantile, m.E2E_SECONDS, ("view",)), f"{_pct(quantile)} {{{{view}}}}")
                    for quantile in (0.5, 0.99)
                ],
            ),
            8,
        ),
        (
            p.latency(
                "Inter-token latency per user",
                "Seconds between tokens of one stream: (e2e - ttft) / "
                "(output tokens - 1) per request; the engine's from its decode time.",
                [
                    (q.quantile(quantile, m.ITL_SECONDS, ("view",)), f"{_pct(quantile)} {{{{view}}}}")
                    for quantile in (0.5, 0.99)
                ],
            ),
            8,
        ),
        (
            p.graph(
                "Tokens/s per user",
                "Output tokens per second one stream receives: 1 / mean ITL.",
                TOKENS_PER_SECOND,
                [(q.inverse_mean(m.ITL_SECONDS, ("view",)), "{{view}}")],
            ),
            8,
        ),
    )
    lay.line(
        9,
        (
            p.bucket_heatmap(
                "Client TTFT distribution",
                "Requests per TTFT bucket over time; exemplar markers link to request IDs.",
                q.bucket_increase(m.TTFT_SECONDS, view="client"),
            ),
            12,
        ),
        (
            p.bucket_heatmap(
                "Queue time distribution",
                "Requests per queue-time bucket over time.",
                q.bucket_increase(m.STAGE_SECONDS, stage="queue"),
            ),
            12,
        ),
    )


def _replicas(lay: Layout) -> None:
    by = ("replica",)
    lay.row("Per replica").line(
        8,
        (
            p.latency(
                "Client TTFT p90 by replica",
                "Which replica's users wait longest for the first token.",
                [(q.quantile(0.9, m.TTFT_SECONDS, by, view="client"), "{{replica}}")],
            ),
            8,
        ),
        (
            p.latency(
                "Queue time p90 by replica",
                "Time waiting for a batch slot, per replica.",
                [(q.quantile(0.9, m.STAGE_SECONDS, by, stage="queue"), "{{replica}}")],
            ),
            8,
        ),
        (
            p.latency(
                "Prefill p90 by replica",
                "Prompt processing time, per replica.",
                [(q.quantile(0.9, m.STAGE_SECONDS, by, stage="prefill"), "{{replica}}")],
            ),
            8,
        ),
    )
    lay.line(
        8,
        (
            p.graph(
                "Requests in flight by replica",
                "Requests received and not finished, per engine replica.",
                "short",
                [(q.gauge(m.IN_FLIGHT, by), "{{replica}}")],
            ),
            8,
        ),
        (
            p.graph(
                "KV-cache bytes held by replica",
                "KV cache held by in-flight requests: (prompt + output so far) x bytes per token.",
                "bytes",
                [(q.gauge(m.KV_CACHE_BYTES, by), "{{replica}}")],
            ),
            8,
        ),
        (
            p.graph(
                "Requests/s by replica",
                "Completed requests per second, per replica.",
                "reqps",
                [(q.rate(m.REQUESTS, by), "{{replica}}")],
            ),
            8,
        ),
    )


def _replica_heatmaps(lay: Layout) -> None:
    """One repeated row per selected replica: its TTFT and queue-time heatmaps."""
    lay.row("Replica $replica", repeat="replica").line(
        8,
        (
            p.bucket_heatmap(
                "Client TTFT distribution on $replica",
                "Requests per TTFT bucket on this replica.",
                q.bucket_increase(m.TTFT_SECONDS, view="client"),
            ),
            12,
        ),
        (
            p.bucket_heatmap(
                "Queue time distribution on $replica",
                "Requests per queue-time bucket on this replica.",
                q.bucket_increase(m.STAGE_SECONDS, stage="queue"),
            ),
            12,
        ),
    )


def _outcomes_and_pitfalls(lay: Layout) -> None:
    by_service = ("service",)
    lay.row("Outcomes and pitfalls").line(
        8,
        (
            p.graph(
                "Request outcomes",
                "Requests per second by how they ended.",
                "reqps",
                [(q.rate(m.REQUESTS, ("outcome",)), "{{outcome}}")],
                stacked=True,
            ),
            12,
        ),
        (
            p.graph(
                "New connections per request",
                "Share of client requests that opened a connection "
                "instead of reusing a pooled one: each costs connect (+ TLS) time on the TTFT.",
                "percentunit",
                [
                    (
                        q.ratio(
                            q.rate(m.CONNECTIONS, by_service, reused="false"),
                            q.rate(m.CONNECTIONS, by_service),
                        ),
                        "{{service}}",
                    )
                ],
            ),
            12,
        ),
    )
    lay.line(
        8,
        (
            p.graph(
                "Requests without max_tokens",
                "Share of requests that set no max_tokens: the engine "
                "reserves KV cache for the longest possible output.",
                "percentunit",
                [
                    (
                        q.ratio(q.rate(m.WITHOUT_MAX_TOKENS, by_service), q.rate(m.REQUESTS, by_service)),
                        "{{service}}",
                    )
                ],
            ),
            12,
        ),
        (
            p.graph(
                "Negative stages",
                "Stages computed below zero per second: an instrumentation or clock problem, never clamped.",
                "short",
                [(q.rate(m.NEGATIVE_STAGES, ("stage",)), "{{stage}}")],
            ),
            12,
        ),
    )


def _modern(lay: Layout) -> None:
    """Disaggregated prefill/decode and reasoning models (the stages the contract adds for them)."""
    by = ("replica",)
    lay.row("Disaggregated prefill/decode and reasoning").line(
        8,
        (
            p.latency(
                "KV transfer p90 by decode replica",
                "Disaggregated prefill/decode: the decode instance's wait for the prefill instance's KV "
                "cache and the forward that loads it (vLLM counts WAITING_FOR_REMOTE_KVS in its queue), "
                "per decode replica; queue and prefill are then the prefill instance's. Empty without P/D. "
                "hopline analyze names the prefill/decode pair of a rise.",
                [(q.quantile(0.9, m.STAGE_SECONDS, by, stage="kv_transfer"), "{{replica}}")],
            ),
            8,
        ),
        (
            p.latency(
                "Prefill and KV transfer (means)",
                "Mean prefill (on the prefill instance under P/D) beside the mean KV transfer: a transfer "
                "that grows while prefill stays is the link or the decode side, not the prompt.",
                [
                    (q.mean(m.STAGE_SECONDS, stage="prefill"), "prefill"),
                    (q.mean(m.STAGE_SECONDS, stage="kv_transfer"), "KV transfer"),
                ],
            ),
            8,
        ),
        (
            p.latency(
                "Reasoning before the first content token (p50)",
                "A reasoning model's time from its first reasoning token (its TTFT) to its first content "
                "token (what a user reads), per model; part of decode. Empty without a reasoning model.",
                [(q.quantile(0.5, m.STAGE_SECONDS, ("model",), stage="reasoning"), "{{model}}")],
            ),
            8,
        ),
    )


def _collector(lay: Layout) -> None:
    lay.row("Collector").line(
        7,
        (
            p.graph(
                "Events accepted",
                "Hop events per second, by hop.",
                "short",
                [(q.rate(m.EVENTS, ("hop",)), "{{hop}}")],
                stacked=True,
            ),
            6,
        ),
        (
            p.graph(
                "Events rejected",
                "Events that broke the contract, by reason.",
                "short",
                [
                    (q.rate(m.EVENTS_REJECTED, ("reason",)), "{{reason}}"),
                    (q.rate(m.EVENTS_DUPLICATE), "duplicates"),
                ],
            ),
            6,
        ),
        (
            p.graph(
                "Incomplete requests",
                "Requests expired before completing, by the first missing hop.",
                "short",
                [(q.rate(m.INCOMPLETE_REQUESTS, ("missing",)), "{{missing}}")],
            ),
            6,
        ),
        (
            p.graph(
                "Requests being joined",
                "Requests the collector is still waiting on.",
                "short",
                [(q.gauge(m.OPEN_REQUESTS), "open")],
            ),
            6,
        ),
    )


def _emitters(lay: Layout) -> None:
    """hopline's own delivery, as every emitter reports it (emitter.stats): what never arrived."""
    lay.row("Emitters").line(
        8,
        (
            p.graph(
                "Hop events dropped by emitters",
                "Events lost before reaching the collector, per second, by reason: full (an emitter's "
                "buffer was full, so its oldest event made room: the sink is slower than the traffic, or "
                "the collector was unreachable), sink (the collector refused the events or stayed "
                "unreachable for the retry budget), closed (emitted after shutdown). Zero when healthy.",
                "short",
                [
                    (
                        q.rate(m.EMITTER_DROPPED, ("service", "replica", "reason")),
                        "{{service}} {{replica}} {{reason}}",
                    )
                ],
                stacked=True,
            ),
            12,
        ),
        (
            p.graph(
                "Emitter delivery",
                "Hop events delivered per second, and waiting in the emitters' buffers, per service and "
                "replica (as their emitters last reported: every 10 s while anything changes).",
                "short",
                [
                    (q.rate(m.EMITTER_SENT, ("service", "replica")), "sent/s {{service}} {{replica}}"),
                    (q.gauge(m.EMITTER_BUFFERED, ("service", "replica")), "buffered {{service}} {{replica}}"),
                ],
            ),
            12,
        ),
    )


def _findings_now(lay: Layout) -> None:
    """What ``hopline watch --listen`` finds firing now: one row per incident, its factor."""
    lay.row("Findings now").line(
        6,
        (
            p.instant_table(
                "Findings now",
                "hopline watch's firing incidents (what it sends to Alertmanager): the stage or pitfall, "
                "the scope, the direction and the factor (a pitfall: 1). Scrape hopline watch --listen.",
                f"{live.FINDING} > 0",
                "factor",
                ("Time", "__name__", "instance", "job"),
            ),
            24,
        ),
    )


def build() -> Dashboard:
    lay = Layout(dashboard(TITLE, LIFECYCLE_UID, DESCRIPTION))
    _findings_now(lay)
    _overview(lay)
    _ttft(lay)
    _replicas(lay)
    _outcomes_and_pitfalls(lay)
    _modern(lay)
    _collector(lay)
    _emitters(lay)
    _replica_heatmaps(lay)
    return lay.dashboard
