"""Which scope a live alert names, and which labels it carries: as ``hopline analyze`` says it.

- A deployment with one replica: the analysis' scope is ``{}`` (there is no other replica to
  tell the change apart from), and the alert carries ``replica`` as a label anyway, because every
  request it is about was on that replica (``Incident.common``).
- A batch job pinned to replica r2 (service batch-eval only on r2, from the rise on): the
  analysis of the first seconds may name ``{service: batch-eval}``, later ``{replica: r2}``; both
  hold the same requests, so they are one place, share one hold, and the incident opens with the
  broadest of them named during the hold, the one ``hopline analyze`` names on the log.
"""

from __future__ import annotations

from dataclasses import replace

import polars as pl
import pytest
from hopline.analyzer.findings.model import iso_utc
from hopline.analyzer.live.alertmanager import payload
from hopline.analyzer.live.detect import findings_now
from hopline.analyzer.live.detector import LiveConfig, LiveDetector
from hopline.analyzer.live.incidents import IncidentBook
from hopline.analyzer.pipeline import analyze
from hopline.analyzer.timelines import timelines
from support.synth import DEFAULT_START, StageShift, generate

DIMS = ("replica", "model", "service")
AT = 150


def feed_until_firing(events: pl.DataFrame, cfg: LiveConfig) -> LiveDetector:
    detector = LiveDetector(cfg)
    slot = (pl.col("ts") // cfg.window_s).alias("_slot")
    for part in events.sort("ts").with_columns(slot).partition_by("_slot", maintain_order=True):
        detector.feed(part.drop("_slot"))
        if detector.book.firing():
            break
    return detector


def test_one_replica_all_traffic_alert_names_its_replica_and_says_what_analyze_says():
    rise = StageShift("queue", 3.0, at_s=AT)
    events = generate(duration_s=300, rate=20, seed=2, replicas=("r7",), incidents=[rise])
    offline = analyze(timelines(events.lazy()).collect(), window="10s")["findings"][0]
    assert (offline["stage"], offline["scope"]) == ("queue", {})  # one replica: nothing to confine to
    detector = feed_until_firing(events, LiveConfig(window_s=10.0, horizon_s=600.0, recent_s=240.0))
    (incident,) = detector.book.firing()
    assert incident.scope == {} and incident.finding.stage == "queue"
    assert incident.common == {"replica": "r7", "model": "llama-3.1-8b"}  # services: two
    alert = payload(incident)
    assert alert["labels"] == {
        "alertname": "HoplineShift",
        "severity": "critical",
        "direction": "up",
        "side": "engine",
        "stage": "queue",
        "replica": "r7",
        "model": "llama-3.1-8b",
    }
    # the sentence is the analysis' own: the offline one, from the requests seen so far
    assert alert["annotations"]["summary"].startswith("queue time tripled at 10:02:30 (p50 ")
    assert offline["summary"].startswith("queue time tripled at 10:02:30 (p50 ")
    assert incident.to_json()["common"] == {"replica": "r7", "model": "llama-3.1-8b"}


def test_a_scope_key_with_two_values_is_no_label():
    rise = StageShift("queue", 3.0, at_s=AT)
    events = generate(duration_s=300, rate=20, seed=2, replicas=("r1", "r2"), incidents=[rise])
    detector = feed_until_firing(events, LiveConfig(window_s=10.0, horizon_s=600.0, recent_s=240.0))
    (incident,) = detector.book.firing()
    assert incident.scope == {} and incident.common == {"model": "llama-3.1-8b"}
    assert "replica" not in payload(incident)["labels"]


@pytest.fixture(scope="module")
def pinned():
    """Replica r1 and r2 serve kite-chat at 20 requests/s; from 2:30 a batch job (service
    batch-eval, only on r2, 20 requests/s) joins and r2's queue time triples for everyone on it."""
    chat = generate(duration_s=300, rate=20, seed=8, replicas=("r1", "r2"), services=("kite-chat",),
                    incidents=[StageShift("queue", 3.0, at_s=AT, scope={"replica": "r2"})])  # fmt: skip
    batch = generate(duration_s=300 - AT, rate=20, seed=9, replicas=("r2",), services=("batch-eval",),
                     start=DEFAULT_START + AT, incidents=[StageShift("queue", 3.0, at_s=0)])  # fmt: skip
    events = pl.concat([chat, batch.with_columns(pl.col("request_id") + "b")]).sort("ts")
    frame = timelines(events.lazy()).collect()
    offline = analyze(frame, window="10s")["findings"][0]
    (found,) = [f for f in findings_now(frame, 10.0, DIMS) if f.kind == "shift" and f.stage == "queue"]
    return frame, offline, found


def test_the_pinned_jobs_scope_and_the_replicas_are_one_place_and_it_opens_as_analyze_names_it(pinned):
    frame, offline, found = pinned
    assert (offline["stage"], offline["scope"]) == ("queue", {"replica": "r2"})
    assert found.scope == {"replica": "r2"}
    early = replace(found, scope={"service": "batch-eval"}, summary="queue time tripled on batch-eval")
    book = IncidentBook(window_s=10.0, horizon_s=600.0, recent_s=120.0, hold_s=20.0, dims=DIMS)
    t = DEFAULT_START + AT + 30
    # the first two steps name the job, the next ones the replica: one hold, not two
    assert book.step(t, [early], frame) == [] and book.step(t + 10, [early], frame) == []
    (opened,) = book.step(t + 20, [found], frame)
    assert opened.scope == {"replica": "r2"} and opened.finding.summary == found.summary
    assert opened.common == {"model": "llama-3.1-8b"}  # r2 serves two services: service is no label
    # the job's scope named again later: the same incident, still firing, with r2's labels and
    # r2's words (the sentence never names another place than the labels); no second alert
    assert book.step(t + 30, [early], frame) == [] and book.step(t + 40, [early], frame) == []
    (still,) = book.firing()
    assert still is opened and len(book.incidents) == 1 and still.last_seen == t + 40
    assert still.finding.summary == found.summary and still.absent_steps == 0
    assert payload(still)["labels"]["replica"] == "r2"
    # the job's scope seen ended: the place's change is over
    (ended,) = book.step(t + 50, [replace(early, until=t + 45)], frame)
    assert ended is opened and ended.state == "resolved"


def test_it_opens_with_the_broadest_scope_named_during_the_hold(pinned):
    """The analysis named the replica at one step of the hold and the job at the others, the
    step that ends the hold included: the alert names the replica, with its words."""
    frame, _, found = pinned
    early = replace(found, scope={"service": "batch-eval"}, summary="queue time tripled on batch-eval")
    book = IncidentBook(window_s=10.0, horizon_s=600.0, recent_s=120.0, hold_s=20.0, dims=DIMS)
    t = DEFAULT_START + AT + 30
    assert book.step(t, [early], frame) == [] and book.step(t + 10, [found], frame) == []
    (opened,) = book.step(t + 20, [early], frame)
    assert opened.scope == {"replica": "r2"} and opened.finding.summary == found.summary


def test_a_scope_inside_a_broader_sibling_is_held_twice_as_long(pinned):
    """All of the job's requests are on r2, which serves kite-chat too: naming the job may be
    the first seconds' view (too few of r2's other requests to tell), so it waits two holds. If
    the replica is named meanwhile, the alert names it; if not, the job."""
    frame, _, found = pinned
    early = replace(found, scope={"service": "batch-eval"}, summary="queue time tripled on batch-eval")
    t = DEFAULT_START + AT + 30
    book = IncidentBook(window_s=10.0, horizon_s=600.0, recent_s=120.0, hold_s=20.0, dims=DIMS)
    for step in range(4):  # 0 to 30 s: held, not yet twice the hold
        assert book.step(t + 10 * step, [early], frame) == []
    (opened,) = book.step(t + 40, [found], frame)
    assert opened.scope == {"replica": "r2"}
    book = IncidentBook(window_s=10.0, horizon_s=600.0, recent_s=120.0, hold_s=20.0, dims=DIMS)
    for step in range(4):
        assert book.step(t + 10 * step, [early], frame) == []
    (opened,) = book.step(t + 40, [early], frame)
    assert opened.scope == {"service": "batch-eval"} and opened.common == {"replica": "r2", "model": "llama-3.1-8b"}


def test_a_scope_that_shares_few_requests_is_another_place(pinned):
    frame, _, found = pinned
    other = replace(found, scope={"replica": "r1"})
    book = IncidentBook(window_s=10.0, horizon_s=600.0, recent_s=120.0, hold_s=20.0, dims=DIMS)
    t = DEFAULT_START + AT + 30
    book.step(t, [other], frame)
    book.step(t + 10, [other], frame)
    assert book.step(t + 20, [found], frame) == []  # r2's hold starts now, not with r1's
