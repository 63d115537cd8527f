"""The trace rule in the streaming join: a stand-in joins its trace's only owner whichever comes first."""

from __future__ import annotations

import itertools

import pytest
from hopline.collector.join import Joiner
from hopline.collector.metrics import Recorder, build_metrics
from hopline.middleware.contract import validate_event
from prometheus_client import CollectorRegistry
from support.collector import parts_config

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
STAND_IN = f"trace:{TRACE}:cccccccccccccccc"


def ev(rid, hop, ts, **kw):
    return validate_event({"ts": ts, "request_id": rid, "hop": hop, "trace_id": TRACE, **kw})


CLIENT = [ev(STAND_IN, "client.sent", 100.0, stream=True), ev(STAND_IN, "client.first_token", 100.5),
          ev(STAND_IN, "client.last_token", 102.0)]
ENGINE = [ev("eng-1", "engine.received", 100.1), ev("eng-1", "engine.first_token", 100.4),
          ev("eng-1", "engine.last_token", 101.9)]


def joiner():
    config = parts_config(grace=60.0)
    return Joiner.from_config(config, Recorder.from_config(config, build_metrics(CollectorRegistry())))


@pytest.mark.parametrize("order", ["client_first", "engine_first", "interleaved"])
def test_a_stand_in_joins_the_trace_owner_in_any_order(order):
    j = joiner()
    batches = {"client_first": [CLIENT, ENGINE], "engine_first": [ENGINE, CLIENT],
               "interleaved": [[e] for pair in itertools.zip_longest(CLIENT, ENGINE) for e in pair if e]}[order]
    for batch in batches:
        j.add(list(batch))
    assert list(j.open) == ["eng-1"]
    got = j.lookup("eng-1")
    assert [h["hop"] for h in got["hops"]] == ["client.sent", "engine.received", "engine.first_token",
                                               "client.first_token", "engine.last_token", "client.last_token"]
    assert got["stages"]["client_ttft"] == pytest.approx(0.5)
    assert got["stages"]["network"] == pytest.approx(0.2)  # 0.5 - engine_ttft 0.3


def test_a_stand_in_in_a_trace_with_two_owners_stays_apart():
    j = joiner()
    other = [ev("eng-2", "engine.received", 100.2), ev("eng-2", "engine.last_token", 101.0)]
    j.add(ENGINE + other + CLIENT)
    assert sorted(j.open) == sorted(["eng-1", "eng-2", STAND_IN])
    assert {h["hop"] for h in j.lookup(STAND_IN)["hops"]} == {"client.sent", "client.first_token", "client.last_token"}
