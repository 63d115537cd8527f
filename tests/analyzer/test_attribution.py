"""Stage percentiles and shares, per scope and window, goodput and its culprit."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hopline.analyzer import attribution
from hopline.analyzer.attribution import Slo, auto_window, choose_window
from hopline.analyzer.timelines import timelines
from hopline.middleware.contract import TTFT_STAGES
from hopline.middleware.durations import parse_duration
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
    assert sum(table[s]["share_of_ttft"] for s in TTFT_STAGES) == pytest.approx(1.0, abs=1e-3)
    assert table["decode"]["share_of_ttft"] is None  # decode is after the first token
    assert table["decode"]["share_of_e2e"] > 0.9
    assert attribution.dominant(table) == "queue"


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
