"""Every Prometheus metric the collector exposes: names, labels, units. Dashboards import this.

Seconds are base units; histograms carry a ``request_id`` exemplar; ``request_id`` is never a
label; every label has a bounded set of values (``service``, ``model``, ``replica`` are capped,
per label and per combination, overflow -> ``other``: a family has at most its fixed labels'
values x the scope cap series).
"""

from __future__ import annotations

from dataclasses import dataclass

from hopline.middleware.contract import VIEWS


@dataclass(frozen=True)
class Metric:
    name: str  # the base name; histograms expose _bucket/_sum/_count, counters _total
    kind: str  # histogram | counter | gauge
    labels: tuple[str, ...]
    help: str

    @property
    def series(self) -> str:
        """The name a PromQL query selects (counters carry the ``_total`` suffix)."""
        return self.name + "_total" if self.kind == "counter" else self.name


SCOPE = ("service", "model", "replica")

STAGE_SECONDS = Metric(
    "hopline_stage_seconds", "histogram", ("stage",) + SCOPE,
    "Time a request spent in one stage (connect, network, gateway, frontend, queue, prefill, decode, ...).",
)
TTFT_SECONDS = Metric(
    "hopline_ttft_seconds", "histogram", ("view",) + SCOPE,
    "Time to first token as the client, the gateway or the engine sees it.",
)
E2E_SECONDS = Metric(
    "hopline_e2e_seconds", "histogram", ("view",) + SCOPE,
    "End-to-end request latency as the client, the gateway or the engine sees it.",
)
ITL_SECONDS = Metric(
    "hopline_itl_seconds", "histogram", ("view",) + SCOPE,
    "Inter-token latency: (e2e - ttft) / (output_tokens - 1), per view.",
)
PROMPT_TOKENS = Metric(
    "hopline_prompt_tokens", "histogram", SCOPE, "Prompt length in tokens per request."
)
OUTPUT_TOKENS = Metric(
    "hopline_output_tokens", "histogram", SCOPE, "Output length in tokens per request."
)
REQUESTS = Metric(
    "hopline_requests", "counter", ("outcome",) + SCOPE,
    "Requests by outcome: ok, error, rejected, disconnected, incomplete.",
)
IN_FLIGHT = Metric(
    "hopline_requests_in_flight", "gauge", ("model", "replica"),
    "Requests the engine received and has not finished.",
)
KV_CACHE_BYTES = Metric(
    "hopline_kv_cache_bytes", "gauge", ("model", "replica"),
    "KV-cache bytes held by in-flight requests (prompt + output so far x bytes per token).",
)
EVENTS = Metric("hopline_events", "counter", ("hop",), "Hop events accepted (durably stored), by hop.")
EVENTS_REJECTED = Metric(
    "hopline_events_rejected", "counter", ("reason",), "Hop events rejected, by reason."
)
EVENTS_DUPLICATE = Metric(
    "hopline_events_duplicate", "counter", (), "Hop events dropped as duplicates (same eid or key)."
)
INCOMPLETE_REQUESTS = Metric(
    "hopline_incomplete_requests", "counter", ("missing",),
    "Requests that expired or were evicted before completing, by the first missing hop.",
)
CONNECTIONS = Metric(
    "hopline_connections", "counter", ("reused",) + SCOPE,
    "Client requests by whether they reused a pooled connection (true) or opened one (false).",
)
WITHOUT_MAX_TOKENS = Metric(
    "hopline_requests_without_max_tokens", "counter", SCOPE,
    "Requests that set no max_tokens / max_completion_tokens.",
)
NEGATIVE_STAGES = Metric(
    "hopline_negative_stages", "counter", ("stage",),
    "Stages computed below zero: an instrumentation or clock problem, never clamped.",
)
OPEN_REQUESTS = Metric(
    "hopline_open_requests", "gauge", (), "Requests the collector is still joining."
)


# -- the collector's own health: what it stored, refused, dropped, and how much it holds ----------
BODIES_REJECTED = Metric(
    "hopline_collector_bodies_rejected", "counter", ("reason",),
    "Request bodies refused whole (too_large, too_many_lines, bad_gzip, not_json, unauthorized, "
    "disconnected, ...): none of their events was stored.",
)
STORE_FAILURES = Metric(
    "hopline_collector_store_failures", "counter", (),
    "Batches the store could not write (answered 503; the sender retries).",
)
COMPACTION_FAILURES = Metric(
    "hopline_collector_compaction_failures", "counter", (),
    "Compaction or retention passes that failed (retried on the next pass).",
)
QUARANTINED_PARTS = Metric(
    "hopline_collector_quarantined_parts", "counter", (),
    "Stored NDJSON files that could not be compacted, moved to DIR/quarantine (named in the log).",
)
DEDUP_KEYS = Metric(
    "hopline_collector_dedup_keys", "gauge", (), "Event keys remembered to drop retried duplicates."
)
OPEN_REQUEST_BYTES = Metric(
    "hopline_collector_open_request_bytes", "gauge", (),
    "Estimated memory held by the events of requests still being joined.",
)
FINISHED_REQUEST_BYTES = Metric(
    "hopline_collector_finished_request_bytes", "gauge", (),
    "Estimated memory held by recently finished requests kept for GET /v1/requests/{id}.",
)
REQUESTS_CLOSED_INCOMPLETE = Metric(
    "hopline_collector_requests_closed_incomplete", "counter", ("why",),
    "Requests closed before completing: expired (TTL), evicted (open-request or memory cap), "
    "overflow (more events than the per-request cap).",
)
SCOPES_OVERFLOWED = Metric(
    "hopline_collector_scopes_overflowed", "counter", (),
    "Finished requests whose (service, model, replica) was beyond the series cap, recorded as other.",
)
EVENT_LOOP_LAG = Metric(
    "hopline_collector_event_loop_lag_seconds", "gauge", (),
    "Largest delay of the collector's event loop over the last housekeeping period.",
)
HTTP_CONNECTIONS_CLOSED = Metric(
    "hopline_collector_http_connections_closed", "counter", ("why",),
    "HTTP connections the collector closed before their request was read: over_cap (beyond "
    "--max-connections, at once), header_timeout (no complete headers within --header-timeout), "
    "body_timeout (a body idle for --body-timeout).",
)
WINDOW_SCOPES_OVERFLOWED = Metric(
    "hopline_collector_window_scopes_overflowed", "counter", ("by",),
    "Finished requests summarized as other in their window's summaries (GET /v1/windows): their "
    "value of the attribute `by` came after --window-scope-cap others in that window.",
)
WINDOW_SUMMARY_BYTES = Metric(
    "hopline_collector_window_summary_bytes", "gauge", (),
    "Estimated memory of the window summaries kept for GET /v1/windows (serialized sketches, rows "
    "not yet folded).",
)
# what a restarted collector rebuilt from its store, and what it could not (restart.py)
RESTART_REQUESTS = Metric(
    "hopline_collector_restart_requests", "gauge", ("state",),
    "Requests the collector read back from its store when it started: rebuilt (finished before the "
    "restart, put back into the windows not served yet), rejoined (in flight at the restart, open "
    "again so the hops sent after it complete them), served_before (finished into windows served "
    "before the restart, left out of them so the watcher does not count them twice).",
)
RESTART_EVENTS = Metric(
    "hopline_collector_restart_events", "gauge", (),
    "Stored events read back when the collector started (from the first window not served before "
    "the restart, less a margin).",
)
RESTART_SECONDS = Metric(
    "hopline_collector_restart_seconds", "gauge", (),
    "Time the start-up rebuild from the store took, before the collector answered.",
)
REQUESTS_PARTIAL = Metric(
    "hopline_collector_requests_partial", "counter", (),
    "Requests finished (every component's final hop arrived) without some of their earlier hops: "
    "hops an emitter lost, or, after a collector restart, hops sent before it that the store did "
    "not give back (older than the rebuild's start). Their stages from those hops are missing.",
)

COLLECTOR_HEALTH: tuple[Metric, ...] = (
    BODIES_REJECTED, STORE_FAILURES, COMPACTION_FAILURES, QUARANTINED_PARTS, DEDUP_KEYS,
    OPEN_REQUEST_BYTES, FINISHED_REQUEST_BYTES, REQUESTS_CLOSED_INCOMPLETE, SCOPES_OVERFLOWED,
    EVENT_LOOP_LAG, HTTP_CONNECTIONS_CLOSED, WINDOW_SCOPES_OVERFLOWED, WINDOW_SUMMARY_BYTES,
    RESTART_REQUESTS, RESTART_EVENTS, RESTART_SECONDS, REQUESTS_PARTIAL,
)

ALL: tuple[Metric, ...] = (
    STAGE_SECONDS, TTFT_SECONDS, E2E_SECONDS, ITL_SECONDS, PROMPT_TOKENS, OUTPUT_TOKENS,
    REQUESTS, IN_FLIGHT, KV_CACHE_BYTES, EVENTS, EVENTS_REJECTED, EVENTS_DUPLICATE,
    INCOMPLETE_REQUESTS, CONNECTIONS, WITHOUT_MAX_TOKENS, NEGATIVE_STAGES, OPEN_REQUESTS,
    *COLLECTOR_HEALTH,
)

VIEW_LABEL_VALUES = VIEWS

# Buckets for LLM latencies: 1 ms .. 30 min (the client library's defaults stop at 10 s).
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
)
ITL_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2,
    0.3, 0.5, 1.0, 2.0,
)
TOKEN_BUCKETS = (
    1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072,
)

# --- emitters' own health (collector/emitter_stats.py, from emitter.stats events) -------------

EMITTER_SCOPE = ("service", "replica")
EMITTER_SENT = Metric(
    "hopline_emitter_events_sent", "counter", EMITTER_SCOPE,
    "Hop events the emitters of a service and replica delivered to their sink (as they report).",
)
EMITTER_DROPPED = Metric(
    "hopline_emitter_events_dropped", "counter", EMITTER_SCOPE + ("reason",),
    "Hop events emitters lost, by reason: full (buffer full, the oldest made room), sink (could not "
    "be delivered), closed (emitted after close).",
)
EMITTER_BUFFERED = Metric(
    "hopline_emitter_events_buffered", "gauge", EMITTER_SCOPE,
    "Hop events waiting in the emitters' buffers at their last report.",
)
EMITTER_ERRORS = Metric(
    "hopline_emitter_errors", "counter", EMITTER_SCOPE,
    "Errors caught inside emitters and their sinks (bugs counted instead of raised into the host).",
)
# Per collector, from emitters whose sink shards over several (the report's ``targets``).
EMITTER_TARGET_SCOPE = EMITTER_SCOPE + ("target",)
EMITTER_TARGET_SENT = Metric(
    "hopline_emitter_target_events_sent", "counter", EMITTER_TARGET_SCOPE,
    "Hop events sharded emitters delivered, per collector (target: host:port as the emitters list it).",
)
EMITTER_TARGET_DROPPED = Metric(
    "hopline_emitter_target_events_dropped", "counter", EMITTER_TARGET_SCOPE + ("reason",),
    "Hop events sharded emitters lost, per collector: full (that collector's buffer was full), sink "
    "(that collector refused them or stayed unreachable for the retry budget).",
)
EMITTER_TARGET_BUFFERED = Metric(
    "hopline_emitter_target_events_buffered", "gauge", EMITTER_TARGET_SCOPE,
    "Hop events waiting in sharded emitters' per-collector buffers at their last report.",
)
EMITTER_METRICS: tuple[Metric, ...] = (
    EMITTER_SENT, EMITTER_DROPPED, EMITTER_BUFFERED, EMITTER_ERRORS,
    EMITTER_TARGET_SENT, EMITTER_TARGET_DROPPED, EMITTER_TARGET_BUFFERED,
)
