"""picks.per_request (numpy: one choice per hop, scope and ending, then gathers) against the
Polars group_by it replaces (timelines.aggregated), value for value, column for column."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hopline.analyzer import picks
from hopline.analyzer import timelines as tl
from hopline.middleware.contract import request_inputs
from hopline.middleware.contract.rules import SCOPE_SOURCES, describe_request
from polars.testing import assert_frame_equal
from support.synth import generate, with_retries
from support.tables import golden_events, synthetic_events

PD_HOPS = ["engine.received", "engine.scheduled", "engine.first_token", "engine.last_token", "engine.stats"]


def both(events: pl.DataFrame, scopes: tuple[str, ...] = ()) -> tuple[pl.DataFrame, pl.DataFrame]:
    """timelines() through picks and through the Polars group_by, sorted by request."""
    fast = tl.timelines(events.lazy(), scopes=scopes).collect()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tl, "_per_request", reference_per_request)
        reference = tl.timelines(events.lazy(), scopes=scopes).collect()
    return fast.sort("request_id"), reference.sort("request_id")


def reference_per_request(read: pl.LazyFrame, sources: dict, traced: bool, need: set[str]) -> pl.LazyFrame:
    return tl.aggregated(read, sources, traced)


def aggregated_both(events: pl.DataFrame) -> tuple[pl.DataFrame | None, pl.DataFrame]:
    """The per-request step alone (every aggregation, before any stage is derived)."""
    read = tl.per_event(events.lazy(), tl.SCOPE_SOURCES)
    reference = tl.aggregated(read, tl.SCOPE_SOURCES, traced=True).collect()
    schema = reference.schema
    got = picks.per_request(read.with_columns(tl.pick_key().alias("_pick")).collect(), tl.picks_plan(tl.SCOPE_SOURCES), schema)
    return got, reference


def with_legs(events: pl.DataFrame, seed: int) -> pl.DataFrame:
    """Add P/D prefill legs (engine hops with ``leg`` = prefill on another replica), cancelled
    errors and trace IDs on some events."""
    rng = np.random.default_rng(seed)
    engine = events.filter(pl.col("hop").is_in(PD_HOPS))
    legs = engine.sample(fraction=0.3, seed=seed).with_columns(
        leg=pl.lit("prefill"), replica=pl.lit("p1"), ts=pl.col("ts") - 0.05
    )
    cancelled = pl.col("hop").str.ends_with(".error") & (pl.col("request_id").hash(seed) % 2 == 0)
    out = pl.concat([events, legs], how="vertical").with_columns(
        status=pl.when(cancelled).then(pl.lit(499).cast(events.schema["status"])).otherwise("status"),
        error=pl.when(cancelled).then(pl.lit("cancelled")).otherwise("error"),
    )
    traced = pl.Series(rng.random(out.height) < 0.2)
    out = out.with_columns(trace_id=pl.when(traced).then(pl.col("request_id").hash(3).cast(pl.String)))
    return out.sample(fraction=1.0, shuffle=True, seed=seed)


def with_ties(events: pl.DataFrame, seed: int) -> pl.DataFrame:
    """Exact ties: a copy of some events (same hop, ts and attempt) with another replica, status
    and error, at a random place in the log."""
    ties = events.sample(fraction=0.1, seed=seed + 1).with_columns(
        replica=pl.lit("r-tie"), status=pl.lit(499).cast(events.schema["status"]), error=pl.lit("cancelled")
    )
    return pl.concat([events, ties]).sample(fraction=1.0, shuffle=True, seed=seed)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_per_request_equals_the_polars_group_by_on_retries_legs_and_errors(seed):
    events = with_legs(with_retries(generate(600, seed=seed, clock_skew_s=30.0, error_rate=0.1), seed), seed)
    got, reference = aggregated_both(events)
    assert got is not None
    assert got.schema == reference.schema
    assert_frame_equal(got.sort("request_id"), reference.sort("request_id"))


def test_an_exact_tie_goes_to_the_first_event_in_the_log_as_in_the_contract():
    """Two events of one hop with the same ts and attempt but other attributes: the contract's
    plain-Python rules (``request_inputs``, ``describe_request``) keep the first in log order.
    The Polars group_by took either, differently from run to run; picks takes the first, always."""
    events = with_ties(with_retries(generate(400, seed=4, clock_skew_s=30.0, error_rate=0.2), 4), 4)
    first = tl.timelines(events.lazy()).collect().sort("request_id")
    assert_frame_equal(first, tl.timelines(events.lazy()).collect().sort("request_id"))  # the same every run
    rows = {r["request_id"]: r for r in first.iter_rows(named=True)}
    by_request: dict[str, list[dict]] = {}
    for row in events.drop("attrs").iter_rows(named=True):
        by_request.setdefault(row["request_id"], []).append({k: v for k, v in row.items() if v is not None})
    tied = 0
    for rid, evs in by_request.items():
        row, described = rows[rid], describe_request(evs)
        assert {k: row[k] for k in SCOPE_SOURCES} == described["scope"], rid
        assert row["outcome"] == described["outcome"], rid
        inputs = request_inputs(evs)
        assert {c: row[c] for c in tl.ATTRIBUTE_COLUMNS.values()} == {
            c: inputs[name] for name, c in tl.ATTRIBUTE_COLUMNS.items()
        }, rid
        tied += any(e.get("replica") == "r-tie" for e in evs)
    assert tied > 50


def test_the_largest_attempt_never_raises_and_wraps_as_the_group_by_does():
    """``attempts`` is the largest ``attempt`` plus one, in the ``attempt`` column's Int32: from
    2**31 - 1 (valid in the contract) the group_by's sum wraps around; picks raised (found by
    test_io_fuzz's hypothesis search)."""
    events = synthetic_events(50, seed=2).with_row_index("row")
    one = events["request_id"][0]
    events = events.with_columns(
        attempt=pl.when(pl.col("row") == 0).then(2**31 - 1).otherwise("attempt").cast(events.schema["attempt"])
    ).drop("row")
    fast, reference = both(events)
    assert_frame_equal(fast, reference)
    assert fast.filter(pl.col("request_id") == one)["attempts"].to_list() == [-(2**31)]


def test_timelines_equal_through_both_on_the_golden_fixture_and_a_synthetic_log():
    for events in (golden_events(), synthetic_events(3_000, seed=5)):
        fast, reference = both(events)
        assert fast.height == reference.height > 0
        assert_frame_equal(fast, reference)


def test_timelines_equal_through_both_with_an_extra_scope():
    events = synthetic_events(1_000, seed=9).with_columns(
        attrs=pl.format('{{"tenant": "t{}"}}', pl.col("request_id").hash(1) % 3)
    )
    fast, reference = both(events, scopes=("tenant",))
    assert fast["tenant"].n_unique() == 3
    assert_frame_equal(fast, reference)


def test_a_missing_attempt_falls_back_to_the_group_by():
    events = synthetic_events(300, seed=3)
    read = tl.per_event(events.lazy(), tl.SCOPE_SOURCES).with_columns(tl.pick_key().alias("_pick")).collect()
    plan, schema = tl.picks_plan(tl.SCOPE_SOURCES), tl.aggregated(read.lazy(), tl.SCOPE_SOURCES, True).collect_schema()
    assert picks.per_request(read, plan, schema) is not None
    assert picks.per_request(read.with_columns(attempt=pl.lit(None, pl.Int32)), plan, schema) is None


def plain_groups(ids: list[str | None]) -> tuple[list[int], list[int]]:
    """The rule written plainly: each row's request numbered by the first row its ID is seen at
    (rows without an ID: one request), and each request's first row."""
    order = list(dict.fromkeys(ids))
    return [order.index(i) for i in ids], [ids.index(i) for i in order]


@pytest.mark.parametrize("ids", [
    ["r3", "r1", "r4", "r1", "r5", "r9", "r2", "r6", "r5", "r3", "r5", "r8", "r9", "r7", "r9"],
    ["b", None, "a", "b", None, "c"],
    [None, None],
    [],
])  # fmt: skip
@pytest.mark.parametrize("numbering", [picks.request_groups, picks.by_categorical])
def test_requests_are_numbered_as_the_ids_are_first_seen(ids, numbering):
    """Each row's request is its ID's (rows without one: one request), numbered by the first row
    it is seen at; ``first_row`` is that row. Held against the plain reading of the rule."""
    found = numbering(pl.Series("request_id", ids, dtype=pl.String))
    groups = found.in_log_order()
    of_row, first_row = plain_groups(ids)
    assert groups.count == len(first_row)
    assert groups.of_row.tolist() == of_row
    assert groups.first_row.tolist() == first_row
    if None not in ids or numbering is picks.request_groups:
        assert groups is found  # numbered in order of first sight already: nothing to renumber


@given(
    ids=st.lists(st.one_of(st.none(), st.sampled_from(["a", "b", "c", "ab", "chatcmpl-a", "", "é"])), max_size=40),
    buckets=st.integers(1, 4),
)
@settings(max_examples=300, deadline=None)
def test_ids_sharing_a_hash_are_still_told_apart(ids, buckets):
    """``request_groups`` sorts rows by their ID's hash: IDs whose hashes share the high bits
    (here, a hash of a few values) must still be numbered apart, by the check against each
    request's first row (without it, ``a`` and ``b`` in one bucket would be one request)."""
    real_hash = pl.Series.hash

    def weak_hash(self, *args, **kwargs):
        return (real_hash(self, *args, **kwargs) % buckets) * 2**60  # high bits: all the sort looks at

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pl.Series, "hash", weak_hash)
        groups = picks.request_groups(pl.Series("request_id", ids, dtype=pl.String)).in_log_order()
    of_row, first_row = plain_groups(ids)
    assert groups.of_row.tolist() == of_row and groups.first_row.tolist() == first_row


def test_request_numbers_not_in_first_sight_order_are_put_in_it(monkeypatch):
    """Should the ``Categorical``'s codes not come in order of first sight, each request's first
    row is still its smallest, and ``in_log_order`` numbers them by it."""
    ids = pl.Series("request_id", ["x", "y", "x", "z", "y"])
    codes = pl.Series([2, 0, 2, 1, 0], dtype=pl.UInt32)
    monkeypatch.setattr(pl.Series, "to_physical", lambda self: codes)
    groups = picks.by_categorical(ids)
    assert groups.count == 3 and groups.first_row.tolist() == [1, 3, 0]
    assert groups.in_log_order().of_row.tolist() == [0, 1, 0, 2, 1]


def test_requests_in_log_order_are_numbered_by_their_first_row():
    groups = picks.Groups(np.array([2, 0, 2, 1, 0]), 3, np.array([1, 3, 0]))
    in_log = groups.in_log_order()  # request 2 (first row 0) is the first, request 0 (row 1) the second
    assert in_log.of_row.tolist() == [0, 1, 0, 2, 1] and in_log.first_row.tolist() == [0, 1, 3]


def test_first_smallest_takes_the_first_row_of_a_tie_and_skips_nulls():
    group = np.array([0, 0, 0, 1, 1, 2])
    key = pl.Series([2.0, 1.0, 1.0, None, None, 5.0])
    smallest, chosen = picks.first_smallest(group, 4, key)
    assert chosen.tolist() == [1, 6, 5, 6]
    assert smallest[[0, 2]].tolist() == [1.0, 5.0]
    assert np.isinf(smallest[[1, 3]]).all()


@pytest.mark.parametrize(
    "columns",
    [
        ("request_id", "replica", "connect", "network", "gateway", "frontend", "queue", "prefill", "decode"),
        ("request_id", "outcome", "missing", "negative"),
        ("start", "attempts", "trace_id", "failed_status"),
    ],
)
def test_a_table_of_some_columns_equals_those_of_the_whole_table(columns):
    """``timelines(columns=...)`` builds only what those columns are computed from."""
    events = with_legs(with_retries(generate(500, seed=6, clock_skew_s=30.0, error_rate=0.1), 6), 6)
    whole = tl.timelines(events.lazy()).collect()
    part = tl.timelines(events.lazy(), columns=columns).collect()
    assert part.columns == list(columns)
    key = [c for c in columns if c not in ("missing", "negative")]
    assert_frame_equal(part.sort(key, nulls_last=True), whole.select(columns).sort(key, nulls_last=True))
