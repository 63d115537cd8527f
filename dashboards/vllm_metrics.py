"""The vLLM metrics hopline's dashboards query, listed explicitly (vLLM >= 0.12 names).

vLLM labels every series with ``model_name`` and ``engine``; ``replica`` is not vLLM's: the
Prometheus scrape job for a vLLM server sets it (see ``provisioning.prometheus_config``) to the
same name the engine's hopline middleware reports (``HOPLINE_REPLICA``), so vLLM's view and
hopline's view of one replica line up on one panel. Names that vLLM dropped
(``vllm:gpu_cache_usage_perc`` in 0.12, ``vllm:time_per_output_token_seconds`` in 0.15) are
deliberately absent.
"""

from __future__ import annotations

from hopline.collector.metric_names import Metric

LABELS = ("model_name", "engine", "replica")

NUM_REQUESTS_RUNNING = Metric(
    "vllm:num_requests_running", "gauge", LABELS, "Requests in the engine's running batch."
)
NUM_REQUESTS_WAITING = Metric(
    "vllm:num_requests_waiting", "gauge", LABELS, "Requests waiting to be scheduled."
)
KV_CACHE_USAGE = Metric(
    "vllm:kv_cache_usage_perc", "gauge", LABELS, "Share of KV-cache blocks in use (0..1)."
)
QUEUE_TIME = Metric("vllm:request_queue_time_seconds", "histogram", LABELS, "Time a request spent WAITING.")
PREFILL_TIME = Metric(
    "vllm:request_prefill_time_seconds", "histogram", LABELS, "Time a request spent in PREFILL."
)
DECODE_TIME = Metric(
    "vllm:request_decode_time_seconds", "histogram", LABELS, "Time a request spent in DECODE."
)
TTFT = Metric("vllm:time_to_first_token_seconds", "histogram", LABELS, "Time to first token inside vLLM.")
PREFIX_CACHE_QUERIES = Metric(
    "vllm:prefix_cache_queries", "counter", LABELS, "Prompt tokens looked up in the prefix cache."
)
PREFIX_CACHE_HITS = Metric("vllm:prefix_cache_hits", "counter", LABELS, "Prompt tokens found in the prefix cache.")

ALL: tuple[Metric, ...] = (
    NUM_REQUESTS_RUNNING,
    NUM_REQUESTS_WAITING,
    KV_CACHE_USAGE,
    QUEUE_TIME,
    PREFILL_TIME,
    DECODE_TIME,
    TTFT,
    PREFIX_CACHE_QUERIES,
    PREFIX_CACHE_HITS,
)
