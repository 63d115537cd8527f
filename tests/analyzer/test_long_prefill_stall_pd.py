"""long_prefill_stall (issue 33): a long prefill stalls only the decodes of the instance where it
ran (P/D: its prefill instance, never the decode instance named by ``replica``), and only gaps that
begin as long prefills begin more often than chance make a finding."""

from __future__ import annotations

import polars as pl
import pytest
from hopline.analyzer.findings import Context
from hopline.analyzer.findings.long_prefill_stall import LongPrefillStall, decode_gaps, long_prefills
from hopline.analyzer.timelines import timelines
from support.modern import pd_stall_log, with_output_gaps
from support.scenarios import generate as production
from support.synth import LongPrompts, generate

CTX = Context(window_s=10.0)
DETECTOR = LongPrefillStall()


def tl_of(events: pl.DataFrame) -> pl.DataFrame:
    return timelines(events.lazy()).collect()


@pytest.mark.parametrize("seed", range(10))
def test_healthy_production_shaped_logs_give_no_stall(seed):
    """Three services, two models, four replicas, heavy-tailed prompts (a long prefill every few
    seconds) and 4% of streams with a hiccup of 0.2 s or more, at random: the detector before
    issue 33 named a stall on 10 of these 10 logs (minor findings, 1-6 requests a replica)."""
    tl = tl_of(with_output_gaps(production(seed=seed).events, seed))
    long, gaps = long_prefills(tl, DETECTOR), decode_gaps(tl)
    # by chance, some hiccups do fall during a long prefill, long enough to pass for its stall
    assert DETECTOR._stalled(gaps, long).height > 0
    assert DETECTOR.detect(tl, CTX) == []


@pytest.mark.parametrize("seed", range(3))
def test_long_prompts_prefilled_on_a_prefill_instance_stall_no_decode_instance(seed):
    """40 prompts of 32,000 tokens prefilled for ~1 s on p1, decoded on d1 and d2 (hiccups on 10%
    of the streams): the detector before issue 33 named d1 or d2 on each of these seeds (it put
    the prefill on the decode instance, the prefill's length before that one's first token)."""
    tl = tl_of(pd_stall_log(seed, long_on="p1", count=40, long_prefill_s=1.0, hiccup_share=0.1))
    long = long_prefills(tl, DETECTOR)
    assert long["replica"].unique().to_list() == ["p1"] and long.height == 40
    # on p1's own clock: its prefill ended with its (one-token) answer
    ran = tl.select(long_id="request_id", pd_end="prefill_last")
    assert long.join(ran, on="long_id").select((pl.col("end") == pl.col("pd_end")).all()).item()
    assert DETECTOR.detect(tl, CTX) == []


@pytest.mark.parametrize("seed", range(2))
def test_a_long_prompt_prefilled_on_a_decode_instance_stalls_it(seed):
    """The proxy sends 12 long prompts to d1 alone (no prefill leg): d1 prefills them for ~2 s
    and every stream it decodes meanwhile stalls. The finding names d1 and exactly those streams."""
    tl = tl_of(pd_stall_log(seed, long_on="d1", count=12, long_prefill_s=2.0))
    (f,) = DETECTOR.detect(tl, CTX)
    assert f.scope == {"replica": "d1"}
    long = tl.filter(pl.col("prompt_tokens") == 32_000)
    begins = (long["engine_first"] - long["prefill"]).to_list()
    # every stream d1 was decoding as one began (a long prompt too: its own decode began after)
    truth = tl.filter(pl.col("replica") == "d1").filter(
        pl.any_horizontal([(pl.col("engine_first") < b) & (pl.col("engine_last") > b) for b in begins])
    )
    assert f.affected_requests == truth.height > 20
    assert f.evidence["aligned_with_prefill_begin"] > 10 * f.evidence["aligned_by_chance"]


def test_long_prompts_on_one_replica_of_a_unified_log_are_its_stall():
    tl = tl_of(generate(5000, seed=7, incidents=[LongPrompts("r2", count=3)], clock_skew_s=5.0))
    (f,) = DETECTOR.detect(tl, CTX)
    assert f.scope == {"replica": "r2"}
    assert f.evidence["long_prompts"] == 3 and f.evidence["prompt_tokens_max"] == 32_000
    assert f.affected_requests > 10
