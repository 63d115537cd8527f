"""Every pitfall triggered by the incident that causes it, and silent on a healthy log."""

from __future__ import annotations

import polars as pl
import pytest
from hopline.analyzer.findings import REGISTRY, Context, detect_all, find
from hopline.analyzer.findings.long_prefill_stall import LongPrefillStall, queued_behind_long_prefills
from hopline.analyzer.findings.new_connection_per_request import NewConnectionPerRequest
from hopline.analyzer.findings.no_max_tokens import NoMaxTokens as NoMaxTokensCheck
from hopline.analyzer.findings.user_vs_engine_gap import UserVsEngineGap
from hopline.analyzer.findings.verbose_outputs import VerboseOutputs
from hopline.analyzer.timelines import timelines
from support.synth import (
    ColdConnections,
    LongPrompts,
    NoMaxTokens,
    StageShift,
    VerboseService,
    generate,
)

N = 5000


def tl_for(*incidents, seed: int = 31, **kw) -> pl.DataFrame:
    return timelines(generate(N, seed=seed, incidents=list(incidents), **kw).lazy()).collect()


@pytest.fixture(scope="module")
def healthy() -> pl.DataFrame:
    return tl_for()


PITFALLS = tuple(d for d in REGISTRY if d.kind == "pitfall")


def run(detector, tl: pl.DataFrame, kv_bytes_per_token: int | None = None) -> list[dict]:
    """``detector``'s findings on ``tl`` as the JSON says them ([] when it cannot run on it)."""
    ctx = Context(window_s=10.0, kv_bytes_per_token=kv_bytes_per_token)
    return [f.to_json() for f in detector.detect(tl, ctx)] if detector.runs_on(tl) else []


@pytest.mark.parametrize("check", PITFALLS, ids=lambda d: d.name)
def test_not_triggered_on_a_healthy_log(check, healthy):
    assert run(check, healthy) == []


def test_healthy_logs_from_other_seeds_have_no_pitfalls():
    for seed in (1001, 1002, 1003):
        assert detect_all(tl_for(seed=seed, clock_skew_s=20.0), Context(window_s=10.0), PITFALLS) == []


def test_user_vs_engine_gap_names_the_network_of_one_service():
    tl = tl_for(StageShift("network", 25.0, at_s=0, scope={"service": "search-assist"}))
    (f,) = run(UserVsEngineGap(), tl)
    assert (f["kind"], f["name"], f["scope"]) == (
        "pitfall",
        "user_vs_engine_gap",
        {"service": "search-assist"},
    )
    ev = f["evidence"]
    assert ev["main"] == "network" and ev["network_share_of_gap"] > 0.9
    assert ev["client_ttft_p50_ms"] > 1.5 * ev["engine_ttft_p50_ms"]
    assert (
        f["affected_requests"]
        == tl.filter(pl.col("service") == "search-assist", pl.col("engine_ttft").is_not_null()).height
    )
    assert "network takes" in f["summary"]


def test_user_vs_engine_gap_costs_only_the_gap_beyond_the_acceptable_one():
    """Its ``impact_s`` is the users' time past ``gap_min_ms`` per request: the normal network of a
    deployment is no incident, and counted whole it outranked real ones on a busy machine."""
    tl = tl_for(StageShift("network", 25.0, at_s=0, scope={"service": "search-assist"}))
    (f,) = run(UserVsEngineGap(), tl)
    mine = tl.filter(pl.col("service") == "search-assist", pl.col("engine_ttft").is_not_null())
    gap = mine["client_ttft"] - mine["engine_ttft"]
    floor = UserVsEngineGap().gap_min_ms / 1e3
    assert f["impact_s"] == pytest.approx((gap - floor).clip(lower_bound=0).sum(), abs=1e-3)
    assert 0 < f["impact_s"] < gap.sum() - 0.5 * floor * mine.height


def test_user_vs_engine_gap_everywhere_is_scope_all():
    tl = tl_for(StageShift("gateway", 60.0, at_s=0))
    (f,) = run(UserVsEngineGap(), tl)
    assert f["scope"] == {} and f["evidence"]["main"] == "gateway"


def test_new_connection_per_request():
    tl = tl_for(ColdConnections("kite-chat"))
    (f,) = run(NewConnectionPerRequest(), tl)
    assert f["scope"] == {"service": "kite-chat"}
    assert f["evidence"]["new_connection_share"] == 1.0
    assert f["affected_requests"] == tl.filter(pl.col("service") == "kite-chat").height
    # connect + TLS: 12 + 30 ms medians in the generator
    assert 30 < f["evidence"]["connect_p50_ms"] < 60


def test_long_prefill_stall_matches_the_requests_that_were_decoding():
    # engine clocks 40 s off: the match uses only the engine's own timestamps
    tl = tl_for(LongPrompts("r1", count=3), clock_skew_s=40.0)
    (f,) = run(LongPrefillStall(), tl)
    assert f["scope"] == {"replica": "r1"}
    ev = f["evidence"]
    assert ev["long_prompts"] == 3 and ev["prompt_tokens_max"] == 32_000
    # ground truth: requests on r1 whose decode spanned the start of a long prefill
    long = tl.filter(pl.col("prompt_tokens") == 32_000)
    begins = (long["engine_first"] - long["prefill"]).to_list()
    others = tl.filter((pl.col("replica") == "r1") & (pl.col("prompt_tokens") != 32_000))
    truth = others.filter(
        pl.any_horizontal([(pl.col("engine_first") < b) & (pl.col("engine_last") > b) for b in begins])
    )
    assert f["affected_requests"] == truth.height > 10
    assert ev["stall_gap_p50_ms"] > 1000


def test_long_prompts_with_chunked_prefill_do_not_stall():
    """Long prompts alone (no overlapping output gap) are not the pitfall."""
    tl = tl_for(LongPrompts("r1", count=3)).with_columns(engine_max_gap_s=pl.col("client_itl") * 2)
    assert run(LongPrefillStall(), tl) == []


def test_no_max_tokens_with_kv_memory():
    tl = tl_for(NoMaxTokens("kite-chat", share=0.3))
    (f,) = run(NoMaxTokensCheck(), tl, kv_bytes_per_token=131_072)
    assert f["scope"] == {"service": "kite-chat"}
    ev = f["evidence"]
    assert ev["ran_long"] == f["affected_requests"] > 50
    assert ev["output_tokens_p50"] > ev["capped_output_tokens_p90"]
    assert ev["kv_gb_seconds"] == pytest.approx(ev["kv_token_seconds"] * 131_072 / 1e9, rel=1e-3)
    # without a model description the finding stands, without the KV bytes
    (plain,) = run(NoMaxTokensCheck(), tl)
    assert "kv_gb_seconds" not in plain["evidence"]


def test_verbose_outputs_ignore_a_service_that_answers_longer_all_along():
    """search-assist's answers are 3x kite-chat's on one model for the whole log: a difference
    between callers, not a template that changed."""
    tl = tl_for(VerboseService("search-assist", factor=3.0))
    p50 = dict(tl.group_by("service").agg(pl.col("output_tokens").median()).iter_rows())
    assert p50["search-assist"] > 2.5 * p50["kite-chat"]  # the old rule (2x the others) fired here
    assert run(VerboseOutputs(), tl) == []


def test_decided_pitfalls_are_ordered_by_impact():
    tl = tl_for(ColdConnections("kite-chat"), NoMaxTokens("search-assist"))
    decided = find(tl, Context(window_s=10.0), PITFALLS)
    names = [f.name for f in decided.findings + decided.minor]
    assert {"new_connection_per_request", "no_max_tokens"} <= set(names)
    for found in (decided.findings, decided.minor):
        assert [f.cost_s for f in found] == sorted((f.cost_s for f in found), reverse=True)


def test_queued_behind_long_prefills_counts_the_union_of_the_prefills_on_the_requests_replica():
    # r1's long prefills: [10, 11] and [10.5, 11.5] (one batch: their union, [10, 11.5]), [13, 14];
    # r2's: [10, 20]
    long = pl.DataFrame(
        {"replica": ["r1", "r1", "r1", "r2"], "begin": [10.0, 10.5, 13.0, 10.0], "end": [11.0, 11.5, 14.0, 20.0]}
    )
    waits = [("r1", 9.5, 12.0), ("r1", 11.2, 13.5), ("r1", 15.0, 16.0), ("r2", 9.0, 11.0), ("r1", 10.2, 10.4)]
    tl = pl.DataFrame(
        {
            "request_id": [f"q{i}" for i in range(len(waits))],
            "replica": [w[0] for w in waits],
            "queue": [w[2] - w[1] for w in waits],
            "prefill": [0.1] * len(waits),
            "engine_first": [w[2] + 0.1 for w in waits],  # the queue ends where its prefill begins
        }
    )
    got = queued_behind_long_prefills(tl, long)
    assert got["replica"].to_list() == [w[0] for w in waits]
    assert got["behind"].to_list() == pytest.approx([1.5, 0.3 + 0.5, 0.0, 1.0, 0.2])
    assert got["queue"].to_list() == pytest.approx([w[2] - w[1] for w in waits])
    assert queued_behind_long_prefills(tl, long.clear())["behind"].to_list() == [0.0] * len(waits)
