"""LiteLLM's detailed timing headers, read by hopline's client: the gateway's phases without its callback.

With ``LITELLM_DETAILED_TIMING=true`` the proxy (litellm[proxy] 1.106.12) answers with
``x-litellm-timing-{pre-processing,llm-api,post-processing,message-copy}-ms``
(``get_custom_headers`` in litellm/proxy/common_request_processing.py, the values from
``set_timing_metrics`` in litellm/litellm_core_utils/llm_response_utils/response_metadata.py). Its
pre-processing starts at the proxy's arrival stamp (``litellm_received_at``), the moment hopline's
callback stamps ``gateway.received``, and ends where the provider call starts, a little after the
callback's ``gateway.forwarded`` (LiteLLM's own pre-call logging lies between them). The client
reads the three phases (``sse.REPORTED_GATEWAY_TIMING``) onto ``client.last_token``; without the
gateway's hops the ``gateway`` stage is the pre-processing, so the client's TTFT still splits.
"""

from __future__ import annotations

import asyncio

import httpx
import orjson
import pytest
from hopline.middleware.client import instrument
from hopline.middleware.contract import TTFT_STAGES, compute_stages, validate_event
from hopline.middleware.sse import reported_gateway_timing
from litellm_testing import FIXTURES, Proxy, helpers
from test_litellm import MESSAGES, events_of, sdk, timeline_of

HEADERS = orjson.loads((FIXTURES / "litellm-1.106.12-detailed-timing-headers.json").read_bytes())
PHASES = ("gateway_pre_s", "gateway_upstream_s", "gateway_post_s")
# LiteLLM stamps with datetime.now(), hopline's callback with time.time(): the same clock, read apart
CLOCK_S = 0.002
# the fake engine reports no queue / prefill: its whole TTFT stands in their place (``engine``)
SPLIT = (*TTFT_STAGES, "engine")


def test_the_headers_become_seconds():
    assert reported_gateway_timing(HEADERS["stream"]) == pytest.approx(
        {"gateway_pre_s": 0.0081029, "gateway_upstream_s": 0.003231, "gateway_post_s": 0.0002749}, abs=1e-12
    )
    assert reported_gateway_timing(HEADERS["body"])["gateway_pre_s"] == pytest.approx(0.0079548, abs=1e-12)
    # LiteLLM leaves a header out where its value is None; nonsense is dropped, never an error
    bad = {"x-litellm-timing-pre-processing-ms": "None", "x-litellm-timing-llm-api-ms": "-3",
           "x-litellm-timing-post-processing-ms": "nan"}  # fmt: skip
    assert reported_gateway_timing(bad) == {} and reported_gateway_timing({}) == {}
    assert reported_gateway_timing({"x-litellm-timing-llm-api-ms": "1" * 40}) == {}


def _headers_app(headers: dict[str, str]):
    """A fake engine that answers with a gateway's timing headers (as if LiteLLM were in front)."""
    engine = helpers.fake_engine_app()
    extra = [(k.encode(), v.encode()) for k, v in headers.items()]

    async def app(scope, receive, send):
        async def sending(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await engine(scope, receive, sending)

    return app


@pytest.mark.parametrize("stream", [True, False])
def test_client_reads_the_phases_and_the_gateway_stage_falls_back_to_pre(stream):
    emitter = helpers.memory_emitter(service="kite-chat")
    headers = HEADERS["stream" if stream else "body"]
    with helpers.running_server(_headers_app(headers)) as url:

        async def run() -> str:
            async with instrument(httpx.AsyncClient(), emitter=emitter) as client:
                body = {"model": "tiny", "messages": MESSAGES, "stream": stream}
                r = await client.post(url + "/v1/chat/completions", json=body)
                assert r.status_code == 200
                return r.request.headers["x-request-id"]

        rid = asyncio.run(run())
    events = [e for e in helpers.events_of(emitter) if e["request_id"] == rid]
    emitter.close()
    last = helpers.one(events, "client.last_token")
    assert {k: last[k] for k in PHASES} == pytest.approx(reported_gateway_timing(headers), abs=1e-12)
    assert not set(PHASES) & set(helpers.one(events, "client.sent"))
    stages = compute_stages([validate_event(e) for e in events])
    assert stages["gateway"] == pytest.approx(last["gateway_pre_s"])
    assert {k: stages[k] for k in PHASES} == {k: last[k] for k in PHASES}
    view = "client_ttft" if stream else "client_e2e"
    assert stages["upstream"] == pytest.approx(
        stages[view] - stages["client_delay"] - stages["connect"] - stages["gateway"], abs=1e-12
    )


@pytest.mark.parametrize("stream", [True, False])
def test_real_litellm_phases_lie_within_the_gateways_span(proxy: Proxy, stream: bool):
    with sdk(proxy, f"timing-{stream}", max_retries=0) as client:
        raw = client.chat.completions.with_raw_response.create(model="tiny", messages=MESSAGES, stream=stream)
        if stream:
            _ = list(raw.parse())
        else:
            raw.parse()
    rid = raw.http_request.headers["x-request-id"]
    assert raw.headers["x-litellm-timing-pre-processing-ms"]  # the proxy runs with LITELLM_DETAILED_TIMING
    events = events_of(proxy, rid, {"client.last_token", "gateway.last_token", "engine.last_token"})
    last = next(e for e in events if e["hop"] == "client.last_token")
    assert all(last.get(name) is not None and last[name] >= 0 for name in PHASES), last
    row = timeline_of(proxy, rid)
    assert {k: row[k] for k in PHASES} == pytest.approx({k: last[k] for k in PHASES})
    # the callback's hops measure the gateway: its stage is theirs, and LiteLLM's pre-processing
    # holds it (same start; LiteLLM's provider call starts after the callback's forwarded)
    assert row["gateway"] == pytest.approx(
        next(e["ts"] for e in events if e["hop"] == "gateway.forwarded")
        - next(e["ts"] for e in events if e["hop"] == "gateway.received")
    )
    assert row["gateway"] <= last["gateway_pre_s"] + CLOCK_S, (row["gateway"], last)
    # every phase lies within the gateway's own span (its e2e: received to its last token)
    assert sum(last[k] for k in PHASES) <= row["gateway_e2e"] + CLOCK_S, (last, row["gateway_e2e"])
    if stream:
        assert last["gateway_pre_s"] <= row["gateway_ttft"] + CLOCK_S, (last, row["gateway_ttft"])
        # the TTFT still splits, the callback's hops leading
        assert sum(row[k] or 0.0 for k in SPLIT) == pytest.approx(row["client_ttft"], abs=1e-9)
    print(
        f"\n{'stream' if stream else 'body'}: callback gateway {row['gateway'] * 1000:.2f} ms, "
        f"LiteLLM pre {last['gateway_pre_s'] * 1000:.2f} / llm-api {last['gateway_upstream_s'] * 1000:.2f} / "
        f"post {last['gateway_post_s'] * 1000:.2f} ms; gateway e2e {row['gateway_e2e'] * 1000:.2f} ms"
    )

    # the same request as a user without hopline's callback sees it: no gateway hops, the gateway
    # stage from the header, the TTFT (or e2e) split the same way
    alone = compute_stages([validate_event(e) for e in events if not e["hop"].startswith("gateway.")])
    assert alone["gateway"] == pytest.approx(last["gateway_pre_s"])
    if stream:
        assert sum(alone[k] or 0.0 for k in SPLIT) == pytest.approx(alone["client_ttft"], abs=1e-9)
        assert alone["network"] >= -CLOCK_S, alone
    else:
        parts = sum(alone[k] for k in ("client_delay", "connect", "network", "gateway", "engine_e2e"))
        assert parts == pytest.approx(alone["client_e2e"], abs=1e-9) and alone["network"] >= -CLOCK_S
