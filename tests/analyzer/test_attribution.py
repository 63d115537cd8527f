"""Stage percentiles and shares, per scope and window, goodput and its culprit."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hopline.analyzer import attribution
from hopline.analyzer.attribution import Slo, auto_window, choose_window
from hopline.analyzer.timelines import timelines
from hopline.middleware.contract import TTFT_STAGES
from hopline.middleware.contract.units import parse_duration
from support.synth import StageShift, generate


@pytest.fixture(scope="module")
def tl() -> pl.DataFrame:
    incident = StageShift("queue", 4.0, at_s=0, scope={"replica": "r2"})
    return timelines(generate(3000, seed=41, incidents=[incident]).lazy()).collect()


def test_durations_and_windows():
    assert parse_duration("500ms") == 0.5
    assert parse_duration("2m") == 120.0
    assert parse_duration("1.5") == 1.5
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration("fast")
    assert auto_window(60) == 1.0  # a one-minute demo: seconds
    assert auto_window(3 * 3600) == 60.0  # hours of logs: a minute
    assert choose_window("10s", 5.0) == 10.0 and choose_window("auto", 60) == 1.0


def test_slo_parsing():
    assert Slo.parse("ttft=500ms, itl=50ms") == Slo(ttft=0.5, itl=0.05)
    for bad in ("ttft", "speed=1s", ""):
        with pytest.raises(ValueError):
            Slo.parse(bad)


def test_percentiles_match_numpy_linear(tl):
    row = attribution.stage_stats(tl.lazy()).collect().row(0, named=True)
    for stage in ("queue", "prefill", "client_ttft", "decode"):
        values = tl[stage].drop_nulls().to_numpy()
        for name, q in (("p50", 50), ("p90", 90), ("p99", 99)):
            assert row[f"{stage}:{name}_ms"] == pytest.approx(np.percentile(values, q) * 1e3, rel=1e-9)


def test_ttft_shares_add_up_for_complete_requests(tl):
    complete = tl.filter(pl.col("outcome") == "ok")
    table = attribution.stage_table(attribution.stage_stats(complete.lazy()).collect().row(0, named=True))
    # (a stage no request has, kv_transfer without disaggregated serving, is not in the table)
    assert "kv_transfer" not in table
    assert sum(table[s]["share_of_ttft"] for s in TTFT_STAGES if s in table) == pytest.approx(1.0, abs=1e-3)
    assert table["decode"]["share_of_ttft"] is None  # decode is after the first token
    assert table["decode"]["share_of_e2e"] > 0.9
    row = attribution.stage_stats(complete.lazy()).collect().row(0, named=True)
    assert attribution.dominant(table, row["split_requests"]) == "queue"


def test_shares_are_over_one_common_set_and_add_up_to_one():
    """A few requests without the engine split (only the `engine` stand-in) and a few without a
    first token must not inflate any share: the parts of every request with a complete split
    add up to its TTFT, so the shares over those requests add up to 100%."""
    full = generate(200, seed=11, error_rate=0.0)
    # drop the engine's stats for request 0..4: their queue/prefill/frontend become the stand-in
    no_split = full["request_id"].unique().sort()[:5].to_list()
    events = full.filter(~(pl.col("request_id").is_in(no_split) & (pl.col("hop") == "engine.stats")))
    tl = timelines(events.lazy()).collect()
    row = attribution.stage_stats(tl.lazy()).collect().row(0, named=True)
    table = attribution.stage_table(row)
    assert row["split_requests"] == 200
    assert table["engine"]["count"] == 5  # the stand-in is listed with its count
    shares = [v["share_of_ttft"] for s, v in table.items() if s in attribution.TTFT_PARTS]
    assert sum(shares) == pytest.approx(1.0, abs=1e-3)
    assert table["engine"]["share_of_ttft"] < 0.05  # 5 of 200 requests: it cannot be the headline


def test_a_handful_of_requests_decides_no_dominant_stage():
    tl = timelines(generate(attribution.MIN_SPLIT_REQUESTS - 1, seed=3, error_rate=0.0).lazy()).collect()
    row = attribution.stage_stats(tl.lazy()).collect().row(0, named=True)
    assert row["split_requests"] == attribution.MIN_SPLIT_REQUESTS - 1
    assert attribution.dominant(attribution.stage_table(row), row["split_requests"]) is None


def test_by_scope_names_the_dominant_stage_per_replica(tl):
    scopes = attribution.by_scope(tl.lazy())
    replicas = {r["scope"]["replica"]: r for r in scopes["replica"]}
    assert set(replicas) == {"r1", "r2"}
    assert replicas["r2"]["dominant"] == "queue"
    assert replicas["r1"]["stages"]["queue"]["p50_ms"] * 3 < replicas["r2"]["stages"]["queue"]["p50_ms"]
    assert sum(r["requests"] for r in scopes["service"]) == tl.height


def test_windowed_series(tl):
    series = attribution.windowed(tl.lazy(), 10.0, by="replica").collect()
    assert series["count"].sum() == tl.height
    assert series["window"].dtype == pl.Datetime("us", "UTC")
    first = series.filter(pl.col("window") == series["window"].min())
    assert set(first["replica"]) == {"r1", "r2"}
    assert (
        series.filter(pl.col("replica") == "r2")["queue:p50_ms"].median()
        > 2 * series.filter(pl.col("replica") == "r1")["queue:p50_ms"].median()
    )


def test_goodput_and_culprit(tl):
    slo = Slo(ttft=0.25, itl=0.05)
    good = attribution.goodput(tl.lazy(), slo)
    ttft = pl.coalesce("client_ttft", "gateway_ttft", "engine_ttft")
    expected = tl.filter((ttft <= 0.25) & (pl.col("client_itl").fill_null(0) <= 0.05)).height
    assert good["good"] == expected and good["requests"] == tl.height
    span = tl["start"].max() - tl["start"].min()
    assert good["goodput_rps"] == pytest.approx(expected / span, rel=1e-3)
    assert good["culprit"] == "queue"
    assert good["targets"] == {"ttft_ms": 250.0, "itl_ms": 50.0}


def _same_row(fast: dict, polars_row: dict) -> None:
    """``scope_stats``' row against ``stage_stats``' (Polars): counts and quantiles exactly, means
    and shares to the last bits (summed in another order); Polars' NaN / inf (0 / 0) is None."""
    for key, want in polars_row.items():
        got = fast[key]
        if isinstance(want, float) and not np.isfinite(want):
            assert got is None or not np.isfinite(got), key
        elif isinstance(want, float) and not key.endswith(("p50_ms", "p90_ms", "p99_ms")):
            assert got == pytest.approx(want, rel=1e-12), key
        else:
            assert got == want, key


def _same_as_polars(frame: pl.DataFrame, dims: tuple[str, ...]) -> dict[str, list[dict]]:
    overall, by = attribution.scope_stats(frame, dims)
    _same_row(overall, attribution.stage_stats(frame.lazy()).collect().row(0, named=True))
    for dim in dims:
        want = attribution.stage_stats(frame.lazy(), [dim]).filter(pl.col(dim).is_not_null()).sort(dim).collect()
        assert [row[dim] for row in by[dim]] == want[dim].to_list() and len(by[dim]) >= 1
        for fast, row in zip(by[dim], want.iter_rows(named=True), strict=True):
            _same_row(fast, row)
    return by


def test_scope_stats_equal_polars_stage_stats(tl, monkeypatch):
    """The report's numbers (numpy sorts and sums, cells of every scope at once) are
    ``stage_stats``' (Polars' group-by): overall and for every value of every scope; the same
    with each dimension alone (too many cells of all of them)."""
    frame = tl.with_columns(
        gateway_replica=pl.when(pl.col("replica") == "r1").then(pl.lit(None)).otherwise(pl.col("service"))
    )
    dims = ("replica", "service", "model", "gateway_replica")
    by = _same_as_polars(frame, dims)
    assert sum(r["count"] for r in by["gateway_replica"]) < frame.height  # r1's requests have none
    monkeypatch.setattr(attribution, "MAX_CELLS", 1)
    _same_as_polars(frame, dims)


def test_scope_stats_leave_a_nan_to_polars(tl):
    """A NaN stage (its place among equal values is the sort's): Polars' own group-by."""
    dims = ("replica", "service")
    nan = tl.with_columns(pl.when(pl.col("replica") == "r2").then(float("nan")).otherwise(pl.col("queue")).alias("queue"))
    overall, by = attribution.scope_stats(nan, dims)
    _same_row(overall, attribution.stage_stats(nan.lazy()).collect().row(0, named=True))
    assert np.isnan(overall["queue:mean_ms"])
    r2 = by["replica"][1]
    assert r2["replica"] == "r2" and np.isnan(r2["queue:p50_ms"])  # as Polars has it
