"""The simulated engine: the serving arithmetic it promises (batch cap, KV budget, chunked prefill,
max_tokens) and the OpenAI wire format, on a real uvicorn server with hopline's engine middleware."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import orjson
import pytest
from hopline.demo.engine_sim import (
    Engine,
    EngineConfig,
    Scheduler,
    SimRequest,
    create_app,
    estimate_prompt_tokens,
)
from hopline.demo.wiring import WARMUP_PREFIX, engine_middleware, make_emitter
from hopline.middleware import clock
from support.events import events_of, memory_emitter
from support.servers import wait_until
from support.servers import running_server

FAST = {"step_base_s": 0.002, "step_per_seq_s": 0.0, "prefill_per_token_s": 0.000001, "frontend_s": 0.0}


def test_kv_budget_comes_from_the_model_shape() -> None:
    # Llama-3-8B in bf16: 2 * 32 layers * 8 KV heads * 128 * 2 bytes = 131072 bytes per token;
    # 24 GiB * 0.9 - 16e9 bytes of weights = 7192823398.4 bytes -> 54876 tokens.
    config = EngineConfig()
    assert config.model.kv.bytes_per_token == 131072
    assert config.kv_budget_tokens == 54876


def test_prompt_tokens_are_estimated_from_message_length() -> None:
    # 3 template tokens + per message 4 + ceil(chars / 4)
    assert estimate_prompt_tokens([{"role": "user", "content": "x" * 400}]) == 3 + 4 + 100
    assert (
        estimate_prompt_tokens([{"role": "system", "content": "ab"}, {"role": "user", "content": ""}])
        == 3 + 5 + 5
    )


def _request(rid: str, prompt: int, target: int, limit: int = 10_000) -> SimRequest:
    return SimRequest(rid, 0, True, prompt, 0, limit, True, target, clock.now())


def _scheduler(finished: list[SimRequest], **overrides: object) -> Scheduler:
    return Scheduler(EngineConfig(**{**FAST, **overrides}), replica="r1", on_finished=finished.append)


def test_plan_without_chunked_prefill_puts_a_whole_prompt_in_one_step() -> None:
    for chunked, expected_steps in ((False, 1), (True, 12)):
        s = _scheduler([], chunked_prefill=chunked, max_num_batched_tokens=1024)
        s.running = [_request("decoding", 100, 50), _request("huge", 12_000, 10)]
        s.running[0].prefill_left = 0  # already decoding
        s.running[1].prefill_left = 12_000
        steps, per_step = 0, []
        while s.running[1].prefill_left:
            decoding, _, tokens = s._plan()
            assert [r.request_id for r in decoding] == ["decoding"]  # decodes never wait for prefill
            per_step.append(tokens)
            steps += 1
        assert steps == expected_steps
        # with chunked prefill no step carries more than the budget (minus the decoding sequence)
        assert max(per_step) == (12_000 if not chunked else 1023)


async def _run_until_done(s: Scheduler, requests: list[SimRequest], finished: list[SimRequest]) -> None:
    loop = asyncio.create_task(s.run())
    for r in requests:
        s.submit(r)
    try:
        while len(finished) < len(requests):
            await asyncio.sleep(0.005)
    finally:
        loop.cancel()


def test_batch_cap_makes_later_requests_wait() -> None:
    finished: list[SimRequest] = []
    s = _scheduler(finished, max_num_seqs=2)
    requests = [_request(f"q{i}", 50, 5) for i in range(6)]
    asyncio.run(_run_until_done(s, requests, finished))
    # never more than two at once: request i+2 is scheduled only after request i finished
    by_id = {r.request_id: r for r in finished}
    for i in range(4):
        assert by_id[f"q{i + 2}"].scheduled >= min(by_id[f"q{i}"].last_token, by_id[f"q{i + 1}"].last_token)
    assert all(r.generated == 5 and r.finish_reason == "stop" for r in finished)


def test_kv_budget_makes_requests_wait_for_memory() -> None:
    finished: list[SimRequest] = []
    # budget: max_model_len is the floor; a 4096-token context with 1500-token prompts fits two
    s = _scheduler(finished, gpu_memory_gib=1.0, max_model_len=4096, max_num_seqs=32)
    assert s.config.kv_budget_tokens == 4096
    requests = [_request(f"m{i}", 1500, 20) for i in range(3)]
    asyncio.run(_run_until_done(s, requests, finished))
    by_id = {r.request_id: r for r in finished}
    assert by_id["m2"].scheduled >= min(by_id["m0"].last_token, by_id["m1"].last_token)


def test_max_tokens_cuts_the_answer_with_finish_reason_length() -> None:
    finished: list[SimRequest] = []
    s = _scheduler(finished)
    asyncio.run(
        _run_until_done(s, [_request("cut", 20, target=7, limit=7), _request("free", 20, target=7)], finished)
    )
    reasons = {r.request_id: (r.finish_reason, r.generated) for r in finished}
    assert reasons == {"cut": ("length", 7), "free": ("stop", 7)}


def test_stream_interval_sends_the_first_token_alone_then_every_nth() -> None:
    """``stream_interval=4`` (SGLang's --stream-interval): the stream is told of token 1 at once
    (TTFT unchanged), then of tokens 4, 8, 12, and of the last one (10 tokens: 1, 4, 8, 10)."""
    finished: list[SimRequest] = []
    s = _scheduler(finished, stream_interval=4)
    r = _request("r", 20, target=10)
    asyncio.run(_run_until_done(s, [r], finished))
    told = []
    while not r.outbox.empty():
        told.append(r.outbox.get_nowait())
    assert len(told) == 4 + 1  # 4 chunk signals, then the end (None)
    assert told[0] == r.first_token and told[-2] == r.last_token and told[-1] is None


def _sse_events(body: str) -> list[str]:
    return [line.removeprefix("data: ") for line in body.split("\n\n") if line.startswith("data: ")]


@pytest.fixture
def engine_url(tmp_path: Path):
    emitter = memory_emitter(service="engine", replica="r1", model="sim-llama-3-8b")
    engine = Engine(
        EngineConfig(**FAST, seed=3), replica="r1", emitter=emitter, truth_path=tmp_path / "truth.jsonl"
    )
    with running_server(engine_middleware(create_app(engine), emitter)) as url:
        yield url, emitter, tmp_path / "truth.jsonl"


def test_streaming_follows_the_openai_chunk_format(engine_url) -> None:
    url, emitter, truth_path = engine_url
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "y" * 800}],
        "max_tokens": 40,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    response = httpx.post(
        f"{url}/v1/chat/completions", json=body, headers={"x-request-id": "abc123"}, timeout=10
    )
    assert response.headers["content-type"].startswith("text/event-stream")
    events = _sse_events(response.text)
    assert events[-1] == "[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    finish = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == []
    assert len(finish) == 1 and finish[0] is chunks[-2]
    tokens = sum(c["choices"][0]["delta"]["content"].count(" ") for c in content)  # one word per token
    assert usage["completion_tokens"] == tokens <= 40
    assert usage["prompt_tokens"] == 3 + 4 + 200
    assert {c["id"] for c in chunks} == {"chatcmpl-abc123"}
    assert finish[0]["choices"][0]["finish_reason"] == ("length" if tokens == 40 else "stop")

    # the engine's own hops (middleware) and engine.stats (as the vLLM plugin) for the same ID
    events = [e for e in events_of(emitter) if e["request_id"] == "abc123"]
    hops = {e["hop"]: e for e in events}
    assert {"engine.received", "engine.first_token", "engine.last_token", "engine.stats"} <= set(hops)
    # the truth line is written off the response path (call_soon after the stream's end): it may
    # come a moment after the client read the body
    lines = wait_until("the request's truth line", lambda: truth_path.read_bytes().splitlines(), timeout=10)
    truth = orjson.loads(lines[-1])
    stats = hops["engine.stats"]
    assert truth["request_id"] == "abc123"
    assert (stats["queue_s"], stats["prefill_s"], stats["decode_s"]) == (
        truth["queue_s"],
        truth["prefill_s"],
        truth["decode_s"],
    )
    assert stats["output_tokens"] == truth["output_tokens"] == tokens
    assert (
        truth["received"]
        <= truth["queued"]
        <= truth["scheduled"]
        <= truth["first_token"]
        <= truth["last_token"]
    )


def test_non_streaming_and_bad_requests(engine_url) -> None:
    url, _, _ = engine_url
    ok = httpx.post(
        f"{url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        timeout=10,
    )
    data = ok.json()
    assert data["object"] == "chat.completion"
    assert data["usage"]["completion_tokens"] <= 3
    assert data["choices"][0]["message"]["role"] == "assistant"
    assert httpx.post(f"{url}/v1/chat/completions", content=b"{", timeout=10).status_code == 400
    too_long = {"messages": [{"role": "user", "content": "z" * 4 * 20_000}]}
    assert httpx.post(f"{url}/v1/chat/completions", json=too_long, timeout=10).status_code == 400


def test_the_demos_warm_up_requests_leave_no_event() -> None:
    """The demo's emitter drops the warm-up's events at every funnel: the middleware's own events,
    those it builds later on the emitter's worker, and engine.stats (``wiring.DemoEmitter``)."""
    emitter = make_emitter(None, service="engine", replica="r1", model="sim-llama-3-8b")
    engine = Engine(EngineConfig(**FAST, seed=3), replica="r1", emitter=emitter, truth_path=None)
    ids = (f"{WARMUP_PREFIX}1", "measured-1", f"{WARMUP_PREFIX}2", "measured-2")
    with running_server(engine_middleware(create_app(engine), emitter)) as url:
        for rid in ids:  # streamed and not
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": rid[-1] == "1"}
            response = httpx.post(
                f"{url}/v1/chat/completions", json=body, headers={"x-request-id": rid}, timeout=10
            )
            assert response.status_code == 200

        def both_stats() -> list[dict] | None:
            events = events_of(emitter)
            return events if sum(e["hop"] == "engine.stats" for e in events) >= 2 else None

        events = wait_until("the measured requests' engine.stats", both_stats, timeout=10)
    assert {e["request_id"] for e in events} == {"measured-1", "measured-2"}
    hops = {(e["request_id"], e["hop"]) for e in events}
    streamed = ("engine.received", "engine.first_token", "engine.last_token", "engine.stats")
    assert {("measured-1", hop) for hop in streamed} <= hops
