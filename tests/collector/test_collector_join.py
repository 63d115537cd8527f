"""The join: golden stages through a real collector, completion, grace, expiry, eviction, engine load."""

from __future__ import annotations

import time

import pytest
from hopline.collector.config import CollectorConfig
from hopline.collector.join import Joiner
from hopline.collector.metrics import Recorder, build_metrics
from hopline.middleware.contract import validate_event
from hopline.middleware.contract.rules import SCOPE_SOURCES, group_requests
from prometheus_client import CollectorRegistry
from support.collector import parts_config, serve
from support.events import event, ndjson
from support.golden import GOLDEN

CASES = {c["name"]: c for c in GOLDEN["cases"]}


def test_golden_stages_through_the_collector(tmp_path):
    """Every fixture case, posted out of order in two batches, reads back with the hand-worked stages.

    A request can look complete before its last events arrive (its final hops came first), so
    the grace period (0.5 s here) is what lets the late ones join before metrics are observed.
    """
    events = [e for case in GOLDEN["cases"] for e in case["events"]]
    # the cases that never end (outcome incomplete) expire after the TTL
    with serve(CollectorConfig(data_dir=tmp_path / "d", grace=0.5, ttl=2.0)) as collector:
        for batch in (events[1::2], events[::2]):  # out of order across and within requests
            r = collector.client.post(
                "/v1/events", content=ndjson(batch), headers={"Content-Type": "application/x-ndjson"}
            )
            assert r.json()["accepted"] == len(batch)
        deadline = time.monotonic() + 10
        while collector.collector.joiner.open:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        check_golden(collector)


def requests_of(case):
    """Resolved request ID -> expected values: one request unless the case lists its ``requests``."""
    return case.get("requests") or {case["events"][0]["request_id"]: case}


SPECS = [spec for case in GOLDEN["cases"] for spec in requests_of(case).values()]


def check_golden(collector):
    tol = GOLDEN["tolerance_s"]
    for case in GOLDEN["cases"]:
        # which events make each request: the rule book's join (request ID, then the trace)
        joined = group_requests(validate_event(e) for e in case["events"])
        assert set(joined) == set(requests_of(case)), case["name"]
        for rid, spec in requests_of(case).items():
            name = f"{case['name']} {rid}"
            got = collector.client.get(f"/v1/requests/{rid}").json()
            assert got["state"] == ("expired" if spec["outcome"] == "incomplete" else "complete"), name
            # the rule book: outcome, scope, missing hops, as worked by hand in the fixture
            assert got["outcome"] == spec["outcome"], name
            assert got["missing"] == spec["missing"], name
            assert {k: got[k] for k in SCOPE_SOURCES} == {k: spec["scope"].get(k) for k in SCOPE_SOURCES}, name
            for stage, want in spec["expected"].items():
                value = got["stages"].get(stage, got["ratios"].get(stage, got["attributes"].get(stage)))
                if want is None:
                    assert value is None, f"{name}: {stage}"
                else:
                    assert value == pytest.approx(want, abs=tol), f"{name}: {stage}"
            assert got["negative"] == spec["negative"]
            assert [h["ts"] for h in got["hops"]] == sorted(e["ts"] for e in joined[rid])
    assert collector.client.get("/v1/requests/never-seen").status_code == 404
    reg = collector.collector.registry
    # e.g. complete_streaming and retry_after_429_then_success: service from the client, model
    # from the engine, replica the engine's; the fixture says which requests have a queue time
    scope = {"service": "kite-chat", "model": "m", "replica": "r1"}
    queued = [
        spec["expected"]["queue"]
        for spec in SPECS
        if spec["expected"].get("queue") is not None and {k: spec["scope"].get(k) for k in scope} == scope
    ]
    assert len(queued) >= 2
    assert reg.get_sample_value("hopline_stage_seconds_count", {"stage": "queue", **scope}) == len(queued)
    assert reg.get_sample_value("hopline_stage_seconds_sum", {"stage": "queue", **scope}) == pytest.approx(
        sum(queued)
    )
    assert reg.get_sample_value("hopline_negative_stages_total", {"stage": "frontend"}) == 1
    assert reg.get_sample_value("hopline_connections_total", {"reused": "false", **scope}) == 1
    # failover: replica is the engine that served the final attempt
    failover = collector.client.get("/v1/requests/gold-failover").json()
    assert failover["replica"] == "r2" and failover["outcome"] == "ok"
    outcomes: dict[str, float] = {}
    for m in reg.collect():
        for s in m.samples if m.name == "hopline_requests" else ():
            if s.name == "hopline_requests_total":
                outcomes[s.labels["outcome"]] = outcomes.get(s.labels["outcome"], 0) + s.value
    assert outcomes.get("ok") == sum(spec["outcome"] == "ok" for spec in SPECS)
    for outcome in ("error", "rejected", "disconnected", "incomplete"):
        assert outcomes.get(outcome, 0) == sum(c["outcome"] == outcome for c in SPECS), outcome


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_joiner(**settings) -> tuple[Joiner, CollectorRegistry, Clock]:
    registry = CollectorRegistry()
    clock = Clock()
    config = parts_config(**settings)
    joiner = Joiner.from_config(config, Recorder.from_config(config, build_metrics(registry)), clock=clock)
    return joiner, registry, clock


def feed(joiner: Joiner, *events: dict) -> None:
    joiner.add([validate_event(e) for e in events])


def test_grace_waits_for_late_stats_and_a_new_attempt_reopens():
    joiner, registry, clock = make_joiner(grace=2.0)
    t = 1767225600.0
    feed(
        joiner,
        event("engine.received", "g1", t, stream=True, replica="r1"),
        event("engine.first_token", "g1", t + 0.1),
    )
    feed(joiner, event("engine.last_token", "g1", t + 1.0, output_tokens=11))
    assert "g1" in joiner.open  # complete, but inside its grace period
    clock.now += 1.0
    feed(joiner, event("engine.stats", "g1", t + 1.01, queue_s=0.03, prefill_s=0.05))
    clock.now += 1.5
    joiner.sweep()
    assert "g1" not in joiner.open
    got = joiner.lookup("g1")
    assert got["stages"]["queue"] == pytest.approx(0.03)  # the late stats were joined
    # a client that retried: attempt 0 failed, attempt 1 arrives within the grace period
    feed(
        joiner,
        event("client.sent", "g2", t, stream=True),
        event("client.error", "g2", t + 0.1, error="ConnectError"),
    )
    clock.now += 1.0
    feed(joiner, event("client.sent", "g2", t + 0.5, attempt=1, stream=True))
    clock.now += 5.0
    joiner.sweep()
    assert "g2" in joiner.open  # attempt 1 has not finished
    feed(
        joiner,
        event("client.first_token", "g2", t + 0.7, attempt=1),
        event("client.last_token", "g2", t + 1.5, attempt=1),
    )
    clock.now += 2.0
    joiner.sweep()
    assert joiner.lookup("g2")["outcome"] == "ok"
    assert (
        registry.get_sample_value(
            "hopline_requests_total",
            {"outcome": "ok", "service": "unknown", "model": "unknown", "replica": "unknown"},
        )
        == 1
    )


def test_expiry_is_sliding_and_counts_the_first_missing_hop():
    joiner, registry, clock = make_joiner(grace=0.0, ttl=60.0)
    t = 1767225600.0
    feed(
        joiner,
        event("client.sent", "x1", t, stream=True, service="svc"),
        event("engine.received", "x1", t + 0.1, stream=True),
    )
    clock.now += 50
    feed(joiner, event("engine.first_token", "x1", t + 0.2))  # activity: the TTL starts again
    clock.now += 50
    joiner.sweep()
    assert "x1" in joiner.open
    clock.now += 11
    joiner.sweep()
    assert "x1" not in joiner.open
    got = joiner.lookup("x1")
    assert (got["state"], got["outcome"]) == ("expired", "incomplete")
    assert got["missing"] == ["client.first_token", "engine.last_token", "client.last_token"]
    assert (
        registry.get_sample_value("hopline_incomplete_requests_total", {"missing": "client.first_token"}) == 1
    )
    assert (
        registry.get_sample_value(
            "hopline_requests_total",
            {"outcome": "incomplete", "service": "svc", "model": "unknown", "replica": "unknown"},
        )
        == 1
    )


def test_open_requests_are_capped_oldest_evicted():
    joiner, registry, _ = make_joiner(grace=0.0, max_open=3, finished_cache=2)
    for i in range(5):
        feed(joiner, event("gateway.received", f"cap{i}", 1767225600.0 + i))
    assert list(joiner.open) == ["cap2", "cap3", "cap4"]
    assert joiner.counts["evicted"] == 2
    assert (
        registry.get_sample_value("hopline_incomplete_requests_total", {"missing": "gateway.forwarded"}) == 2
    )
    assert list(joiner.finished) == ["cap0", "cap1"]


def test_in_flight_and_kv_bytes_follow_engine_hops_in_any_order():
    bpt = 2 * 32 * 8 * 128 * 2  # llama-3-8b-like, bf16: 131072 bytes per token
    joiner, registry, _ = make_joiner(grace=0.0, model_config={"m": bpt})
    t = 1767225600.0
    labels = {"model": "m", "replica": "r1"}
    feed(joiner, event("engine.received", "k1", t, model="m", replica="r1", prompt_tokens=1000, stream=True))
    feed(joiner, event("engine.received", "k2", t, model="m", replica="r1", prompt_tokens=10, stream=True))
    assert registry.get_sample_value("hopline_requests_in_flight", labels) == 2
    assert registry.get_sample_value("hopline_kv_cache_bytes", labels) == 1010 * bpt
    feed(joiner, event("engine.last_token", "k1", t + 2, replica="r1"))
    assert registry.get_sample_value("hopline_requests_in_flight", labels) == 1
    assert registry.get_sample_value("hopline_kv_cache_bytes", labels) == 10 * bpt
    # the final hop before the received one (out of order): nothing is held afterwards
    feed(joiner, event("engine.error", "k3", t + 1, replica="r1", status=500, error="boom"))
    feed(joiner, event("engine.received", "k3", t, model="m", replica="r1", prompt_tokens=5, stream=True))
    assert registry.get_sample_value("hopline_requests_in_flight", labels) == 1
    assert registry.get_sample_value("hopline_kv_cache_bytes", labels) == 10 * bpt


def test_a_pd_prefill_leg_neither_finishes_the_request_nor_shares_the_decode_instances_load():
    """Engine-only P/D (SGLang PD spans, or engines without a client): the prefill instance's last
    token is not the request's end, and each instance holds its own in-flight slot, though both
    legs are attempt 0."""
    joiner, registry, _ = make_joiner(grace=0.0)
    t = 1767225600.0
    feed(joiner, event("engine.received", "pd1", t, model="m", replica="p1", stream=False, leg="prefill"))
    feed(joiner, event("engine.received", "pd1", t + 0.3, model="m", replica="d1", stream=True, leg="decode"))
    assert registry.get_sample_value("hopline_requests_in_flight", {"model": "m", "replica": "p1"}) == 1
    feed(joiner, event("engine.last_token", "pd1", t + 0.25, replica="p1", leg="prefill"))
    assert "pd1" in joiner.open  # the decode instance has not finished
    assert registry.get_sample_value("hopline_requests_in_flight", {"model": "m", "replica": "p1"}) == 0
    assert registry.get_sample_value("hopline_requests_in_flight", {"model": "m", "replica": "d1"}) == 1
    feed(joiner, event("engine.first_token", "pd1", t + 0.4, replica="d1", leg="decode"),
         event("engine.last_token", "pd1", t + 1.4, replica="d1", leg="decode"))  # fmt: skip
    got = joiner.lookup("pd1")
    assert got["state"] == "complete" and got["stages"]["kv_transfer"] == pytest.approx(0.1, abs=1e-6)
    assert got["stages"]["engine"] == pytest.approx(0.25, abs=1e-6) and got["prefill_replica"] == "p1"
    assert registry.get_sample_value("hopline_requests_in_flight", {"model": "m", "replica": "d1"}) == 0


def test_labels_are_capped_to_other():
    joiner, registry, _ = make_joiner(grace=0.0, label_cap=2)
    t = 1767225600.0
    for i in range(4):
        rid = f"svc{i}"
        feed(
            joiner,
            event("client.sent", rid, t, stream=False, service=f"s{i}", conn_reused=True),
            event("client.last_token", rid, t + 1),
        )
    services = {
        s.labels["service"] for m in registry.collect() if m.name == "hopline_requests" for s in m.samples
    }
    assert services == {"s0", "s1", "other"}
    assert (
        registry.get_sample_value(
            "hopline_e2e_seconds_count",
            {"view": "client", "service": "other", "model": "unknown", "replica": "unknown"},
        )
        == 2
    )


@pytest.mark.parametrize(
    ("final", "outcome"),
    [
        (event("client.error", "o", 2.0, status=499, error="disconnected"), "disconnected"),
        (event("client.error", "o", 2.0, status=500, error="http_500"), "error"),
    ],
)
def test_outcome_from_the_outermost_final_hop(final, outcome):
    joiner, _, _ = make_joiner(grace=0.0)
    feed(joiner, event("client.sent", "o", 1.0, stream=True), final)
    assert joiner.lookup("o")["outcome"] == outcome


def test_gateway_rejection_is_rejected():
    joiner, _, _ = make_joiner(grace=0.0)
    feed(
        joiner,
        event("client.sent", "rej", 1.0, stream=True),
        event("gateway.received", "rej", 1.1),
        event("gateway.rejected", "rej", 1.2, status=429, error="http_429"),
        event("client.error", "rej", 1.3, status=429, error="http_429"),
    )
    assert joiner.lookup("rej")["outcome"] == "rejected"


def test_without_max_tokens_counted(tmp_path):
    with serve(CollectorConfig(data_dir=tmp_path / "d", grace=0)) as c:
        events = [
            event(
                "engine.received",
                "mt",
                1767225600.0,
                stream=False,
                max_tokens_set=False,
                replica="r9",
                model="m",
            ),
            event("engine.last_token", "mt", 1767225601.0, replica="r9"),
        ]
        c.client.post("/v1/events", content=ndjson(events), headers={"Content-Type": "application/x-ndjson"})
        text = c.client.get("/metrics").text
        assert (
            'hopline_requests_without_max_tokens_total{model="m",replica="r9",service="unknown"} 1.0' in text
        )
