"""A forged clock (issue 34, item 1): one event dated a year ahead must not move event time.

The contract takes any ``ts`` before 2100. Before the guards, one such event moved the detector's
newest event time a year forward: the horizon emptied, the firing incident resolved with an end a
year ahead, and no new incident was found until the wall clock caught up.

The log: two replicas at 20 requests/s for 5 min, queue time x3 on r2 from 2:30 (no end). It is
fed as a watcher is fed, one 10-s batch at a time, with one client event a year ahead slipped
into the batch at 2:00 (before the onset: the incident must still be found) and another into the
batch at 4:00 (after it fired: it must still be firing). The detector with the forged events must
step, find and fire exactly as the same detector without them, and count the forged events.
"""

from __future__ import annotations

import time

import polars as pl
import pytest
from hopline.analyzer.findings.model import Shift, iso_utc
from hopline.analyzer.live.alertmanager import AlertSender, bounded, payload
from hopline.analyzer.live.cli import live_config
from hopline.analyzer.live.detector import LEAP_QUORUM, LiveConfig, LiveDetector
from hopline.analyzer.live.incidents import Incident
from hopline.analyzer.live.metrics import FROM_FUTURE, build_registry
from hopline.analyzer.live.server import findings_answer
from hopline.analyzer.live.watch import Watch
from hopline.middleware.contract.units import to_epoch
from prometheus_client import generate_latest
from support.alertmanager import Webhook
from support.servers import wait_until
from support.synth import DEFAULT_START, StageShift, generate

YEAR_S = 365 * 86400.0
ONSET = DEFAULT_START + 150
FORGED_AT = (120, 240)  # the batches (seconds into the log) a forged event is slipped into
CONFIG = LiveConfig(window_s=10.0, horizon_s=600.0, recent_s=120.0, idle_s=30.0)


def batches(events: pl.DataFrame, every_s: float = 10.0) -> list[pl.DataFrame]:
    """The log in event-time order, one batch per 10 s, as a replay or a follow feeds it."""
    slot = (pl.col("ts") / every_s).floor().alias("_slot")
    return [
        p.drop("_slot")
        for p in events.sort("ts").with_columns(slot).partition_by("_slot", maintain_order=True)
    ]


@pytest.fixture(scope="module")
def log() -> list[pl.DataFrame]:
    events = generate(
        duration_s=300,
        rate=20,
        seed=11,
        incidents=[StageShift("queue", 3.0, at_s=150, scope={"replica": "r2"})],
    )
    return batches(events)


def forged(batch: pl.DataFrame, n: int) -> pl.DataFrame:
    """``batch`` with one more event: a copy of its first ``client.sent``, a new request, a year ahead."""
    one = batch.filter(pl.col("hop") == "client.sent").head(1)
    one = one.with_columns(pl.col("ts") + YEAR_S, pl.lit(f"forged-{n}").alias("request_id"))
    assert one.height == 1
    return pl.concat([batch, one], how="vertical")


def run(log: list[pl.DataFrame], config: LiveConfig, forge: bool) -> tuple[LiveDetector, list[tuple]]:
    """Feed the log (a forged event into the batches at ``FORGED_AT`` with ``forge``); the wall clock
    is the batch's newest honest event plus 1 s, as on a watcher that keeps up. Returns the
    detector and each step's firing incidents (event time, key, onset)."""
    wall = [0.0]
    detector = LiveDetector(config, clock=lambda: wall[0])
    seen: list[tuple] = []
    detector.on_step = lambda now, changed: seen.extend((now, i.key, i.onset) for i in detector.book.firing())
    for batch in log:
        wall[0] = batch["ts"].max() + 1.0
        offset = batch["ts"].min() - DEFAULT_START
        hit = [k for k, at in enumerate(FORGED_AT) if at <= offset < at + 10]
        detector.feed(forged(batch, hit[0]) if forge and hit else batch)
    return detector, seen


@pytest.fixture(scope="module")
def honest(log) -> tuple[LiveDetector, list[tuple]]:
    return run(log, CONFIG, forge=False)


def queue_on_r2(detector: LiveDetector):
    (incident,) = [i for i in detector.book.firing() if i.key[1] == "queue"]
    assert incident.scope == {"replica": "r2"} and incident.onset == ONSET
    return incident


def test_following_a_year_ahead_event_is_dropped_at_the_wall_clock_and_counted(log, honest):
    follow = LiveConfig(**{**CONFIG.__dict__, "future_s": 60.0})
    detector, seen = run(log, follow, forge=True)
    baseline, baseline_seen = honest
    # event time never left the log: the last step is the honest run's, the incident still fires
    assert detector.now == baseline.now and detector.newest == baseline.newest < DEFAULT_START + 400
    assert queue_on_r2(detector).ends_at is None
    # every step found and fired the same as without the forged events (2 dropped, none held)
    assert seen == baseline_seen and len(seen) > 5
    assert detector.events_from_future == len(FORGED_AT) and detector.ahead.height == 0


def test_replaying_a_lone_leap_never_moves_event_time(log, honest):
    """No wall clock in a replay: the leap rule alone keeps the forged events out."""
    detector, seen = run(log, CONFIG, forge=True)
    baseline, baseline_seen = honest
    assert detector.now == baseline.now and detector.newest == baseline.newest
    assert queue_on_r2(detector).ends_at is None and seen == baseline_seen
    assert detector.ahead.height == len(FORGED_AT)  # held, waiting for LEAP_QUORUM requests to agree
    detector.flush()
    assert detector.events_from_future == len(FORGED_AT) and detector.ahead.height == 0
    # flush ran on from the log's end, not from a year ahead
    assert detector.now < DEFAULT_START + 300 + CONFIG.idle_s + 2 * CONFIG.window_s


def test_a_real_pause_longer_than_the_horizon_is_a_leap_the_requests_agree_on(log):
    """The traffic stops for 20 min (twice the 10-min horizon) and comes back: event time follows."""
    detector = LiveDetector(LiveConfig(window_s=10.0, horizon_s=300.0, recent_s=120.0))
    for batch in log[:6]:
        detector.feed(batch)
    later = log[6].with_columns(pl.col("ts") + 1200.0)
    assert later["request_id"].n_unique() >= LEAP_QUORUM
    detector.feed(later)
    assert detector.newest == later["ts"].max() and detector.ahead.height == 0
    assert detector.events_from_future == 0


def test_the_count_is_on_metrics_and_findings(log):
    batch = log[3]
    detector = LiveDetector(
        LiveConfig(**{**CONFIG.__dict__, "future_s": 60.0}), clock=lambda: batch["ts"].max()
    )
    watch = Watch(detector, out=None)
    detector.feed(forged(batch, 0))
    text = generate_latest(build_registry(watch)).decode()
    assert f"{FROM_FUTURE}_total 1.0" in text.splitlines()
    assert findings_answer(watch, None)["events_from_future"] == 1


def test_follow_bounds_the_future_and_replay_does_not():
    args = ("replica,model,service", "10s", "30m", "5m", "5s", "5s", None, 1.0)
    assert live_config(*args, "1m").future_s == 60.0
    assert live_config(*args).future_s is None


def resolved_incident(onset: float) -> Incident:
    """A queue rise on r2 at ``onset``, resolved 3 min later."""
    finding = Shift(
        summary="queue time tripled on replica r2", stage="queue", scope={"replica": "r2"}, statistic="p50",
        at=onset, before_ms=40.0, after_ms=120.0, factor=3.0, z=9.0, affected_requests=300, impact_s=25.0,
    )  # fmt: skip
    made = Incident(("HoplineShift", "queue", (("replica", "r2"),), "up"), finding, onset, onset + 20, onset + 20,
                    "critical", 0.2, ["s1-1"])  # fmt: skip
    made.state, made.ends_at, made.ended = "resolved", onset + 180, "queue back near its level before"
    return made


def test_alertmanager_never_gets_an_end_a_year_ahead():
    """An incident dated a year ahead (what the forged event used to make): sent with ``ahead_s``
    (--follow), its ``startsAt`` and ``endsAt`` reach Alertmanager at most 60 s past the wall clock
    (a resolved alert with a year-ahead ``endsAt`` stays active in Alertmanager for a year)."""
    hook = Webhook()  # stands in for Alertmanager: records what the sender posts
    sender = AlertSender([hook.url], ahead_s=60.0).start()
    try:
        sent_at = time.time()
        sender.update([payload(resolved_incident(sent_at + YEAR_S))])
        (batch,) = wait_until("the post", lambda: list(hook.notifications), timeout=10)
    finally:
        sender.close()
        hook.close()
    (alert,) = batch
    starts, ends = to_epoch(alert["startsAt"]), to_epoch(alert["endsAt"])
    assert starts <= ends <= time.time() + 60.0 + 1  # +1: iso_utc rounds to the second
    assert ends >= sent_at + 60.0 - 1  # capped at the wall clock + 60 s, not dropped
    # an honest alert (event time in the past) is sent as the detector dated it
    honest = payload(resolved_incident(to_epoch("2026-01-05T10:25:00Z")))
    assert bounded(honest, time.time() + 60.0) is honest and honest["endsAt"] == iso_utc(
        to_epoch("2026-01-05T10:28:00Z")
    )
