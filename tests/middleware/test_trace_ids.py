"""Events carry the W3C trace ID (the second join key): client, gateway and engine, real servers.

hopline's client sends a ``traceparent`` (its own or the caller's) and puts its trace ID on every
event; the gateway and engine middleware read the incoming one, and the gateway forwards it, so
an OTel engine span and hopline's events of one request share a trace.
"""

from __future__ import annotations

import httpx
import pytest
from hopline.middleware.client import instrument
from hopline.middleware.contract import EventError, validate_event
from hopline.middleware.engine import EngineMiddleware

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 4}
CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def two_ends(events) -> bool:
    return sum(e["hop"].endswith("last_token") for e in events) == 2


def test_client_events_carry_the_trace_of_the_traceparent_they_sent(mw):
    client_events, engine_events = mw.memory_emitter(), mw.memory_emitter(replica="r1")
    with mw.running_server(EngineMiddleware(mw.fake_engine_app(), emitter=engine_events)) as engine_url:
        with instrument(httpx.Client(), emitter=client_events) as client:
            fresh = client.post(engine_url + "/v1/chat/completions", json=BODY)
            own = client.post(engine_url + "/v1/chat/completions", json=BODY,
                              headers={"X-Request-Id": "mine-1", "traceparent": CALLER})
            assert fresh.status_code == own.status_code == 200
        events = mw.wait_for(client_events, two_ends) + mw.wait_for(engine_events, two_ends)
    traces: dict[str, set] = {}
    for e in events:
        traces.setdefault(e["request_id"], set()).add((e["hop"].split(".")[0], e.get("trace_id")))
    (fresh_id,) = set(traces) - {"mine-1"}
    # a fresh call: hopline made the traceparent, its trace ID is the request ID; the engine saw it
    assert traces[fresh_id] == {("client", fresh_id), ("engine", fresh_id)}
    assert traces["mine-1"] == {("client", "0af7651916cd43dd8448eb211c80319c"), ("engine", "0af7651916cd43dd8448eb211c80319c")}
    assert all(validate_event(e) for e in events)


def test_gateway_and_engine_events_carry_the_incoming_trace_and_the_gateway_forwards_it(mw):
    engine_events = mw.memory_emitter(replica="r1")
    gateway_events = mw.memory_emitter(service="gw")
    with mw.running_server(EngineMiddleware(mw.fake_engine_app(), emitter=engine_events)) as engine_url:  # noqa: SIM117
        with mw.running_server(mw.fake_gateway_app([("r1", engine_url)], gateway_events)) as gateway_url:
            r = httpx.post(gateway_url + "/v1/chat/completions", json=BODY, headers={"traceparent": CALLER})
            plain = httpx.post(gateway_url + "/v1/chat/completions", json=BODY, headers={"traceparent": "garbage"})
            assert r.status_code == plain.status_code == 200
    g = mw.wait_for(gateway_events, two_ends)
    e = mw.wait_for(engine_events, two_ends)
    traced = [ev for ev in g + e if ev["request_id"] == r.headers["x-request-id"]]
    untraced = [ev for ev in g + e if ev["request_id"] == plain.headers["x-request-id"]]
    assert {ev["hop"].split(".")[0] for ev in traced} == {"gateway", "engine"}
    # the engine saw the trace only because the gateway forwarded the header
    assert {ev.get("trace_id") for ev in traced} == {"0af7651916cd43dd8448eb211c80319c"}
    assert {ev.get("trace_id") for ev in untraced} == {None}  # a malformed traceparent is no trace


@pytest.mark.parametrize("bad", ["0" * 32, "0AF7651916CD43DD8448EB211C80319C", "abc", 12])
def test_contract_rejects_a_malformed_trace_id(bad):
    with pytest.raises(EventError, match="trace_id"):
        validate_event({"ts": 1.0, "request_id": "r", "hop": "client.sent", "trace_id": bad})
