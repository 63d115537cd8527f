"""Turn a closed hour of NDJSON into one typed Parquet file, with Polars.

The Parquet schema is exactly ``contract.STORAGE_COLUMNS``: core fields and every known
attribute typed, all other fields of an event as one JSON object in ``attrs`` (null when the
event had none). Rows are sorted by (request_id, ts) so a reader pivoting per request finds a
request's events together. The file is written under a temporary name, fsynced and renamed, and
only then are the NDJSON files removed: a crash at any point leaves either the NDJSON files, or
a complete Parquet file (plus NDJSON files that ``compact_hour`` removes on its next run).

Polars' NDJSON reader infers one schema for the hour, which is fast but fails on what the
contract allows: an unknown attribute that is an object on one line and a list on another, or
lines stored by an older collector that validated less. When it fails, the hour is read again
line by line in Python, each line validated with the contract: valid events go to Parquet
(their unknown attributes JSON-encoded one by one), and lines that still cannot be stored are
returned so the store can move them aside (quarantine) instead of stopping compaction for good.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import orjson
import polars as pl
from hopline.middleware.contract import STORAGE_COLUMNS, EventError, validate_event

PARQUET_NAME = "events.parquet"
NDJSON_GLOB = "*.ndjson"
DEFAULTS = {"v": 1, "attempt": 0}  # what an absent field means (DESIGN.md)
SCHEMA = {name: getattr(pl, dtype) for name, dtype in STORAGE_COLUMNS.items()}
KNOWN = frozenset(STORAGE_COLUMNS) - {"attrs"}


def trim_partial_line(path: Path) -> None:
    """Cut a file back to its last newline: a torn tail was never acknowledged to anyone."""
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        end = size
        while end > 0:
            step = min(65536, end)
            f.seek(end - step)
            chunk = f.read(step)
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                end = end - step + nl + 1
                break
            end -= step
        if end != size:
            f.truncate(end)


def _known(name: str, present: set[str]) -> pl.Expr:
    dtype = SCHEMA[name]
    if name not in present:
        return pl.lit(DEFAULTS.get(name), dtype=dtype).alias(name)
    expr = pl.col(name).cast(dtype)
    return expr.fill_null(DEFAULTS[name]) if name in DEFAULTS else expr


def _attrs(unknown: list[str]) -> pl.Expr:
    """One JSON object per row of the unknown fields that are set (absent and null are the same)."""
    if not unknown:
        return pl.lit(None, dtype=pl.String).alias("attrs")
    members = [
        pl.when(pl.col(name).is_not_null()).then(
            pl.struct(pl.col(name)).struct.json_encode().str.strip_prefix("{").str.strip_suffix("}")
        )
        for name in unknown
    ]
    joined = pl.concat_str(members, separator=",", ignore_nulls=True)
    return pl.when(joined != "").then(pl.concat_str([pl.lit("{"), joined, pl.lit("}")])).alias("attrs")


def events_frame(paths: list[Path]) -> pl.LazyFrame:
    """The events of NDJSON files, typed as ``STORAGE_COLUMNS``."""
    lf = pl.scan_ndjson(paths, infer_schema_length=None)
    present = set(lf.collect_schema().names())
    unknown = sorted(present - KNOWN)
    return lf.select([_known(name, present) for name in SCHEMA if name != "attrs"] + [_attrs(unknown)])


def events_frame_by_line(paths: list[Path]) -> tuple[pl.DataFrame, list[bytes]]:
    """The valid events of NDJSON files typed as ``STORAGE_COLUMNS``, read line by line (the slow
    path, when the whole-file reader fails), and the lines that are not valid events."""
    columns: dict[str, list] = {name: [] for name in SCHEMA}
    known = [name for name in SCHEMA if name != "attrs"]
    bad: list[bytes] = []
    for path in paths:
        for line in path.read_bytes().splitlines():
            if not line.strip():
                continue
            try:
                event = validate_event(orjson.loads(line))
            except (orjson.JSONDecodeError, EventError):
                bad.append(line)
                continue
            for name in known:
                columns[name].append(event.get(name))
            extra = {k: v for k, v in event.items() if k not in KNOWN and v is not None}
            columns["attrs"].append(orjson.dumps(extra, option=orjson.OPT_SORT_KEYS).decode() if extra else None)
    return pl.DataFrame(columns, schema=SCHEMA), bad


def _frame(paths: list[Path]) -> tuple[pl.DataFrame, list[bytes]]:
    try:
        return events_frame(paths).collect(), []
    except (Exception, pl.exceptions.PanicException):  # noqa: BLE001 - any reader failure: go line by line
        return events_frame_by_line(paths)


def compact_hour(hour_dir: Path, quarantine: Callable[[list[bytes]], None] | None = None) -> Path | None:
    """Compact ``hour_dir``'s NDJSON files into ``events.parquet``; returns it (None: nothing to do).

    Lines that are not valid events are handed to ``quarantine`` (which must store them
    durably) before the Parquet file replaces the NDJSON files; without one, they raise.
    """
    target = hour_dir / PARQUET_NAME
    sources = sorted(hour_dir.glob(NDJSON_GLOB))
    if not sources:
        return None
    if not target.exists():
        for path in sources:
            trim_partial_line(path)
        nonempty = [p for p in sources if p.stat().st_size > 0]
        if nonempty:
            tmp = hour_dir / (PARQUET_NAME + ".tmp")
            frame, bad = _frame(nonempty)
            if bad:
                if quarantine is None:
                    raise EventError(f"{hour_dir}: {len(bad)} lines are not valid events")
                quarantine(bad)
            frame = frame.sort("request_id", "ts")
            frame.write_parquet(tmp, compression="zstd", statistics=True)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, target)
            fsync_dir(hour_dir)
    for path in sources:
        path.unlink(missing_ok=True)
    fsync_dir(hour_dir)
    return target if target.exists() else None


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
