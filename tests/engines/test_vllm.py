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
# (request ID or None, max_tokens): the two longest take both slots (MAX_NUM_SEQS), unstreamed; the
# other three are sent once vLLM runs both, and wait for a slot. The long ones decode ~15x as many
# tokens as the others, 2-4 s here, so the three get to the engine while both run.
CONCURRENT = [("vllm-conc-1", 112), ("vllm-conc-2", 1900), ("vllm-conc-3", 96), ("vllm-conc-4", 1850), (None, 128)]
QUEUED_MODEL_LEN = 2048
# vLLM's CPU default (VLLM_CPU_OMP_THREADS_BIND=auto) pins its model worker to core 0 and leaves the
# API server, the engine core's busy loop and this client to share core 1: at load both the API
# server and the client were seen stalled for a whole decode, in every round of that server. Not
# pinned, one OpenMP thread: 18 of 18 runs with two CPU burners beside them passed (6 of 9 pinned).
UNPINNED = {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "1"}
SOLO = ("vllm-solo-1", 24)
# vLLM's API server closes a connection idle for VLLM_HTTP_TIMEOUT_KEEP_ALIVE (5 s by default). A
# test client on a loaded machine can stall longer than that (its event loop or threads seen not
# to run for 5-7 s at load 9 on 2 cores) between taking an idle connection from its pool and
# writing its request on it: the server has closed it meanwhile, and the request fails with
# ReadError or "Server disconnected without sending a response" before vLLM sees it. Nothing here
# is about keep-alive, so the test servers keep idle connections for the length of a test.
KEEP_ALIVE_S = "3600"
QUEUE_ROUNDS = 4
STAGES_STREAMED = ("queue", "prefill", "frontend", "decode", "engine_ttft")
STAGES_UNSTREAMED = ("queue", "prefill", "decode", "engine_e2e")  # no first token: no TTFT, no frontend


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
    max_model_len: int = 512,
    env_extra: dict[str, str] | None = None,
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
        VLLM_HTTP_TIMEOUT_KEEP_ALIVE=KEEP_ALIVE_S,
        DO_NOT_TRACK="1",
        VLLM_CACHE_ROOT=str(root / "cache" / "vllm"),
        HF_HOME=str(root / "cache" / "hf"),
        XDG_CACHE_HOME=str(root / "cache"),
    )
    env.update(env_extra or {})
    cmd = [
        str(root / venv / "bin" / "python"), str(HERE / "vllm_cli.py"), "serve", str(root / "tiny"),
        "--host", "127.0.0.1", "--port", str(port), "--served-model-name", MODEL,
        "--dtype", "float32", "--max-model-len", str(max_model_len), "--max-num-seqs", str(max_num_seqs),
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


async def chat(
    client: httpx.AsyncClient, port: int, request_id: str | None, max_tokens: int, stream: bool = True
) -> dict[str, Any]:
    """One chat completion, streamed unless ``stream=False``; returns the IDs and the usage it reported."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"Hello world, tell me about latency {max_tokens}"}],
        "stream": stream,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        **({"stream_options": {"include_usage": True}} if stream else {}),
    }
    headers = {"X-Request-Id": request_id} if request_id else {}
    seen: dict[str, Any] = {"sent_id": request_id, "max_tokens": max_tokens, "stream": stream, "chunk_ids": set()}
    async with client.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body, headers=headers) as r:
        assert r.status_code == 200, await r.aread()
        seen["header_id"] = r.headers.get("x-request-id")
        if not stream:
            answer = orjson.loads(await r.aread())
            seen["chunk_ids"].add(answer["id"])
            seen["usage"] = answer["usage"]
            return seen
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = orjson.loads(line[6:])
            assert "error" not in chunk, chunk
            seen["chunk_ids"].add(chunk["id"])
            if chunk.get("usage"):
                seen["usage"] = chunk["usage"]
    return seen


async def until_running(client: httpx.AsyncClient, port: int, count: int, held: list[asyncio.Task]) -> None:
    """Until vLLM's scheduler runs ``count`` requests (``vllm:num_requests_running`` on its
    /metrics), or one of ``held`` has ended (the assertions on queueing then say what happened)."""
    while not any(task.done() for task in held):
        text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
        lines = [line for line in text.splitlines() if line.startswith("vllm:num_requests_running")]
        if sum(float(line.rsplit(" ", 1)[1]) for line in lines) >= count:
            return
        await asyncio.sleep(0.01)


def answered_id(seen: dict[str, Any]) -> str:
    """The request ID vLLM answered under (its chunk ``id`` is chatcmpl-<the request ID>)."""
    return normalize_request_id(next(iter(seen["chunk_ids"])))


def engine_stats(events: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The ``engine.stats`` events by request ID."""
    return {event["request_id"]: event for event in events if event["hop"] == "engine.stats"}


def waited_for_a_slot(stats: dict[str, dict[str, Any]], request_ids: list[str]) -> dict[str, float]:
    """The requests of one concurrent round whose vLLM ``queue_s`` is at least half the round's
    shortest decode: they waited for a slot."""
    shortest = min(stats[request_id]["decode_s"] for request_id in request_ids)
    return {i: round(stats[i]["queue_s"], 4) for i in request_ids if stats[i]["queue_s"] >= 0.5 * shortest}


async def concurrent_round(client: httpx.AsyncClient, port: int, batch: list[tuple[str | None, int]]) -> list[dict[str, Any]]:
    # the longest answers take both slots first; the other three are sent once vLLM runs both
    # (its own gauge), so they wait for a slot. The long ones are not streamed: streamed, an
    # answer at load can keep the API server's event loop to itself (vLLM's generate() takes a
    # ready output without awaiting), and neither the gauge nor the three get in until both long
    # ones have ended. Should the three still come late, the round is sent again (QUEUE_ROUNDS).
    holders = sorted(batch, key=lambda c: -c[1])[:MAX_NUM_SEQS]
    held = [asyncio.create_task(chat(client, port, *c, stream=False)) for c in holders]
    await until_running(client, port, MAX_NUM_SEQS, held)
    waiting = [c for c in batch if c not in holders]
    answers = dict(zip(waiting, await asyncio.gather(*(chat(client, port, *c) for c in waiting)), strict=True))
    answers |= dict(zip(holders, await asyncio.gather(*held), strict=True))
    return [answers[c] for c in batch]


async def send_requests(port: int, sink_path: Path) -> tuple[dict[str, Any], list[list[dict[str, Any]]]]:
    """The solo request, then up to ``QUEUE_ROUNDS`` concurrent rounds: another only while no
    round has had ``len(CONCURRENT) - MAX_NUM_SEQS`` requests wait for a slot (by vLLM's own
    ``queue_s``), i.e. while the machine's load kept the queue from forming."""
    rounds = []
    async with httpx.AsyncClient(timeout=120) as client:
        solo = await chat(client, port, *SOLO)
        # one open connection per concurrent request first (health checks, not generation routes),
        # so the five arrive together instead of spread over five TCP handshakes on a busy machine
        await asyncio.gather(*(client.get(f"http://127.0.0.1:{port}/health") for _ in CONCURRENT))
        for number in range(QUEUE_ROUNDS):
            batch = [(f"{rid}-{number}" if rid and number else rid, max_tokens) for rid, max_tokens in CONCURRENT]
            rounds.append(await concurrent_round(client, port, batch))
            request_ids = [answered_id(seen) for seen in rounds[-1]]
            deadline = time.monotonic() + 30
            while not set(request_ids) <= (stats := engine_stats(read_events(sink_path, so_far=True))).keys():
                if time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.1)
            if not set(request_ids) <= stats.keys():
                break  # the assertions on the hops say which are missing
            if len(waited_for_a_slot(stats, request_ids)) >= len(CONCURRENT) - MAX_NUM_SEQS:
                break
    return solo, rounds


def read_events(sink_path: Path, so_far: bool = False) -> list[dict[str, Any]]:
    """Every hop event in the live file and any rotated ones; each must pass the contract (the
    emitters' own health reports, ``emitter.stats``, are left out). ``so_far``: while the server
    runs, a line still being written is left for the next read."""
    events = []
    for name in sorted(glob.glob(f"{sink_path}*")):
        data = Path(name).read_bytes()
        for number, event, error in iter_ndjson(data[: data.rfind(b"\n") + 1] if so_far else data):
            assert error is None, f"{name}:{number}: {error}"
            if event["hop"] != EMITTER_STATS_HOP:
                events.append(event)
    return events


def test_vllm_engine_hops_and_stats_join(tmp_path: Path) -> None:
    root = vllm_dir()
    port, sink_path, log_path = free_port(), tmp_path / "events.ndjson", tmp_path / "serve.log"
    proc = start_server(root, port, sink_path, log_path, max_model_len=QUEUED_MODEL_LEN, env_extra=UNPINNED)
    try:
        startup_s = wait_ready(proc, port, log_path)
        solo, rounds = asyncio.run(send_requests(port, sink_path))
    finally:
        stop_server(proc)
    assert proc.returncode is not None
    events = read_events(sink_path)
    by_request: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for event in events:
        by_request[event["request_id"]].append(event)

    rows = []
    for seen in [solo, *(seen for batch in rounds for seen in batch)]:
        # vLLM's own ID (chunk `id`) is chatcmpl-<the request ID>, also for the request sent
        # without one: the middleware inserted it before vLLM read the header, which echoes it.
        assert len(seen["chunk_ids"]) == 1, seen["chunk_ids"]
        request_id = answered_id(seen)
        assert request_id == (seen["sent_id"] or seen["header_id"]), seen
        mine = by_request.get(request_id, [])
        hops = sorted(e["hop"] for e in mine)
        # an unstreamed answer has no first token (its one body is its last)
        assert hops == [*["engine.first_token"] * seen["stream"], "engine.last_token", "engine.received", "engine.stats"], (
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
        for name in STAGES_STREAMED if seen["stream"] else STAGES_UNSTREAMED:
            assert stages[name] is not None, (name, stages)
        if seen["stream"]:
            assert stages["frontend"] >= -FRONTEND_TOLERANCE_S, (request_id, stages)
            # how much of the CPU it asked for the engine got (its API server and engine core
            # processes, middleware/cpu_wait.py): a share, on every streamed answer's last event
            last = next(e for e in mine if e["hop"] == "engine.last_token")
            assert 0.0 <= last["cpu_wait"] <= 1.0, last
        rows.append((request_id, stats, stages))

    # Real queueing: five requests, two slots; the three sent while the two longest run wait
    # for a slot at least until one of those finishes its decode. vLLM's queue_s must show that
    # wait (no queue_s fails), and can never exceed what the middleware saw from arrival to
    # scheduled (its first token - vLLM's prefill): prefill counted in queue_s would. Frontend
    # work (tokenizing, ~20-50 ms here, far more on a loaded machine) is the rest of that span, so
    # the span itself says nothing about waiting for a slot. The bound holds for every request of
    # every round; the wait must show in the last round (the one that ended the sending).
    for request_id, stats, st in rows:
        if st["engine_first"] is None:
            continue  # unstreamed (a slot holder)
        arrival_to_scheduled = st["engine_first"] - st["stats_prefill_s"] - st["engine_received"]
        assert stats["queue_s"] <= arrival_to_scheduled + FRONTEND_TOLERANCE_S, (request_id, stats, st)
    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:.4f}"

    waited = [waited_for_a_slot(engine_stats(events), [answered_id(seen) for seen in batch]) for batch in rounds]
    print(f"\nvLLM ready after {startup_s:.1f} s; {len(events)} events; waited for a slot, by round: {waited}")
    print(f"{'request_id':34} {'queue':>7} {'prefill':>7} {'frontend':>8} {'eng_ttft':>8} {'decode':>7} {'stats_dec':>9} {'received':>9}")
    for request_id, stats, st in rows:
        print(
            f"{request_id:34} {cell(st['queue']):>7} {cell(st['prefill']):>7} {cell(st['frontend']):>8} "
            f"{cell(st['engine_ttft']):>8} {cell(st['decode']):>7} {cell(stats['decode_s']):>9} {cell(st['engine_received'] % 100):>9}",
            file=sys.stdout,
        )
    assert len(waited[-1]) >= len(CONCURRENT) - MAX_NUM_SEQS, waited
