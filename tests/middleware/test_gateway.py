"""GatewayMiddleware and hops(request) on a real gateway relaying a real (fake) engine over HTTP."""

from __future__ import annotations

import asyncio
import re

import httpx
import orjson
import pytest

from hopline.middleware import emit
from hopline.middleware.engine import EngineMiddleware
from hopline.middleware.gateway import GatewayHops, GatewayMiddleware, hops

HEX32 = re.compile(r"[0-9a-f]{32}")
BODY = {"model": "tiny", "messages": [{"role": "user", "content": "SECRET"}], "stream": True, "max_tokens": 4,
        "stream_options": {"include_usage": True}}


@pytest.fixture
def stack(mw):
    """A gateway forwarding to an engine: (gateway URL, gateway emitter, engine emitter, engine URL)."""
    engine_events = mw.memory_emitter(replica="r1")
    gateway_events = mw.memory_emitter(service="gw")
    with mw.running_server(EngineMiddleware(mw.fake_engine_app(), emitter=engine_events)) as engine_url:
        with mw.running_server(mw.fake_gateway_app([("r1", engine_url)], gateway_events)) as gateway_url:
            yield gateway_url, gateway_events, engine_events, engine_url


def finished(hop):
    return lambda events: any(e["hop"] == hop for e in events)


def test_streaming_request_hops_ids_and_echo(mw, stack):
    url, gw, eng, _ = stack
    r = httpx.post(url + "/v1/chat/completions", json=BODY)
    assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
    rid = r.headers["x-request-id"]
    assert HEX32.fullmatch(rid)
    g = mw.wait_for(gw, finished("gateway.last_token"))
    e = mw.wait_for(eng, finished("engine.last_token"))
    assert mw.hops_of(g) == ["gateway.received", "gateway.admitted", "gateway.forwarded",
                             "gateway.first_token", "gateway.last_token"]
    assert {ev["request_id"] for ev in g + e} == {rid}
    assert {ev["attempt"] for ev in g + e} == {0}
    assert mw.one(g, "gateway.forwarded")["upstream"] == "r1"
    last = mw.one(g, "gateway.last_token")
    assert (last["output_tokens"], last["output_chunks"], last["finish_reason"], last["service"]) == (4, 4, "length", "gw")
    # the gateway relays: its first token comes after the engine's, its end after the engine's end
    assert mw.one(g, "gateway.first_token")["ts"] >= mw.one(e, "engine.first_token")["ts"]
    assert mw.one(g, "gateway.forwarded")["ts"] <= mw.one(e, "engine.received")["ts"]


def test_incoming_id_and_attempt_are_kept(mw, stack):
    url, gw, eng, _ = stack
    r = httpx.post(url + "/v1/chat/completions", json=BODY, headers={"X-Request-Id": "call-7", "X-Hopline-Attempt": "1"})
    assert r.headers["x-request-id"] == "call-7"
    g = mw.wait_for(gw, finished("gateway.last_token"))
    e = mw.wait_for(eng, finished("engine.last_token"))
    assert {(ev["request_id"], ev["attempt"]) for ev in g + e} == {("call-7", 1)}


@pytest.mark.parametrize("hostile", ["y" * 65, "bad id", "a\"b"])
def test_hostile_request_id_is_replaced_echoed_and_never_logged(mw, stack, hostile, capfd):
    url, gw, eng, _ = stack
    r = httpx.post(url + "/v1/chat/completions", json=BODY, headers={"X-Request-Id": hostile})
    rid = r.headers["x-request-id"]
    assert HEX32.fullmatch(rid)
    g = mw.wait_for(gw, finished("gateway.last_token"))
    e = mw.wait_for(eng, finished("engine.last_token"))
    assert {ev["request_id"] for ev in g + e} == {rid}
    out, err = capfd.readouterr()
    assert hostile not in out + err + orjson.dumps(g + e).decode()


def test_failover_counts_attempts(mw):
    gw, eng = mw.memory_emitter(), mw.memory_emitter()
    with mw.running_server(EngineMiddleware(mw.fake_engine_app(), emitter=eng)) as engine_url:
        upstreams = [("r0", mw.closed_port_url()), ("r1", engine_url)]
        with mw.running_server(mw.fake_gateway_app(upstreams, gw)) as url:
            assert httpx.post(url + "/v1/chat/completions", json=BODY).status_code == 200
    g = mw.wait_for(gw, finished("gateway.last_token"))
    e = mw.wait_for(eng, finished("engine.last_token"))
    forwards = sorted((ev["attempt"], ev["upstream"]) for ev in g if ev["hop"] == "gateway.forwarded")
    assert forwards == [(0, "r0"), (1, "r1")]
    assert mw.one(g, "gateway.received")["attempt"] == 0
    assert mw.one(g, "gateway.first_token")["attempt"] == 1 and mw.one(g, "gateway.last_token")["attempt"] == 1
    assert {ev["attempt"] for ev in e} == {1}


@pytest.mark.parametrize(("headers", "status"), [({"Authorization": "Bearer bad"}, 401), ({"x-fake-limit": "1"}, 429)])
def test_rejections(mw, stack, headers, status):
    url, gw, _, _ = stack
    r = httpx.post(url + "/v1/chat/completions", json=BODY, headers=headers)
    assert r.status_code == status
    g = mw.wait_for(gw, finished("gateway.rejected"))
    assert mw.hops_of(g) == ["gateway.received", "gateway.rejected"]
    assert mw.one(g, "gateway.rejected")["status"] == status
    assert g[0]["request_id"] == r.headers["x-request-id"]


def test_upstream_500_and_error_inside_200_stream(mw, stack):
    url, gw, _, _ = stack
    r = httpx.post(url + "/v1/chat/completions", json=BODY, headers={"x-fake-mode": "fail_once", "X-Request-Id": "f-1"})
    assert r.status_code == 500
    r = httpx.post(url + "/v1/chat/completions", json=BODY | {"max_tokens": 6},
                   headers={"x-fake-mode": "error_in_stream", "X-Request-Id": "s-1"})
    assert r.status_code == 200
    g = mw.wait_for(gw, lambda ev: sum(e["hop"] == "gateway.error" for e in ev) == 2)
    assert mw.one(g, "gateway.error", request_id="f-1")["status"] == 500
    assert mw.hops_of(g, "s-1")[-2:] == ["gateway.first_token", "gateway.error"]
    assert mw.one(g, "gateway.error", request_id="s-1")["error"] == "stream_error:InternalServerError"


def test_client_disconnect_mid_stream_reaches_gateway_and_engine(mw, stack):
    url, gw, eng, _ = stack
    with httpx.Client() as client:
        with client.stream("POST", url + "/v1/chat/completions", json=BODY | {"max_tokens": 40},
                           headers={"x-fake-mode": "slow"}) as r:
            lines = r.iter_lines()
            while "tok1" not in next(lines):
                pass
    g = mw.wait_for(gw, finished("gateway.error"))
    e = mw.wait_for(eng, finished("engine.error"))
    assert mw.one(g, "gateway.error")["error"] == "disconnected"
    assert mw.one(e, "engine.error")["error"] == "disconnected"
    assert "gateway.last_token" not in mw.hops_of(g)


def test_app_exception_is_reraised_unchanged_and_reported(mw, stack):
    url, gw, _, _ = stack
    assert httpx.post(url + "/boom", json={}).status_code == 500
    g = mw.wait_for(gw, finished("gateway.error"))
    assert mw.hops_of(g) == ["gateway.received", "gateway.admitted", "gateway.error"]
    assert (mw.one(g, "gateway.error")["status"], mw.one(g, "gateway.error")["error"]) == (500, "exception:RuntimeError")

    async def app(scope, receive, send):
        raise KeyError("bug")

    direct = GatewayMiddleware(app, emitter=mw.memory_emitter())
    with pytest.raises(KeyError, match="bug"):
        asyncio.run(direct({"type": "http", "headers": []}, None, None))


def test_hops_accepts_a_scope_and_works_without_the_middleware(mw, monkeypatch):
    emitter = mw.memory_emitter()
    monkeypatch.setattr(emit, "_default", emitter)
    scope = {"type": "http", "headers": [(b"x-request-id", b"abc"), (b"x-hopline-attempt", b"3")]}
    h = hops(scope)
    assert isinstance(h, GatewayHops) and hops(scope) is h
    assert (h.request_id, h.attempt) == ("abc", 3)
    h.admitted()
    assert h.forwarded("r9") == {"X-Request-Id": "abc", "X-Hopline-Attempt": "3"}
    assert h.forwarded("r8") == {"X-Request-Id": "abc", "X-Hopline-Attempt": "4"}
    assert h.attempt == 4
    events = mw.events_of(emitter)
    assert [(e["hop"], e["attempt"], e.get("upstream")) for e in events] == [
        ("gateway.admitted", 3, None), ("gateway.forwarded", 3, "r9"), ("gateway.forwarded", 4, "r8")]


def test_health_checks_pass_through_unobserved(mw):
    calls = []

    async def app(scope, receive, send):
        calls.append((scope["path"], dict(scope["headers"]).get(b"x-request-id")))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    emitter = mw.memory_emitter()
    gateway = GatewayMiddleware(app, emitter=emitter)

    async def call(path):
        sent = []

        async def send(message):
            sent.append(message)

        await gateway({"type": "http", "path": path, "headers": []}, None, send)
        return sent

    asyncio.run(call("/health"))
    asyncio.run(call("/v1/chat/completions"))
    emitter.flush()
    # /health got no request ID and no events; the chat route got both
    assert calls[0] == ("/health", None)
    assert calls[1][0] == "/v1/chat/completions" and HEX32.fullmatch(calls[1][1].decode())
    assert {e["hop"] for e in mw.events_of(emitter)} == {"gateway.received", "gateway.last_token"}


def test_a_pd_proxy_forwards_each_leg_in_one_attempt_and_names_it(mw, monkeypatch):
    """vLLM's disaggregated-serving proxy sends a request to a prefill instance, then to a decode
    instance: one ``forwarded(leg=...)`` per leg, both attempt 0 (neither is a failover); a
    retried decode leg is the next attempt. The headers tell each engine its leg."""
    emitter = mw.memory_emitter()
    monkeypatch.setattr(emit, "_default", emitter)
    h = hops({"type": "http", "headers": [(b"x-request-id", b"pd-1")]})
    assert h.forwarded("p1", leg="prefill") == {"X-Request-Id": "pd-1", "X-Hopline-Attempt": "0", "X-Hopline-Leg": "prefill"}
    assert h.forwarded("d2", leg="decode") == {"X-Request-Id": "pd-1", "X-Hopline-Attempt": "0", "X-Hopline-Leg": "decode"}
    assert h.forwarded("d3", leg="decode")["X-Hopline-Attempt"] == "1"
    events = mw.events_of(emitter)
    assert [(e["attempt"], e["upstream"], e["leg"]) for e in events] == [(0, "p1", "prefill"), (0, "d2", "decode"), (1, "d3", "decode")]
    with pytest.raises(ValueError, match="leg must be one of prefill, decode, got 'encode'"):
        h.forwarded("x", leg="encode")
