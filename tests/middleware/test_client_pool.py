"""A full connection pool and a busy caller, told apart at the source (issue 27).

The OpenAI SDK on ``instrument(httpx.AsyncClient(...))`` / ``instrument(httpx.Client(...))``
against a real uvicorn engine on 127.0.0.1 (with hopline's engine middleware, so that the stage
table has both ends). ``pool_wait_s`` is the wait for a connection from a full pool only;
``client_delay_s`` is the rest of the time before the first transport step (the caller catching
up); ``loop_lag_s`` is how late the client's event loop ran. Asserts are structural (who met a
full pool, in what order connections were handed out, which stage holds a delay the test made),
never how fast this machine is.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import openai
import orjson
import pytest
from hopline.analyzer.timelines import timelines
from hopline.middleware.client import _Call, _Slots, instrument
from hopline.middleware.contract import compute_stages
from hopline.middleware.contract.rules import group_requests
from hopline.middleware.engine import EngineMiddleware
from support.cli import hopline
from support.tables import storage_frame

MESSAGES = [{"role": "user", "content": "hi"}]
TOKENS = 8  # the fake engine's "slow" mode: 50 ms per token, so a stream holds its connection >= 0.4 s
SLOW = {"x-fake-mode": "slow"}


@pytest.fixture
def served(mw):
    """A memory emitter and the URL of a fake engine whose engine hops go to the same emitter."""
    emitter = mw.memory_emitter(service="app")
    with mw.running_server(EngineMiddleware(mw.fake_engine_app(), emitter=emitter)) as url:
        yield emitter, url


def burn(seconds: float) -> None:
    """CPU work that holds the thread (and its event loop) for ``seconds``."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def client_events(mw, emitter, calls: int) -> list[dict]:
    events = mw.wait_for(emitter, lambda ev: sum(e["hop"] == "engine.last_token" for e in ev) == calls
                         and sum(e["hop"] == "client.last_token" for e in ev) == calls)
    return events


def sent_of(events: list[dict]) -> list[dict]:
    """The ``client.sent`` events in the order the requests entered the transport."""
    return sorted((e for e in events if e["hop"] == "client.sent"), key=lambda e: e["ts"])


def assert_waits_end_at_releases(events: list[dict], limit: int) -> None:
    """A request that met a full pool waited until a connection was given back: the k-th of them
    to get one got it no earlier than the k-th request finished (a request reads its last token
    before it gives its connection back)."""
    sent = sent_of(events)
    ends = sorted(e["ts"] for e in events if e["hop"] == "client.last_token")
    granted = sorted(e["ts"] + e["pool_wait_s"] for e in sent if e["pool_full"])
    for k, g in enumerate(granted):
        assert g >= ends[k] - 1e-6, (k, g - ends[0], [round(t - ends[0], 4) for t in ends], [
            (round(e["ts"] - ends[0], 4), e["pool_full"], round(e["pool_wait_s"], 4), round(e["client_delay_s"], 4),
             e["conn_reused"]) for e in sent])
    assert all(e["pool_limit"] == limit for e in sent)


def assert_stage_sums(events: list[dict], tmp_path, *, busy: bool) -> dict:
    """Per request, client TTFT is the sum of its stages with client_delay a term of its own (the
    contract in Python, the analyzer's Polars); ``hopline analyze --json`` lists the stage."""
    for rid, evs in group_requests(events).items():
        got = compute_stages(evs)
        total = got["client_delay"] + got["connect"] + got["network"] + got["engine"]
        assert total == pytest.approx(got["client_ttft"], abs=1e-6), rid
        assert got["network"] >= 0
    rows = timelines(storage_frame(events).lazy()).collect()
    assert rows.height == len(group_requests(events))
    for r in rows.iter_rows(named=True):
        total = r["client_delay"] + r["connect"] + r["network"] + r["engine"]
        assert total == pytest.approx(r["client_ttft"], abs=1e-6)
    path = tmp_path / "events.ndjson"
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    run = hopline("analyze", str(path), "--json")
    assert run.returncode == 0, run.stderr
    stages = json.loads(run.stdout)["stages"]
    assert "client_delay" in stages
    if busy:
        assert stages["client_delay"]["share_of_ttft"] > 0
    return stages


def test_async_full_pool_is_pool_wait(mw, served, tmp_path):
    """max_connections=2 and 10 concurrent streams: the first two find room, the other eight wait
    for a connection (each stream holds one for >= 0.4 s, far longer than ten calls take to start)."""
    emitter, url = served

    async def run() -> None:
        http = instrument_async(emitter, limits=httpx.Limits(max_connections=2))
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", http_client=http) as sdk:

            async def one() -> None:
                stream = await sdk.chat.completions.create(
                    model="tiny", messages=MESSAGES, stream=True, max_tokens=TOKENS, extra_headers=SLOW)
                async for _ in stream:
                    pass

            await asyncio.gather(*(one() for _ in range(10)))

    asyncio.run(run())
    events = client_events(mw, emitter, 10)
    sent = sent_of(events)
    assert [e["pool_full"] for e in sent] == [False] * 2 + [True] * 8
    assert all(e["pool_wait_s"] > 0 for e in sent[2:])
    assert all(e["pool_wait_s"] == 0 for e in sent[:2])
    assert all(e["client_delay_s"] >= 0 and e["loop_lag_s"] >= 0 for e in sent)
    assert_waits_end_at_releases(events, 2)
    assert_stage_sums(events, tmp_path, busy=False)


def test_async_busy_loop_is_client_delay_not_pool(mw, served, tmp_path):
    """Default limits (100 connections), one call at a time, and CPU work that blocks the loop for
    0.2 s right after each call entered the transport (a callback the request hook schedules: it
    runs at the call's first yield, before httpcore's first step): the pool was never full, the
    delay is the client's, and the loop ran at least 0.15 s late (the probe is due every 50 ms)."""
    emitter, url = served

    async def run() -> None:
        loop = asyncio.get_running_loop()

        async def block_the_loop(request: httpx.Request) -> None:
            loop.call_soon(burn, 0.2)

        http = instrument_async(emitter, event_hooks={"request": [block_the_loop]})
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", http_client=http) as sdk:
            for _ in range(4):
                stream = await sdk.chat.completions.create(model="tiny", messages=MESSAGES, stream=True, max_tokens=3)
                async for _ in stream:
                    pass

    asyncio.run(run())
    events = client_events(mw, emitter, 4)
    sent = sent_of(events)
    assert [(e["pool_full"], e["pool_limit"], e["pool_wait_s"]) for e in sent] == [(False, 100, 0.0)] * 4
    assert all(e["client_delay_s"] >= 0.2 for e in sent)  # the burn ran inside that interval
    assert all(e["loop_lag_s"] >= 0.15 for e in sent)
    first = [e for e in events if e["hop"] == "client.first_token"]
    assert len(first) == 4 and all(e["loop_lag_s"] >= 0.15 for e in first)
    stages = assert_stage_sums(events, tmp_path, busy=True)
    assert stages["client_delay"]["p50_ms"] >= 200
    assert stages["client_delay"]["p50_ms"] > stages["connect"]["p50_ms"]


def test_async_tasks_doing_cpu_work_between_calls(mw, served, tmp_path):
    """The issue's shape: several tasks that each burn 0.1 s of CPU between their calls. Whatever
    the interleaving, the pool (100) is never full, so no wait is the pool's; some 0.1 s burn
    covered a moment the probe was due (every 50 ms), so the loop ran >= 0.05 s late."""
    emitter, url = served

    async def run() -> None:
        http = instrument_async(emitter)
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", http_client=http) as sdk:

            async def worker() -> None:
                for _ in range(3):
                    stream = await sdk.chat.completions.create(
                        model="tiny", messages=MESSAGES, stream=True, max_tokens=3)
                    async for _ in stream:
                        pass
                    burn(0.1)

            await asyncio.gather(*(worker() for _ in range(4)))

    asyncio.run(run())
    events = client_events(mw, emitter, 12)
    sent = sent_of(events)
    assert {(e["pool_full"], e["pool_wait_s"]) for e in sent} == {(False, 0.0)}
    assert max(e["loop_lag_s"] for e in events if "loop_lag_s" in e and e["hop"].startswith("client.")) >= 0.05
    assert_stage_sums(events, tmp_path, busy=True)


def test_async_neither_full_nor_busy(mw, served, tmp_path):
    """Five concurrent streams, default limits, nothing blocking: no request met a full pool, so
    no time is pool wait."""
    emitter, url = served

    async def run() -> None:
        http = instrument_async(emitter)
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", http_client=http) as sdk:

            async def one() -> None:
                stream = await sdk.chat.completions.create(model="tiny", messages=MESSAGES, stream=True, max_tokens=3)
                async for _ in stream:
                    pass

            await asyncio.gather(*(one() for _ in range(5)))

    asyncio.run(run())
    events = client_events(mw, emitter, 5)
    sent = sent_of(events)
    assert {(e["pool_full"], e["pool_limit"], e["pool_wait_s"]) for e in sent} == {(False, 100, 0.0)}
    assert all(e["client_delay_s"] >= 0 and e["loop_lag_s"] >= 0 for e in sent)
    assert_stage_sums(events, tmp_path, busy=False)


def test_sync_threads_full_pool_and_room(mw, served, tmp_path):
    """The sync client's threads: six threads through max_connections=2 → two find room, four wait
    their turn; with room for all (the default 100) nobody waits. Threads have no event loop:
    their loop_lag_s is the process's thread lateness (``thread_probe``), on every sent and first token."""
    emitter, url = served

    def run(limits: httpx.Limits, threads: int) -> None:
        http = httpx.Client(limits=limits)
        sdk = openai.OpenAI(base_url=url + "/v1", api_key="k", http_client=instrument(http, emitter=emitter))
        start = threading.Barrier(threads)

        def one() -> None:
            start.wait()
            for _ in sdk.chat.completions.create(
                    model="tiny", messages=MESSAGES, stream=True, max_tokens=TOKENS, extra_headers=SLOW):
                pass

        workers = [threading.Thread(target=one) for _ in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        sdk.close()

    run(httpx.Limits(max_connections=2), 6)
    events = client_events(mw, emitter, 6)
    sent = sent_of(events)
    assert sorted(e["pool_full"] for e in sent) == [False] * 2 + [True] * 4
    assert all(e["pool_wait_s"] > 0 for e in sent if e["pool_full"])
    assert all(e["pool_wait_s"] == 0 for e in sent if not e["pool_full"])
    lagged = [e for e in events if e["hop"] in ("client.sent", "client.first_token")]
    assert len(lagged) == 12 and all(e["loop_lag_s"] >= 0 for e in lagged)
    assert_waits_end_at_releases(events, 2)
    assert_stage_sums(events, tmp_path, busy=False)

    emitter.sink.events.clear()
    run(httpx.Limits(max_connections=100), 4)
    events = client_events(mw, emitter, 4)
    assert {(e["pool_full"], e["pool_wait_s"]) for e in sent_of(events)} == {(False, 0.0)}


def instrument_async(emitter, **kw) -> httpx.AsyncClient:
    return instrument(httpx.AsyncClient(**kw), emitter=emitter)


def test_a_thread_that_overtook_one_counted_ahead_of_it_swaps_places():
    """Threads count themselves, then enter httpcore's pool: B (counted second of two) may reach
    the pool after C (counted third, so "full"). When C gets a connection with nothing given back
    since it came, C did not wait; B does, and its wait ends when a connection is given back."""
    def call() -> _Call:
        return _Call(None, "r", 0, {}, {})  # type: ignore[arg-type]

    slots = _Slots(2)
    a, b, c = call(), call(), call()
    for x in (a, b, c):
        x.hold(slots, None)
    assert (a.pool_full, b.pool_full, c.pool_full) == (False, False, True)
    a.on_trace("connection.connect_tcp.started")
    c.on_trace("connection.connect_tcp.started")  # nothing given back yet: C overtook B
    assert (b.pool_full, c.pool_full, c.slot_at) == (True, False, None)
    a.closing()
    b.on_trace("connection.send_request_headers.started")  # B got A's connection, A still closing
    a.release()
    assert b.slot_at is not None and b.slot_at <= b.first_trace

    d = call()
    d.hold(slots, None)
    assert d.pool_full is True
    d.release()  # it never had a connection (a pool timeout): nothing was given back
    assert d.slot_at is None and slots.freed_at == b.slot_at
    for x in (b, c):
        x.release()
    assert (slots.held, slots.pending, slots.waiting) == (0, [], set())
