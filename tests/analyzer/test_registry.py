"""The detector registry: what a detector declares decides when it runs, a new detector is one class
and one registration, and a relation between findings is a field (the findings stay as their
detectors said them)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import polars as pl
import pytest
from hopline.analyzer.findings import REGISTRY, Context, Detector, Pitfall, Shift, detect_all, find
from hopline.analyzer.findings.model import pitfall, validate
from hopline.analyzer.findings.new_connection_per_request import NewConnectionPerRequest
from hopline.analyzer.timelines import timelines
from support.synth import ColdConnections, LongPrompts, StageShift, generate


@pytest.fixture(scope="module")
def cold() -> pl.DataFrame:
    """300 s of traffic whose search-assist clients open a connection per request (~42 ms)."""
    return timelines(generate(duration_s=300, seed=6, incidents=[ColdConnections("search-assist")]).lazy()).collect()


def test_every_detector_is_registered_once_with_what_it_reads():
    names = [d.name for d in REGISTRY]
    assert len(names) == len(set(names)) == 8
    assert [d.kind for d in REGISTRY] == ["shift"] + ["pitfall"] * 7
    assert all(d.needs and d.min_requests >= 1 for d in REGISTRY)


def test_a_detector_is_skipped_without_the_columns_it_needs(cold):
    ctx = Context(window_s=10.0)
    detector = NewConnectionPerRequest()
    assert detector.runs_on(cold) and [f.name for f in detector.detect(cold, ctx)] == ["new_connection_per_request"]
    unknown = cold.with_columns(conn_reused=pl.lit(None, dtype=pl.Boolean))  # a client that does not say
    assert not detector.runs_on(unknown)
    assert not detector.runs_on(cold.drop("conn_reused"))
    assert "new_connection_per_request" not in [f.name for f in detect_all(unknown, ctx) if isinstance(f, Pitfall)]
    assert not detector.runs_on(cold.head(detector.min_requests - 1))  # too few requests to judge


@dataclass(frozen=True)
class SlowGateway(Detector):
    """A detector written the way a new one is: its name, what it reads, its threshold, its words."""

    name = "slow_gateway"
    kind = "pitfall"
    needs = ("gateway",)
    p50_ms: float = 1.0

    def detect(self, frame: pl.DataFrame, ctx: Context) -> list[Pitfall]:
        p50 = frame["gateway"].median()
        if p50 is None or p50 * 1e3 < self.p50_ms:
            return []
        words = f"the gateway takes {p50 * 1e3:.0f} ms (p50) of every request"
        return [pitfall(self.name, {}, frame.height, {"gateway_p50_ms": p50 * 1e3}, words,
                        frame["gateway"].sum(), "gateway")]  # fmt: skip


def test_a_new_detector_is_one_class_and_one_registration(cold):
    decided = find(cold, Context(window_s=10.0), (*REGISTRY, SlowGateway()))
    (mine,) = [f for f in decided.findings + decided.minor if isinstance(f, Pitfall) and f.name == "slow_gateway"]
    assert mine.share_of_users_time is not None and mine.share_of_users_time > 0  # ranked like the others
    assert mine.sentence.startswith("the gateway takes")
    as_json = decided.to_json()
    assert validate(as_json).findings == decided.findings  # the JSON reads back into the same values
    without = find(cold, Context(window_s=10.0))
    assert "slow_gateway" not in [getattr(f, "name", None) for f in without.findings + without.minor]


def test_the_same_window_gives_the_same_findings_each_time(cold):
    """What live detection does: the registry run again and again on a window of finished requests."""
    window = cold.filter(pl.col("start") < cold["start"].min() + 120)
    ctx = Context(window_s=5.0)
    assert detect_all(window, ctx) == detect_all(window, ctx)
    assert find(window, ctx) == find(window, ctx)


def test_a_rise_brought_by_a_pitfall_is_a_field_and_neither_summary_is_edited():
    """r1's long prefills hold its queue (as in test_report): the queue rise lands in the stall's
    ``with_shifts``; the stall's own ``summary`` stays its detector's, its ``sentence`` says both."""
    stall = LongPrompts("r1", 80, prompt_tokens=14_000, after=0.4, queue_behind=True)
    frame = timelines(generate(duration_s=300, seed=8, incidents=[stall]).lazy()).collect()
    ctx = Context(window_s=5.0)
    found = detect_all(frame, ctx)
    (own,) = [f for f in found if isinstance(f, Pitfall) and f.name == "long_prefill_stall"]
    assert own.with_shifts == () and "(queue shift)" not in own.summary
    first = find(frame, ctx).findings[0]
    assert isinstance(first, Pitfall) and first.name == "long_prefill_stall"
    assert first.summary == own.summary and first.impact_s == own.impact_s  # as the detector said it
    rises = [s for s in first.with_shifts if s.stage == "queue"]
    assert rises and all(isinstance(s, Shift) and s.up for s in rises)
    assert first.sentence.startswith(own.summary + "; with it, ") and "(queue shift)" in first.sentence
    assert first.cost_s == pytest.approx(own.impact_s + sum(s.cost_s for s in first.with_shifts), abs=1e-3)
    assert replace(first, with_shifts=()).sentence == own.summary


def test_a_shift_detector_finds_a_rise_on_its_own():
    frame = timelines(
        generate(duration_s=300, seed=5, incidents=[StageShift("queue", 3.0, at_s=150, scope={"replica": "r2"})])
        .lazy()
    ).collect()
    (shifts,) = [d for d in REGISTRY if d.kind == "shift"]
    found = shifts.detect(frame, Context(window_s=5.0))
    assert [(s.stage, s.scope) for s in found][:1] == [("queue", {"replica": "r2"})]
    assert found[0].factor == pytest.approx(3.0, rel=0.25) and found[0].share_of_users_time is None  # undecided
