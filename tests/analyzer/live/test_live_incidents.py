"""The incident book: which findings open, update, resolve an incident, and which never re-fire.

The findings are real: ``findings_now`` on a generated log (two replicas at 20 requests/s,
queue x3 on r2 from 2:30, no end); the tests move their times to state each rule.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hopline.analyzer.live.detect import findings_now
from hopline.analyzer.live.incidents import IncidentBook, fingerprint
from hopline.analyzer.findings.model import iso_utc
from hopline.analyzer.timelines import timelines
from hopline.middleware.contract.units import to_epoch
from support.synth import DEFAULT_START, StageShift, generate

ONSET = DEFAULT_START + 150


@pytest.fixture(scope="module")
def seen():
    events = generate(
        duration_s=300,
        rate=20,
        seed=11,
        incidents=[StageShift("queue", 3.0, at_s=150, scope={"replica": "r2"})],
    )
    frame = timelines(events.lazy()).collect()
    (finding,) = [
        f for f in findings_now(frame, 10.0, ("replica", "model", "service")) if f.kind == "shift" and f.stage == "queue"
    ]
    assert (finding.scope, finding.at, finding.until) == ({"replica": "r2"}, ONSET, None)
    return frame, finding


def book() -> IncidentBook:
    return IncidentBook(window_s=10.0, horizon_s=600.0, recent_s=60.0)


def test_a_recent_onset_opens_one_incident_that_later_steps_update(seen):
    frame, finding = seen
    b = book()
    (opened,) = b.step(ONSET + 20, [finding], frame)
    assert opened.state == "firing" and opened.key == ("HoplineShift", "queue", (("replica", "r2"),), "up")
    assert opened.severity == "critical" and opened.share > 0.05  # ~2 x 40 ms more on half the requests
    assert opened.examples and all(r.startswith("s11-") for r in opened.examples)
    assert b.step(ONSET + 30, [finding], frame) == []  # the same sentence: nothing to send
    assert len(b.firing()) == 1 and b.firing()[0].last_seen == ONSET + 30


def test_an_old_onset_in_the_horizon_never_fires(seen):
    frame, finding = seen
    b = book()
    assert b.step(ONSET + 61, [finding], frame) == [] and b.incidents == []


def test_until_resolves_it_and_the_same_change_never_fires_again(seen):
    frame, finding = seen
    b = book()
    b.step(ONSET + 20, [finding], frame)
    ended = replace(finding, until=ONSET + 40, summary=finding.summary + " (ended)")
    (resolved,) = b.step(ONSET + 50, [ended], frame)
    assert resolved.state == "resolved" and resolved.ends_at == ONSET + 40
    for now in (ONSET + 60, ONSET + 70):
        assert b.step(now, [ended], frame) == [] and b.firing() == []
        assert b.step(now + 5, [finding], frame) == [] and b.firing() == []


def test_a_reversal_in_its_scope_is_its_end_not_a_new_incident(seen):
    frame, finding = seen
    b = book()
    b.step(ONSET + 20, [finding], frame)
    back = replace(finding, at=ONSET + 50, before_ms=finding.after_ms, after_ms=finding.before_ms)
    assert fingerprint(back)[3] == "down"
    (resolved,) = b.step(ONSET + 70, [back], frame)
    assert resolved.key[3] == "up" and resolved.ends_at == ONSET + 50
    assert b.step(ONSET + 80, [back], frame) == [] and len(b.incidents) == 1


def test_the_same_change_seen_from_a_wider_scope_is_the_same_incident(seen):
    frame, finding = seen
    b = book()
    b.step(ONSET + 20, [finding], frame)
    wider = replace(finding, scope={}, at=ONSET + 10)
    b.step(ONSET + 30, [wider], frame)
    assert len(b.incidents) == 1 and b.incidents[0].scope == {"replica": "r2"}


def test_a_finding_gone_from_the_analysis_keeps_firing_while_its_stage_stays_up(seen):
    """Its onset left the horizon, so the analysis no longer sees a change; r2's queue is still x3."""
    frame, finding = seen
    b = book()
    b.step(ONSET + 20, [finding], frame)
    end = frame["start"].max()
    for i in range(5):
        b.step(end + i, [], frame)
    assert len(b.firing()) == 1
    before = replace(finding, before_ms=finding.after_ms, after_ms=finding.after_ms * 3)
    b.firing()[0].finding = before  # as if r2's level now were its "before": it came back
    (resolved,) = b.step(end + 6, [], frame)
    assert resolved.state == "resolved" and resolved.ends_at == end + 6
