"""Emitters' emitter.stats reports: validated without a request, stored, never joined, exposed as
``hopline_emitter_*`` counters per service and replica that stay monotonic across processes."""

from __future__ import annotations

import pytest
from support.collector import stored_lines
from support.events import ndjson
from hopline.collector.emitter_stats import EmitterStats
from hopline.middleware.contract import EMITTER_STATS_HOP, EventError, new_eid, validate_event
from prometheus_client import CollectorRegistry


def report(emitter: str, ts: float, service: str = "kite-chat", replica: str = "r1", **counts) -> dict:
    return {
        "v": 1, "eid": new_eid(), "ts": ts, "hop": EMITTER_STATS_HOP, "emitter": emitter,
        "service": service, "replica": replica, **counts,
    }


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, {"service": "kite-chat", "replica": "r1", **labels})


def test_counts_of_two_processes_add_up_and_a_late_or_repeated_report_adds_nothing() -> None:
    registry = CollectorRegistry()
    stats = EmitterStats(registry)
    stats.observe([report("a", 10.0, sent=100, dropped_full=5, buffered=7)])
    stats.observe([report("b", 11.0, sent=40, dropped_sink=2, buffered=3)])
    stats.observe([report("a", 20.0, sent=150, dropped_full=9, buffered=1)])
    stats.observe([report("a", 15.0, sent=120, dropped_full=6, buffered=50)])  # sent before the last one
    stats.observe([report("a", 20.0, sent=150, dropped_full=9, buffered=1)])  # the same again
    assert sample(registry, "hopline_emitter_events_sent_total") == 190  # 150 + 40
    assert sample(registry, "hopline_emitter_events_dropped_total", reason="full") == 9
    assert sample(registry, "hopline_emitter_events_dropped_total", reason="sink") == 2
    assert sample(registry, "hopline_emitter_events_buffered") == 4  # 1 + 3: the latest of each
    # b exits (its final report): its counts stay in the sums, its buffer leaves the gauge
    stats.observe([report("b", 30.0, sent=45, dropped_sink=2, buffered=0, final=True)])
    assert sample(registry, "hopline_emitter_events_sent_total") == 195
    assert sample(registry, "hopline_emitter_events_buffered") == 1
    assert len(stats) == 1


def test_silent_instances_are_forgotten_and_series_are_capped() -> None:
    registry = CollectorRegistry()
    clock = Clock()
    stats = EmitterStats(registry, max_series=2, max_instances=3, expiry_s=100.0, clock=clock)
    stats.observe([report("a", 1.0, buffered=10)])
    clock.now = 150.0  # a was last heard 150 s ago
    stats.observe([report("b", 2.0, buffered=1)])
    assert len(stats) == 1 and sample(registry, "hopline_emitter_events_buffered") == 1
    for i in range(5):  # more instances than remembered, more (service, replica) pairs than series
        stats.observe([report(f"x{i}", 3.0, replica=f"r{i + 2}", sent=1)])
    assert len(stats) == 3
    assert registry.get_sample_value(
        "hopline_emitter_events_sent_total", {"service": "other", "replica": "other"}
    ) == 4  # r2 took the second series; r3..r6 overflow


def test_a_report_validates_without_a_request_but_needs_its_eid_and_sane_counts() -> None:
    good = report("a", 1700000000, sent=3)
    assert validate_event(good)["ts"] == 1700000000.0
    for broken, field in (
        ({k: v for k, v in good.items() if k != "eid"}, "eid"),
        ({**good, "emitter": ""}, "emitter"),
        ({**good, "sent": -1}, "sent"),
        ({**good, "dropped_full": 2**64}, "dropped_full"),
        ({**good, "buffered": 1.5}, "buffered"),
        ({**good, "ts": float("inf")}, "ts"),
    ):
        with pytest.raises(EventError, match=field):
            validate_event(broken)


def test_the_collector_stores_reports_exposes_them_and_never_joins_them(collector, config) -> None:
    answer = collector.client.post(
        "/v1/events",
        content=ndjson([
            report("a", 1700000000.0, sent=10, dropped_full=3, buffered=2),
            {"v": 1, "eid": new_eid(), "ts": 1700000000.0, "request_id": "req-1", "hop": "client.sent",
             "stream": True},
            {**report("b", 1700000000.0), "eid": None},  # reports must carry their eid
        ]),
        headers={"content-type": "application/x-ndjson"},
    )
    assert answer.status_code == 200
    body = answer.json()
    assert body["accepted"] == 2, body
    assert [r["line"] for r in body["rejected"]] == [3]
    assert "eid" in body["rejected"][0]["error"]
    assert [e["hop"] for e in stored_lines(config.data_dir)] == [EMITTER_STATS_HOP, "client.sent"]
    assert set(collector.collector.joiner.open) == {"req-1"}  # the report is no request
    metrics = collector.client.get("/metrics").text
    assert 'hopline_emitter_events_dropped_total{reason="full",replica="r1",service="kite-chat"} 3.0' in metrics
    assert 'hopline_emitter_events_sent_total{replica="r1",service="kite-chat"} 10.0' in metrics
    assert 'hopline_emitter_events_buffered{replica="r1",service="kite-chat"} 2.0' in metrics
