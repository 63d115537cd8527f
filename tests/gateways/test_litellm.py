"""hopline's LiteLLM callback on the real proxy (litellm[proxy] 1.106.12, from the package index).

The OpenAI SDK through hopline's client -> LiteLLM (``callbacks: hopline.middleware.litellm.proxy_handler``)
-> two OpenAI-style engines on uvicorn with hopline's ``EngineMiddleware``. Each component writes
its own NDJSON file; the analyzer (``scan_events`` + ``timelines``) joins them by request ID, as
it would in production.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import openai
import orjson
import polars as pl
import pytest
from hopline.analyzer.io import scan_events
from hopline.analyzer.timelines import timelines
from hopline.middleware.client import instrument
from hopline.middleware.emit import Emitter
from litellm_testing import LITELLM_VERSION, MASTER_KEY, Proxy

MESSAGES = [{"role": "user", "content": "SECRET PROMPT"}]
GATEWAY_HOPS = [
    "gateway.received",
    "gateway.admitted",
    "gateway.forwarded",
    "gateway.first_token",
    "gateway.last_token",
]


@contextmanager
def sdk(proxy: Proxy, name: str, **kw) -> Iterator[openai.OpenAI]:
    """The OpenAI SDK through hopline's client transport, writing client events to the proxy's folder."""
    emitter = Emitter(
        f"file:{proxy.events_dir}/client-{name}.ndjson", service="kite-chat", flush_interval=0.02
    )
    proxy.emitters.append(emitter)
    client = openai.OpenAI(
        base_url=proxy.url + "/v1",
        api_key=MASTER_KEY,
        http_client=instrument(httpx.Client(timeout=30), emitter=emitter),
        **kw,
    )
    try:
        yield client
    finally:
        client.close()


def events_of(proxy: Proxy, request_id: str, final_hops: set[str], timeout: float = 10.0) -> list[dict]:
    """Every component's events of one request, once each hop in ``final_hops`` has arrived on disk."""
    deadline = time.monotonic() + timeout
    while True:
        for emitter in proxy.emitters:
            emitter.flush()
        found = [
            event
            for path in sorted(proxy.events_dir.glob("*.ndjson*"))
            for line in path.read_bytes().splitlines()
            if line.strip() and (event := orjson.loads(line)).get("request_id") == request_id  # not emitter.stats
        ]
        if final_hops <= {e["hop"] for e in found}:
            return found
        assert time.monotonic() < deadline, (
            f"missing {final_hops - {e['hop'] for e in found}} for {request_id}"
        )
        time.sleep(0.05)


def timeline_of(proxy: Proxy, request_id: str) -> dict:
    frame, report = scan_events([proxy.events_dir])
    assert report.bad_lines == 0, report.errors
    rows = timelines(frame).filter(pl.col("request_id") == request_id).collect().to_dicts()
    assert len(rows) == 1, rows
    return rows[0]


def hops(events: list[dict], prefix: str) -> list[tuple[str, int]]:
    return [
        (e["hop"], e["attempt"]) for e in sorted(events, key=lambda e: e["ts"]) if e["hop"].startswith(prefix)
    ]


def one(events: list[dict], hop: str, attempt: int = 0) -> dict:
    found = [e for e in events if e["hop"] == hop and e["attempt"] == attempt]
    assert len(found) == 1, (hop, attempt, found)
    return found[0]


def test_streaming_and_plain_requests_join_client_litellm_engine(proxy: Proxy):
    with sdk(proxy, "join") as client:
        stream = client.chat.completions.with_raw_response.create(
            model="tiny", messages=MESSAGES, stream=True, max_tokens=4, stream_options={"include_usage": True}
        )
        chunks = list(stream.parse())
        plain = client.chat.completions.with_raw_response.create(
            model="tiny", messages=MESSAGES, max_tokens=3
        )
        answer = plain.parse()
    assert stream.headers["x-litellm-version"] == LITELLM_VERSION  # the pinned proxy answered
    for raw, response_id, is_stream in ((stream, chunks[0].id, True), (plain, answer.id, False)):
        rid = raw.http_request.headers["x-request-id"]  # the ID hopline's client sent
        # the engine saw the caller's ID: vLLM-style engines answer with chatcmpl-<X-Request-Id>,
        # and (HOPLINE_REQUEST_ID_BODY_FIELD=rid) SGLang-style engines find it in the body's `rid`
        assert response_id == f"chatcmpl-{rid}"
        assert proxy.engines["r1"].body_rids[rid] == rid
        last = {"client.last_token", "gateway.last_token", "engine.last_token"}
        events = events_of(proxy, rid, last)
        assert {e["service"] for e in events} == {"kite-chat", "litellm", "engine"}
        expected = GATEWAY_HOPS if is_stream else [h for h in GATEWAY_HOPS if "first_token" not in h]
        assert [h for h, _ in hops(events, "gateway.")] == expected
        assert one(events, "gateway.forwarded")["upstream"] == "r1"
        assert one(events, "engine.received")["replica"] == "r1"
        gw_last = one(events, "gateway.last_token")
        assert (gw_last["output_tokens"], gw_last["finish_reason"]) == (
            (4, "length") if is_stream else (3, "length")
        )
        assert not any("SECRET" in orjson.dumps(e).decode() for e in events)

        row = timeline_of(proxy, rid)
        assert row["outcome"] == "ok" and row["missing"] == [] and row["negative"] == []
        assert (row["replica"], row["gateway_upstream"], row["attempts"]) == ("r1", "r1", 1)
        # the gateway stage is LiteLLM's time: its arrival stamp to the upstream attempt
        received, forwarded = one(events, "gateway.received")["ts"], one(events, "gateway.forwarded")["ts"]
        assert row["gateway"] == pytest.approx(forwarded - received, abs=1e-6) and row["gateway"] > 0
        view = "client_ttft" if is_stream else "client_e2e"
        engine = "engine_ttft" if is_stream else "engine_e2e"
        total = row["client_delay"] + row["connect"] + row["network"] + row["gateway"] + row[engine]
        assert row[view] == pytest.approx(total, abs=1e-9)
        # LiteLLM's own overhead header covers more than the gateway stage (also the work after
        # the upstream answered), on the same arrival stamp
        overhead_ms = float(raw.headers["x-litellm-overhead-duration-ms"])
        assert 0 < row["gateway"] * 1000 <= overhead_ms


def test_request_id_minted_by_litellm_callback_reaches_the_engine(proxy: Proxy):
    """A caller without hopline (plain SDK, no X-Request-Id): the callback's ID is the engine's."""
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key=MASTER_KEY)
    answer = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2)
    client.close()
    rid = answer.id.removeprefix("chatcmpl-")
    events = events_of(proxy, rid, {"gateway.last_token", "engine.last_token"})
    assert {e["service"] for e in events} == {"litellm", "engine"}
    assert len(rid) == 32


def test_failover_is_counted_as_attempts_with_the_failed_time_in_gateway(proxy: Proxy):
    proxy.engines["r1"].failing = True
    try:
        with sdk(proxy, "failover", max_retries=0) as client:
            raw = client.chat.completions.with_raw_response.create(
                model="tiny",
                messages=MESSAGES,
                stream=True,
                max_tokens=3,
                stream_options={"include_usage": True},
            )
            chunks = list(raw.parse())
    finally:
        proxy.engines["r1"].failing = False
    assert raw.headers["x-litellm-attempted-fallbacks"] == "1"  # LiteLLM's own count of the failover
    rid = raw.http_request.headers["x-request-id"]
    assert chunks[0].id == f"chatcmpl-{rid}"
    events = events_of(
        proxy, rid, {"client.last_token", "gateway.last_token", "engine.last_token", "engine.error"}
    )
    assert hops(events, "gateway.") == [
        ("gateway.received", 0),
        ("gateway.admitted", 0),
        ("gateway.forwarded", 0),
        ("gateway.forwarded", 1),
        ("gateway.first_token", 1),
        ("gateway.last_token", 1),
    ]
    assert [one(events, "gateway.forwarded", a)["upstream"] for a in (0, 1)] == ["r1", "r2"]
    failed = one(events, "engine.error", 0)
    assert (failed["replica"], failed["status"]) == ("r1", 500)
    assert one(events, "engine.received", 1)["replica"] == "r2"

    row = timeline_of(proxy, rid)
    assert row["outcome"] == "ok" and row["negative"] == []
    assert (row["replica"], row["gateway_upstream"], row["attempts"]) == ("r2", "r2", 2)
    # gateway = received -> the final attempt's forward, so it holds the failed attempt, whose
    # engine-side time (r1: received -> error, measured on the engine) fits inside it
    failed_engine_s = failed["ts"] - one(events, "engine.received", 0)["ts"]
    assert row["gateway"] == pytest.approx(
        one(events, "gateway.forwarded", 1)["ts"] - one(events, "gateway.received")["ts"]
    )
    assert row["gateway"] > failed_engine_s > 0
    assert row["client_ttft"] == pytest.approx(
        row["client_delay"] + row["connect"] + row["network"] + row["gateway"] + row["engine_ttft"], abs=1e-9
    )


def test_litellm_rate_limit_is_gateway_rejected(proxy: Proxy):
    """``tiny-limited`` allows 1 request a minute (deployment ``rpm: 1``): the second is refused
    by LiteLLM's router with 429, before any upstream attempt."""
    with sdk(proxy, "limit", max_retries=0) as client:
        client.chat.completions.create(model="tiny-limited", messages=MESSAGES, max_tokens=2)
        with pytest.raises(openai.RateLimitError) as refused:
            client.chat.completions.create(model="tiny-limited", messages=MESSAGES, max_tokens=2)
    rid = refused.value.response.request.headers["x-request-id"]
    events = events_of(proxy, rid, {"client.error", "gateway.rejected"})
    assert hops(events, "gateway.") == [("gateway.received", 0), ("gateway.rejected", 0)]
    assert one(events, "gateway.rejected")["status"] == 429
    assert not [e for e in events if e["hop"].startswith("engine.")]
    row = timeline_of(proxy, rid)
    assert row["outcome"] == "rejected" and row["status"] == 429


def test_a_key_litellm_cannot_check_is_gateway_error_at_its_arrival_stamp(proxy: Proxy):
    """An unknown key with no key database: LiteLLM 1.106.12 answers 400 ("No connected db.") from
    ``user_api_key_auth``, before any pre-call hook. The failure hook still reports it (status
    400, so ``gateway.error``, not ``rejected``) at the request's start, but LiteLLM gives that
    hook no request headers: the event has an ID of the callback's own, not the caller's. (With a
    key database a bad key is 401, reported as ``gateway.rejected``; with no key at all this
    release answers 500, because its auth error path imports ``prisma``, which litellm[proxy]
    does not install.)"""
    sent = time.time()
    response = httpx.post(
        proxy.url + "/v1/chat/completions",
        json={"model": "tiny", "messages": MESSAGES},
        headers={"X-Request-Id": "caller-unknown-key", "Authorization": "Bearer sk-unknown"},
    )
    assert response.status_code == 400, response.text
    deadline = time.monotonic() + 10
    while not (
        errors := [e for e in proxy_events(proxy) if e["hop"] == "gateway.error" and e.get("status") == 400]
    ):
        assert time.monotonic() < deadline, "no gateway.error for the refused key"
        time.sleep(0.05)
    (error,) = errors
    events = [e for e in proxy_events(proxy) if e["request_id"] == error["request_id"]]
    assert hops(events, "") == [("gateway.received", 0), ("gateway.error", 0)]
    assert error["error"] == "http_400" and error["request_id"] != "caller-unknown-key"
    assert sent - 0.5 < one(events, "gateway.received")["ts"] <= error["ts"]


def proxy_events(proxy: Proxy) -> list[dict]:
    """Every event the proxy's callback wrote (the live file and any the file sink rotated)."""
    paths = sorted(proxy.events_dir.glob("litellm.ndjson*"))
    return [orjson.loads(line) for path in paths for line in path.read_bytes().splitlines() if line.strip()]
