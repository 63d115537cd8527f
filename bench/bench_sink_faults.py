"""An instrumented app while its collector is down, slow or failing, next to the same app with a file sink.

    python bench/bench_sink_faults.py [--rounds 3] [--seconds 20] [--rate 100] [--concurrency 4]

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
emitter's own counters (read from the app, ``GET /_stats``). Rounds run every variant (the order
reversed every other round); the p99 ratio against the file sink is taken within a round, and
its median [min, max] over rounds printed (the machine is shared: absolute tails are noisy).

``--exit-only``: how long a process with 5,000 buffered events takes to exit when its collector
is a closed port or accepts connections and never answers (median of 5), against a file sink.
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
        wait_listening(cport, collector, timeout=90)
    sink = f"file:{tmp / variant}.ndjson" if variant == "file" else f"http://127.0.0.1:{cport}"
    env = {**os.environ, "HOPLINE_SINK": sink, "HOPLINE_SERVICE": "bench", "HOPLINE_REPLICA": "r1",
           "HOPLINE_LOG_LEVEL": "error", "PYTHONPATH": str(Path(__file__).parent)}  # fmt: skip
    app = subprocess.Popen([sys.executable, __file__, "--serve-app", str(aport)], env=env)
    try:
        wait_listening(aport, app, timeout=90)
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
                wait_listening(cport, collector, timeout=90)
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


EXIT_SCRIPT = """
from hopline.middleware.emit import get_emitter
for i in range(5000):
    get_emitter().emit("client.sent", f"req-{i}", stream=True)
print("ready", flush=True)
"""


def exit_seconds(sink: str) -> float:
    """Seconds from a script's last statement to its process's end, with 5,000 events buffered."""
    env = {**os.environ, "HOPLINE_SINK": sink, "HOPLINE_LOG_LEVEL": "error"}
    proc = subprocess.Popen([sys.executable, "-c", EXIT_SCRIPT], env=env, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    start = time.monotonic()
    proc.wait(timeout=60)
    return time.monotonic() - start


def exit_table(repeats: int) -> None:
    """How long an unreachable collector holds up a process's exit (median of ``repeats``)."""
    import socket

    with socket.socket() as blackhole:
        blackhole.bind(("127.0.0.1", 0))
        blackhole.listen(64)  # accepts connections (the kernel does), never answers
        sinks = {
            "file": f"file:{tempfile.mkdtemp()}/events.ndjson",
            "closed port": f"http://127.0.0.1:{free_port()}",
            "blackholed (accepts, never answers)": f"http://127.0.0.1:{blackhole.getsockname()[1]}",
        }
        print("| sink | exit s (median) | [min, max] |\n|---|---|---|")
        for name, sink in sinks.items():
            times = [exit_seconds(sink) for _ in range(repeats)]
            print(f"| {name} | {statistics.median(times):.2f} | [{min(times):.2f}, {max(times):.2f}] |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="file first: the baseline")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, the variant order reversed every other")
    parser.add_argument("--exit-only", action="store_true", help="only time the exit against dead collectors")
    parser.add_argument("--serve-app", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_app:
        serve_app(args.serve_app)
        return
    if args.exit_only:
        exit_table(repeats=5)
        return
    variants = args.variants.split(",")
    rounds: list[dict[str, dict]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for number in range(args.rounds):
            order = variants if number % 2 == 0 else variants[::-1]
            results = {}
            for variant in order:
                results[variant] = run_variant(variant, args, Path(tmp) / str(number))
                print(orjson.dumps(results[variant]).decode(), file=sys.stderr, flush=True)
            rounds.append(results)
    print("| sink | p50 ms | p99 ms | p99 / file (per round) | app RSS MiB | dropped during (full / sink) "
          "| after recovery |\n|---|---|---|---|---|---|---|")  # fmt: skip
    for variant in variants:
        runs = [r[variant] for r in rounds]
        ratio = [r[variant]["p99_ms"] / r["file"]["p99_ms"] for r in rounds]
        last = runs[-1]
        after = (
            "—" if variant == "file"
            else f"{last['delivered']} delivered in {last['resumed_s']:.1f} s; exported drops "
            f"{'match' if all(r['exported_matches'] for r in runs) else 'DO NOT match'} the emitter's "
            f"(full {last['exported']['dropped_full']:.0f}, sink {last['exported']['dropped_sink']:.0f})"
        )  # fmt: skip
        print(
            f"| {variant} | {statistics.median(r['p50_ms'] for r in runs):.2f} "
            f"| {statistics.median(r['p99_ms'] for r in runs):.2f} "
            f"| {statistics.median(ratio):.3f} [{min(ratio):.3f}, {max(ratio):.3f}] "
            f"| {max(r['rss_mib'] for r in runs):.0f} "
            f"| {last['during']['dropped_full']} / {last['during']['dropped_sink']} | {after} |"
        )


if __name__ == "__main__":
    main()
