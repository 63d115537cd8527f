"""Findings of modern serving (issue 25) on logs whose truth is known (``support.modern``): a slow
KV transfer named by its prefill/decode pair, a prefix-cache miss named as the cause of a prefill
rise, reasoning and content time side by side, speculative decoding's acceptance length moving
with a decode shift. Each scenario runs on the first seeds; none was chosen."""

from __future__ import annotations

import polars as pl
import pytest
from hopline.analyzer.findings.detector import Context
from hopline.analyzer.findings.model import Pitfall, Shift
from hopline.analyzer.findings.prefix_cache_miss import PrefixCacheMiss
from hopline.analyzer.findings.rank import find
from hopline.analyzer.pipeline import analysis
from hopline.analyzer.timelines import timelines
from support.modern import INCIDENT_S, START, cache_log, pd_log, reasoning_log

WINDOW_S = 10.0


def frame_of(events: pl.DataFrame) -> pl.DataFrame:
    return timelines(events.lazy()).collect()


def top_level(frame: pl.DataFrame, scopes=("replica", "service", "model", "prefill_replica")):
    return find(frame, Context(window_s=WINDOW_S, scopes=scopes)).findings


@pytest.mark.parametrize("seed", [1, 2])
def test_a_slow_kv_transfer_is_named_by_its_pair_and_the_other_stages_stay(seed):
    """From 10:05 the decode side of p1 → d2 waits 5× longer for the KV (its kv_transfer: that
    wait plus one forward, p50 20 → ~80 ms); every other pair, and prefill and decode, unchanged.
    The prefill leg is engine time, so no user-vs-engine gap is reported."""
    found = top_level(frame_of(pd_log(seed)))
    assert [f.kind for f in found] == ["shift"], [f.sentence for f in found]
    shift = found[0]
    assert isinstance(shift, Shift) and shift.stage == "kv_transfer" and shift.up
    assert shift.scope == {"replica": "d2", "prefill_replica": "p1"}
    assert abs(shift.at - (START + INCIDENT_S)) <= WINDOW_S
    assert 3.0 <= shift.factor <= 5.0  # 15 ms x 5 + 5 ms over 15 + 5 ms
    assert " between p1 and d2 " in shift.sentence
    assert "prefill and decode unchanged" in shift.sentence


def test_the_kv_transfer_of_every_request_closes_its_ttft():
    """Per request, the P/D stages add up to the client's TTFT (the contract's identity), and the
    kv_transfer is the decode instance's queue + prefill (what the generator drew)."""
    frame = frame_of(pd_log(3, rate=1.0))
    parts = ["client_delay", "connect", "network", "gateway", "frontend", "queue", "prefill", "kv_transfer"]
    gap = frame.select((pl.sum_horizontal(parts) - pl.col("client_ttft")).abs().max()).item()
    assert gap < 1e-6
    assert frame["kv_transfer"].null_count() == 0 and frame["engine"].null_count() == frame.height
    assert set(frame["prefill_replica"].unique()) == {"p1", "p2"} and set(frame["decode_replica"].unique()) == {"d1", "d2"}


@pytest.mark.parametrize("seed", [1, 2])
def test_a_prefix_cache_miss_is_named_as_the_cause_of_the_prefill_rise(seed):
    """r2's hits fall from ~78% to ~6% at 10:05 while r1's and r3's rise (the sharing traffic
    moved): one pitfall naming the fall and the routing, which holds r2's prefill rise."""
    found = top_level(frame_of(cache_log(seed)))
    miss, *others = found
    # what else may be said is true of the log: r1's and r3's prefills got faster as their hits rose
    assert all(isinstance(f, Shift) and f.stage == "prefill" and not f.up and f.scope["replica"] in ("r1", "r3") for f in others)
    assert isinstance(miss, Pitfall) and miss.name == "prefix_cache_miss" and miss.scope == {"replica": "r2"}
    assert abs(miss.at - (START + INCIDENT_S)) <= WINDOW_S
    assert miss.evidence["hit_share_before"] == pytest.approx(0.78, abs=0.02)
    assert miss.evidence["hit_share_after"] == pytest.approx(0.06, abs=0.02)
    assert miss.evidence["others_hit_share_after"] > miss.evidence["others_hit_share_before"]
    assert "requests that used to land on r2 now land elsewhere" in miss.sentence
    # the cache saved 1,560 tokens x 0.09 ms before, 120 x 0.09 ms after
    assert miss.evidence["prefill_saved_ms_before"] == pytest.approx(140, rel=0.1)
    assert miss.evidence["prefill_saved_ms_after"] == pytest.approx(11, rel=0.25)
    (rise,) = miss.with_shifts
    assert rise.stage == "prefill" and rise.scope == {"replica": "r2"} and rise.factor > 3


def test_a_cache_miss_on_every_replica_is_one_finding_for_all_traffic():
    """The same fall on each replica at once: the prompts stopped sharing a prefix."""
    events = cache_log(4)
    frame = frame_of(events)
    after = pl.col("start") >= START + INCIDENT_S
    frame = frame.with_columns(cached_tokens=pl.when(after).then(pl.col("prompt_tokens") // 20).otherwise(pl.col("prompt_tokens") * 7 // 10))
    (miss,) = PrefixCacheMiss().detect(frame, Context(window_s=WINDOW_S))
    assert miss.scope == {} and "on every replica" in miss.sentence and "no longer share their prefix" in miss.sentence
    assert (miss.evidence["hit_share_before"], miss.evidence["hit_share_after"]) == (pytest.approx(0.7), pytest.approx(0.05))


def test_steady_cache_hits_are_no_finding():
    frame = frame_of(cache_log(5)).filter(pl.col("start") < START + INCIDENT_S)
    assert PrefixCacheMiss().detect(frame, Context(window_s=WINDOW_S)) == []


def test_reasoning_and_content_time_in_the_ttft_table_and_acceptance_length_with_a_decode_shift():
    """A reasoning model: TTFT counts the first reasoning token (~70 ms), the first content comes
    ~1.2 s later; r1's acceptance length halves at 10:05 and its decode doubles."""
    result = analysis(frame_of(reasoning_log(1)), window="10s")
    stages = result.facts.stages
    assert stages["client_ttft"]["p50_ms"] < 100
    assert stages["reasoning"]["p50_ms"] == pytest.approx(1200, rel=0.05)
    assert stages["client_content_ttft"]["p50_ms"] == pytest.approx(stages["client_ttft"]["p50_ms"] + 1200, rel=0.05)
    (shift,) = [f for f in result.findings.findings if isinstance(f, Shift)]
    assert shift.stage == "decode" and shift.scope == {"replica": "r1"}
    assert "acceptance length on r1 3.0 tokens → 1.5 tokens" in shift.sentence



def test_on_the_only_replica_a_miss_is_all_traffics_and_names_no_routing():
    """r2 alone (the log's other replicas taken out): no request can have moved elsewhere, so the
    miss is all traffic's, says the prompts changed, and holds the prefill rise of all traffic
    (found by the real prefix-cache test on one vLLM: it named a routing cause and a separate rise)."""
    frame = frame_of(cache_log(1)).filter(pl.col("replica") == "r2")
    miss, *rest = top_level(frame)
    assert isinstance(miss, Pitfall) and miss.name == "prefix_cache_miss" and miss.scope == {}
    assert "land elsewhere" not in miss.sentence and "which served all traffic" in miss.sentence
    assert "no longer share their prefix" in miss.sentence
    assert [(s.stage, s.scope) for s in miss.with_shifts] == [("prefill", {})]
    assert not any(isinstance(f, Shift) and f.stage == "prefill" for f in rest)


def test_when_the_other_replicas_hits_hold_the_miss_names_no_routing():
    """r2 falls while the others' hit shares stay where they were: nothing says the requests moved."""
    frame = frame_of(cache_log(2))
    held = pl.col("replica") != "r2"
    frame = frame.with_columns(
        cached_tokens=pl.when(held).then(pl.col("prompt_tokens") * 4 // 10).otherwise(pl.col("cached_tokens"))
    )
    (miss,) = PrefixCacheMiss().detect(frame, Context(window_s=WINDOW_S))
    assert miss.scope == {"replica": "r2"} and "land elsewhere" not in miss.sentence
    assert "the other replicas' hits held (40% → 40%)" in miss.sentence
