"""The client transport wrapper with httpx and the OpenAI SDK against a real streaming server."""

from __future__ import annotations

import asyncio
import re

import httpx
import openai
import orjson
import pytest
from fastapi import FastAPI, Request

from hopline.middleware.client import AsyncHoplineTransport, HoplineTransport, instrument, request_id_of

HEX32 = re.compile(r"[0-9a-f]{32}")
BODY = {"model": "tiny", "messages": [{"role": "user", "content": "SECRET"}], "stream": True, "max_tokens": 3,
        "stream_options": {"include_usage": True}}


def echo_app() -> FastAPI:
    """Answers with the hopline headers it received."""
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request) -> dict:
        return {k: request.headers.get(k) for k in ("x-request-id", "x-hopline-attempt", "traceparent")}

    return app


@pytest.fixture(scope="module")
def engine_url(mw):
    with mw.running_server(mw.fake_engine_app()) as url:
        yield url


@pytest.fixture(scope="module")
def engine_tls_url(mw, tls):
    with mw.running_server(mw.fake_engine_app(), tls) as url:
        yield url


@pytest.fixture(scope="module")
def echo_url(mw):
    with mw.running_server(echo_app()) as url:
        yield url


def stream_text(client: httpx.Client, url: str, **kw) -> str:
    with client.stream("POST", url + "/v1/chat/completions", json=BODY, **kw) as r:
        return "".join(r.iter_text())


def test_streaming_request_cold_then_reused_connection(mw, engine_url):
    emitter = mw.memory_emitter(service="app")
    with instrument(httpx.Client(), emitter=emitter) as client:
        texts = [stream_text(client, engine_url) for _ in range(2)]
    events = mw.wait_for(emitter, lambda ev: sum(e["hop"] == "client.last_token" for e in ev) == 2)
    ids = list(dict.fromkeys(e["request_id"] for e in events))
    assert len(ids) == 2 and all(HEX32.fullmatch(i) for i in ids)
    for rid, text in zip(ids, texts):
        assert f'"id":"chatcmpl-{rid}"' in text  # the server received our X-Request-Id
        assert mw.hops_of(events, rid) == ["client.sent", "client.first_token", "client.last_token"]
    cold, warm = (mw.one(events, "client.sent", request_id=i) for i in ids)
    assert {k: cold[k] for k in ("stream", "max_tokens", "max_tokens_set", "model", "attempt", "service")} == {
        "stream": True, "max_tokens": 3, "max_tokens_set": True, "model": "tiny", "attempt": 0, "service": "app"}
    assert cold["conn_reused"] is False and cold["connect_s"] > 0 and cold["pool_wait_s"] >= 0
    assert "tls_s" not in cold  # plain http
    assert warm["conn_reused"] is True and "connect_s" not in warm
    last = mw.one(events, "client.last_token", request_id=ids[0])
    assert (last["output_tokens"], last["output_chunks"], last["finish_reason"]) == (3, 3, "length")
    assert "SECRET" not in orjson.dumps(events).decode()


def test_tls_connection_cost_is_measured(mw, engine_tls_url, tls):
    emitter = mw.memory_emitter()
    with instrument(httpx.Client(verify=tls.client_context), emitter=emitter) as client:
        stream_text(client, engine_tls_url)
        stream_text(client, engine_tls_url)
    events = mw.wait_for(emitter, lambda ev: sum(e["hop"] == "client.last_token" for e in ev) == 2)
    cold, warm = sorted((e for e in events if e["hop"] == "client.sent"), key=lambda e: e["ts"])
    assert cold["tls_s"] > 0 and cold["connect_s"] > 0 and cold["conn_reused"] is False
    assert warm["conn_reused"] is True and "tls_s" not in warm


def test_async_client(mw, engine_url):
    emitter = mw.memory_emitter()

    async def run():
        async with instrument(httpx.AsyncClient(), emitter=emitter) as client:
            async with client.stream("POST", engine_url + "/v1/chat/completions", json=BODY) as r:
                return "".join([t async for t in r.aiter_text()])

    text = asyncio.run(run())
    events = mw.wait_for(emitter, lambda ev: any(e["hop"] == "client.last_token" for e in ev))
    rid = events[0]["request_id"]
    assert f"chatcmpl-{rid}" in text
    assert mw.hops_of(events) == ["client.sent", "client.first_token", "client.last_token"]
    assert mw.one(events, "client.sent")["conn_reused"] is False


def test_headers_set_and_caller_values_kept(mw, echo_url):
    emitter = mw.memory_emitter()
    with instrument(httpx.Client(), emitter=emitter) as client:
        fresh = client.post(echo_url + "/echo", json={}).json()
        own = client.post(echo_url + "/echo", json={}, headers={
            "X-Request-Id": "mine-1", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "x-stainless-retry-count": "2"}).json()
        hostile = client.post(echo_url + "/echo", json={}, headers={"X-Request-Id": "z" * 80}).json()
    assert HEX32.fullmatch(fresh["x-request-id"]) and fresh["x-hopline-attempt"] == "0"
    version, trace_id, span_id, flags = fresh["traceparent"].split("-")
    assert (version, trace_id, len(span_id), flags) == ("00", fresh["x-request-id"], 16, "01")
    assert own == {"x-request-id": "mine-1", "x-hopline-attempt": "2",
                   "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    assert HEX32.fullmatch(hostile["x-request-id"])
    events = mw.wait_for(emitter, lambda ev: sum(e["hop"] == "client.last_token" for e in ev) == 3)
    assert {(e["request_id"], e["attempt"]) for e in events} == {
        (fresh["x-request-id"], 0), ("mine-1", 2), (hostile["x-request-id"], 0)}
    assert "z" * 80 not in orjson.dumps(events).decode()


def test_retries_of_one_logical_call_keep_the_id(mw, echo_url):
    emitter = mw.memory_emitter()
    with instrument(httpx.Client(), emitter=emitter) as client:
        tries = [client.post(echo_url + "/echo", json={"q": 1}, headers={"x-stainless-retry-count": str(n)}).json()
                 for n in range(3)]
        other = client.post(echo_url + "/echo", json={"q": 2}, headers={"x-stainless-retry-count": "0"}).json()
    assert len({t["x-request-id"] for t in tries}) == 1
    assert [t["x-hopline-attempt"] for t in tries] == ["0", "1", "2"]
    assert other["x-request-id"] != tries[0]["x-request-id"]


def test_a_new_task_never_inherits_a_finished_tasks_call(mw, echo_url):
    """Retries are matched within one caller. A task that looks like a retry (attempt 1) of what a
    finished task sent gets its own ID, even when Python gives it the finished task's ``id()``."""
    emitter = mw.memory_emitter()

    async def run() -> list[tuple[str, str]]:
        pairs = []
        async with instrument(httpx.AsyncClient(), emitter=emitter) as client:

            async def post(retry: int) -> str:
                r = await client.post(echo_url + "/echo", json={"q": 1}, headers={"x-stainless-retry-count": str(retry)})
                return r.json()["x-request-id"]

            for _ in range(20):
                first = await asyncio.create_task(post(0))
                # CPython reuses a freed task's memory: after one task in between, the next task
                # usually has the first one's id()
                await asyncio.create_task(asyncio.sleep(0))
                later = await asyncio.create_task(post(1))
                pairs.append((first, later))
            # within one task a retry still keeps its call's ID
            async def one_task() -> tuple[str, str]:
                return await post(0), await post(1)

            pairs.append(await asyncio.create_task(one_task()))
        return pairs

    pairs = asyncio.run(run())
    assert [a == b for a, b in pairs[:-1]] == [False] * 20
    assert pairs[-1][0] == pairs[-1][1]


def test_openai_sdk_retry_after_500(mw, engine_url):
    emitter = mw.memory_emitter()
    client = openai.OpenAI(base_url=engine_url + "/v1", api_key="k", max_retries=2,
                           http_client=instrument(httpx.Client(), emitter=emitter))
    stream = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True, max_tokens=3,
        extra_headers={"x-fake-mode": "fail_once"})
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "tok0 tok1 tok2 "
    events = mw.wait_for(emitter, lambda ev: any(e["hop"] == "client.last_token" for e in ev))
    assert len({e["request_id"] for e in events}) == 1
    assert chunks[0].id == f"chatcmpl-{events[0]['request_id']}"
    assert [(e["hop"], e["attempt"]) for e in sorted(events, key=lambda e: e["ts"])] == [
        ("client.sent", 0), ("client.error", 0), ("client.sent", 1), ("client.first_token", 1), ("client.last_token", 1)]
    assert mw.one(events, "client.error")["status"] == 500


def test_a_calls_request_id_is_easy_to_get(mw, engine_url):
    """From an OpenAI SDK raw response or a plain httpx response: the ID hopline's events carry."""
    emitter = mw.memory_emitter()
    http = instrument(httpx.Client(), emitter=emitter)
    client = openai.OpenAI(base_url=engine_url + "/v1", api_key="k", max_retries=0, http_client=http)
    raw = client.chat.completions.with_raw_response.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    events = mw.wait_for(emitter, lambda ev: any(e["hop"] == "client.last_token" for e in ev))
    assert request_id_of(raw) == events[0]["request_id"]
    plain = http.post(engine_url + "/v1/chat/completions", json={"model": "tiny", "messages": [], "max_tokens": 1})
    assert request_id_of(plain) == plain.request.headers["x-request-id"] and request_id_of(object()) is None


def test_connection_error_is_reported_and_reraised(mw):
    emitter = mw.memory_emitter()
    with instrument(httpx.Client(), emitter=emitter) as client:
        with pytest.raises(httpx.ConnectError):
            client.post(mw.closed_port_url() + "/v1/chat/completions", json=BODY)
    events = mw.events_of(emitter)
    assert mw.hops_of(events) == ["client.sent", "client.error"]
    assert mw.one(events, "client.error")["error"] == "ConnectError"


def test_http_error_error_event_and_cancelled_stream(mw, engine_url):
    emitter = mw.memory_emitter()
    with instrument(httpx.Client(), emitter=emitter) as client:
        failed = client.post(engine_url + "/v1/chat/completions", json=BODY, headers={"x-fake-mode": "fail_once", "X-Request-Id": "h"})
        assert failed.status_code == 500
        stream_text(client, engine_url, headers={"x-fake-mode": "error_in_stream", "X-Request-Id": "s"})
        with client.stream("POST", engine_url + "/v1/chat/completions", json=BODY | {"max_tokens": 40},
                           headers={"x-fake-mode": "slow", "X-Request-Id": "c"}) as r:
            lines = r.iter_lines()
            while "tok0" not in next(lines):
                pass
    events = mw.wait_for(emitter, lambda ev: sum(e["hop"] == "client.error" for e in ev) == 3)
    assert (mw.one(events, "client.error", request_id="h")["status"], mw.one(events, "client.error", request_id="h")["error"]) == (500, "http_500")
    assert mw.hops_of(events, "s") == ["client.sent", "client.first_token", "client.error"]
    assert mw.one(events, "client.error", request_id="s")["error"] == "stream_error:InternalServerError"
    assert mw.hops_of(events, "c") == ["client.sent", "client.first_token", "client.error"]
    assert mw.one(events, "client.error", request_id="c")["error"] == "cancelled"


def test_non_streaming_json_response(mw, engine_url):
    emitter = mw.memory_emitter()
    with instrument(httpx.Client(), emitter=emitter) as client:
        r = client.post(engine_url + "/v1/chat/completions", json=BODY | {"stream": False, "max_tokens": 5})
    assert r.json()["usage"]["completion_tokens"] == 5
    events = mw.wait_for(emitter, lambda ev: any(e["hop"] == "client.last_token" for e in ev))
    assert mw.hops_of(events) == ["client.sent", "client.last_token"]
    assert mw.one(events, "client.sent")["stream"] is False
    last = mw.one(events, "client.last_token")
    assert (last["output_tokens"], last["finish_reason"]) == (5, "length")


def test_mounts_are_wrapped_once_and_user_trace_still_called(mw, echo_url):
    emitter = mw.memory_emitter()
    client = httpx.Client(mounts={"http://127.0.0.1": httpx.HTTPTransport()})
    instrument(instrument(client, emitter=emitter), emitter=emitter)
    mounted = next(iter(client._mounts.values()))
    assert isinstance(mounted, HoplineTransport) and not isinstance(mounted.transport, HoplineTransport)
    assert not isinstance(client._transport.transport, HoplineTransport)
    seen = []
    client.post(echo_url + "/echo", json={}, extensions={"trace": lambda name, info: seen.append(name)})
    client.close()
    assert "connection.connect_tcp.complete" in seen
    events = mw.wait_for(emitter, lambda ev: any(e["hop"] == "client.last_token" for e in ev))
    assert mw.one(events, "client.sent")["conn_reused"] is False
    assert isinstance(instrument(httpx.AsyncClient(), emitter=emitter)._transport, AsyncHoplineTransport)
    with pytest.raises(TypeError, match="httpx.Client"):
        instrument(object(), emitter=emitter)  # type: ignore[type-var]


def test_openai_default_clients_built_on_httpx2(mw, engine_url):
    """openai >= 3 builds its default clients on httpx2; instrument() takes those too."""
    emitter = mw.memory_emitter()
    client = openai.OpenAI(base_url=engine_url + "/v1", api_key="k", max_retries=1,
                           http_client=instrument(openai.DefaultHttpxClient(), emitter=emitter))
    chunks = list(client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True, max_tokens=2,
        extra_headers={"x-fake-mode": "fail_once"}))
    client.close()

    async def run_async() -> list:
        http = instrument(openai.DefaultAsyncHttpxClient(), emitter=emitter)
        async with openai.AsyncOpenAI(base_url=engine_url + "/v1", api_key="k", http_client=http) as sdk:
            return [c async for c in await sdk.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True, max_tokens=2)]

    async_chunks = asyncio.run(run_async())
    sync_id, async_id = rid_of(chunks[0]), rid_of(async_chunks[0])
    events = mw.wait_for(emitter, lambda ev: sum(e["hop"] == "client.last_token" for e in ev) == 2)
    assert [(e["hop"], e["attempt"]) for e in sorted(events, key=lambda e: e["ts"]) if e["request_id"] == sync_id] == [
        ("client.sent", 0), ("client.error", 0), ("client.sent", 1), ("client.first_token", 1), ("client.last_token", 1)]
    assert mw.hops_of(events, async_id) == ["client.sent", "client.first_token", "client.last_token"]
    assert mw.one(events, "client.sent", request_id=async_id)["conn_reused"] is False


def rid_of(chunk) -> str:
    return chunk.id.removeprefix("chatcmpl-")
