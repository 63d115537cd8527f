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

Hostile or damaged input never stops a run and never loses what is valid: a file that cannot be
read (a corrupt gzip stream, a file that is not Parquet, a Parquet whose columns are not hop
events or have other types) is reported as a bad file with its reason (``ScanReport.bad_files``)
and the rest is analysed; the complete lines before a gzip stream's damage are kept. A line or
row the storage types cannot hold (an integer beyond its column's range, a ``ts`` past year 9999,
attributes nested deeper than JSON can be written back) is a bad line. ``emitter.stats`` reports
(emitters' health, not requests) are skipped.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import orjson
import polars as pl
from hopline.middleware.contract import (
    EMITTER_STATS_HOP,
    ENGINE_ID_PREFIXES,
    STORAGE_COLUMNS,
    TS_MAX,
    iter_ndjson,
)
from hopline.middleware.contract.records import is_record_file, translate_lines
from hopline.middleware.contract.units import TimeBound, to_epoch  # shared with the collector's ?since=

SCHEMA: dict[str, pl.DataType] = {name: getattr(pl, dtype)() for name, dtype in STORAGE_COLUMNS.items()}
_EVENT_SCHEMA = {name: dtype for name, dtype in SCHEMA.items() if name != "attrs"}
_KNOWN = frozenset(_EVENT_SCHEMA)
MAX_ERRORS = 10
_NDJSON_NAME = re.compile(r"\.(ndjson|jsonl)(\.gz)?$|\.(ndjson|jsonl)\.[0-9][0-9.]*(\.gz)?$")
_PARTITION = re.compile(r"^(date|hour)=(.+)$")
# What the storage types can hold: integer columns' ranges, and times Polars can turn into dates.
_INT_RANGES = {
    name: (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    for name, dtype in STORAGE_COLUMNS.items()
    if (bits := {"Int16": 16, "Int32": 32, "Int64": 64}.get(dtype))
}
MAX_TS = TS_MAX  # the contract's bound (2100): Parquet rows are held to what validate_event accepts
REQUIRED_COLUMNS = ("ts", "request_id", "hop")
_DEFAULTS = {"v": 1, "attempt": 0}  # what an absent field means (DESIGN.md), as validation fills in



@dataclass
class ScanReport:
    """What was read: files, lines (NDJSON lines and Parquet rows), hop events kept, bad lines and
    files and why."""

    files: list[str] = field(default_factory=list)
    lines: int = 0
    events: int = 0  # hop events kept (before --since / --until)
    bad_lines: int = 0
    errors: list[str] = field(default_factory=list)  # the first MAX_ERRORS, "file:line: reason"
    bad_files: list[str] = field(default_factory=list)  # every file not (fully) read, "file: reason"

    def bad(self, where: str, reason: str, count: int = 1) -> None:
        self.bad_lines += count
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(f"{where}: {reason}")

    def bad_file(self, path: Path, reason: str) -> None:
        self.bad_files.append(f"{path}: {reason}")
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(f"{path}: {reason}")

    def to_dict(self) -> dict:
        return {
            "files": len(self.files),
            "lines": self.lines,
            "events": self.events,
            "bad_lines": self.bad_lines,
            "bad_files": self.bad_files,
            "errors": self.errors,
        }


def is_ndjson(path: Path) -> bool:
    # or an engine's per-request record file by its own name (each RecordFormat row names its files)
    return _NDJSON_NAME.search(path.name) is not None or is_record_file(path.name)


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


def _gunzip(data: bytes) -> tuple[bytes, str | None]:
    """A gzip file's content (every member), and what was wrong when the stream breaks off: then
    the content up to its last complete line, so nothing readable is lost."""
    out: list[bytes] = []
    while data:
        stream = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out.append(stream.decompress(data))
        except zlib.error as exc:
            partial = b"".join(out)
            return partial[: partial.rfind(b"\n") + 1], f"corrupt gzip stream ({exc}): read up to it"
        if not stream.eof:
            partial = b"".join(out)
            return partial[: partial.rfind(b"\n") + 1], "gzip stream cut short: read up to its end"
        data = stream.unused_data
    return b"".join(out), None


def _storage_problem(event: dict) -> str | None:
    """Why the storage types cannot hold this validated event, or None."""
    ts = event["ts"]
    if ts > MAX_TS:
        return f"ts {ts!r} is after 2100-01-01T00:00:00Z, a broken clock, not an event"
    for name in _INT_RANGES.keys() & event.keys():
        value = event[name]
        low, high = _INT_RANGES[name]
        if type(value) is int and not low <= value <= high:
            return f"{name} {value} does not fit a {STORAGE_COLUMNS[name]}"
    return None


def _attrs_json(event: dict) -> str | None:
    """The event's fields outside the schema as one JSON object (the ``attrs`` column)."""
    extra = event.keys() - _KNOWN
    return orjson.dumps({k: event[k] for k in sorted(extra)}).decode() if extra else None


def read_ndjson(path: Path, report: ScanReport) -> pl.DataFrame:
    """One NDJSON file, every line validated by the contract; bad lines (and a damaged gzip
    stream's reason) go to ``report``."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        report.bad_file(path, f"unreadable: {exc.strerror or exc}")
        return pl.DataFrame(schema=SCHEMA)
    if path.name.endswith(".gz"):
        data, problem = _gunzip(data)
        if problem is not None:
            report.bad_file(path, problem)
    return parse_ndjson(data, str(path), report)


def parse_ndjson(data: bytes, where: str, report: ScanReport) -> pl.DataFrame:
    """NDJSON bytes (complete lines) as ``read_ndjson`` reads a file's; ``where`` names them in errors."""
    path = where
    data, record_errors = translate_lines(data)  # engines' own per-request records (middleware/contract/records.py)
    for error in record_errors:
        report.bad(str(path), error)
    events: list[dict] = []
    attrs: list[str | None] = []
    for number, event, error in iter_ndjson(data):
        report.lines += 1
        if event is None:
            report.bad(f"{path}:{number}", error or "invalid")
            continue
        if event["hop"] == EMITTER_STATS_HOP:  # an emitter's health report, not a request's hop
            continue
        problem = _storage_problem(event)
        if problem is None:
            try:
                attrs.append(_attrs_json(event))
            except orjson.JSONEncodeError as exc:
                problem = f"attributes cannot be kept: {exc}"
        if problem is not None:
            report.bad(f"{path}:{number}", problem)
            continue
        events.append(event)
    report.events += len(events)
    # Polars builds the typed columns from the dicts (fields outside the schema are ignored here
    # and kept in ``attrs``)
    return pl.DataFrame(events, schema=_EVENT_SCHEMA, strict=False).with_columns(
        attrs=pl.Series(attrs, dtype=pl.String)
    )


def _normalized_request_id() -> pl.Expr:
    """``contract.normalize_request_id``'s prefix rule, vectorised: strip the first engine prefix
    the ID starts with, when something follows it. (Prefix tests and slices: a regex replace cost
    as much CPU as reading the column, 0.4 CPU-s per 5.9M events.)"""
    rid = pl.col("request_id")
    stripped = rid
    for prefix in reversed(ENGINE_ID_PREFIXES):  # the first prefix that applies wins, as in the loop
        applies = rid.str.starts_with(prefix) & (rid.str.len_bytes() > len(prefix))
        stripped = pl.when(applies).then(rid.str.strip_prefix(prefix)).otherwise(stripped)
    return stripped


def _castable(actual: pl.DataType, expected: pl.DataType) -> bool:
    """Whether a column stored as ``actual`` reads as ``expected`` without changing a value's
    meaning (integers into a float or an integer column; range checked per row)."""
    if actual == expected or actual == pl.Null():
        return True
    if actual.is_integer():
        return expected.is_integer() or expected.is_float()
    return actual.is_float() and expected.is_float()


def _parquet_problem(present: pl.Schema) -> str | None:
    """Why a Parquet file's columns are not stored hop events, or None."""
    missing = [name for name in REQUIRED_COLUMNS if name not in present]
    if missing:
        columns = ", ".join(list(present)[:8]) or "none"
        return f"not hop events: missing column {', '.join(missing)} (it has {columns})"
    wrong = [
        f"{name} is {present[name]}, expected {dtype}"
        for name, dtype in SCHEMA.items()
        if name in present and not _castable(present[name], dtype)
    ]
    return f"wrong column types: {'; '.join(wrong)}" if wrong else None


def _row_problem(present: pl.Schema) -> pl.Expr:
    """True on rows the storage types cannot hold (no ts / request_id / hop, ts not a time up to
    year 9999, an integer beyond its column's range)."""
    return pl.any_horizontal(_null_problem(), _value_problem(present))


def _null_problem() -> pl.Expr:
    """No ts, request_id or hop: what a Parquet file's null counts answer without its values."""
    return pl.col("ts").is_null() | pl.col("request_id").is_null() | pl.col("hop").is_null()


def _value_problem(present: pl.Schema) -> pl.Expr:
    """ts not a time up to year 9999 (null included), an integer beyond its column's range."""
    return pl.any_horizontal(
        ~pl.col("ts").cast(pl.Float64).is_between(0, MAX_TS, closed="right").fill_null(False),
        *(
            ~pl.col(name).is_between(*_INT_RANGES[name]).fill_null(True)
            for name in _INT_RANGES
            if name in present and present[name].is_integer() and present[name] != SCHEMA[name]
        ),
    )


def scan_parquet(path: Path, report: ScanReport) -> pl.LazyFrame:
    """A Parquet file of stored events, lazily, with every storage column present and typed.

    Its schema and row counts are read at once (a file that is not Parquet, or not hop events,
    is a bad file here rather than an error later, inside the analysis); rows the types cannot
    hold are counted as bad lines and left out, ``emitter.stats`` rows skipped."""
    present = check_parquet(path, report)
    return pl.LazyFrame(schema=SCHEMA) if present is None else typed_parquet(path, present)


def check_parquet(path: Path, report: ScanReport) -> pl.Schema | None:
    """``scan_parquet``'s checks and counts: the file's schema, or None for a bad file."""
    try:
        lf = pl.scan_parquet(path, hive_partitioning=False)
        present = lf.collect_schema()
        problem = _parquet_problem(present)
        if problem is not None:
            report.bad_file(path, problem)
            return None
        stats = pl.col("hop") == EMITTER_STATS_HOP
        # first whether any row is bad, asked so that no ID string is decoded (the null counts
        # in the row groups' statistics say it; 0.3 CPU-s a 5.9M-event bucket when decoded);
        # only a file with bad rows is read for their exact count
        nulls, values = pl.collect_all(
            [lf.filter(_null_problem()).select(pl.len()), lf.filter(_value_problem(present)).select(pl.len())]
        )
        if nulls.item() == 0 and values.item() == 0:
            rows, reports = lf.select(pl.len(), stats.sum()).collect().row(0)
            bad_rows = 0
        else:
            bad = _row_problem(present)
            rows, bad_rows, reports = lf.select(pl.len(), bad.sum(), (stats & ~bad).sum()).collect().row(0)
    except (pl.exceptions.PolarsError, OSError) as exc:
        report.bad_file(path, f"not a readable Parquet file: {str(exc).splitlines()[0][:200]}")
        return None
    report.lines += rows
    report.events += rows - bad_rows - reports
    if bad_rows:
        report.bad(str(path), f"{bad_rows} rows without ts, request_id or hop, or with values their types cannot hold", bad_rows)
    return present


def typed_parquet(path: Path, present: pl.Schema) -> pl.LazyFrame:
    """A checked Parquet file's events, lazily: bad and ``emitter.stats`` rows out, every storage
    column present and typed."""
    bad = _row_problem(present)
    stats = pl.col("hop") == EMITTER_STATS_HOP
    return (
        pl.scan_parquet(path, hive_partitioning=False)
        .filter(~bad & ~stats)
        .select(
            [
                (pl.col(name) if name in present else pl.lit(None)).cast(dtype).alias(name)
                for name, dtype in SCHEMA.items()
            ]
        )
        .with_columns(_normalized_request_id(), *(pl.col(k).fill_null(v) for k, v in _DEFAULTS.items()))
    )


@dataclass
class Scanned:
    """One event file: its events, lazily, and how many lines or rows it has (bad ones included).

    A Parquet file's lazy frame is made when asked for (``events``), from its checked schema: a
    held ``scan_parquet`` frame keeps the file's metadata, ~170 KB, i.e. 1.6 GiB for the 10,000
    files of a 50M-request store. An NDJSON file's frame is the one read."""

    path: Path
    frame: pl.LazyFrame | None  # NDJSON: read; Parquet: None (made from ``present``)
    rows: int
    present: pl.Schema | None = None
    bounds: tuple[float | None, float | None] = (None, None)  # since, until (Unix seconds)

    @property
    def events(self) -> pl.LazyFrame:
        if self.frame is not None:
            events = self.frame
        elif self.present is not None:
            events = typed_parquet(self.path, self.present)
        else:  # a bad Parquet file
            return pl.LazyFrame(schema=SCHEMA)
        lo, hi = self.bounds
        if lo is not None:
            events = events.filter(pl.col("ts") >= lo)
        if hi is not None:
            events = events.filter(pl.col("ts") <= hi)
        return events


def scan_each(
    paths: list[str | Path],
    since: TimeBound = None,
    until: TimeBound = None,
    progress: Callable[[Path], None] | None = None,
) -> tuple[list[Scanned], ScanReport]:
    """Each event file under ``paths`` with its events as a lazy frame (``STORAGE_COLUMNS``,
    ``since <= ts <= until``), and what was read: for readers that take files a group at a time
    (``bounded``: one bucket of requests at a time)."""
    lo, hi = to_epoch(since), to_epoch(until)
    report = ScanReport()
    scanned: list[Scanned] = []
    for path in find_files(paths, lo, hi):
        if progress is not None:
            progress(path)
        report.files.append(str(path))
        before = report.lines
        if is_parquet(path):
            frame, present = None, check_parquet(path, report)
        else:
            frame, present = read_ndjson(path, report).lazy(), None
        scanned.append(Scanned(path, frame, report.lines - before, present, (lo, hi)))
    return scanned, report


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
    scanned, report = scan_each(paths, since, until, progress)
    frames = [s.events for s in scanned]
    return (pl.concat(frames, how="vertical") if frames else pl.LazyFrame(schema=SCHEMA)), report
