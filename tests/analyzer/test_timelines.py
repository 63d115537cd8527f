"""timelines() — Polars expressions derived from the contract's stage table — against the golden
fixture (worked by hand) and against ``contract.compute_stages`` on generated logs."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hopline.analyzer.timelines import (
    ATTRIBUTE_COLUMNS,
    COLUMNS,
    INPUT_NAMES,
    RATIO_COLUMNS,
    STAGE_COLUMNS,
    names_where,
    timelines,
)
from hopline.middleware.contract import (
    STAGE_NAMES,
    compute_stages,
    negative_stages,
    request_inputs,
)
from hopline.middleware.contract.rules import SCOPE_SOURCES, describe_request
from support.golden import GOLDEN, golden_log
from support.synth import generate, with_retries
from support.tables import storage_frame

CASES = {c["name"]: c for c in GOLDEN["cases"]}


def frame(events: list[dict]) -> pl.LazyFrame:
    return storage_frame(events).lazy()


def requests_of(case):
    """Resolved request ID -> expected values: one request unless the case lists its ``requests``."""
    return case.get("requests") or {case["events"][0]["request_id"]: case}


SPEC_KEYS = sorted((name, rid) for name, c in CASES.items() for rid in requests_of(c))


@pytest.fixture(scope="module")
def golden_rows() -> dict[tuple[str, str], dict]:
    """Every case in one frame: real request IDs prefixed with the case name so cases cannot
    collide; trace stand-ins kept as they are (their trace is the case's own)."""
    events, stand_ins = golden_log()
    out = timelines(frame(events)).collect()
    assert out.columns == list(COLUMNS)
    assert out.height == len(SPEC_KEYS)
    return {
        (stand_ins[r["request_id"]], r["request_id"]) if r["request_id"] in stand_ins
        else tuple(r["request_id"].split(".", 1)): r
        for r in out.iter_rows(named=True)
    }


@pytest.mark.parametrize("name,rid", SPEC_KEYS)
def test_golden_case_through_polars(name, rid, golden_rows):
    spec, got = requests_of(CASES[name])[rid], golden_rows[name, rid]
    for stage, want in spec["expected"].items():
        if want is None:
            assert got[stage] is None, f"{name}: {stage} should be null, got {got[stage]}"
        else:
            assert got[stage] == pytest.approx(want, abs=GOLDEN["tolerance_s"]), f"{name}: {stage}"
    assert got["negative"] == spec["negative"]


@pytest.mark.parametrize("name,rid", SPEC_KEYS)
def test_golden_request_rules_through_polars(name, rid, golden_rows):
    """Outcome, scope and missing hops: the rule book's answers, worked by hand in the fixture."""
    spec, got = requests_of(CASES[name])[rid], golden_rows[name, rid]
    assert got["outcome"] == spec["outcome"]
    assert got["missing"] == spec["missing"]
    assert {k: got[k] for k in SCOPE_SOURCES} == {k: spec["scope"].get(k) for k in SCOPE_SOURCES}


def test_every_stage_is_a_column():
    assert set(STAGE_NAMES) <= set(COLUMNS)


@pytest.mark.parametrize("seed", [0, 1])
def test_timelines_match_the_contract_per_request(seed):
    """Every input, attribute, stage, ratio, outcome, scope and missing hop equals the contract's
    plain-Python evaluation on the same events, with skewed host clocks, shuffled order, errors,
    retries and duplicates."""
    events = with_retries(generate(400, seed=seed, clock_skew_s=30.0, error_rate=0.05), seed)
    got = {r["request_id"]: r for r in timelines(events.lazy()).collect().iter_rows(named=True)}
    by_request: dict[str, list[dict]] = {}
    for row in events.drop("attrs").iter_rows(named=True):
        by_request.setdefault(row["request_id"], []).append({k: v for k, v in row.items() if v is not None})
    assert set(got) == set(by_request)
    names = INPUT_NAMES + STAGE_COLUMNS + RATIO_COLUMNS
    for rid, evs in by_request.items():
        want, row = compute_stages(evs), got[rid]
        for name in names:
            if want[name] is None:
                assert row[name] is None, (rid, name)
            else:
                assert row[name] == pytest.approx(want[name], abs=1e-9), (rid, name)
        for name, column in ATTRIBUTE_COLUMNS.items():
            assert row[column] == request_inputs(evs)[name], (rid, name)
        assert row["negative"] == negative_stages(want)
        # the rule book (rules.describe_request) agrees request by request
        described = describe_request(evs)
        assert (row["outcome"], row["missing"]) == (described["outcome"], described["missing"]), rid
        assert {k: row[k] for k in SCOPE_SOURCES} == described["scope"], rid


def test_request_level_columns():
    events = generate(300, seed=4, error_rate=0.1)
    tl = timelines(events.lazy()).collect()
    assert tl.height == 300
    ok = tl.filter(pl.col("outcome") == "ok")
    failed = tl.filter(pl.col("outcome") == "error")
    assert ok.height + failed.height == 300 and failed.height > 10
    assert ok["missing"].list.len().sum() == 0 and failed["missing"].list.len().sum() == 0
    assert set(tl["replica"].unique()) == {"r1", "r2"}
    assert set(tl["service"].unique()) == {"kite-chat", "search-assist"}
    assert (tl["start"] == tl["client_sent"]).all()
    # the identity of DESIGN.md holds for every complete streaming request
    total = ok.select(
        pl.sum_horizontal("connect", "network", "gateway", "frontend", "queue", "prefill")
        - pl.col("client_ttft")
    )
    assert total.to_series().abs().max() < 1e-9


def test_missing_hops_and_outcomes():
    base = {"v": 1, "attempt": 0}
    events = [
        # the gateway reported, the engine did not finish: incomplete, engine last token missing
        {**base, "ts": 10.0, "request_id": "inc", "hop": "gateway.received", "stream": True},
        {**base, "ts": 10.1, "request_id": "inc", "hop": "gateway.forwarded", "upstream": "r1"},
        {**base, "ts": 10.2, "request_id": "inc", "hop": "engine.received", "stream": True, "replica": "r1"},
        {**base, "ts": 10.5, "request_id": "inc", "hop": "engine.first_token", "replica": "r1"},
        # rejected at the gateway
        {**base, "ts": 20.0, "request_id": "rej", "hop": "gateway.received"},
        {**base, "ts": 20.1, "request_id": "rej", "hop": "gateway.rejected", "status": 429},
        # the client went away
        {**base, "ts": 30.0, "request_id": "gone", "hop": "client.sent", "stream": True},
        {
            **base,
            "ts": 31.0,
            "request_id": "gone",
            "hop": "client.error",
            "status": 499,
            "error": "client disconnected",
        },
    ]
    tl = {r["request_id"]: r for r in timelines(frame(events)).collect().iter_rows(named=True)}
    assert tl["inc"]["outcome"] == "incomplete"
    assert tl["inc"]["missing"] == ["gateway.first_token", "engine.last_token", "gateway.last_token"]  # request order
    assert tl["inc"]["replica"] == "r1"
    assert tl["rej"]["outcome"] == "rejected" and tl["rej"]["missing"] == [] and tl["rej"]["status"] == 429
    assert tl["gone"]["outcome"] == "disconnected"


LOOP_LAG_COLUMNS = ("client_read_lag_s", "engine_loop_lag_s", "gateway_loop_lag_s", "loop_lag_s")


def test_loop_lag_columns_come_from_their_hops():
    """Each process's event loop lateness (``loop_lag_s``) as a column of its own: the client's when
    it read the first token, the gateway's and the engine's when their middleware got the request
    (of the final attempt: r1's busy loop failed over to r2); ``loop_lag_s`` stays the client's at
    ``client.sent``. A request without them has nulls."""
    base = {"v": 1, "attempt": 0}
    events = [
        {**base, "ts": 10.0, "request_id": "lag", "hop": "client.sent", "stream": True, "loop_lag_s": 0.003},
        {**base, "ts": 10.01, "request_id": "lag", "hop": "gateway.received", "loop_lag_s": 0.25},
        {**base, "ts": 10.27, "request_id": "lag", "hop": "gateway.forwarded", "upstream": "r1"},
        {**base, "ts": 10.28, "request_id": "lag", "hop": "engine.received", "replica": "r1", "loop_lag_s": 0.5},
        {**base, "ts": 10.3, "request_id": "lag", "hop": "engine.error", "replica": "r1", "status": 500},
        {**base, "ts": 10.31, "request_id": "lag", "hop": "gateway.forwarded", "attempt": 1, "upstream": "r2"},
        {**base, "ts": 10.32, "request_id": "lag", "hop": "engine.received", "attempt": 1, "replica": "r2",
         "loop_lag_s": 0.125},
        {**base, "ts": 10.6, "request_id": "lag", "hop": "engine.first_token", "attempt": 1, "replica": "r2"},
        {**base, "ts": 10.61, "request_id": "lag", "hop": "gateway.first_token", "attempt": 1},
        {**base, "ts": 10.9, "request_id": "lag", "hop": "client.first_token", "loop_lag_s": 0.0625},
        {**base, "ts": 20.0, "request_id": "none", "hop": "client.sent", "stream": True},
        {**base, "ts": 20.5, "request_id": "none", "hop": "client.first_token"},
    ]  # fmt: skip
    tl = {r["request_id"]: r for r in timelines(frame(events)).collect().iter_rows(named=True)}
    assert [tl["lag"][c] for c in LOOP_LAG_COLUMNS] == [0.0625, 0.125, 0.25, 0.003]
    assert [tl["none"][c] for c in LOOP_LAG_COLUMNS] == [None] * 4
    for rid in tl:  # the contract's plain-Python reading agrees
        inputs = request_inputs([e for e in events if e["request_id"] == rid])
        assert [inputs[c] for c in LOOP_LAG_COLUMNS] == [tl[rid][c] for c in LOOP_LAG_COLUMNS]


@pytest.mark.parametrize("flags", [1, 5, 32, 33, 70])
def test_names_where_lists_the_names_whose_flag_holds(flags):
    """``names_where`` (negative stages, missing hops: a bit mask per row, a list per distinct
    mask) gives each row the names of its true flags in order, null as false, across masks."""
    rng = np.random.default_rng(flags)
    values, true = [True, False, None], 0.5 / flags  # about 60% of the rows have no true flag
    frame = pl.DataFrame(
        {f"b{i}": pl.Series([values[j] for j in rng.choice(3, 400, p=[true, 0.9 - true, 0.1])], dtype=pl.Boolean)
         for i in range(flags)}  # fmt: skip
    )
    names = [f"n{i}" for i in range(flags)]
    expr = names_where([pl.col(f"b{i}") for i in range(flags)], names).alias("x")
    want = [[names[i] for i in range(flags) if row[f"b{i}"]] for row in frame.iter_rows(named=True)]
    assert frame.select(expr)["x"].to_list() == want
    assert any(want) and not all(want)
    assert frame.head(0).select(expr)["x"].to_list() == []
