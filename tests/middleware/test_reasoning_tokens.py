"""A reasoning model's reasoning tokens, as the engine's usage counts them: vLLM (with a
``--reasoning-parser``) and OpenAI put ``usage.completion_tokens_details.reasoning_tokens`` in the
final usage chunk of a stream and in a non-streaming body; SGLang puts ``usage.reasoning_tokens``.
Read as ``reasoning_tokens`` on the ``*.last_token``; where no usage says it, it is absent (never
estimated from the reasoning deltas), and no text is ever kept."""

from __future__ import annotations

from types import SimpleNamespace

import httpx
import orjson
import pytest
from hopline.middleware.contract import validate_event
from hopline.middleware.engine import EngineMiddleware
from hopline.middleware.sse import StreamReader, reasoning_count, response_summary


def event(obj: object) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def chat(delta: dict | None, finish: str | None = None, **extra: object) -> bytes:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return event({"id": "chatcmpl-x", "object": "chat.completion.chunk", "choices": choices, **extra})


def usage(reasoning: int | None, completion: int = 9, **more: object) -> dict:
    """vLLM's final usage (``UsageInfo``): ``completion_tokens_details`` only with a reasoning parser."""
    out: dict = {"prompt_tokens": 5, "completion_tokens": completion, "total_tokens": 5 + completion, **more}
    if reasoning is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return out


def reasoning_stream(final_usage: dict | None) -> list[bytes]:
    """A vLLM-shaped reasoning stream: role, 3 reasoning deltas, 2 content deltas, finish, usage, [DONE]."""
    chunks = [chat({"role": "assistant", "content": ""})]
    chunks += [chat({"reasoning": f"THOUGHT {i}"}) for i in range(3)]
    chunks += [chat({"content": "ANSWER"}), chat({"content": " TEXT"}), chat({}, "stop")]
    if final_usage is not None:
        chunks.append(chat(None, usage=final_usage))
    return [*chunks, b"data: [DONE]\n\n"]


def read(chunks: list[bytes]) -> StreamReader:
    reader = StreamReader()
    for i, chunk in enumerate(chunks):
        reader.feed(chunk, float(i))
    return reader


def test_the_final_usage_chunk_of_a_vllm_stream_gives_the_reasoning_count():
    reader = read(reasoning_stream(usage(6, completion=9)))
    summary = reader.summary()
    assert (summary["output_tokens"], summary["reasoning_tokens"]) == (9, 6)  # content: 3 tokens
    assert summary["first_reasoning_at"] == 1.0 and summary["first_content_at"] == 4.0
    assert "THOUGHT" not in str(summary) and "ANSWER" not in str(summary)


def test_split_and_merged_network_chunks_read_the_same_count():
    whole = b"".join(reasoning_stream(usage(6)))
    for cut in (7, 50, len(whole) - 40, len(whole) - 20):
        reader = read([whole[:cut], whole[cut:]])
        assert (reader.output_tokens, reader.reasoning_tokens) == (9, 6), cut


def test_a_reasoning_parser_that_saw_no_reasoning_reports_zero_and_zero_is_kept():
    """vLLM fills the field whenever a reasoning parser is set: 0 means the model did not think."""
    reader = read(reasoning_stream(usage(0, completion=4)))
    assert reader.summary()["reasoning_tokens"] == 0


def test_reasoning_deltas_without_a_count_leave_it_unknown():
    """No reasoning parser's count (an older vLLM, no completion_tokens_details), or no usage at all:
    the reasoning deltas are there, the count is not estimated from them."""
    for final in (usage(None), None):
        reader = read(reasoning_stream(final))
        assert reader.first_reasoning_at == 1.0
        assert reader.reasoning_tokens is None and "reasoning_tokens" not in reader.summary()


def test_continuous_usage_keeps_the_last_chunks_count():
    """With ``stream_options.continuous_usage_stats`` every chunk carries the usage so far."""
    chunks = [
        chat({"role": "assistant", "content": ""}, usage=usage(0, completion=0)),
        chat({"reasoning": "a"}, usage=usage(1, completion=1)),
        chat({"reasoning": "b"}, usage=usage(2, completion=2)),
        chat({"content": "c"}, "stop", usage=usage(2, completion=3)),
        b"data: [DONE]\n\n",
    ]
    reader = read(chunks)
    assert (reader.output_tokens, reader.reasoning_tokens) == (3, 2)


def test_sglang_reports_it_at_the_top_of_usage_and_its_default_zero_says_nothing():
    """SGLang's UsageInfo has ``reasoning_tokens`` (default 0, also where nothing counted) next
    to ``completion_tokens``; its ``completion_tokens_details`` holds only spec-decode counts."""
    assert read(reasoning_stream(usage(None, reasoning_tokens=6))).reasoning_tokens == 6
    assert read(reasoning_stream(usage(None, reasoning_tokens=0))).reasoning_tokens is None
    spec_only = usage(None, reasoning_tokens=4, completion_tokens_details={"accepted_prediction_tokens": 3})
    assert read(reasoning_stream(spec_only)).reasoning_tokens == 4


@pytest.mark.parametrize("bad", [-1, "6", 6.0, True, None, [6]])
def test_a_count_that_is_not_a_non_negative_integer_is_left_out(bad):
    assert reasoning_count({"completion_tokens_details": {"reasoning_tokens": bad}}) is None
    assert reasoning_count({"completion_tokens": 9, "completion_tokens_details": bad}) is None
    final = usage(None, completion_tokens_details={"reasoning_tokens": bad})
    assert read(reasoning_stream(final)).reasoning_tokens is None


def test_a_non_streaming_response_gives_it_from_its_usage():
    body = {
        "id": "chatcmpl-x", "object": "chat.completion",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "reasoning": "THOUGHT", "content": "ANSWER"}}],
        "usage": usage(120, completion=150),
    }  # fmt: skip
    summary = response_summary(orjson.dumps(body))
    expected = {"output_tokens": 150, "reasoning_tokens": 120, "prompt_tokens": 5, "finish_reason": "stop"}
    assert summary == expected
    del body["usage"]["completion_tokens_details"]
    assert "reasoning_tokens" not in response_summary(orjson.dumps(body))


def test_a_gateways_parsed_chunk_objects_give_it_too():
    """LiteLLM hands its callbacks objects: ``usage.completion_tokens_details.reasoning_tokens``."""
    reader = StreamReader()
    delta = SimpleNamespace(content=None, reasoning_content="THOUGHT", tool_calls=None, function_call=None)
    choice = SimpleNamespace(delta=delta, finish_reason=None)
    reader.feed_object(SimpleNamespace(choices=[choice], usage=None), 1.0)
    details = SimpleNamespace(reasoning_tokens=7)
    final = SimpleNamespace(prompt_tokens=5, completion_tokens=10, completion_tokens_details=details)
    reader.feed_object(SimpleNamespace(choices=[], usage=final), 2.0)
    assert (reader.summary()["output_tokens"], reader.summary()["reasoning_tokens"]) == (10, 7)


def test_the_contract_accepts_it_as_an_integer_attribute_of_a_last_token():
    ev = {"v": 1, "ts": 1.0, "request_id": "r1", "hop": "engine.last_token", "output_tokens": 9,
          "reasoning_tokens": 6}  # fmt: skip
    assert validate_event(ev)["reasoning_tokens"] == 6
    with pytest.raises(ValueError, match="reasoning_tokens"):
        validate_event({**ev, "reasoning_tokens": "6"})


def _reasoning_engine(stream: bool):
    """A vLLM-shaped engine serving a reasoning model with a reasoning parser (ASGI, no framework)."""

    async def app(scope, receive, send):
        await receive()
        if stream:
            headers, parts = [(b"content-type", b"text/event-stream")], reasoning_stream(usage(6))
        else:
            choice = {"index": 0, "message": {"content": "ANSWER"}, "finish_reason": "stop"}
            body = {"id": "chatcmpl-x", "choices": [choice], "usage": usage(6)}
            headers, parts = [(b"content-type", b"application/json")], [orjson.dumps(body)]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for part in parts:
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "non-stream"])
def test_the_engine_middleware_on_a_real_server_emits_it_on_engine_last_token(mw, stream):
    emitter = mw.memory_emitter(service="engine", replica="r1", model="thinker")
    app = EngineMiddleware(_reasoning_engine(stream), emitter=emitter)
    request = {"model": "thinker", "messages": [{"role": "user", "content": "SECRET PROMPT"}],
               "stream": stream, "stream_options": {"include_usage": True}}  # fmt: skip
    with mw.running_server(app) as url:
        r = httpx.post(url + "/v1/chat/completions", json=request)
        assert r.status_code == 200
        events = mw.wait_for(emitter, lambda ev: any(e["hop"] == "engine.last_token" for e in ev))
    last = mw.one(events, "engine.last_token")
    assert (last["output_tokens"], last["reasoning_tokens"]) == (9, 6)
    text = orjson.dumps(events).decode()
    assert "SECRET" not in text and "THOUGHT" not in text and "ANSWER" not in text
