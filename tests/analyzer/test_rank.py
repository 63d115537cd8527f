"""The order of the findings (``rank.decide``): the largest cost to users first, except that the
calling process's own lateness comes after what the serving side did, whichever way it moved."""

from __future__ import annotations

from hopline.analyzer.findings.detector import Context
from hopline.analyzer.findings.model import Shift
from hopline.analyzer.findings.rank import decide
from hopline.analyzer.timelines import timelines
from support.scenarios import generate


def _shift(stage: str, before_ms: float, after_ms: float, impact_s: float, scope: dict[str, str]) -> Shift:
    return Shift(
        summary=f"{stage} moved",
        stage=stage,
        at="2026-12-05T10:05:00Z",
        scope=scope,
        statistic="p50",
        before_ms=before_ms,
        after_ms=after_ms,
        factor=after_ms / before_ms,
        z=9.0,
        affected_requests=500,
        impact_s=impact_s,
    )


def test_a_fall_of_the_callers_own_delay_comes_after_what_the_serving_did():
    """A load generator busy at first and on time later: its client-side delay fell, by more
    users' seconds than the queue on r2 rose. The queue is what the serving did; the fall is
    the caller's own (so is a rise of it, which came last already)."""
    frame = timelines(generate(duration_s=120.0, rate=20.0, seed=3).events.lazy()).collect()
    queue = _shift("queue", 20.0, 90.0, 200.0, {"replica": "r2"})
    fell = _shift("client_delay", 800.0, 190.0, -600.0, {})
    rose = _shift("client_delay", 190.0, 800.0, 600.0, {})
    for callers in (fell, rose):
        found = decide([callers, queue], frame, Context(window_s=5.0, scopes=("replica",)))
        ranked = found.findings
        assert [f.stage for f in ranked] == ["queue", "client_delay"], (callers.factor, ranked)
