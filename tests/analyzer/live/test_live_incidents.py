"""The incident book: which findings open, update, resolve an incident, and which never re-fire.

The findings are real: ``findings_now`` on a generated log (two replicas at 20 requests/s,
queue x3 on r2 from 2:30, no end); the tests move their times to state each rule.
"""

from __future__ import annotations

from dataclasses import replace

import polars as pl
import pytest
from hopline.analyzer.findings.rank import MINOR_SHARE
from hopline.analyzer.live.alertmanager import payload
from hopline.analyzer.live.detect import findings_now
from hopline.analyzer.live.incidents import SCOPE_SHARE, IncidentBook, fingerprint, live_share, scope_share
from hopline.analyzer.findings.model import MixChange, Pitfall, iso_utc
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


def test_a_fall_part_of_the_way_back_is_no_end(seen):
    """A flood's queue 0 -> 1.4 s, then 1.4 -> 0.6 s while the flood goes on (vllm-flood-ci-9):
    still nearer its level after than before, the incident goes on; the rest of the way ends it."""
    frame, finding = seen
    b = book()
    (opened,) = b.step(ONSET + 20, [finding], frame)
    level = finding.after_ms * 0.7  # 121 -> 85 ms: nearer 121 than 42
    partly = replace(finding, at=ONSET + 50, before_ms=finding.after_ms, after_ms=level)
    assert fingerprint(partly)[3] == "down"
    assert b.step(ONSET + 70, [partly], frame) == [] and opened.state == "firing"
    back = replace(partly, at=ONSET + 80, before_ms=level, after_ms=finding.before_ms)
    (resolved,) = b.step(ONSET + 90, [back], frame)
    assert resolved is opened and opened.state == "resolved" and opened.ends_at == ONSET + 80


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


@pytest.fixture(scope="module")
def fleet(seen):
    """``seen``'s two replicas among 113 more that did not change: r2's tripled queue costs the
    fleet under 1% of its waits since the onset and r2's own users a good share of theirs."""
    frame, finding = seen
    replicas = tuple(f"r{i:02d}" for i in range(3, 40))
    others = timelines(generate(duration_s=300, rate=300, seed=12, replicas=replicas).lazy()).collect()
    copies = [
        others.with_columns(pl.col("replica") + suffix, pl.col("request_id") + suffix)
        for suffix in ("", "b", "c")
    ]
    return pl.concat([frame, *copies], how="diagonal_relaxed"), finding


def test_one_replica_of_many_pages_on_its_own_users_time(fleet):
    """Under ``MINOR_SHARE`` of all users' time, at least ``SCOPE_SHARE`` of its scope's: it pages,
    as a warning (critical is the fleet's share); the alert says both shares."""
    frame, finding = fleet
    share, local = live_share(finding, frame, ONSET), scope_share(finding, frame, ONSET)
    assert share < MINOR_SHARE and local >= SCOPE_SHARE  # the premise
    b = book()
    (opened,) = b.step(ONSET + 20, [finding], frame)
    assert opened.pages and opened.severity == "warning" and opened.scope == {"replica": "r2"}
    assert opened.to_json()["scope_share_since_onset"] == round(local, 4)
    assert f"share_of_scope_users_time_since_onset={local:.1%}" in payload(opened)["annotations"]["evidence"]


def test_a_scoped_change_small_for_its_own_users_too_opens_nothing(fleet):
    """The same replica's change at a fifth of its cost: under both floors, nothing opens."""
    frame, finding = fleet
    small = replace(finding, impact_s=finding.impact_s / 5)
    share, local = live_share(small, frame, ONSET), scope_share(small, frame, ONSET)
    assert share < MINOR_SHARE and local < SCOPE_SHARE
    b = book()
    assert b.step(ONSET + 20, [small], frame) == [] and b.incidents == []


def test_a_standing_pitfall_or_a_mix_change_found_with_a_noted_shift_does_not_lead_it(seen):
    """What a finding is decides whether it pages, however it comes to lead (``noted_kind``): a
    standing pitfall (a condition with no onset) or a change in the traffic, found at a noted
    shift's moment in its place (r2's queue up 5 ms: unfelt), is that incident's co-mover. The
    pitfall opening alone would be noted as standing; leading the noted shift it paged, critical."""
    frame, finding = seen
    standing = Pitfall(
        summary="no max_tokens on r2", name="no_max_tokens", scope={"replica": "r2"},
        affected_requests=2000, evidence={}, impact_s=400.0, spent_in="decode",
    )  # fmt: skip
    prefill = replace(finding, stage="prefill", before_ms=30.0, after_ms=300.0, summary="prefill x10 on r2")
    mix = MixChange(**{**prefill.__dict__, "kind": "mix_change"}, per_unit={"unit": "computed prompt token"})
    for other in (standing, mix):
        b = book()
        quiet = replace(finding, after_ms=finding.before_ms + 5.0, summary="queue up 5 ms on r2")
        (opened,) = b.step(ONSET + 20, [quiet], frame)
        assert not opened.pages and opened.unfelt
        b.step(ONSET + 30, [quiet, other], frame)
        assert b.paging() == [] and b.incidents == [opened], other.summary
        assert opened.fired is quiet and opened.key == fingerprint(quiet), other.summary
        assert fingerprint(other) in [fingerprint(f) for f in opened.co_movers]
