"""Memory and /metrics are bounded by what the collector is configured to hold (issue 10, items 5, 6, 13).

Before: label caps were per label, so 2,048 (service, model, replica) combinations made 2,048
series per family (127.5 MiB of /metrics); the join's bound was a request count, so 1,000 open
requests x 500 events took 366 MB, and nothing reported the join's memory.
"""

from __future__ import annotations

from support.collector import parts_config, serve
from support.events import event, ndjson
from hopline.collector import metric_names as names
from hopline.collector.config import CollectorConfig
from hopline.collector.join import Joiner, event_bytes
from hopline.collector.metrics import Recorder, build_metrics
from hopline.middleware.contract import dumps, validate_event
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

T = 1767225600.0


def joiner_with(**settings) -> tuple[Joiner, CollectorRegistry]:
    registry = CollectorRegistry()
    config = parts_config(grace=0.0, **settings)
    return Joiner.from_config(config, Recorder.from_config(config, build_metrics(registry))), registry


def add(joiner: Joiner, events: list[dict]) -> None:
    valid = [validate_event(e) for e in events]
    joiner.add(valid, [len(dumps(e)) for e in valid])


def scopes(registry: CollectorRegistry, family: str) -> set[tuple[str, str, str]]:
    return {
        (s.labels["service"], s.labels["model"], s.labels["replica"])
        for m in registry.collect()
        if m.name == family
        for s in m.samples
    }


def test_series_are_capped_per_family_by_combination_not_per_label():
    """16 services x 16 models x 8 replicas: each label within its cap of 64, 2,048 combinations."""
    joiner, registry = joiner_with(scope_cap=100)
    for i in range(2048):
        rid = f"combo-{i}"
        scope = {"service": f"s{i % 16}", "model": f"m{i // 16 % 16}", "replica": f"r{i // 256}"}
        add(
            joiner,
            [
                event("client.sent", rid, T, stream=False, service=scope["service"]),
                event("engine.received", rid, T + 0.1, stream=False, model=scope["model"], replica=scope["replica"]),
                event("engine.last_token", rid, T + 0.5, replica=scope["replica"]),
                event("client.last_token", rid, T + 0.6),
            ],
        )
    assert joiner.counts["complete"] == 2048
    for family in ("hopline_requests", "hopline_stage_seconds", "hopline_e2e_seconds"):
        seen = scopes(registry, family)
        assert len(seen) == 101, family  # the first 100 combinations, then (other, other, other)
        assert ("other", "other", "other") in seen
    assert registry.get_sample_value("hopline_collector_scopes_overflowed_total") == 2048 - 100
    in_flight = {
        (s.labels["model"], s.labels["replica"])
        for m in registry.collect()
        if m.name == "hopline_requests_in_flight"
        for s in m.samples
    }
    assert len(in_flight) <= 101


def test_open_requests_are_bounded_by_bytes_oldest_evicted_first():
    one = validate_event(event("engine.received", "b000", T, stream=True, replica="r1"))
    per_event = event_bytes(len(dumps(one)))
    joiner, registry = joiner_with(max_open_bytes=per_event * 50)
    for i in range(200):  # 200 open requests of one event each: room for 50
        add(joiner, [event("engine.received", f"b{i:03d}", T, stream=True, replica="r1")])
        assert joiner.open_bytes <= per_event * 50
    assert len(joiner.open) == 50 and next(iter(joiner.open)) == "b150"
    assert joiner.counts["evicted"] == 150
    assert registry.get_sample_value("hopline_collector_requests_closed_incomplete_total", {"why": "evicted"}) == 150


def test_a_request_over_the_event_cap_is_closed_as_incomplete_and_counted():
    joiner, registry = joiner_with(max_events_per_request=100)
    events = [event("engine.received", "chatty", T, stream=True)] + [
        event("engine.scheduled", "chatty", T + i * 1e-3) for i in range(1, 500)
    ]
    add(joiner, events)
    assert "chatty" not in joiner.open
    assert joiner.counts["overflow"] == 1
    assert joiner.finished["chatty"].state == "overflow"
    assert len(joiner.finished["chatty"].events) == 100  # the rest is stored, not held
    assert registry.get_sample_value("hopline_collector_requests_closed_incomplete_total", {"why": "overflow"}) == 1
    assert registry.get_sample_value("hopline_requests_total", {"outcome": "incomplete", "service": "unknown",
                                                                "model": "unknown", "replica": "unknown"}) == 1
    assert joiner.open_bytes == 0


def test_the_collector_exposes_its_own_health(tmp_path):
    """Every health metric is on /metrics, and the ones this run moves say what happened."""
    config = CollectorConfig(data_dir=tmp_path, grace=60.0)
    with serve(config) as c:
        batch = [event("client.sent", f"h{i}", T, stream=True) for i in range(10)]
        headers = {"Content-Type": "application/x-ndjson"}
        assert c.client.post("/v1/events", content=ndjson(batch), headers=headers).status_code == 200
        assert c.client.post("/v1/events", content=b"{}\n", headers=headers).status_code == 400
        assert c.client.post("/v1/events", content=b"x" * 10, headers={**headers, "Content-Encoding": "gzip"}).status_code == 400
        text = c.client.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for metric in names.COLLECTOR_HEALTH:
        assert metric.name in families, metric.name

    def value(name: str, **labels: str) -> float:
        return next(s.value for s in families[name].samples if s.labels == labels and not s.name.endswith("_created"))

    assert value("hopline_collector_dedup_keys") == 10
    assert value("hopline_open_requests") == 10
    assert value("hopline_collector_open_request_bytes") >= 10 * 400
    assert value("hopline_collector_bodies_rejected", reason="no_valid_event") == 1
    assert value("hopline_collector_bodies_rejected", reason="bad_gzip") == 1
    assert value("hopline_events_rejected", reason="invalid_ts") == 1
    assert value("hopline_collector_event_loop_lag_seconds") >= 0
