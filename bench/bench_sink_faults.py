"""An instrumented app while its collector is down, slow or failing, next to the same app with a file sink.

    python bench/bench_sink_faults.py [--seconds 20] [--rate 100] [--concurrency 4]

The app is bench_asgi's streaming Starlette app (34 SSE chunks a request) under
``EngineMiddleware``, in its own uvicorn process, with ``HOPLINE_SINK`` pointing at:

* ``file``: a file (the baseline);
* ``healthy``: a collector answering at once;
* ``down``: a port where nothing listens (connections refused);
* ``slow``: a collector answering every batch after 5 s;
* ``error``: a collector answering 500 to every batch.

The collector is tests/collector/fault_collector.py (a real collector behind a fault injector),
in its own process. Per variant: ``--seconds`` of paced load (``--rate`` requests/s over
``--concurrency`` keep-alive connections, raw asyncio sockets) measuring each request's latency
(request written to the last chunk read); the app's RSS at the end; then the fault is cleared
(the collector started or switched to ok), 200 more requests with known IDs are sent, and we
wait until they are joined by the collector and its ``hopline_emitter_*`` metrics match the
emitter's own counters (read from the app, ``GET /_stats``). Ratios are p99 against the file sink's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson
from bench_asgi import PATH, REQUEST_BODY, free_port, wait_listening

ROOT = Path(__file__).resolve().parents[1]
FAULT_COLLECTOR = ROOT / "tests" / "collector" / "fault_collector.py"
VARIANTS = ("file", "healthy", "down", "slow", "error")
RECOVERY_REQUESTS = 200


# --- the app (child process) --------------------------------------------------------------------


def serve_app(port: int) -> None:
    import uvicorn
    from bench_asgi import build_app
    from hopline.middleware.emit import get_emitter
    from hopline.middleware.engine import EngineMiddleware

    emitter = get_emitter()  # from HOPLINE_SINK
    instrumented = EngineMiddleware(build_app("bare", ""), emitter=emitter)

    async def app(scope, receive, send):
        if scope["type"] == "http" and scope["path"] == "/_stats":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": orjson.dumps(emitter.stats())})
            return
        await instrumented(scope, receive, send)

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="off",
                timeout_keep_alive=120)  # fmt: skip


# --- load ---------------------------------------------------------------------------------------


def _request(rid: str) -> bytes:
    return (
        f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"X-Request-Id: {rid}\r\nContent-Length: {len(REQUEST_BODY)}\r\n\r\n"
    ).encode() + REQUEST_BODY


async def _connection(port: int, ids: list[str], interval: float, latencies: list[float]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    next_at = time.perf_counter()
    try:
        for rid in ids:
            delay = next_at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            next_at += interval
            start = time.perf_counter()
            writer.write(_request(rid))
            buf = b""
            while not buf.endswith(b"\r\n0\r\n\r\n"):
                data = await reader.read(65536)
                if not data:
                    raise ConnectionResetError("the app closed the connection")
                buf = buf[-16:] + data
            latencies.append(time.perf_counter() - start)
    finally:
        writer.close()


def paced_load(port: int, ids: list[str], rate: float, concurrency: int) -> list[float]:
    latencies: list[float] = []
    interval = concurrency / rate
    shares = [ids[i::concurrency] for i in range(concurrency)]

    async def run() -> None:
        await asyncio.gather(*(_connection(port, share, interval, latencies) for share in shares))

    asyncio.run(run())
    return latencies


def quantile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000)[int(q * 1000) - 1]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


# --- one variant --------------------------------------------------------------------------------


def _metric(text: str, name: str, **labels: str) -> float:
    pattern = re.escape(name) + r"\{([^}]*)\} ([0-9.e+]+)"
    total = 0.0
    for match in re.finditer(pattern, text):
        got = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(match.group(2))
    return total


def run_variant(variant: str, args: argparse.Namespace, tmp: Path) -> dict:
    cport, aport = free_port(), free_port()
    collector_cmd = [sys.executable, str(FAULT_COLLECTOR), "--port", str(cport), "--data-dir", str(tmp / variant)]
    collector = None
    if variant in ("healthy", "slow", "error"):
        mode = {"healthy": "ok"}.get(variant, variant)
        collector = subprocess.Popen([*collector_cmd, "--mode", mode])
        wait_listening(cport, collector)
    sink = f"file:{tmp / variant}.ndjson" if variant == "file" else f"http://127.0.0.1:{cport}"
    env = {**os.environ, "HOPLINE_SINK": sink, "HOPLINE_SERVICE": "bench", "HOPLINE_REPLICA": "r1",
           "HOPLINE_LOG_LEVEL": "error", "PYTHONPATH": str(Path(__file__).parent)}  # fmt: skip
    app = subprocess.Popen([sys.executable, __file__, "--serve-app", str(aport)], env=env)
    try:
        wait_listening(aport, app)
        n = int(args.seconds * args.rate)
        paced_load(aport, [f"warm-{i}" for i in range(min(n // 10, 200))], args.rate, args.concurrency)
        latencies = paced_load(aport, [f"{variant}-{i}" for i in range(n)], args.rate, args.concurrency)
        result = {
            "variant": variant,
            "p50_ms": 1000 * statistics.median(latencies),
            "p99_ms": 1000 * quantile(latencies, 0.99),
            "rss_mib": rss_mib(app.pid),
        }
        with httpx.Client(timeout=10) as http:
            result["during"] = http.get(f"http://127.0.0.1:{aport}/_stats").json()
            if variant == "file":
                return result
            # clear the fault, then send requests the collector must see
            if collector is None:
                collector = subprocess.Popen(collector_cmd)
                wait_listening(cport, collector)
            else:
                http.post(f"http://127.0.0.1:{cport}/_faults/ok")
            recovered_at = time.monotonic()
            ids = [f"recovered-{variant}-{i}" for i in range(RECOVERY_REQUESTS)]
            paced_load(aport, ids, args.rate, args.concurrency)
            base = f"http://127.0.0.1:{cport}"
            deadline = time.monotonic() + 120
            delivered, matches = 0, False
            while time.monotonic() < deadline:
                delivered = sum(http.get(f"{base}/v1/requests/{rid}").status_code == 200 for rid in ids)
                stats = http.get(f"http://127.0.0.1:{aport}/_stats").json()
                text = http.get(f"{base}/metrics").text
                exported = {
                    "sent": _metric(text, "hopline_emitter_events_sent_total", service="bench"),
                    **{
                        f"dropped_{r}": _metric(text, "hopline_emitter_events_dropped_total", service="bench", reason=r)
                        for r in ("full", "sink", "closed")
                    },
                }
                # the emitter reports every 10 s while its counts change: wait for a report that
                # has caught up with them
                matches = all(exported[k] == stats[k] for k in exported)
                if delivered == len(ids) and matches:
                    break
                time.sleep(0.5)
            result.update(
                delivered=f"{delivered}/{len(ids)}",
                resumed_s=time.monotonic() - recovered_at,
                exported=exported,
                after=stats,
                exported_matches=matches,
            )
            return result
    finally:
        for proc in (app, collector):
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--serve-app", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_app:
        serve_app(args.serve_app)
        return
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for variant in args.variants.split(","):
            results.append(run_variant(variant, args, Path(tmp)))
            print(orjson.dumps(results[-1]).decode(), file=sys.stderr, flush=True)
    base = next(r for r in results if r["variant"] == "file")
    print("| sink | p50 ms | p99 ms | p99 / file | app RSS MiB | dropped during (full / sink) | after recovery |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        during = r["during"]
        after = (
            "—" if r["variant"] == "file"
            else f"{r['delivered']} delivered in {r['resumed_s']:.1f} s; exported drops "
            f"{'match' if r['exported_matches'] else 'DO NOT match'} the emitter's "
            f"(full {r['exported']['dropped_full']:.0f}, sink {r['exported']['dropped_sink']:.0f})"
        )  # fmt: skip
        print(
            f"| {r['variant']} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} | {r['p99_ms'] / base['p99_ms']:.3f} | "
            f"{r['rss_mib']:.0f} | {during['dropped_full']} / {during['dropped_sink']} | {after} |"
        )


if __name__ == "__main__":
    main()
