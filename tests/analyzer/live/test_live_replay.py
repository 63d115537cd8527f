"""Live detection on replayed logs (event time), alerts through a real Alertmanager to a webhook.

The log: four replicas at 20 requests/s for 15 min (tests/support/synth.py); the incident: queue
time x3 on replica r2 from 6:00 to 10:00 (``RISE``). The detector keeps a 10-minute horizon and
opens incidents whose onset is in the last 4 minutes. Event-time figures are exact (a replay is
deterministic); wall-clock waits only have generous bounds.
"""

from __future__ import annotations

from datetime import UTC, datetime

import polars as pl
import pytest
from hopline.analyzer.findings.model import iso_utc
from hopline.analyzer.live.alertmanager import AlertSender
from hopline.analyzer.live.detector import LiveConfig, LiveDetector
from hopline.analyzer.live.watch import Watch
from hopline.middleware.contract.units import to_epoch
from support.alertmanager import alertmanager_with_webhook
from support.servers import wait_until
from support.synth import DEFAULT_START, StageShift, generate

REPLICAS = ("r1", "r2", "r3", "r4")
RISE = StageShift("queue", 3.0, at_s=360, until_s=600, scope={"replica": "r2"})
CONFIG = LiveConfig(window_s=10.0, horizon_s=600.0, recent_s=240.0)


def iso(offset_s: float) -> str:
    return datetime.fromtimestamp(DEFAULT_START + offset_s, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def batches(events: pl.DataFrame, every_s: float = 10.0) -> list[pl.DataFrame]:
    """The log in event-time order, one batch per 10 s, as a replay feeds it."""
    slot = (pl.col("ts") / every_s).floor().alias("_slot")
    return [
        p.drop("_slot")
        for p in events.sort("ts").with_columns(slot).partition_by("_slot", maintain_order=True)
    ]


def test_a_queue_rise_on_one_replica_is_one_alert_that_names_it_then_resolves(tmp_path):
    events = generate(duration_s=900, rate=20, seed=3, replicas=REPLICAS, incidents=[RISE])
    lines: list[str] = []
    with alertmanager_with_webhook(tmp_path) as (am, webhook):
        sender = AlertSender([am.url]).start()
        detector = LiveDetector(CONFIG)
        Watch(detector, sender=sender, out=lines.append, store="/var/lib/hopline")
        parts = iter(batches(events))
        for part in parts:  # up to the first firing incident
            detector.feed(part)
            if detector.book.firing():
                break
        (incident,) = detector.book.firing()
        # onset: the window boundary at 6:00; found 20 s later (the rise's requests finish, settle 5 s
        # and lateness 5 s: the step at 6:20 is the first that holds 50 of r2's requests after it),
        # fired 20 s after that (found at every step for 2 windows, the default hold)
        assert (incident.finding.stage, incident.scope, iso_utc(incident.finding.at)) == (
            "queue",
            {"replica": "r2"},
            iso(360),
        )
        assert detector.now - DEFAULT_START == 400
        firing = wait_until("the firing notification", lambda: webhook.alerts("firing"), timeout=90)
        for part in parts:
            detector.feed(part)
        detector.flush()
        resolved = wait_until("the resolved notification", lambda: webhook.alerts("resolved"), timeout=90)
        sender.close()
    labels = firing[0]["labels"]
    assert labels == {
        "alertname": "HoplineShift",
        "stage": "queue",
        "replica": "r2",
        "direction": "up",
        "side": "engine",  # the engine's queue: the serving on-call's, not the caller's
        "severity": "critical",
        "model": "llama-3.1-8b",  # every request on r2 was for it (the log has one model)
    }
    summary = firing[0]["annotations"]["summary"]
    assert summary.startswith("queue time tripled at 10:06 on replica r2 (p50 ")
    assert firing[0]["startsAt"].startswith(f"{iso(360)[:-1]}")
    assert firing[0]["annotations"]["timeline"].startswith("hopline timeline s3-")
    assert firing[0]["annotations"]["timeline"].endswith(" /var/lib/hopline")
    assert {a["labels"]["alertname"] for a in webhook.alerts()} == {"HoplineShift"}
    assert {tuple(sorted(a["labels"].items())) for a in webhook.alerts()} == {
        tuple(sorted(labels.items()))
    }  # one alert
    (end,) = [i for i in detector.incidents() if i.state == "resolved"]
    assert detector.book.firing() == []
    # the rise ended at 10:00 (600 s); the reversal is seen in the window that began at 9:50
    assert iso(590) <= end.to_json()["ends_at"] <= iso(600)
    assert resolved[0]["labels"] == labels
    assert resolved[0]["endsAt"][:19] == end.to_json()["ends_at"][:19]
    # the printout: one line at the onset, one at the end, with the event-time seconds since onset
    assert len(lines) == 2
    assert lines[0].startswith("[2026-01-05T10:06:40Z +40s since onset] FIRING HoplineShift{")
    assert "RESOLVED" in lines[1]


@pytest.mark.parametrize("seed", [5, 6])
def test_a_clean_log_raises_no_alert(tmp_path, seed):
    events = generate(duration_s=900, rate=20, seed=seed, replicas=REPLICAS)
    with alertmanager_with_webhook(tmp_path) as (am, webhook):
        sender = AlertSender([am.url]).start()
        detector = LiveDetector(CONFIG)
        Watch(detector, sender=sender)
        for part in batches(events):
            detector.feed(part)
        detector.flush()
        sender.close()
        held = am.alerts()
    assert detector.now >= events["ts"].max()  # every request of the log was in a step
    assert detector.finished_requests == events["request_id"].n_unique()
    assert detector.incidents() == [] and held == [] and webhook.alerts() == []
    assert sender.stats.sent == {}  # nothing was ever posted


def test_the_load_a_live_finding_reports_is_measured_on_finished_requests_only():
    """The horizon's newest requests are partly still running (absent) and partly finished
    early (their end columns nulled, ``detector._survivors``): counted as they are, r2's
    concurrency after the onset read 24.5 -> 8.2, a fall that never happened (the log's load is
    flat). The load after a change stops where the requests are complete (``Context.complete_before``)."""
    events = generate(duration_s=900, rate=20, seed=3, replicas=REPLICAS, incidents=[RISE])
    detector = LiveDetector(CONFIG)
    for part in batches(events):
        detector.feed(part)
        if detector.book.firing():
            break
    (incident,) = detector.book.firing()
    context = incident.finding.context
    before, after = context["before"]["concurrency"], context["after"]["concurrency"]
    assert after is not None and abs(after / before - 1) < 0.25, context
    assert "concurrency" not in context["moved_with"] and "arrivals_per_s" not in context["moved_with"]
    assert "concurrency" not in incident.finding.summary, incident.finding.summary
    assert context["after"]["span_s"] < detector.now - incident.finding.at  # stops before now
