"""The collector's settings in one frozen dataclass, shared by the CLI, the app factory and tests.

Every limit that bounds memory or disk lives here with its default and the reason for it, so a
reader can see what the collector will hold on to whatever arrives.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

FSYNC_POLICIES = ("batch", "interval", "none")


@dataclass(frozen=True)
class CollectorConfig:
    data_dir: Path  # where to listen is uvicorn's business (the command's --host / --port)
    token: str | None = None  # when set, POST /v1/events needs "Authorization: Bearer <token>"
    # GET /metrics and /v1/requests/{id} need "Authorization: Bearer <read_token>" (or <token>);
    # without a read token they need <token> when that is set. /healthz stays open. open_reads
    # leaves the read endpoints open even with a token (a Prometheus without credentials).
    read_token: str | None = None
    open_reads: bool = False
    # model name -> KV-cache bytes per token (see hopline.collector.kv_cache)
    kv_bytes_per_token: dict[str, int] = field(default_factory=dict)
    retention_s: float = 14 * 86400.0
    tail: tuple[str, ...] = ()  # globs of NDJSON files written by the file sink
    tail_interval_s: float = 0.5
    # batch: write + fsync before every acknowledgement (survives power loss);
    # interval: write before acknowledging, fsync at most every fsync_interval_s (survives a
    # killed process, may lose the last interval on power loss); none: write only, the OS decides.
    fsync: str = "batch"
    fsync_interval_s: float = 1.0
    max_body_bytes: int = 8 * 1024 * 1024  # 413 above this, compressed or not
    max_decompressed_bytes: int = 64 * 1024 * 1024  # gzip bombs stop here (413)
    # lines (or array items) per body, 413 above: bounds the parse time of one body (~10 µs a
    # line at worst, so ~0.5 s on the parse thread) whatever its bytes hold; sinks send 1,000
    max_lines_per_body: int = 50_000
    # join
    grace_s: float = 2.0  # after the final hops arrived, wait this long for late hops (engine.stats)
    ttl_s: float = 15 * 60.0  # sliding: a request without max_tokens can decode for minutes
    max_open_requests: int = 100_000  # beyond: the least recently active request is evicted
    max_open_bytes: int = 256 * 1024 * 1024  # estimated event memory of open requests (same eviction)
    max_events_per_request: int = 512  # a request with more is closed as incomplete (overflow)
    max_finished_bytes: int = 64 * 1024 * 1024  # estimated event memory of the finished LRU
    completed_cache: int = 10_000  # finished requests kept for GET /v1/requests/{id}
    # finished requests kept in brief (~350 bytes each) for GET /v1/requests?since=…&slowest=N
    recent_requests: int = 100_000
    dedup_capacity: int = 500_000  # eids remembered per generation (two generations are kept)
    dedup_window_s: float = 600.0  # a generation older than this is forgotten
    label_cap: int = 64  # distinct values per label (service, model, replica); overflow -> "other"
    # distinct (service, model, replica) per metric family; overflow -> (other, other, other).
    # Bounds /metrics: hopline_stage_seconds holds 12 stages x 31 buckets x scope_cap series.
    scope_cap: int = 128
    compact_interval_s: float = 60.0  # how often closed hours are compacted and retention applied
    compact_delay_s: float = 60.0  # an hour is compacted this long after it closed
    # OTLP: scope field -> resource attributes to read it from, in place of spans.RESOURCE_SCOPE's
    otlp_resource: dict[str, tuple[str, ...]] = field(default_factory=dict)
    otlp_export: str | None = None  # an OTLP/HTTP traces URL: each finished request is sent as a trace

    def __post_init__(self) -> None:
        if self.fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync must be one of {', '.join(FSYNC_POLICIES)}, got {self.fsync!r}")
        for name in ("token", "read_token"):
            value = getattr(self, name)
            if value is not None and not value.strip():
                raise ValueError(f"{name} is empty: give a real token, or none to run without auth")
        object.__setattr__(self, "data_dir", Path(self.data_dir))

    @property
    def reads_token(self) -> tuple[str, ...]:
        """Tokens that open GET /metrics and /v1/requests/{id} (empty: open to anyone)."""
        if self.open_reads:
            return ()
        return tuple(t for t in (self.read_token, self.token) if t is not None)
