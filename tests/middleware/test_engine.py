"""EngineMiddleware on a real uvicorn server in front of a vLLM-shaped fake engine."""

from __future__ import annotations

import asyncio
import hashlib
import re

import httpx
import orjson
import pytest

from hopline.middleware import emit
from hopline.middleware.attempts import ATTEMPTS, AttemptRegistry
from hopline.middleware.emit import Emitter
from hopline.middleware.engine import DEFAULT_ROUTES, EngineMiddleware
from hopline.middleware.vllm_stats import HoplineStatLogger

HEX32 = re.compile(r"[0-9a-f]{32}")


def chat_body(**overrides: object) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": "SECRET PROMPT"}], "stream": True,
            "max_tokens": 4, "stream_options": {"include_usage": True}, **overrides}


def chunk_ids(text: str) -> set[str]:
    return {orjson.loads(line[6:])["id"] for line in text.splitlines() if line.startswith("data: {")}


@pytest.fixture
def engine(mw):
    """(base URL, emitter) of a fake engine behind EngineMiddleware."""
    emitter = mw.memory_emitter(service="engine", replica="r1", model="tiny")
    app = EngineMiddleware(mw.fake_engine_app(), emitter=emitter)
    with mw.running_server(app) as url:
        yield url, emitter


def test_streaming_request_without_id_gets_one_that_the_engine_uses(mw, engine):
    url, emitter = engine
    r = httpx.post(url + "/v1/chat/completions", json=chat_body())
    assert r.status_code == 200
    events = mw.wait_for(emitter, lambda ev: any(e["hop"] == "engine.last_token" for e in ev))
    rid = events[0]["request_id"]
    assert HEX32.fullmatch(rid)
    assert chunk_ids(r.text) == {f"chatcmpl-{rid}"}  # vLLM's own ID is built from the inserted header
    assert mw.hops_of(events) == ["engine.received", "engine.first_token", "engine.last_token"]
    received = mw.one(events, "engine.received")
    assert {k: received.get(k) for k in ("stream", "max_tokens", "max_tokens_set", "route", "replica", "model", "attempt")} == {
        "stream": True, "max_tokens": 4, "max_tokens_set": True, "route": "/v1/chat/completions",
        "replica": "r1", "model": "tiny", "attempt": 0,
    }
    assert "n" not in received and "prompt_tokens" not in received
    last = mw.one(events, "engine.last_token")
    assert (last["output_tokens"], last["output_chunks"], last["finish_reason"]) == (4, 4, "length")
    assert last["max_gap_s"] >= 0 and last["max_gap_at"] >= mw.one(events, "engine.first_token")["ts"]
    assert "SECRET" not in orjson.dumps(events).decode()


def test_incoming_id_and_attempt_are_kept(mw, engine):
    url, emitter = engine
    r = httpx.post(url + "/v1/completions", json=chat_body(stream=False, max_tokens=None, max_completion_tokens=3),
                   headers={"X-Request-Id": "cmpl-req-42", "X-Hopline-Attempt": "2"})
    assert r.json()["id"] == "chatcmpl-req-42"  # normalized (prefix stripped) before the engine saw it
    assert r.headers.get_list("x-request-id") == ["req-42"]  # echoed once: the caller can look it up
    events = mw.wait_for(emitter, lambda ev: len(ev) == 2)
    assert {(e["hop"], e["request_id"], e["attempt"]) for e in events} == {
        ("engine.received", "req-42", 2), ("engine.last_token", "req-42", 2)}
    received, last = mw.one(events, "engine.received"), mw.one(events, "engine.last_token")
    assert (received["stream"], received["max_tokens"], received["route"]) == (False, 3, "/v1/completions")
    assert (last["output_tokens"], last["finish_reason"]) == (3, "length")


@pytest.mark.parametrize("hostile", ["x" * 65, "id with spaces", "a<script>b", "é-unicode"])
def test_hostile_request_id_is_replaced_and_never_logged(mw, engine, hostile, capfd):
    url, emitter = engine
    r = httpx.post(url + "/v1/chat/completions", json=chat_body(), headers={"X-Request-Id": hostile.encode("utf-8")})
    events = mw.wait_for(emitter, lambda ev: any(e["hop"] == "engine.last_token" for e in ev))
    rid = events[0]["request_id"]
    assert HEX32.fullmatch(rid) and chunk_ids(r.text) == {f"chatcmpl-{rid}"}
    assert r.headers["x-request-id"] == rid  # the ID hopline gave it, not the hostile one
    out, err = capfd.readouterr()
    assert hostile not in out + err + orjson.dumps(events).decode()


def test_other_routes_pass_through_untouched(mw, engine):
    url, emitter = engine
    assert httpx.get(url + "/health").status_code == 200
    assert httpx.post(url + "/v1/embeddings", json={}).status_code == 404
    assert httpx.post(url + "/v1/chat/completions", json=chat_body(max_tokens=1)).status_code == 200
    events = mw.wait_for(emitter, lambda ev: any(e["hop"] == "engine.last_token" for e in ev))
    assert {e["route"] for e in events if e["hop"] == "engine.received"} == {"/v1/chat/completions"}
    assert len(events) == 3


def test_huge_and_non_json_bodies_reach_the_app_intact(mw, engine):
    url, emitter = engine
    for body in (b"{" + b"x" * (3 << 20), b"\x00\xffnot json at all"):
        r = httpx.post(url + "/v1/chat/completions", content=body, headers={"x-fake-mode": "body_digest"})
        assert r.json()["size"] == len(body)
        assert r.json()["sha256"] == hashlib.sha256(body).hexdigest()
    events = mw.wait_for(emitter, lambda ev: sum(e["hop"] == "engine.last_token" for e in ev) == 2)
    for received in (e for e in events if e["hop"] == "engine.received"):
        assert "stream" not in received and "max_tokens" not in received  # unknown, not guessed


def test_error_event_inside_a_200_stream(mw, engine):
    url, emitter = engine
    r = httpx.post(url + "/v1/chat/completions", json=chat_body(max_tokens=6), headers={"x-fake-mode": "error_in_stream"})
    assert r.status_code == 200
    events = mw.wait_for(emitter, lambda ev: any(e["hop"] == "engine.error" for e in ev))
    assert mw.hops_of(events) == ["engine.received", "engine.first_token", "engine.error"]
    error = mw.one(events, "engine.error")
    assert (error["status"], error["error"]) == (500, "stream_error:InternalServerError")
    assert "engine died" not in orjson.dumps(events).decode()


def test_client_disconnect_mid_stream(mw, engine):
    url, emitter = engine
    with httpx.Client() as client:
        with client.stream("POST", url + "/v1/chat/completions", json=chat_body(max_tokens=40),
                           headers={"x-fake-mode": "slow"}) as r:
            lines = r.iter_lines()
            while "tok1" not in next(lines):
                pass
    events = mw.wait_for(emitter, lambda ev: any(e["hop"] == "engine.error" for e in ev))
    assert mw.hops_of(events) == ["engine.received", "engine.first_token", "engine.error"]
    assert mw.one(events, "engine.error")["error"] == "disconnected"


async def _raising_app(scope, receive, send):
    await receive()
    raise LookupError("app bug")


def test_app_exception_is_reraised_unchanged_and_reported(mw):
    emitter = mw.memory_emitter()
    middleware = EngineMiddleware(_raising_app, emitter=emitter)
    scope = {"type": "http", "path": "/v1/chat/completions", "headers": [(b"x-request-id", b"r-1")]}
    sent = []

    async def receive():
        return {"type": "http.request", "body": orjson.dumps(chat_body()), "more_body": False}

    async def send(message):
        sent.append(message)

    with pytest.raises(LookupError, match="app bug"):
        asyncio.run(middleware(scope, receive, send))
    events = mw.events_of(emitter)
    assert mw.hops_of(events) == ["engine.received", "engine.error"]
    assert (mw.one(events, "engine.error")["status"], mw.one(events, "engine.error")["error"]) == (500, "exception:LookupError")
    with mw.running_server(middleware) as url:
        assert httpx.post(url + "/v1/chat/completions", json=chat_body()).status_code == 500


class BrokenSink:
    def write(self, batch):
        raise OSError("disk full")

    def flush(self):
        raise OSError("disk full")

    def close(self):
        pass


def test_a_sink_that_cannot_write_does_not_affect_the_app(mw):
    emitter = Emitter(BrokenSink(), flush_interval=0.01)
    with mw.running_server(EngineMiddleware(mw.fake_engine_app(), emitter=emitter)) as url:
        for _ in range(3):
            r = httpx.post(url + "/v1/chat/completions", json=chat_body())
            assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
    emitter.flush()
    assert emitter.dropped_sink == 9  # 3 requests x (received, first_token, last_token)
    emitter.close()  # not left to the exit hook, whose flush would warn after the session


def test_constructed_with_only_the_app_uses_environment(mw, monkeypatch):
    emitter = mw.memory_emitter()
    monkeypatch.setattr(emit, "_default", emitter)
    monkeypatch.setenv("HOPLINE_ENGINE_ROUTES", " /generate , /v1/completions")
    middleware = EngineMiddleware(mw.fake_engine_app())
    assert middleware.emitter is emitter
    assert middleware.routes == {"/generate", "/v1/completions"}
    monkeypatch.delenv("HOPLINE_ENGINE_ROUTES")
    assert EngineMiddleware(mw.fake_engine_app()).routes == set(DEFAULT_ROUTES)
    with mw.running_server(middleware) as url:
        httpx.post(url + "/v1/chat/completions", json=chat_body())  # not a configured route
        httpx.post(url + "/v1/completions", json=chat_body())
    events = mw.wait_for(emitter, lambda ev: any(e["hop"] == "engine.last_token" for e in ev))
    assert {e["route"] for e in events if e["hop"] == "engine.received"} == {"/v1/completions"}


def test_failover_attempt_is_handed_to_the_vllm_stat_logger(mw):
    """The middleware and the stat logger share one AttemptRegistry: engine.stats learn the attempt."""
    emitter = mw.memory_emitter(service="engine", replica="r1", model="tiny")
    attempts = AttemptRegistry()
    app = EngineMiddleware(mw.fake_engine_app(), emitter=emitter, attempts=attempts)
    with mw.running_server(app) as url:
        # no stat logger attached to the registry (not a vLLM server): nothing is remembered
        headers = {"X-Request-Id": "req-12", "X-Hopline-Attempt": "3"}
        assert httpx.post(url + "/v1/chat/completions", json=chat_body(), headers=headers).status_code == 200
        assert len(attempts) == 0
        stat_logger = HoplineStatLogger(None, emitter=emitter, attempts=attempts)
        for rid, attempt in (("req-9", "2"), ("req-10", "0"), ("req-11", None)):
            headers = {"X-Request-Id": rid} | ({"X-Hopline-Attempt": attempt} if attempt else {})
            assert httpx.post(url + "/v1/chat/completions", json=chat_body(), headers=headers).status_code == 200
    assert len(attempts) == 1 and attempts.get("req-9") == 2  # attempt 0 (or none) is the default
    assert stat_logger.attempts is attempts
    events = mw.wait_for(emitter, lambda ev: sum(e["hop"] == "engine.last_token" for e in ev) == 4)
    assert {(e["request_id"], e["attempt"]) for e in events} == {("req-9", 2), ("req-10", 0), ("req-11", 0), ("req-12", 3)}


def test_a_pd_leg_header_tags_every_engine_event_and_the_vllm_stats(mw):
    """A P/D proxy's ``X-Hopline-Leg`` (GatewayHops.forwarded(leg=...)): every engine event of the
    request carries the leg, and the stat logger's engine.stats too (through the AttemptRegistry),
    so the contract reads a prefill leg as ``prefill.*``; an unknown leg is ignored."""
    emitter = mw.memory_emitter(service="engine", replica="p1", model="tiny")
    attempts = AttemptRegistry()
    app = EngineMiddleware(mw.fake_engine_app(), emitter=emitter, attempts=attempts)
    stat_logger = HoplineStatLogger(None, emitter=emitter, attempts=attempts)
    with mw.running_server(app) as url:
        for rid, leg in (("pd-p", "prefill"), ("pd-d", "decode"), ("pd-x", "encode")):
            headers = {"X-Request-Id": rid, "X-Hopline-Leg": leg}
            assert httpx.post(url + "/v1/chat/completions", json=chat_body(), headers=headers).status_code == 200
    assert (attempts.leg("pd-p"), attempts.get("pd-p"), attempts.leg("pd-d"), attempts.leg("pd-x")) == ("prefill", None, "decode", None)
    assert stat_logger.attempts is attempts
    events = mw.wait_for(emitter, lambda ev: sum(e["hop"] == "engine.last_token" for e in ev) == 3)
    legs = {(e["request_id"], e["hop"]): e.get("leg") for e in events}
    assert {legs[rid, hop] for rid in ("pd-p",) for hop in ("engine.received", "engine.first_token", "engine.last_token")} == {"prefill"}
    assert legs["pd-d", "engine.last_token"] == "decode" and legs["pd-x", "engine.received"] is None


def test_middleware_and_stat_logger_share_the_default_registry(mw):
    """vLLM constructs both itself, without arguments: they meet in the process-wide ATTEMPTS."""
    assert EngineMiddleware(mw.fake_engine_app(), emitter=mw.memory_emitter()).attempts is ATTEMPTS
    assert HoplineStatLogger(None, emitter=mw.memory_emitter()).attempts is ATTEMPTS


def _sse(obj: dict) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _delta(delta: dict, finish: str | None = None) -> bytes:
    return _sse({"id": "chatcmpl-b", "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]})


# After the role chunk and a first plain content chunk: plain chunks, chunks a byte template cannot
# settle (a quote in the text, an empty text, a reasoning delta, two events in one message, an event
# split over two messages) and a comment line; 8 of each kind of the 7 with output.
MIXED = [
    part
    for i in range(8)
    for part in (
        _delta({"content": f" w{i}"}),
        _delta({"content": f'say "{i}"'}),
        _delta({"content": ""}),
        _delta({"reasoning_content": f"r{i}"}),
        _delta({"content": "a"}) + _delta({"content": "b"}),
        _delta({"content": "split"})[:20],
        _delta({"content": "split"})[20:],
        b": keep-alive\n\n",
    )
]
MIXED_OUTPUTS = 1 + 8 * 6  # the first content chunk, then per round: w, say, reasoning, a+b (2), split


def _drive(middleware: EngineMiddleware, parts: list[bytes], pause_before: int | None = None) -> None:
    """One streaming request through ``middleware`` on a fresh event loop, ``parts`` as body messages."""

    async def app(scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for i, part in enumerate(parts):
            if i == pause_before:
                await asyncio.sleep(0.05)
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def receive():
        return {"type": "http.request", "body": orjson.dumps(chat_body()), "more_body": False}

    async def send(message):
        pass

    scope = {"type": "http", "path": "/v1/chat/completions", "headers": [(b"x-request-id", b"r-batch")]}
    asyncio.run(EngineMiddleware(app, emitter=middleware.emitter)(scope, receive, send))


def test_chunks_after_the_first_token_are_read_off_the_request_path_and_exactly(mw, monkeypatch):
    """Only the chunks up to the first token are parsed on the event loop's thread; the rest are
    kept and read on the emitter's worker, with the same counts, gap and finish as reading each."""
    from hopline.middleware.sse import StreamReader

    parsed_on: list[bool] = []  # per parsed event: inside the request's event loop?
    dispatch = StreamReader._dispatch

    def spy(self, *args):
        parsed_on.append(asyncio._get_running_loop() is not None)
        return dispatch(self, *args)

    monkeypatch.setattr(StreamReader, "_dispatch", spy)
    emitter = mw.memory_emitter()
    head = [_delta({"role": "assistant", "content": ""}), _delta({"content": "first"})]
    tail = [_delta({}, "length"), _sse({"id": "chatcmpl-b", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 77}}),
            b"data: [DONE]\n\n"]
    parts = head + MIXED + tail
    _drive(EngineMiddleware(None, emitter=emitter), parts, pause_before=len(head) + 17)
    events = mw.wait_for(emitter, lambda ev: any(e["hop"] == "engine.last_token" for e in ev))
    assert mw.hops_of(events) == ["engine.received", "engine.first_token", "engine.last_token"]
    last = mw.one(events, "engine.last_token")
    assert (last["output_chunks"], last["output_tokens"], last["finish_reason"]) == (MIXED_OUTPUTS, 77, "length")
    # the 50 ms pause came before part 17 of MIXED (a "say" chunk, with output) after part 14 (a+b)
    assert last["max_gap_s"] >= 0.05 and mw.one(events, "engine.first_token")["ts"] < last["max_gap_at"] < last["ts"] - 0.05
    assert parsed_on[:2] == [True, True]  # the role chunk and the first content chunk: on the request path
    assert len(parsed_on) > 2 + 8 * 3 and not any(parsed_on[2:])  # every later one after it, off the loop


def test_an_error_event_after_many_chunks_is_exact_and_memory_stays_bounded(mw):
    """Past MAX_KEPT_CHUNKS the kept chunks are read on the spot (a request holds at most that
    many); an error event inside the 200 stream still ends it as engine.error at its own time."""
    from hopline.middleware import asgi

    emitter = mw.memory_emitter()
    kept_sizes: list[int] = []
    original = asgi.Exchange._read_kept

    def spy(self):
        kept_sizes.append(len(self._kept))
        original(self)

    head = [_delta({"role": "assistant", "content": ""}), _delta({"content": "first"})]
    plain = [_delta({"content": f" w{i}"}) for i in range(3 * asgi.MAX_KEPT_CHUNKS)]
    error = _sse({"error": {"message": "engine died SECRET", "type": "InternalServerError", "code": 500}})
    parts = head + plain + [error] + plain[:10] + [b"data: [DONE]\n\n"]
    asgi.Exchange._read_kept = spy
    try:
        _drive(EngineMiddleware(None, emitter=emitter), parts)
    finally:
        asgi.Exchange._read_kept = original
    assert kept_sizes == [asgi.MAX_KEPT_CHUNKS] * 3  # read on the spot three times, each a full batch
    events = mw.wait_for(emitter, lambda ev: any(e["hop"] == "engine.error" for e in ev))
    assert mw.hops_of(events) == ["engine.received", "engine.first_token", "engine.error"]
    failure = mw.one(events, "engine.error")
    assert (failure["error"], failure["status"]) == ("stream_error:InternalServerError", 500)
    assert "SECRET" not in orjson.dumps(events).decode()


HEADER_CASES = [
    [],
    [(b"host", b"h"), (b"content-type", b"application/json")],
    [(b"x-request-id", b"abc-1"), (b"x-hopline-attempt", b"2")],
    [(b"x-request-id", b"a"), (b"x-request-id", b"b"), (b"x-hopline-attempt", b"1"), (b"x-hopline-attempt", b"x")],
    [(b"traceparent", b"00-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01"), (b"traceparent", b"00-" + b"3" * 32 + b"-" + b"4" * 16 + b"-01")],
    [(b"traceparent", b"garbage"), (b"traceparent", b"00-" + b"3" * 32 + b"-" + b"4" * 16 + b"-01")],
    [(b"x-hopline-leg", b" Prefill "), (b"x-hopline-leg", b"decode")],
    [(b"x-hopline-leg", b"sideways"), (b"x-request-id", b"\xff\xfe"), (b"traceparent", b"ff-" + b"1" * 32 + b"-" + b"2" * 16 + b"-01")],
]


@pytest.mark.parametrize("headers", HEADER_CASES)
def test_the_one_pass_header_scan_reads_what_the_three_readers_read(headers):
    """The engine's setup reads its four headers in one pass; the values (and so every event)
    must be those the separate readers give (the last ID and attempt, the first traceparent and leg)."""
    from hopline.middleware.asgi import leg_in, leg_of, read_request_headers, scan_request_headers, traceparent_in
    from hopline.middleware.contract import trace_id_of

    scope = {"type": "http", "headers": headers}
    rid, attempt, trace, leg = scan_request_headers(scope)
    assert (rid, attempt) == read_request_headers(scope)
    assert (None if trace is None else trace_id_of(trace)) == traceparent_in(scope)[1]
    assert leg_of(leg) == leg_in(scope)


@pytest.mark.parametrize("headers", [None, [], [(b"content-type", b"text/event-stream")],
                                     [(b"X-Request-Id", b"other"), (b"a", b"b")],
                                     [(b"x-request-id", b"rid1")], [(b"x-request-id", b"rid1"), (b"x-request-id", b"rid1")]])
def test_echo_and_inserted_id_are_the_same_headers_as_the_filtering_path(headers):
    """The fast paths (no ``x-request-id`` there: append without filtering) give the headers the
    filtering path gives."""
    from hopline.middleware.asgi import REQUEST_ID_HEADER, echo_request_id, with_request_id

    message = {"type": "http.response.start", "status": 200}
    if headers is not None:
        message["headers"] = list(headers)
    echo_request_id(message, "rid1")
    expected = [(k, v) for k, v in headers or () if k.lower() != REQUEST_ID_HEADER] + [(REQUEST_ID_HEADER, b"rid1")]
    if [v for k, v in headers or () if k.lower() == REQUEST_ID_HEADER] == [b"rid1"]:
        expected = list(headers)  # the app already answers with it: left as it was
    assert list(message["headers"]) == expected
    scope = {"type": "http", "path": "/x", "headers": [(k, v) for k, v in headers or () if k != REQUEST_ID_HEADER]}
    assert with_request_id(scope, "rid1", present=False) == with_request_id(scope, "rid1")
    assert scope["headers"] == [(k, v) for k, v in headers or () if k != REQUEST_ID_HEADER]  # the caller's scope untouched
