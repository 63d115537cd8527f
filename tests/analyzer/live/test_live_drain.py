"""The end of a stream for good (``LiveDetector.drain``, what the demo's watch does when the run
is over): what fires resolves with an ``endsAt`` Alertmanager has already passed, never one in
the future, and the strides past the last event only resolve.

The log: two replicas at 20 requests/s for 5 minutes; queue time x3 on r2 from 2:30 to the end
(the incident is still on when the stream stops), and the last 20 requests cut before their
final hops (the stack stopped under them).
"""

from __future__ import annotations

import polars as pl
from hopline.analyzer.live.alertmanager import payload
from hopline.analyzer.live.detector import LiveConfig, LiveDetector
from hopline.middleware.contract.units import to_epoch
from support.synth import DEFAULT_START, StageShift, generate

RISE = StageShift("queue", 3.0, at_s=150, scope={"replica": "r2"})
CONFIG = LiveConfig(window_s=10.0, horizon_s=600.0, recent_s=240.0)
FINAL = ("client.last_token", "gateway.last_token", "engine.last_token", "engine.stats")


def cut_log() -> pl.DataFrame:
    events = generate(duration_s=300, rate=20, seed=4, replicas=("r1", "r2"), incidents=[RISE])
    firsts = events.group_by("request_id").agg(pl.col("ts").min()).sort("ts")
    cut = firsts["request_id"].tail(20).implode()
    return events.filter(~(pl.col("request_id").is_in(cut) & pl.col("hop").is_in(FINAL))).sort("ts")


def test_a_drained_stream_resolves_what_fires_no_later_than_its_last_event():
    events = cut_log()
    newest = float(events["ts"].max())
    detector = LiveDetector(CONFIG)
    opened: list = []
    detector.on_step = lambda now, changed: opened.extend(
        (now, i.key) for i in changed if i.first_seen == now
    )
    for _, part in events.with_columns(slot=(pl.col("ts") // 10)).group_by("slot", maintain_order=True):
        detector.feed(part.drop("slot"))
    (queue,) = detector.book.firing()
    assert (queue.key[1], queue.scope) == ("queue", {"replica": "r2"})
    onset = queue.onset
    assert onset == DEFAULT_START + 150
    steps = detector.steps
    detector.drain()
    assert detector.book.firing() == []
    assert queue.state == "resolved"
    # its end: r2's last request before the stream stopped, not the event time the drain reached
    # (an endsAt in the future keeps Alertmanager's alert firing until then)
    assert onset < queue.ends_at <= newest
    alert = payload(queue)
    assert to_epoch(alert["endsAt"]) <= newest and alert["startsAt"] == queue.to_json()["onset"]
    assert queue.onset == onset  # the strides past the last event do not re-place it
    # the cut requests were finished once settled, not after idle_s (300 s of 10 s steps)
    assert detector.pending.height == 0
    assert detector.steps - steps < 30
    # nothing opened after the last event
    assert all(now <= newest for now, _ in opened), opened
