"""End to end: the OpenAI SDK through ``instrument`` -> TLS -> gateway -> TLS -> engine, all real servers.

One request's events from the three components must form the complete hop sequence, carry the
same request ID, and give ``compute_stages`` every stage it can compute without engine internals.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest

from hopline.middleware.client import instrument
from hopline.middleware.contract import compute_stages, negative_stages, validate_event
from hopline.middleware.emit import Emitter
from hopline.middleware.engine import EngineMiddleware
from hopline.middleware.sinks import HttpSink
from support.servers import wait_until

CLIENT_HOPS = ["client.sent", "client.first_token", "client.last_token"]
GATEWAY_HOPS = ["gateway.received", "gateway.admitted", "gateway.forwarded", "gateway.first_token", "gateway.last_token"]
ENGINE_HOPS = ["engine.received", "engine.first_token", "engine.last_token"]
MESSAGES = [{"role": "user", "content": "SECRET"}]


@dataclass
class Stack:
    gateway_url: str
    client: Emitter
    gateway: Emitter
    engine: Emitter
    verify: object

    def events(self, request_id: str, done: int = 3) -> list[dict]:
        """All events of one request once ``done`` components said their final word."""
        finals = {"client.last_token", "client.error", "gateway.last_token", "gateway.error", "gateway.rejected",
                  "engine.last_token", "engine.error"}
        found: list[dict] = []

        def complete() -> bool:
            for emitter in (self.client, self.gateway, self.engine):
                emitter.flush()
            found[:] = [e for em in (self.client, self.gateway, self.engine) for e in em.sink.events
                        if e["request_id"] == request_id]
            return sum(e["hop"] in finals for e in found) >= done

        wait_until("the events", complete, timeout=5.0, interval=0.02)
        return found

    def openai(self, **kw) -> openai.OpenAI:
        http = instrument(httpx.Client(verify=self.verify), emitter=self.client)
        return openai.OpenAI(base_url=self.gateway_url + "/v1", api_key="k", http_client=http, **kw)


@pytest.fixture(scope="module")
def stack(mw, tls) -> Iterator[Stack]:
    client = mw.memory_emitter(service="kite-chat")
    gateway = mw.memory_emitter(service="gateway", replica="gw-0")
    engine = mw.memory_emitter(service="engine", replica="r1", model="tiny")
    with mw.running_server(EngineMiddleware(mw.fake_engine_app(), emitter=engine), tls) as engine_url:
        gateway_app = mw.fake_gateway_app([("r1", engine_url)], gateway, verify=tls.client_context)
        with mw.running_server(gateway_app, tls) as gateway_url:
            yield Stack(gateway_url, client, gateway, engine, tls.client_context)


def by_component(events: list[dict], prefix: str) -> list[dict]:
    return sorted((e for e in events if e["hop"].startswith(prefix)), key=lambda e: e["ts"])


def rid_of(chunk) -> str:
    return chunk.id.removeprefix("chatcmpl-")


def test_full_requests_cold_then_reused_connection(stack):
    # AsyncOpenAI: its sync twin (openai 3.57) closes an HTTP/1.1 stream at [DONE] without draining
    # it, so httpcore cannot reuse the connection; the async stream drains it first.
    async def run() -> list[str]:
        http = instrument(httpx.AsyncClient(verify=stack.verify), emitter=stack.client)
        async with openai.AsyncOpenAI(base_url=stack.gateway_url + "/v1", api_key="k", http_client=http) as sdk:
            ids = []
            for _ in range(2):
                stream = await sdk.chat.completions.create(model="tiny", messages=MESSAGES, stream=True, max_tokens=4,
                                                           stream_options={"include_usage": True})
                chunks = [c async for c in stream]
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
                assert text == "tok0 tok1 tok2 tok3 "
                ids.append(rid_of(chunks[0]))
            return ids

    ids = asyncio.run(run())
    sent = []
    for rid in ids:
        events = stack.events(rid)
        assert [e["hop"] for e in by_component(events, "client.")] == CLIENT_HOPS
        assert [e["hop"] for e in by_component(events, "gateway.")] == GATEWAY_HOPS
        assert [e["hop"] for e in by_component(events, "engine.")] == ENGINE_HOPS
        assert {e["attempt"] for e in events} == {0}
        assert {e["service"] for e in events} == {"kite-chat", "gateway", "engine"}
        sent.append(next(e for e in events if e["hop"] == "client.sent"))
        attrs = {e["hop"]: e for e in events}
        assert (attrs["client.sent"]["stream"], attrs["client.sent"]["max_tokens"], attrs["client.sent"]["model"]) == (True, 4, "tiny")
        assert attrs["gateway.forwarded"]["upstream"] == "r1"
        assert (attrs["engine.received"]["stream"], attrs["engine.received"]["replica"]) == (True, "r1")
        for view in ("client", "gateway", "engine"):
            last = attrs[f"{view}.last_token"]
            assert (last["output_tokens"], last["output_chunks"], last["finish_reason"]) == (4, 4, "length")

        stages = compute_stages([validate_event(e) for e in events])
        for name in ("client_ttft", "gateway_ttft", "engine_ttft", "client_delay", "connect", "network", "gateway",
                     "engine", "client_e2e", "decode"):
            assert stages[name] is not None, name
        assert stages["queue"] is None and stages["prefill"] is None  # no engine.stats in this stack
        total = stages["client_delay"] + stages["connect"] + stages["network"] + stages["gateway"] + stages["engine"]
        assert stages["client_ttft"] == pytest.approx(total, abs=1e-9)
        assert stages["engine"] == stages["engine_ttft"]
        assert negative_stages(stages) == []
    cold, warm = sent
    assert cold["conn_reused"] is False and cold["tls_s"] > 0 and cold["connect_s"] > 0
    assert warm["conn_reused"] is True and "tls_s" not in warm and "connect_s" not in warm


def test_retried_request_keeps_its_id_and_counts_attempts(stack):
    sdk = stack.openai(max_retries=2)
    chunks = list(sdk.chat.completions.create(model="tiny", messages=MESSAGES, stream=True, max_tokens=3,
                                              extra_headers={"x-fake-mode": "fail_once"}))
    sdk.close()
    rid = rid_of(chunks[0])
    events = stack.events(rid, done=6)
    seq = [(e["hop"], e["attempt"]) for e in by_component(events, "client.")]
    assert seq == [("client.sent", 0), ("client.error", 0), ("client.sent", 1), ("client.first_token", 1), ("client.last_token", 1)]
    assert [(e["hop"], e["attempt"]) for e in by_component(events, "gateway.")] == [
        ("gateway.received", 0), ("gateway.admitted", 0), ("gateway.forwarded", 0), ("gateway.error", 0),
        ("gateway.received", 1), ("gateway.admitted", 1), ("gateway.forwarded", 1), ("gateway.first_token", 1),
        ("gateway.last_token", 1)]
    assert [(e["hop"], e["attempt"]) for e in by_component(events, "engine.")] == [
        ("engine.received", 0), ("engine.error", 0), ("engine.received", 1), ("engine.first_token", 1), ("engine.last_token", 1)]
    assert {e.get("status") for e in events if e["hop"].endswith(".error")} == {500}
    stages = compute_stages([validate_event(e) for e in events])
    assert stages["client_ttft"] is not None and stages["network"] is not None and negative_stages(stages) == []


def test_mid_stream_disconnect(stack):
    sdk = stack.openai()
    stream = sdk.chat.completions.create(model="tiny", messages=MESSAGES, stream=True, max_tokens=40,
                                         extra_headers={"x-fake-mode": "slow"})
    first = next(c for c in stream if c.choices and c.choices[0].delta.content)
    stream.close()
    sdk.close()
    events = stack.events(rid_of(first))
    finals = {e["hop"]: e["error"] for e in events if e["hop"].endswith(".error")}
    assert finals == {"client.error": "cancelled", "gateway.error": "disconnected", "engine.error": "disconnected"}
    assert not any(e["hop"].endswith(".last_token") for e in events)


def test_error_inside_a_200_stream(stack):
    sdk = stack.openai()
    stream = sdk.chat.completions.create(model="tiny", messages=MESSAGES, stream=True, max_tokens=6,
                                         extra_headers={"x-fake-mode": "error_in_stream"})
    seen = []
    with pytest.raises(openai.APIError):
        for chunk in stream:
            seen.append(chunk)
    sdk.close()
    events = stack.events(rid_of(seen[0]))
    assert {e["hop"]: (e["error"], e["status"]) for e in events if e["hop"].endswith(".error")} == {
        view: ("stream_error:InternalServerError", 500) for view in ("client.error", "gateway.error", "engine.error")}
    assert [e["hop"] for e in by_component(events, "client.")] == ["client.sent", "client.first_token", "client.error"]


def test_sync_openai_client(stack):
    sdk = stack.openai()
    chunks = list(sdk.chat.completions.create(model="tiny", messages=MESSAGES, stream=True, max_tokens=2))
    sdk.close()
    events = stack.events(rid_of(chunks[0]))
    assert [e["hop"] for e in by_component(events, "client.")] == CLIENT_HOPS
    assert [e["hop"] for e in by_component(events, "gateway.")] == GATEWAY_HOPS
    assert [e["hop"] for e in by_component(events, "engine.")] == ENGINE_HOPS
    last = next(e for e in events if e["hop"] == "client.last_token")
    assert (last["output_chunks"], last["finish_reason"]) == (2, "length")
    assert "output_tokens" not in last  # no usage chunk was asked for: unknown, not guessed


def test_http_sink_to_a_closed_port_does_not_stop_the_service(mw, tls):
    dead = Emitter(HttpSink(mw.closed_port_url(), retry_budget=0.3, backoff=(0.05, 0.1)), flush_interval=0.02)
    with mw.running_server(EngineMiddleware(mw.fake_engine_app(), emitter=dead), tls) as url:
        with httpx.Client(verify=tls.client_context) as client:
            for _ in range(5):
                r = client.post(url + "/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES,
                                                                     "stream": True, "max_tokens": 3})
                assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
    wait_until("the dropped hops", lambda: dead.dropped_sink == 15, timeout=5.0)  # 5 requests x 3 engine hops
    assert dead.sent == 0
    dead.close(timeout=1)
