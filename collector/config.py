"""The collector's settings, each declared once: the fields of ``CollectorConfig``.

A field made with ``setting(...)`` is a user setting. Its name is its option (``max_open``:
``--max-open``), and its one declaration gives the environment variable (``HOPLINE_MAX_OPEN``), the
key in a ``--config`` TOML file (``max-open``), the default as a user writes it (``2s``), how text
becomes the value (``parse``: a ValueError names what is wrong) and the range of a number, and the
help line. ``cli.py`` makes the ``hopline collector`` command from these declarations,
``markdown_table()`` the README's table of settings (a test compares them). Fields without
``setting`` are limits tuned in code and tests: every limit that bounds memory or disk is here with
the reason for it. Durations are seconds and sizes bytes, named without a unit (as the options are).

The collector's parts take their settings from here and nowhere else: each has a
``from_config(config, ...)`` that passes the fields it uses under the same names (``Joiner(grace=...)``),
and none has a default of its own for them. A new setting is its field here plus the code that uses it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Iterator
from dataclasses import MISSING, Field, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from hopline.collector.kv_cache import parse_model_config
from hopline.middleware.contract.rules import SCOPE_SOURCES
from hopline.middleware.contract.spans import parse_resource_map
from hopline.middleware.contract.units import SIZE_HELP, parse_duration, parse_size

FSYNC_POLICIES = ("batch", "interval", "none")
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")
ENV_PREFIX = "HOPLINE_"


@dataclass(frozen=True)
class Setting:
    """What one field needs to be a setting of ``hopline collector`` (see ``setting``)."""

    help: str
    show: str | None = None  # the default as written on the command line ("2s"); None: not shown
    parse: Callable[[Any], Any] | None = None  # the command line's value -> the field's value
    kind: type = str  # what the command line takes: str, int, bool, Path
    repeat: bool = False  # the option may be given several times (a list in the config file)
    min: int | None = None
    max: int | None = None
    choices: tuple[str, ...] = ()
    metavar: str | None = None  # the value's name in --help (default: from the kind)
    name: str = ""  # the field's name ("max_open"), filled in by ``settings()``

    @property
    def option(self) -> str:
        """The command line's option: the field's name with dashes (``--max-open``)."""
        return "--" + self.name.replace("_", "-")

    @property
    def key(self) -> str:
        """The setting's key in a ``--config`` file: the option without its dashes."""
        return self.option.removeprefix("--")

    @property
    def value_name(self) -> str:
        if self.metavar is not None:
            return self.metavar
        if self.choices:
            return "[" + "|".join(self.choices) + "]"
        if self.parse is parse_duration:
            return "DURATION"
        return {int: "N", Path: "PATH", bool: ""}.get(self.kind, "TEXT")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.key.replace("-", "_").upper()


def setting(default: Any = MISSING, *, factory: Any = MISSING, **declared: Any) -> Any:
    """A dataclass field that is a user setting; ``declared``: ``Setting``'s fields. A text default
    of a setting with ``parse`` is written as a user writes it ("2s"): the field's default is its
    parsed value (2.0)."""
    s = Setting(**declared)
    if isinstance(default, str) and s.parse is not None:
        s, default = replace(s, show=default), s.parse(default)
    elif default not in (MISSING, None) and s.kind is not bool and not s.repeat:
        s = replace(s, show=str(default))
    return field(default=default, default_factory=factory, metadata={"setting": s})


def model_configs(specs: Iterable[str]) -> dict[str, int]:
    return dict(parse_model_config(spec) for spec in specs)


def resource_maps(specs: Iterable[str]) -> dict[str, tuple[str, ...]]:
    return dict(parse_resource_map(spec) for spec in specs)


def window_scopes(names: str | Iterable[str]) -> tuple[str, ...]:
    """``--window-by`` values: scope attributes of the rule book (``rules.SCOPE_SOURCES``), each once."""
    if isinstance(names, str):
        names = [names]
    chosen = tuple(dict.fromkeys(n.strip() for name in names for n in name.split(",") if n.strip()))
    unknown = [n for n in chosen if n not in SCOPE_SOURCES]
    if unknown:
        known = ", ".join(SCOPE_SOURCES)
        raise ValueError(f"--window-by: unknown scope {unknown[0]!r}: give some of {known}")
    return chosen


WINDOW_BY = ("replica", "model", "service")


MIB = 1024 * 1024


@dataclass(frozen=True)
class CollectorConfig:
    data_dir: Path = setting(kind=Path, help="Where events are stored (DIR/events/date=…/hour=…).")
    host: str = setting("127.0.0.1", help="Address to listen on.")
    port: int = setting(9400, kind=int, min=0, max=65535, help="Port to listen on (0: any free port).")
    # GET /metrics and /v1/requests need "Authorization: Bearer <read_token>" (or <token>); without
    # a read token they need <token> when that is set. /healthz stays open.
    token: str | None = setting(None, help=(
        "Bearer token POST /v1/events requires (GET /metrics and /v1/requests too, unless --read-token "
        "or --open-reads). An empty one is refused."))
    read_token: str | None = setting(None, help=(
        "Bearer token GET /metrics and /v1/requests accept (besides --token, which they require when "
        "set). /healthz stays open."))
    open_reads: bool = setting(False, kind=bool, help=(
        "Leave /metrics and /v1/requests open even with --token (a Prometheus without credentials)."))
    # model name -> KV-cache bytes per token (see hopline.collector.kv_cache)
    model_config: dict[str, int] = setting(
        factory=dict, repeat=True, parse=model_configs, help=(
        "NAME=PATH (a Hugging Face config.json) or NAME=layers,kv_heads,head_dim,kv_dtype, for the "
        "KV-cache gauge. Repeatable."),
    )
    retention: float = setting("14d", parse=parse_duration, help=(
        "Delete stored hours older than this (e.g. 36h, 14d)."))
    tail: tuple[str, ...] = setting((), repeat=True, parse=tuple, help=(
        "Follow NDJSON files written by the file sink, e.g. '/var/log/hopline/events.ndjson*'. Repeatable."))
    # batch: write + fsync before every acknowledgement (survives power loss); interval: write
    # before acknowledging, fsync at most every fsync_interval (survives a killed process, may
    # lose the last interval on power loss); none: write only, the OS decides.
    fsync: str = setting("batch", choices=FSYNC_POLICIES, help=(
        "batch: fsync every batch before acknowledging it; interval: write before acknowledging, "
        "fsync every --fsync-interval; none: write only."))
    fsync_interval: float = setting("1s", parse=parse_duration, help=(
        "fsync period of --fsync interval."))
    max_body: int = setting(8 * MIB, kind=int, min=1, help=(
        "Largest request body accepted, in bytes (413 above), compressed or not."))
    # connections that never finish their request must not hold file descriptors (issue 34, item 2)
    max_connections: int = setting(1000, kind=int, min=1, help=(
        "Most HTTP connections open at once: one beyond them is closed as it opens. Lowered to leave "
        "256 descriptors of the open-files limit (ulimit -n) to the collector's own files."))
    header_timeout: float = setting("10s", parse=parse_duration, help=(
        "Close a connection whose request line and headers are not complete this long after it "
        "opened (or after the first byte of its next request)."))
    body_timeout: float = setting("30s", parse=parse_duration, help=(
        "Close a connection that sends no byte of its request's body for this long."))
    # a sender's clock a year ahead would move every live detector's event time a year forward
    max_future: float = setting("5m", parse=parse_duration, help=(
        "Refuse an event whose ts is more than this ahead of the collector's own clock (a sender's "
        "clock gone wrong); the batch's other events are stored."))
    healthz_min_free: int = setting("64MiB", parse=parse_size, metavar="SIZE", help=(
        "/healthz answers 503 while the data directory's file system has less free space than this "
        "(the largest body the collector accepts, decompressed), so a load balancer drains a "
        "collector before a full disk refuses events; 0: only failed writes count. " + SIZE_HELP + "."))
    # join
    grace: float = setting("2s", parse=parse_duration, help=(
        "Wait this long for late hops once a request's final hops arrived (with --tail, at least two "
        "tail polls, 1s: files written together can be read a poll apart)."))
    # sliding: a request without max_tokens can decode for minutes
    ttl: float = setting("15m", parse=parse_duration, help=(
        "An unfinished request expires this long after its last event."))
    max_open: int = setting(100_000, kind=int, min=1, help=(
        "Most requests joined at once (the least recently active is evicted)."))
    max_open_bytes: int = setting(256 * MIB, kind=int, min=1, help=(
        "Most estimated bytes of events held by open requests (oldest evicted)."))
    finished_cache: int = setting(10_000, kind=int, min=0, help=(
        "Finished requests kept for GET /v1/requests/{id}."))
    recent_requests: int = setting(100_000, kind=int, min=1, help=(
        "Finished requests kept in brief (~350 bytes each) for GET /v1/requests?since=…&slowest=N."))
    # per-window, per-scope summaries (windows.py): DDSketches that merge across collectors
    window: float = setting("10s", parse=parse_duration, help=(
        "Width of the per-window, per-scope summaries of finished requests served at GET /v1/windows "
        "(windows aligned to Unix time, by each request's start; 0s: none kept)."))
    window_keep: float = setting("1h", parse=parse_duration, help=(
        "Window summaries kept, in event time behind the newest window."))
    window_by: tuple[str, ...] = setting(
        ",".join(WINDOW_BY), parse=window_scopes, help=(
        "Scope attributes summarized per window, comma-separated (of replica, model, service, region, "
        "route, prefill_replica, decode_replica, …)."),
    )
    window_scope_cap: int = setting(128, kind=int, min=1, help=(
        "Most values of one attribute in one window; later ones are summarized as other (counted in "
        "hopline_collector_window_scopes_overflowed)."))
    window_settle: float = setting("30s", parse=parse_duration, help=(
        "A window's summaries are served this long after it ends, so that requests that started in it "
        "and finish later still land in it."))
    dedup_capacity: int = setting(500_000, kind=int, min=1, help=(
        "Event keys per dedup generation (two are kept): retries within it are dropped."))
    dedup_window: float = setting("10m", parse=parse_duration, help=(
        "A dedup generation older than this is forgotten."))
    # OTLP: scope field -> resource attributes to read it from, in place of spans.RESOURCE_SCOPE's
    otlp_resource: dict[str, tuple[str, ...]] = setting(
        factory=dict, repeat=True, parse=resource_maps, help=(
        "FIELD=ATTR[,ATTR…]: read service, replica or model of OTLP spans from these resource "
        "attributes, e.g. replica=k8s.pod.name. Repeatable."),
    )
    otlp_max_spans: int = setting(100_000, kind=int, min=1, help=(
        "Most spans in one POST /v1/traces (413 with an OTLP error above); they are decoded, mapped "
        "and stored in slices off the event loop."))
    otlp_export: str | None = setting(None, help=(
        "Send each finished request as a trace (root + one span per stage) to this OTLP/HTTP traces "
        "URL, e.g. http://tempo:4318/v1/traces."))
    log_level: str = setting("warning", choices=LOG_LEVELS, help="uvicorn's log level.")

    # -- limits tuned in code and tests ------------------------------------------------------------
    tail_interval: float = 0.5
    max_decompressed_bytes: int = 64 * MIB  # gzip bombs stop here (413)
    # lines (or array items) per body, 413 above: bounds the parse time of one body (~10 µs a
    # line at worst, so ~0.5 s on the parse thread) whatever its bytes hold; sinks send 1,000
    max_lines_per_body: int = 50_000
    max_events_per_request: int = 512  # a request with more is closed as incomplete (overflow)
    max_finished_bytes: int = 64 * MIB  # estimated event memory of the finished LRU
    label_cap: int = 64  # distinct values per label (service, model, replica); overflow -> "other"
    # distinct (service, model, replica) per metric family; overflow -> (other, other, other).
    # Bounds /metrics: hopline_stage_seconds holds 12 stages x 31 buckets x scope_cap series.
    scope_cap: int = 128
    compact_interval: float = 60.0  # how often closed hours are compacted and retention applied
    compact_delay: float = 60.0  # an hour is compacted this long after it closed

    def __post_init__(self) -> None:
        for f, s in settings():
            value = getattr(self, f.name)
            if s.choices and value not in s.choices:
                raise ValueError(f"{s.option} must be one of {', '.join(s.choices)}, got {value!r}")
        for name in ("token", "read_token"):
            value = getattr(self, name)
            if value is not None and not value.strip():
                raise ValueError(f"{name} is empty: give a real token, or none to run without auth")
        for option, value in (("--header-timeout", self.header_timeout), ("--body-timeout", self.body_timeout)):
            if not value > 0:
                raise ValueError(f"{option} must be more than 0, got {value!r}")
        if not (self.window >= 0 and self.window_keep >= self.window):
            raise ValueError(
                f"--window must be 0 or more and --window-keep at least --window, got {self.window!r} and "
                f"{self.window_keep!r}"
            )
        object.__setattr__(self, "window_by", window_scopes(self.window_by))
        object.__setattr__(self, "data_dir", Path(self.data_dir))

    @classmethod
    def from_options(cls, given: dict[str, Any]) -> CollectorConfig:
        """The config from settings as the command line gives them (field name -> text, list or
        number; None or an empty list: not given). ValueError naming the option that is wrong."""
        values = {}
        for f, s in settings():
            raw = given.get(f.name)
            if raw is None or (s.repeat and not raw):
                continue
            try:
                values[f.name] = s.parse(raw) if s.parse is not None else raw
            except ValueError as exc:
                message = str(exc)
                named = message if message.startswith(s.option) else f"{s.option}: {message}"
                raise ValueError(named) from None
        return cls(**values)

    @property
    def writes_token(self) -> tuple[str, ...]:
        """Tokens that open POST /v1/events and /v1/traces (empty: open to anyone)."""
        return (self.token,) if self.token is not None else ()

    @property
    def reads_token(self) -> tuple[str, ...]:
        """Tokens that open GET /metrics and /v1/requests/{id} (empty: open to anyone)."""
        if self.open_reads:
            return ()
        return tuple(t for t in (self.read_token, self.token) if t is not None)


def settings() -> Iterator[tuple[Field, Setting]]:
    """(field, its declaration) for every user setting, in declaration order."""
    return iter(_settings())


@functools.cache
def _settings() -> tuple[tuple[Field, Setting], ...]:
    declared = (f for f in fields(CollectorConfig) if "setting" in f.metadata)
    return tuple((f, replace(f.metadata["setting"], name=f.name)) for f in declared)


def settings_of(component: type, config: CollectorConfig) -> dict[str, Any]:
    """The keyword-only parameters of ``component`` that are fields of ``config`` (a setting's
    field is its keyword), with ``config``'s values: what a ``from_config`` passes on."""
    names = {f.name for f in fields(CollectorConfig)}
    parameters = inspect.signature(component).parameters.values()
    return {p.name: getattr(config, p.name) for p in parameters if p.kind is p.KEYWORD_ONLY and p.name in names}


def markdown_table() -> str:
    """The README's table of collector settings, from the declarations."""
    rows = ["| option | environment | default | what it does |", "| --- | --- | --- | --- |"]
    for _, s in settings():
        default = f"`{s.show}`" if s.show is not None else "—"
        what = (s.help + (f" One of: {', '.join(s.choices)}." if s.choices else "")).replace("|", "\\|")
        rows.append(f"| `{s.option}` | `{s.env}` | {default} | {what} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":  # python -m hopline.collector.config: the table for the README
    print(markdown_table(), end="")
