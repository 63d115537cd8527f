"""The per-request step of ``timelines()`` with numpy: which event each hop, scope and ending
takes, found once per kind of choice instead of once per output column.

``timelines()`` reduces a request's events to one row through ~130 aggregations (a hop's time and
attributes: a ``min`` / ``min_by`` of its pick; a scope attribute: a ``min_by`` of its source key;
a component's ending; first times; attempts). In one Polars ``group_by`` each of them is its own
pass with its own gather per group: 6.3 of the 7.4 CPU-s of ``timelines()`` on 2.4M events.
Most of them choose the same event: every attribute of a hop comes from that hop's chosen event.
So here a request's rows are found once (``request_id`` as a ``Categorical``: each row's request
number), each (request, hop) cell's chosen event once (two ``np.minimum.at``: the smallest pick,
then the first row holding it: on an exact tie the first event in the log, as the contract's
``request_inputs`` takes it), each scope key's and each ending's chosen event once, and every
output column is a gather of its source column at those rows. Requests are numbered by their first
event (``Groups.in_log_order``), and that is their row order (the caller sorts what it shows): a
request's events lie close together in the log, so the ``np.minimum.at`` passes write to nearby
cells and the gathers read nearby rows (a bucket of 5.9M events: the hop cells' pass 395 -> 180 ms,
the gathers of 77 hop columns 1,047 -> 517 ms, against the order of a hash of the IDs).

The output is ``timelines.aggregated()``'s frame column for column, value for value
(tests/analyzer/test_picks.py holds the two together on logs with retries, legs, errors and
missing fields), but on an exact tie with other attributes, where the group_by took either
event, differently from run to run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import polars as pl

@dataclass(frozen=True)
class Groups:
    """Rows -> requests: each row's request number, how many, each request's first row."""

    of_row: np.ndarray
    count: int
    first_row: np.ndarray

    def in_log_order(self) -> Groups:
        """The same requests numbered by their first row."""
        if not np.any(self.first_row[1:] < self.first_row[:-1]):
            return self  # numbered so already
        order = np.argsort(self.first_row)
        number = np.empty(self.count, dtype=np.int64)
        number[order] = np.arange(self.count)
        return Groups(number[self.of_row], self.count, self.first_row[order])


def request_groups(request_id: pl.Series) -> Groups:
    """The requests of ``request_id``'s rows (rows without an ID: one request, as a ``group_by``
    makes them), numbered by their first row.

    Rows are sorted by their ID's 64-bit hash, with the row number in the hash's low bits (one
    ``np.sort`` of integers: a request's rows end up together, smallest row first), and every
    row's ID is then checked against its request's first row's. A hash prefix shared by two IDs
    fails that check, and ``by_categorical`` numbers the rows instead, so the result is exact
    either way. A 5.9M-event bucket: 0.8-0.9 CPU-s, against 1.3-1.4 for the ``Categorical``
    (its hash table of 500k IDs does not stay in the cache)."""
    size = len(request_id)
    if size == 0:
        return Groups(np.zeros(0, dtype=np.int64), 0, np.zeros(0, dtype=np.int64))
    request_id = request_id.rechunk()  # a gather from one chunk: 60 chunks (a bucket's files) cost 18x
    bits = size.bit_length()
    low = np.uint64((1 << bits) - 1)
    key = request_id.hash().to_numpy() & ~low  # a new array: the hash's high bits
    key |= np.arange(size, dtype=np.uint64)
    key.sort()
    rows = (key & low).astype(np.int64)
    key >>= np.uint64(bits)
    starts = np.empty(size, dtype=bool)
    starts[0] = True
    np.not_equal(key[1:], key[:-1], out=starts[1:])
    del key
    firsts = rows[starts]  # each request's first row, the requests in the order of their hash
    order = np.argsort(firsts)
    first_row = firsts[order]  # in the order of the log
    in_log = np.empty(len(firsts), dtype=np.int64)
    in_log[order] = np.arange(len(firsts))
    of_row = np.empty(size, dtype=np.int64)
    of_row[rows] = in_log[np.cumsum(starts) - 1]
    # exact: every row's ID is its request's first row's (null with null)
    if not request_id.gather(pl.Series(first_row[of_row], dtype=pl.UInt32)).eq_missing(request_id).all():
        return by_categorical(request_id)
    return Groups(of_row, len(first_row), first_row)


def by_categorical(request_id: pl.Series) -> Groups:
    """``request_groups`` by each row's ID's code in a ``Categorical`` of its own (a string's code
    is the same string's, exactly)."""
    codes = request_id.cast(pl.Categorical(pl.Categories.random())).to_physical()
    size = len(codes)
    if codes.has_nulls():
        codes = codes.cast(pl.Int64).fill_null(codes.max() + 1 if codes.null_count() < size else 0)
    of_row = codes.to_numpy().astype(np.int64)
    count = int(of_row.max()) + 1 if size else 0
    # codes are given in order of first sight, so a request's first row is where its code passes
    # the largest before it; else (not so promised) the smallest row of each
    seen = np.maximum.accumulate(of_row) if size else of_row
    first = np.empty(size, dtype=bool)
    first[:1] = True
    np.greater(of_row[1:], seen[:-1], out=first[1:])
    first_row = np.flatnonzero(first)
    if len(first_row) != count or (size and not np.array_equal(of_row[first_row], np.arange(count))):
        first_row = np.full(count, size, dtype=np.int64)
        np.minimum.at(first_row, of_row, np.arange(size))
    return Groups(of_row, count, first_row)


def first_smallest(group: np.ndarray, size: int, key: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    """Per group (0..size-1): the smallest ``key`` (inf when none) and the first row holding it
    (``len(key)`` when none); rows whose key is null take no part."""
    if key.has_nulls():
        index = key.is_not_null().arg_true().to_numpy()
        g, k = group[index], key.drop_nulls().to_numpy()
    else:
        index, g, k = None, group, key.to_numpy()
    smallest = np.full(size, np.inf)
    np.minimum.at(smallest, g, k)
    won = np.flatnonzero(k == smallest[g])
    chosen = np.full(size, len(key), dtype=np.int64)
    np.minimum.at(chosen, g[won], won if index is None else index[won])
    return smallest, chosen


def masked_min(group: np.ndarray, size: int, values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Per group, the smallest of ``values`` on rows where ``mask`` holds (inf when none)."""
    out = np.full(size, np.inf)
    np.minimum.at(out, group[mask], values[mask])
    return out


def masked_max(group: np.ndarray, size: int, values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Per group, the largest of integer ``values`` (never negative) on rows where ``mask`` holds
    (-1 when none)."""
    out = np.full(size, -1, dtype=np.int64)
    np.maximum.at(out, group[mask], values[mask].astype(np.int64))
    return out


@dataclass(frozen=True)
class Plan:
    """What ``per_request`` builds, by kind (output names as ``timelines._aggregations`` has them).

    ``hop_columns``: output -> (hop, column) read from the hop's chosen event (the smallest
    ``_pick`` of the hop's rows); ``keyed``: output -> (key, column) read from the row with the
    smallest ``key``; ``earliest``: output -> the hops whose earliest ``ts`` it is (None: all);
    ``tops``: output -> the hops whose largest ``attempt`` it is (None: all; ``plus_one``: the
    outputs that add one)."""

    hop_columns: Mapping[str, tuple[str, str]]
    keyed: Mapping[str, tuple[str, str]]
    earliest: Mapping[str, Sequence[str] | None]
    tops: Mapping[str, Sequence[str] | None]
    plus_one: frozenset[str] = frozenset()

    def only(self, names: set[str]) -> Plan:
        """The outputs in ``names`` alone."""
        def keep(parts: Mapping) -> dict:
            return {name: how for name, how in parts.items() if name in names}

        return Plan(keep(self.hop_columns), keep(self.keyed), keep(self.earliest), keep(self.tops), self.plus_one)

    def reads(self) -> list[str]:
        """The per-event columns the outputs read (besides ``request_id``, ``hop``, ``ts``,
        ``attempt`` and ``_pick``)."""
        columns = [column for _, column in self.hop_columns.values()]
        columns += [part for key, column in self.keyed.values() for part in (key, column)]
        return [c for c in dict.fromkeys(columns) if c != "_pick"]


def _at(rows: np.ndarray, missing: int) -> tuple[pl.Series, pl.Series | None]:
    """``rows`` (``missing`` where there is none) as a gather index, and where it is missing (None:
    nowhere): the gather reads row 0 there, and ``_masked`` makes it null."""
    absent = rows == missing
    if not absent.any():
        return pl.Series(rows, dtype=pl.UInt32), None
    return pl.Series(np.where(absent, 0, rows), dtype=pl.UInt32), pl.Series(absent)


def _masked(value: pl.Expr, absent: pl.Series | None) -> pl.Expr:
    """``value``, null where ``absent`` holds."""
    return value if absent is None else pl.when(pl.lit(absent)).then(None).otherwise(value)


def _nullables(columns: Sequence[tuple[str, np.ndarray, np.ndarray, pl.DataType, bool]]) -> dict[str, pl.Series]:
    """Each ``(name, values, missing, dtype, wrap)``: ``values`` as ``dtype``, null where ``missing``;
    ``wrap``: an integer beyond ``dtype`` wraps around, as Polars' own arithmetic does in the
    reference (``attempt`` 2**31 - 1, plus one). The nulls of all of them set by one select (a
    when/then each: 500k values 0.65 ms against 3.1 for a scatter; one select, not one each, as
    ~0.3 ms of a select's own cost adds up over ~20 columns a bucket)."""
    exprs = []
    for name, values, missing, dtype, wrap in columns:
        series = pl.Series(name, values).cast(dtype, wrap_numerical=wrap)
        exprs.append(_masked(pl.lit(series), pl.Series(missing) if missing.any() else None).alias(name))
    return dict(zip((c[0] for c in columns), pl.select(exprs).get_columns())) if exprs else {}


class _Rows:
    """The per-event frame with the numbers every choice needs, read once."""

    def __init__(self, events: pl.DataFrame, groups: Groups) -> None:
        self.events, self.groups = events, groups
        hop = events["hop"]
        self.categories: list[str] = hop.dtype.categories.to_list()  # type: ignore[union-attr]
        self.hop = hop.to_physical().to_numpy().astype(np.int64)
        self._of_hops: dict[tuple[str, ...], np.ndarray] = {}

    def of_hops(self, hops: Sequence[str] | None) -> np.ndarray:
        """Whether each row's hop is one of ``hops`` (None: any), by a lookup of its code (a
        component's hops are asked for its first time and its last attempt alike: kept)."""
        if hops is None:
            return np.ones(self.events.height, dtype=bool)
        asked = tuple(hops)
        if asked not in self._of_hops:
            table = np.zeros(len(self.categories), dtype=bool)
            table[[self.categories.index(h) for h in hops if h in self.categories]] = True
            self._of_hops[asked] = table[self.hop]
        return self._of_hops[asked]

    def hop_choices(self, hops: set[str]) -> dict[str, np.ndarray]:
        """Each hop's chosen row per request (``len(events)`` when the hop is absent). A request's
        cells are the hops asked for and one for every other hop's events, never read: 12 a
        request instead of the 23 of the enum for the 7 stages, half the array to fill and write."""
        asked = sorted(hops, key=self.categories.index)
        width, count = len(asked) + 1, self.groups.count
        column = np.full(len(self.categories), len(asked), dtype=np.int64)
        column[[self.categories.index(h) for h in asked]] = np.arange(len(asked))
        cell = self.groups.of_row * width + column[self.hop]
        _, chosen = first_smallest(cell, count * width, self.events["_pick"])
        # one contiguous row of requests a hop (a strided column costs 3x to gather and mask)
        by_hop = np.ascontiguousarray(chosen.reshape(count, width)[:, : len(asked)].T)
        return dict(zip(asked, by_hop, strict=True))


def per_request(events: pl.DataFrame, plan: Plan, schema: pl.Schema) -> pl.DataFrame | None:
    """One row per request of ``events`` (the per-event frame ``timelines`` groups: ``hop``,
    ``ts``, ``attempt``, ``_pick``, the keys and the columns read), typed and ordered as
    ``schema``; None when an event has no ``attempt`` (the reader fills it in; a frame made another
    way goes to the reference)."""
    if events["attempt"].has_nulls():
        return None
    groups = request_groups(events["request_id"]).in_log_order()
    rows = _Rows(events, groups)
    hop_rows = rows.hop_choices({hop for hop, _ in plan.hop_columns.values()}) if plan.hop_columns else {}
    chosen = dict(hop_rows)  # a hop's or a key's chosen row per request (events.height: none)
    for key, _ in plan.keyed.values():
        if key not in chosen:
            chosen[key] = first_smallest(groups.of_row, groups.count, events[key])[1]
    at = {source: _at(row, events.height) for source, row in chosen.items()}
    # every column read at a chosen event: one select, so Polars runs the gathers together (a
    # request without the event reads row 0, made null there: no null in the index, no select to make one)
    read = {"request_id": ("request_id", (pl.Series(groups.first_row), None))}
    # a hop's pick is read from the array its choice was made from (numpy: one Polars gather less a hop)
    picked = {name: hop for name, (hop, column) in plan.hop_columns.items() if column == "_pick"}
    read |= {name: (column, at[hop]) for name, (hop, column) in plan.hop_columns.items() if name not in picked}
    read |= {name: (column, at[key]) for name, (key, column) in plan.keyed.items()}
    gathered = events.select(
        _masked(pl.col(column).gather(pl.lit(index)), absent).alias(name)
        for name, (column, (index, absent)) in read.items()
    )
    out = dict(zip(gathered.columns, gathered.get_columns()))
    made: list[tuple[str, np.ndarray, np.ndarray, pl.DataType, bool]] = []
    if picked:
        pick = events["_pick"].to_numpy()
        for name, hop in picked.items():
            missing = hop_rows[hop] == events.height
            made.append((name, pick[np.where(missing, 0, hop_rows[hop])], missing, pl.Float64, False))
    ts = events["ts"].to_numpy()
    for name, hops in plan.earliest.items():
        earliest = masked_min(groups.of_row, groups.count, ts, rows.of_hops(hops))
        made.append((name, earliest, np.isinf(earliest), pl.Float64, False))
    attempt = events["attempt"]
    for name, hops in plan.tops.items():
        top = masked_max(groups.of_row, groups.count, attempt.to_numpy(), rows.of_hops(hops))
        made.append((name, top + (name in plan.plus_one), top < 0, attempt.dtype, True))
    out |= _nullables(made)
    if "trace_id" in schema:
        out["trace_id"] = _trace_ids(events, groups)
    return pl.DataFrame(out).select(list(schema)).cast(dict(schema))


def _trace_ids(events: pl.DataFrame, groups: Groups) -> pl.Series:
    """The largest ``trace_id`` of each request's events (null when none carries one)."""
    out = pl.Series("trace_id", [None] * groups.count, dtype=pl.String)
    if "trace_id" not in events.columns:
        return out
    trace = events["trace_id"]
    carried = trace.is_not_null()
    if not carried.any():
        return out.cast(trace.dtype)
    largest = (
        pl.DataFrame({"g": groups.of_row[carried.to_numpy()], "t": trace.filter(carried)})
        .group_by("g")
        .agg(pl.col("t").max())
    )
    return out.cast(trace.dtype).scatter(largest["g"].to_numpy(), largest["t"])
