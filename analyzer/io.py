"""Reading hop events from wherever they were written, into one typed ``LazyFrame``.

Accepts NDJSON files (``*.ndjson``, ``*.jsonl``, rotated names such as
``events.ndjson.2026112913.1``, optionally ``.gz``), Parquet files, folders (searched
recursively) and the collector's hive-partitioned store (``DIR/events/date=YYYY-MM-DD/hour=HH/``:
NDJSON for open hours, Parquet for compacted ones).

NDJSON lines go through the contract's ``validate_event`` one by one, so the analyzer accepts
exactly what the collector accepts; a bad line is counted and reported (``file:line: reason``),
never fatal. Parquet files were validated when they were written (the collector's store), so
they are scanned lazily, with only the request-ID normalization applied, vectorised.
Every frame comes out with ``contract.STORAGE_COLUMNS`` names and types.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import orjson
import polars as pl
from hopline.middleware.contract import ENGINE_ID_PREFIXES, STORAGE_COLUMNS, iter_ndjson
from hopline.middleware.records import translate_lines

SCHEMA: dict[str, pl.DataType] = {name: getattr(pl, dtype)() for name, dtype in STORAGE_COLUMNS.items()}
_EVENT_SCHEMA = {name: dtype for name, dtype in SCHEMA.items() if name != "attrs"}
_KNOWN = frozenset(_EVENT_SCHEMA)
MAX_ERRORS = 10
_NDJSON_NAME = re.compile(r"\.(ndjson|jsonl)(\.gz)?$|\.(ndjson|jsonl)\.[0-9][0-9.]*(\.gz)?$")
# engines' per-request record files read as NDJSON (middleware/records.py): SGLang's metrics export
_RECORD_NAME = re.compile(r"sglang-request-metrics-[0-9_]+\.log$")
_PARTITION = re.compile(r"^(date|hour)=(.+)$")
_PREFIX_RE = "^(?:" + "|".join(re.escape(p) for p in ENGINE_ID_PREFIXES) + ")(.)"

TimeBound = float | int | str | datetime | None


@dataclass
class ScanReport:
    """What was read: files, lines (NDJSON lines and Parquet rows), bad lines and why."""

    files: list[str] = field(default_factory=list)
    lines: int = 0
    bad_lines: int = 0
    errors: list[str] = field(default_factory=list)  # the first MAX_ERRORS, "file:line: reason"

    def bad(self, where: str, reason: str) -> None:
        self.bad_lines += 1
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(f"{where}: {reason}")

    def to_dict(self) -> dict:
        return {
            "files": len(self.files),
            "lines": self.lines,
            "bad_lines": self.bad_lines,
            "errors": self.errors,
        }


def to_epoch(value: TimeBound) -> float | None:
    """``--since`` / ``--until`` as Unix seconds: a number, or ISO-8601 (UTC when no offset)."""
    if value is None or isinstance(value, (int, float)):
        return None if value is None else float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.timestamp()


def is_ndjson(path: Path) -> bool:
    return _NDJSON_NAME.search(path.name) is not None or _RECORD_NAME.match(path.name) is not None


def is_parquet(path: Path) -> bool:
    return path.suffix == ".parquet"


def _partition_hour(path: Path) -> tuple[float, float] | None:
    """The [start, end) hour a hive-partitioned file covers (``date=…/hour=…``), if any."""
    parts = dict(m.groups() for p in path.parts if (m := _PARTITION.match(p)))
    if "date" not in parts:
        return None
    try:
        day = datetime.fromisoformat(parts["date"]).replace(tzinfo=UTC).timestamp()
        if "hour" not in parts:
            return day, day + 86400.0
        start = day + 3600.0 * int(parts["hour"])
    except ValueError:
        return None
    return start, start + 3600.0


PARTITION_SKEW_S = 600.0  # how far ahead of the collector an emitter's clock may run


def find_files(
    paths: Iterable[str | Path], since: float | None = None, until: float | None = None
) -> list[Path]:
    """Event files under ``paths`` (files as given, folders recursively, sorted), skipping
    hive partitions that cannot hold events of [since, until]. Raises ``FileNotFoundError`` for
    a path that does not exist.

    The collector partitions by *ingest* time, which is at or after an event's ``ts`` up to the
    emitting host's clock skew: an hour that closed more than ``PARTITION_SKEW_S`` before
    ``since`` is skipped; an hour after ``until`` is not (late events land there)."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            candidates = sorted(p for p in path.rglob("*") if p.is_file() and (is_ndjson(p) or is_parquet(p)))
        elif path.exists():
            candidates = [path]
        else:
            raise FileNotFoundError(f"no such file or folder: {path}")
        for p in candidates:
            span = _partition_hour(p)
            if span is not None and since is not None and span[1] <= since - PARTITION_SKEW_S:
                continue
            found.append(p)
    return found


def _read_bytes(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if path.name.endswith(".gz") else data


def read_ndjson(path: Path, report: ScanReport) -> pl.DataFrame:
    """One NDJSON file, every line validated by the contract; bad lines go to ``report``."""
    try:
        data = _read_bytes(path)
    except (OSError, EOFError) as exc:
        report.bad(str(path), f"unreadable: {exc}")
        return pl.DataFrame(schema=SCHEMA)
    data, record_errors = translate_lines(data)  # engines' own per-request records (middleware/records.py)
    for error in record_errors:
        report.bad(str(path), error)
    events: list[dict] = []
    attrs: list[str | None] = []
    for number, event, error in iter_ndjson(data):
        report.lines += 1
        if event is None:
            report.bad(f"{path}:{number}", error or "invalid")
            continue
        events.append(event)
        extra = event.keys() - _KNOWN
        attrs.append(orjson.dumps({k: event[k] for k in sorted(extra)}).decode() if extra else None)
    # Polars builds the typed columns from the dicts (fields outside the schema are ignored here
    # and kept in ``attrs``)
    return pl.DataFrame(events, schema=_EVENT_SCHEMA, strict=False).with_columns(
        attrs=pl.Series(attrs, dtype=pl.String)
    )


def _normalized_request_id() -> pl.Expr:
    """``contract.normalize_request_id``'s prefix rule, vectorised (strip one engine prefix)."""
    return pl.col("request_id").str.replace(_PREFIX_RE, "${1}")


def scan_parquet(path: Path, report: ScanReport) -> pl.LazyFrame:
    """A Parquet file of stored events, lazily, with every storage column present and typed."""
    lf = pl.scan_parquet(path, hive_partitioning=False)
    present = lf.collect_schema()
    report.lines += lf.select(pl.len()).collect().item()
    return lf.select(
        [
            (pl.col(name) if name in present else pl.lit(None)).cast(dtype).alias(name)
            for name, dtype in SCHEMA.items()
        ]
    ).with_columns(_normalized_request_id())


def scan_events(
    paths: list[str | Path],
    since: TimeBound = None,
    until: TimeBound = None,
    progress: Callable[[Path], None] | None = None,
) -> tuple[pl.LazyFrame, ScanReport]:
    """All events under ``paths`` as one lazy frame (``STORAGE_COLUMNS``), and what was read.

    ``since`` / ``until`` (Unix seconds, ISO-8601 or datetime) keep events with
    ``since <= ts <= until``. ``progress`` is called with each file before it is read.
    """
    lo, hi = to_epoch(since), to_epoch(until)
    report = ScanReport()
    frames: list[pl.LazyFrame] = []
    for path in find_files(paths, lo, hi):
        if progress is not None:
            progress(path)
        report.files.append(str(path))
        if is_parquet(path):
            frames.append(scan_parquet(path, report))
        else:
            frames.append(read_ndjson(path, report).lazy())
    events = pl.concat(frames, how="vertical") if frames else pl.LazyFrame(schema=SCHEMA)
    if lo is not None:
        events = events.filter(pl.col("ts") >= lo)
    if hi is not None:
        events = events.filter(pl.col("ts") <= hi)
    return events, report
