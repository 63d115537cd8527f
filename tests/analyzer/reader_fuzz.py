"""Property-based fuzzing of the analyzer's readers (``io.scan_events``), shared by the CI test
(tests/analyzer/test_io_fuzz.py, a few thousand cases) and bench/bench_fuzz_readers.py (>= 10,000).

A case is a folder of files mixing valid hop events with hostile content: JSON of any shape,
known fields with wrong types, integers beyond their column's range, ``ts`` of 1e308, nesting
deeper than JSON can be written back, bytes that are not text; gzip streams cut short or
damaged; Parquet files with random columns and types, and bytes that are not Parquet. The
property (``check_case``): reading never raises, building timelines never raises, and every valid
line of an undamaged file comes out (request ID, hop and ts), counted in ``report.events``.
"""

from __future__ import annotations

import gzip
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import polars as pl
from hopline.analyzer.io import scan_events
from hopline.analyzer.timelines import timelines
from hopline.middleware.contract import (
    ATTRIBUTE_TYPES,
    HOPS,
    MAX_DURATION_S,
    STORAGE_COLUMNS,
    EventError,
    normalize_request_id,
    validate_event,
)
from hypothesis import strategies as st

_ID_CHARS = string.ascii_letters + string.digits + "._:-"
_INT_MAX = {"Int16": 2**15 - 1, "Int32": 2**31 - 1, "Int64": 2**63 - 1}


def _label(max_size: int) -> st.SearchStrategy[str]:
    """Text the contract accepts in a known string attribute: any but control characters (Cc is
    exactly the contract's C0, DEL and C1; Cs, surrogates, are no UTF-8); a hostile line puts
    them back."""
    return st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=max_size)


def _attribute(name: str) -> st.SearchStrategy[Any]:
    """A value the contract and the storage type both accept for a known attribute."""
    types = ATTRIBUTE_TYPES[name]
    if types == (bool,):
        return st.booleans()
    if types == (str,):
        return _label(20)
    if types == (int,):
        return st.integers(0, _INT_MAX[STORAGE_COLUMNS[name]])
    return st.floats(0, MAX_DURATION_S, allow_nan=False)


valid_events = st.fixed_dictionaries(
    {
        "ts": st.floats(1e9, 2e9, allow_nan=False),
        "request_id": st.text(_ID_CHARS, min_size=1, max_size=64),
        "hop": st.sampled_from(HOPS),
    },
    optional={
        "attempt": st.integers(0, 2**31 - 1),
        "service": _label(30),
        "replica": _label(30),
        "model": _label(30),
        "eid": st.text(string.hexdigits, min_size=1, max_size=16),
        **{name: _attribute(name) for name in ("stream", "n", "prompt_tokens", "status", "error", "queue_s")},
        "extra": st.recursive(
            st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=10),
            lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
            max_leaves=10,
        ),
    },
)

_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)  # what orjson writes
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


def _deep(depth: int) -> bytes:
    return b'{"ts": 1.7e9, "request_id": "deep", "hop": "client.sent", "a": ' + b"[" * depth + b"]" * depth + b"}"


hostile_lines = st.one_of(
    st.binary(max_size=60),  # not text, not JSON
    _json_values.map(orjson.dumps),  # JSON of any shape
    st.builds(  # an event with one known field replaced by anything
        lambda event, field, value: orjson.dumps({**event, field: value}),
        valid_events,
        st.sampled_from(sorted(STORAGE_COLUMNS.keys() - {"attrs"})),
        _json_values | st.integers(2**63, 2**64 - 1) | st.just(1e308),
    ),
    st.integers(255, 1100).map(_deep),  # deeper than orjson writes (254), or reads (1,024)
    st.integers(2**64, 2**200).map(  # beyond any integer type (orjson reads it as a float)
        lambda n: b'{"ts": 1.7e9, "request_id": "big", "hop": "client.sent", "n": %d}' % n
    ),
    st.sampled_from([b"", b"{}", b"[]", b"null", b'{"hop": "emitter.stats"}', b"\xff\xfe", b"{" * 2000]),
)


@dataclass
class NdjsonFile:
    lines: list[tuple[bytes, dict[str, Any] | None]]  # (line, the event when the line is valid)
    gz: bool = False
    damage: tuple[int, bytes] | None = None  # (offset, bytes written over the gzip stream there)
    cut: float | None = None  # keep this fraction of the gzip stream

    def content(self) -> bytes:
        data = b"".join(line + b"\n" for line, _ in self.lines)
        if not self.gz:
            return data
        stream = gzip.compress(data)
        if self.cut is not None:
            stream = stream[: int(len(stream) * self.cut)]
        if self.damage is not None:
            at = self.damage[0] % max(len(stream), 1)
            stream = stream[:at] + self.damage[1] + stream[at + len(self.damage[1]) :]
        return stream

    @property
    def intact(self) -> bool:
        return self.damage is None and self.cut is None


lines = st.lists(
    st.one_of(valid_events.map(lambda e: (orjson.dumps(e), e)), hostile_lines.map(lambda line: (line, None))),
    max_size=12,
)
ndjson_files = st.builds(
    NdjsonFile,
    lines,
    gz=st.booleans(),
    damage=st.none() | st.tuples(st.integers(0, 10_000), st.binary(min_size=1, max_size=16)),
    cut=st.none() | st.floats(0, 0.99),
)

_dtypes = st.sampled_from(
    [pl.Float64, pl.Float32, pl.Int64, pl.Int32, pl.Int16, pl.UInt64, pl.String, pl.Boolean, pl.Null]
)


@st.composite
def parquet_frames(draw: st.DrawFn) -> pl.DataFrame:
    """A frame with a random subset of the storage columns (and others), random types and values."""
    rows = draw(st.integers(0, 6))
    names = draw(st.lists(st.sampled_from([*STORAGE_COLUMNS, "other", "x"]), unique=True, max_size=10))
    columns = {}
    for name in names:
        dtype = draw(_dtypes)
        if dtype == pl.Null:
            columns[name] = pl.Series(name, [None] * rows, dtype=pl.Null)
            continue
        values = st.none() | {
            pl.Float64: st.floats(allow_nan=True), pl.Float32: st.floats(width=32),
            pl.Int64: st.integers(-(2**63), 2**63 - 1), pl.Int32: st.integers(-(2**31), 2**31 - 1),
            pl.Int16: st.integers(-(2**15), 2**15 - 1), pl.UInt64: st.integers(0, 2**64 - 1),
            pl.String: st.sampled_from(HOPS) | st.text(max_size=10), pl.Boolean: st.booleans(),
        }[dtype]
        columns[name] = pl.Series(name, draw(st.lists(values, min_size=rows, max_size=rows)), dtype=dtype)
    return pl.DataFrame(columns, height=rows) if columns else pl.DataFrame()


cases = st.lists(
    st.one_of(
        ndjson_files,
        parquet_frames(),
        st.binary(max_size=200).map(lambda data: ("garbage.parquet", data)),
    ),
    min_size=1,
    max_size=4,
)


def accepted(event: dict[str, Any]) -> bool:
    try:
        validate_event(event)
    except EventError:
        return False
    return True


def check_case(folder: Path, files: list[Any], *, with_timelines: bool = True) -> None:
    """Write ``files`` under ``folder`` and assert the property (see the module docstring)."""
    expected: list[tuple[str, str, float]] = []
    for number, item in enumerate(files):
        if isinstance(item, NdjsonFile):
            path = folder / f"f{number}.ndjson{'.gz' if item.gz else ''}"
            path.write_bytes(item.content())
            if item.intact:  # valid: what the contract accepts (the collector stores the same)
                expected += [
                    (normalize_request_id(e["request_id"]), e["hop"], e["ts"])
                    for _, e in item.lines
                    if e is not None and accepted(e)
                ]
        elif isinstance(item, pl.DataFrame):
            item.write_parquet(folder / f"f{number}.parquet")
        else:
            (folder / f"f{number}.{item[0]}").write_bytes(item[1])
    events, report = scan_events([folder])
    frame = events.collect()
    found = set(zip(frame["request_id"], frame["hop"], frame["ts"], strict=True))
    missing = [key for key in expected if key not in found]
    assert not missing, (missing, report.errors)
    assert report.events >= len(expected) and frame.height == report.events
    if with_timelines:
        timelines(frame.lazy()).collect()
