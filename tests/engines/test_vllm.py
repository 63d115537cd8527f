"""End to end against a real vLLM (CPU build, tiny random Llama): engine hops + ``engine.stats``.

Needs the separate vLLM venv built by ``.ci/vllm-setup.sh`` at ``$HOPLINE_VLLM_DIR`` (venv/ and
tiny/). Runs ``vllm serve`` with ``--middleware hopline.middleware.engine.EngineMiddleware`` and
``--max-num-seqs 2``, the stat logger loaded from its entry point, ``HOPLINE_SINK=file:...``;
sends one streaming chat request alone and five at once (one without ``X-Request-Id``), stops
the server with SIGTERM and checks that every request has the middleware's hops and the plugin's
``engine.stats`` under the same request ID, and that the stage table splits its TTFT.
"""

from __future__ import annotations

import asyncio
import glob
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from hopline.middleware.contract import EMITTER_STATS_HOP, compute_stages, iter_ndjson, normalize_request_id
from support.servers import free_port

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(240)]

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
MODEL = "tiny"
MAX_NUM_SEQS = 2
STARTUP_TIMEOUT_S = 420  # ~25 s on a quiet machine, 150 s at load 10
# frontend = engine_ttft (middleware, API-server clock) - queue - prefill (engine-core durations);
# the engine core's interval lies inside the middleware's, so it may only dip below 0 by clock
# read granularity.
FRONTEND_TOLERANCE_S = 0.002
# (request ID or None, max_tokens): sent all at once; with MAX_NUM_SEQS running, the rest wait.
# Decodes of a few hundred ms each, so the five arrive well within one decode of each other.
CONCURRENT = [("vllm-conc-1", 224), ("vllm-conc-2", 256), ("vllm-conc-3", 192), ("vllm-conc-4", 240), (None, 208)]
SOLO = ("vllm-solo-1", 24)


def vllm_dir() -> Path:
    """``$HOPLINE_VLLM_DIR``, checked: a missing engine is a failure, not a skip."""
    raw = os.environ.get("HOPLINE_VLLM_DIR")
    if not raw:
        pytest.fail(
            "HOPLINE_VLLM_DIR is not set: build the vLLM engine with "
            "`HOPLINE_VLLM_DIR=/some/dir bash .ci/vllm-setup.sh` and export HOPLINE_VLLM_DIR "
            "(or deselect with -m 'not vllm')"
        )
    root = Path(raw)
    for need in (root / "venv" / "bin" / "python", root / "tiny" / "config.json"):
        if not need.exists():
            pytest.fail(f"{need} is missing: run `HOPLINE_VLLM_DIR={root} bash .ci/vllm-setup.sh`")
    where = subprocess.run(
        [str(root / "venv" / "bin" / "python"), "-c", "import hopline.middleware as m; print(m.__file__)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if where.returncode != 0 or not Path(where.stdout.strip()).is_relative_to(REPO):
        pytest.fail(
            f"the vLLM venv does not run this checkout's hopline ({where.stdout.strip() or where.stderr[-300:]}):"
            f" run `HOPLINE_VLLM_DIR={root} bash .ci/vllm-setup.sh`"
        )
    return root


def tail(path: Path, n: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:]) if path.exists() else "(no log)"


def start_server(
    root: Path,
    port: int,
    sink_path: Path,
    log_path: Path,
    max_num_seqs: int = MAX_NUM_SEQS,
    extra_args: tuple[str, ...] = (),
    replica: str = "r1",
    venv: str = "venv",
    middleware: bool = True,
) -> subprocess.Popen:
    """``vllm serve`` from ``root/venv`` (``venv-nohop``: the same vLLM without hopline, hence
    without its stat logger); ``middleware=False`` leaves hopline's ASGI middleware out."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOPLINE_", "VLLM_PLUGINS"))}
    env.update(
        HOPLINE_SINK=f"file:{sink_path}",
        HOPLINE_SERVICE="vllm-test",
        HOPLINE_REPLICA=replica,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        VLLM_CACHE_ROOT=str(root / "cache" / "vllm"),
        HF_HOME=str(root / "cache" / "hf"),
        XDG_CACHE_HOME=str(root / "cache"),
    )
    cmd = [
        str(root / venv / "bin" / "python"), str(HERE / "vllm_cli.py"), "serve", str(root / "tiny"),
        "--host", "127.0.0.1", "--port", str(port), "--served-model-name", MODEL,
        "--dtype", "float32", "--max-model-len", "512", "--max-num-seqs", str(max_num_seqs),
        "--enforce-eager", "--kv-cache-memory-bytes", "64M", "--enable-request-id-headers",
        *(("--middleware", "hopline.middleware.engine.EngineMiddleware") if middleware else ()), *extra_args,
    ]  # fmt: skip
    with open(log_path, "wb") as log:
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def wait_ready(proc: subprocess.Popen, port: int, log_path: Path, timeout_s: float = STARTUP_TIMEOUT_S) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            pytest.fail(f"vllm serve exited with {proc.returncode} during startup:\n{tail(log_path)}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return time.monotonic() - t0
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    pytest.fail(f"vllm serve not ready after {timeout_s:g} s:\n{tail(log_path)}")


def stop_server(proc: subprocess.Popen) -> None:
    """SIGTERM (vLLM shuts its engine down; hopline flushes at exit), then SIGKILL the group."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # EngineCore children, should any be left
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


async def chat(client: httpx.AsyncClient, port: int, request_id: str | None, max_tokens: int) -> dict[str, Any]:
    """One streaming chat completion; returns the IDs and the usage it reported."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"Hello world, tell me about latency {max_tokens}"}],
        "stream": True,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"X-Request-Id": request_id} if request_id else {}
    seen: dict[str, Any] = {"sent_id": request_id, "max_tokens": max_tokens, "chunk_ids": set()}
    async with client.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body, headers=headers) as r:
        assert r.status_code == 200, await r.aread()
        seen["header_id"] = r.headers.get("x-request-id")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = orjson.loads(line[6:])
            assert "error" not in chunk, chunk
            seen["chunk_ids"].add(chunk["id"])
            if chunk.get("usage"):
                seen["usage"] = chunk["usage"]
    return seen


async def send_requests(port: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    async with httpx.AsyncClient(timeout=120) as client:
        solo = await chat(client, port, *SOLO)
        # one open connection per concurrent request first (health checks, not generation routes),
        # so the five arrive together instead of spread over five TCP handshakes on a busy machine
        await asyncio.gather(*(client.get(f"http://127.0.0.1:{port}/health") for _ in CONCURRENT))
        concurrent = await asyncio.gather(*(chat(client, port, rid, mt) for rid, mt in CONCURRENT))
    return solo, list(concurrent)


def read_events(sink_path: Path) -> list[dict[str, Any]]:
    """Every hop event in the live file and any rotated ones; each must pass the contract (the
    emitters' own health reports, ``emitter.stats``, are left out)."""
    events = []
    for name in sorted(glob.glob(f"{sink_path}*")):
        for number, event, error in iter_ndjson(Path(name).read_bytes()):
            assert error is None, f"{name}:{number}: {error}"
            if event["hop"] != EMITTER_STATS_HOP:
                events.append(event)
    return events


def test_vllm_engine_hops_and_stats_join(tmp_path: Path) -> None:
    root = vllm_dir()
    port, sink_path, log_path = free_port(), tmp_path / "events.ndjson", tmp_path / "serve.log"
    proc = start_server(root, port, sink_path, log_path)
    try:
        startup_s = wait_ready(proc, port, log_path)
        solo, concurrent = asyncio.run(send_requests(port))
    finally:
        stop_server(proc)
    assert proc.returncode is not None
    events = read_events(sink_path)
    by_request: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for event in events:
        by_request[event["request_id"]].append(event)

    rows = []
    for seen in [solo, *concurrent]:
        # vLLM's own ID (chunk `id`) is chatcmpl-<the request ID>, also for the request sent
        # without one: the middleware inserted it before vLLM read the header, which echoes it.
        assert len(seen["chunk_ids"]) == 1, seen["chunk_ids"]
        request_id = normalize_request_id(next(iter(seen["chunk_ids"])))
        assert request_id == (seen["sent_id"] or seen["header_id"]), seen
        mine = by_request.get(request_id, [])
        hops = sorted(e["hop"] for e in mine)
        assert hops == ["engine.first_token", "engine.last_token", "engine.received", "engine.stats"], (
            request_id,
            hops,
            f"{len(events)} events in all; server log:\n{tail(log_path)}",
        )
        stats = next(e for e in mine if e["hop"] == "engine.stats")
        max_tokens = seen["max_tokens"]
        assert seen["usage"]["completion_tokens"] == max_tokens, seen["usage"]
        assert stats["output_tokens"] == max_tokens and stats["max_tokens"] == max_tokens, stats
        assert stats["prompt_tokens"] == seen["usage"]["prompt_tokens"], stats
        assert stats["finish_reason"] == "length", stats  # ignore_eos: it ran to max_tokens
        assert stats["cached_tokens"] >= 0 and stats["attempt"] == 0, stats
        assert (stats["model"], stats["service"], stats["replica"]) == (MODEL, "vllm-test", "r1"), stats
        for name in ("queue_s", "prefill_s", "decode_s"):
            assert stats[name] >= 0, (name, stats)
        stages = compute_stages(mine)
        for name in ("queue", "prefill", "frontend", "decode", "engine_ttft"):
            assert stages[name] is not None, (name, stages)
        assert stages["frontend"] >= -FRONTEND_TOLERANCE_S, (request_id, stages)
        rows.append((request_id, stats, stages))

    # Real queueing: five requests at once, two slots, decodes of ~0.5 s, so three of them wait
    # for a slot at least until one of the running ones finishes its decode. vLLM's queue_s must
    # show that wait (no queue_s fails), and can never exceed what the middleware saw from arrival
    # to scheduled (its first token - vLLM's prefill): prefill counted in queue_s would. Frontend
    # work (tokenizing, ~20-50 ms here, far more on a loaded machine) is the rest of that span, so
    # the span itself says nothing about waiting for a slot.
    shortest_decode = min(stats["decode_s"] for request_id, stats, st in rows[1:])
    blocked = {}
    for request_id, stats, st in rows:
        arrival_to_scheduled = st["engine_first"] - st["stats_prefill_s"] - st["engine_received"]
        assert stats["queue_s"] <= arrival_to_scheduled + FRONTEND_TOLERANCE_S, (request_id, stats, st)
        if stats["queue_s"] >= 0.5 * shortest_decode:
            blocked[request_id] = round(stats["queue_s"], 4)
    assert len(blocked) >= len(CONCURRENT) - MAX_NUM_SEQS, (blocked, shortest_decode)

    print(f"\nvLLM ready after {startup_s:.1f} s; {len(events)} events; waited for a slot: {blocked}")
    print(f"{'request_id':34} {'queue':>7} {'prefill':>7} {'frontend':>8} {'eng_ttft':>8} {'decode':>7} {'stats_dec':>9}")
    for request_id, stats, st in rows:
        print(
            f"{request_id:34} {st['queue']:7.4f} {st['prefill']:7.4f} {st['frontend']:8.4f} "
            f"{st['engine_ttft']:8.4f} {st['decode']:7.4f} {stats['decode_s']:9.4f}",
            file=sys.stdout,
        )
