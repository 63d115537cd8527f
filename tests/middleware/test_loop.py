"""Event loop lateness (middleware/loop.py): the probe itself, and the engine and gateway middlewares
on real uvicorn servers putting their loop's lateness on ``engine.received`` / ``gateway.received``.

A server's loop is blocked by a request to ``/block`` whose handler sleeps 0.3 s without yielding
(CPU work or a blocking call in an async handler: the shape of a busy API server). A generation
request sent meanwhile waits for the loop before any middleware sees it. The probe is due every
50 ms, so one tick falls inside the block and runs at least 0.3 - 0.05 = 0.25 s late: the request
reports >= 0.2. An idle server's loop is late by scheduling noise only: < 0.1.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from hopline.middleware.engine import EngineMiddleware
from hopline.middleware.loop import LagProbe, ThreadProbe, lag_probe, loop_lag, thread_probe

BLOCK_S = 0.3
BODY = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 2}


def test_no_probe_outside_asyncio():
    assert lag_probe() is None and loop_lag() is None


def test_one_probe_per_loop_that_sees_a_blocked_loop():
    async def run() -> tuple[LagProbe | None, LagProbe | None, float | None, float | None]:
        first, again = lag_probe(), lag_probe()
        await asyncio.sleep(0.12)  # two ticks on time
        idle = loop_lag()
        time.sleep(BLOCK_S)  # the tick due within 50 ms runs >= 0.25 s late
        await asyncio.sleep(0)
        return first, again, idle, loop_lag()

    first, again, idle, busy = asyncio.run(run())
    assert first is not None and first is again
    # a tick was due at most INTERVAL into the block; the lag counts the one running late right now
    assert busy is not None and busy >= BLOCK_S - LagProbe.INTERVAL
    assert idle is not None and idle < busy
    second = asyncio.run(run())[0]
    assert second is not None and second is not first  # a new loop, its own probe


def test_one_thread_probe_per_process_that_sees_the_gil_held():
    """A sync caller has no loop: the process's thread probe wakes every 50 ms, and wakes late
    while another thread holds the GIL (pure-Python work with a long switch interval: the
    probe's thread cannot run) or the host has no CPU for it: what a blocking read waits for."""
    probe = thread_probe()
    assert isinstance(probe, ThreadProbe) and thread_probe() is probe
    idle = probe.lag()
    for _ in range(3):  # a busy CI host can make even an idle thread late: wait it out
        if idle < 0.1:
            break
        time.sleep(2 * ThreadProbe.WINDOW)
        idle = probe.lag()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1.0)
    try:
        until = time.monotonic() + BLOCK_S
        while time.monotonic() < until:  # holds the GIL: the probe's thread is not switched to
            pass
        busy = probe.lag()
    finally:
        sys.setswitchinterval(interval)
    assert idle < 0.1
    assert busy >= BLOCK_S - ThreadProbe.INTERVAL
    time.sleep(0.12)  # the probe thread runs again: it noted how late it woke
    assert probe.lag() >= BLOCK_S - ThreadProbe.INTERVAL


def blocking(app, started: threading.Event):
    """``app`` behind a route, ``/block``, that blocks the server's event loop for ``BLOCK_S``."""

    async def wrapped(scope, receive, send):
        if scope["type"] == "http" and scope["path"] == "/block":
            started.set()
            time.sleep(BLOCK_S)  # no await: nothing else runs on this loop meanwhile
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await app(scope, receive, send)

    return wrapped


def lag_on(mw, emitter, hop: str, url: str, request_id: str) -> float:
    """``loop_lag_s`` of ``hop`` for one streamed request sent to ``url``."""
    r = httpx.post(url + "/v1/chat/completions", json=BODY, headers={"X-Request-Id": request_id}, timeout=10)
    assert r.status_code == 200
    events = mw.wait_for(emitter, lambda ev: any(e["hop"] == hop and e["request_id"] == request_id for e in ev))
    lag = mw.one(events, hop, request_id=request_id)["loop_lag_s"]
    assert isinstance(lag, float)
    return lag


def idle_then_blocked(mw, emitter, hop: str, url: str, started: threading.Event) -> tuple[float, float]:
    """``loop_lag_s`` of a request to an idle server, then of one sent while its loop is blocked.

    An idle loop is late by scheduling noise only (< 0.1 s), but on a machine whose every CPU is
    busy with other work a thread can wait longer for one, and the probe remembers the largest
    lateness for 2-4 s (two ``WINDOW``s): then the idle server is asked again once they passed.
    """
    lag_on(mw, emitter, hop, url, "warm-up")  # starts the server loop's probe
    time.sleep(0.1)
    for again in range(3):
        idle = lag_on(mw, emitter, hop, url, f"idle-{again}")
        if idle < 0.1:
            break
        time.sleep(2 * LagProbe.WINDOW)
    blocker = threading.Thread(target=httpx.post, args=(url + "/block",), kwargs={"timeout": 10})
    blocker.start()
    assert started.wait(5)
    busy = lag_on(mw, emitter, hop, url, "busy")  # waits for the loop, unseen by the middleware
    blocker.join()
    return idle, busy


@pytest.fixture
def started() -> threading.Event:
    return threading.Event()


@pytest.fixture
def engine(mw, started) -> Iterator[tuple[str, object]]:
    emitter = mw.memory_emitter(service="engine", replica="r1")
    with mw.running_server(EngineMiddleware(blocking(mw.fake_engine_app(), started), emitter=emitter)) as url:
        yield url, emitter


def test_engine_received_carries_the_engine_loops_lateness(mw, engine, started):
    url, emitter = engine
    idle, busy = idle_then_blocked(mw, emitter, "engine.received", url, started)
    assert idle < 0.1
    assert busy >= 0.2


def test_gateway_received_carries_the_gateway_loops_lateness(mw, started):
    """Only the gateway's loop is blocked (the engine is another server, its own loop)."""
    gateway_events, engine_events = mw.memory_emitter(service="gw"), mw.memory_emitter(replica="r1")
    with mw.running_server(EngineMiddleware(mw.fake_engine_app(), emitter=engine_events)) as engine_url:
        gateway = blocking(mw.fake_gateway_app([("r1", engine_url)], gateway_events), started)
        with mw.running_server(gateway) as url:
            idle, busy = idle_then_blocked(mw, gateway_events, "gateway.received", url, started)
            engine_busy = mw.one(mw.events_of(engine_events), "engine.received", request_id="busy")["loop_lag_s"]
    assert idle < 0.1
    assert busy >= 0.2
    assert engine_busy < busy  # the engine's loop was free: the wait was the gateway's


def test_a_broken_probe_never_reaches_the_app(mw, monkeypatch):
    """An error reading the lag is counted in the emitter's errors; the request is served as usual."""
    from hopline.middleware import engine as engine_module

    def broken() -> float:
        raise RuntimeError("probe bug")

    monkeypatch.setattr(engine_module, "loop_lag", broken)
    emitter = mw.memory_emitter(replica="r1")
    with mw.running_server(EngineMiddleware(mw.fake_engine_app(), emitter=emitter)) as url:
        r = httpx.post(url + "/v1/chat/completions", json=BODY, timeout=10)
    assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
    assert emitter.errors == 1
