"""The order of the findings (``rank.decide``): the largest cost to users first among what the
serving side and its callers did, then the changes of the traffic (``MixChange``), then the
calling process's own lateness, whichever way it moved; and what a pitfall brings with it."""

from __future__ import annotations

from hopline.analyzer.findings.detector import Context
from hopline.analyzer.findings.model import MixChange, Shift, pitfall
from hopline.analyzer.findings.new_connection_per_request import NewConnectionPerRequest
from hopline.analyzer.findings.rank import decide, find
from hopline.analyzer.timelines import timelines
from support.scenarios import generate
from support.synth import ColdConnections
from support.synth import generate as synth


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


def test_a_change_of_the_traffic_comes_after_what_was_done_wrong_and_before_the_callers_own():
    """A mix change (bigger requests: nothing to fix, and the live path pages none) costing users
    far more seconds than a queue rise and a pitfall comes after both, and before the caller's
    own lateness."""
    frame = timelines(generate(duration_s=120.0, rate=20.0, seed=3).events.lazy()).collect()
    queue = _shift("queue", 20.0, 90.0, 200.0, {"replica": "r2"})
    at = float(frame["start"].min()) + 60.0
    mix = MixChange(**{**_shift("prefill", 30.0, 170.0, 900.0, {"replica": "r2"}).__dict__, "kind": "mix_change", "at": at})
    cold = pitfall("new_connection_per_request", {"service": "s"}, 60, {}, "s opens connections", 50.0, "connect")
    callers = _shift("client_delay", 190.0, 800.0, 600.0, {})
    found = decide([callers, mix, cold, queue], frame, Context(window_s=5.0, scopes=("replica",)))
    ranked = [f.stage if f.kind != "pitfall" else f.name for f in found.findings]
    assert ranked == ["queue", "new_connection_per_request", "prefill", "client_delay"], ranked


def test_a_client_that_began_opening_connections_keeps_its_connect_rise():
    """kite-chat drops its shared HTTP client at 150 s: the connect rise is its own change (it
    opened none before), said as the shift with the pitfall in it, not folded into the pitfall
    as traffic that moved (``NewConnectionPerRequest.brought``)."""
    events = synth(duration_s=300, rate=10, seed=3, incidents=[ColdConnections("kite-chat", at_s=150.0)])
    frame = timelines(events.lazy()).collect()
    ctx = Context(window_s=10.0, scopes=("replica", "service", "model"))
    found = find(frame, ctx).findings
    said = [f.sentence for f in found]
    (first,) = found
    assert (first.kind, first.stage, first.scope) == ("shift", "connect", {"service": "kite-chat"}), said
    assert [p.name for p in first.with_pitfalls] == ["new_connection_per_request"], said
    assert NewConnectionPerRequest().brought(first, frame, ctx) is None
