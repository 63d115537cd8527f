"""Collector benchmark: ingest throughput (in-process and over HTTP) and memory under 1M requests.

    /work/venv/bin/python bench/bench_collector.py            # everything (a few minutes)
    /work/venv/bin/python bench/bench_collector.py --only ingest|http|memory
    /work/venv/bin/python bench/bench_collector.py --only otlp     # one 100,000-span POST /v1/traces vs /healthz
    /work/venv/bin/python bench/bench_collector.py --only ingest-live --rounds 2   # paced, detector off vs on

Ingest: batches of 1,000 events (12 hops per request: client, gateway and engine with stats),
metrics and the durable store on (fsync per batch), measured as wall time and as the process's
CPU time (the machine is shared: CPU time per event is the steadier figure). Side by side in the
same run: bare ``orjson.loads`` and ``contract.validate_event`` of the same lines, and the ingest
path's parts, to show where the time goes.

HTTP: ``python -m hopline.collector`` in its own process (pinned to CPU 0 when taskset exists),
posted to by 2 client threads here (pinned to CPU 1) with NDJSON bodies of 1,000 events; the
server's CPU time comes from /proc.

Ingest with the live detector (``--only ingest-live``): the same 12-hop requests paced at
``--live-rate`` requests/s (1,000: 12,000 events/s) for ``--live-seconds`` into a fresh store
(fsync=batch, the collector's defaults otherwise), through ``Ingestor.ingest`` in this process,
alternately without and with ``hopline watch --follow STORE --sample S --horizon 10m --listen``
in its own process. Printed per run: this process's CPU per event, the watch's CPU (from the
first body to when its finished-request count stops moving) as a share of a core and per
request, its peak RSS (VmHWM) and what it took in (from its /metrics).

Memory (in a fresh process): 1M requests through the ingest path (4 engine hops each; 10% never
finish: no last_token / stats), RSS sampled at 100k / 500k / 1M requests. ``--max-open`` (20,000
here, 100,000 by default in the collector) caps the requests joined at once, so the never-finished
ones are evicted (counted as incomplete) instead of piling up for the 15-minute TTL.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import orjson
import psutil
from prometheus_client import generate_latest
from hopline.collector.app import build_collector

try:
    from hopline.collector.app import tune_gc
except ImportError:  # an older hopline run through PYTHONPATH: its server only froze the heap

    def tune_gc() -> None:
        gc.freeze()

from hopline.collector.config import CollectorConfig
from hopline.middleware.contract import new_eid, validate_event

BATCH = 1000


def full_request(rid: str, t: float) -> list[bytes]:
    """The 12 hop events of one healthy streaming request through client, gateway and engine."""
    c = {"service": "kite-chat"}
    g = {"service": "gw", "replica": "gw-0"}
    e = {"service": "engine", "replica": f"r{hash(rid) % 4}", "model": "m"}
    hops = [
        ("client.sent", 0.0, {**c, "stream": True, "conn_reused": True}),
        ("gateway.received", 0.01, g),
        ("gateway.admitted", 0.011, g),
        ("gateway.forwarded", 0.012, {**g, "upstream": e["replica"]}),
        (
            "engine.received",
            0.02,
            {**e, "stream": True, "n": 1, "max_tokens": 256, "max_tokens_set": True, "prompt_tokens": 1200},
        ),
        ("engine.first_token", 0.2, e),
        ("gateway.first_token", 0.21, g),
        ("client.first_token", 0.22, c),
        ("engine.last_token", 1.2, {**e, "output_tokens": 100, "finish_reason": "stop"}),
        (
            "engine.stats",
            1.21,
            {
                **e,
                "queue_s": 0.05,
                "prefill_s": 0.1,
                "decode_s": 1.0,
                "prompt_tokens": 1200,
                "output_tokens": 100,
            },
        ),
        ("gateway.last_token", 1.22, g),
        ("client.last_token", 1.23, {**c, "output_tokens": 100, "finish_reason": "stop"}),
    ]
    return [
        orjson.dumps(
            {"v": 1, "eid": new_eid(), "ts": t + dt, "request_id": rid, "hop": hop, "attempt": 0, **attrs}
        )
        for hop, dt, attrs in hops
    ]


def engine_request(rid: str, t: float, finishes: bool) -> list[bytes]:
    """4 engine hops (2 when the request never finishes)."""
    e = {"service": "engine", "replica": f"r{hash(rid) % 4}", "model": "m"}
    hops = [
        ("engine.received", 0.0, {**e, "stream": True, "prompt_tokens": 500}),
        ("engine.first_token", 0.1, e),
    ]
    if finishes:
        hops += [
            ("engine.last_token", 1.0, {**e, "output_tokens": 50}),
            ("engine.stats", 1.01, {**e, "queue_s": 0.01}),
        ]
    return [
        orjson.dumps({"v": 1, "eid": new_eid(), "ts": t + dt, "request_id": rid, "hop": h, **a})
        for h, dt, a in hops
    ]


def batches_of(lines: list[bytes]) -> list[bytes]:
    return [b"\n".join(lines[i : i + BATCH]) + b"\n" for i in range(0, len(lines), BATCH)]


def cpu_us_per(fn, n: int) -> float:
    start = time.process_time()
    fn()
    return (time.process_time() - start) / n * 1e6


# -- ingest in-process ---------------------------------------------------------------------------


def fold_windows(c) -> int | None:
    """Fold the collector's live window summaries (GET /v1/windows), as its server does once a
    second: every window's rows into its sketches, as if all were settled. The rows folded (one
    a finished request), None for a collector without them (an older hopline)."""
    windows = getattr(c.joiner, "windows", None)
    return None if windows is None else windows.fold(now=float("inf"), force=True)


def _ingest_once(batches: list[bytes], fsync: str, requests: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds) to ingest ``batches`` into a fresh collector."""
    tmp = Path(tempfile.mkdtemp(prefix="hopline-bench-"))
    c = build_collector(CollectorConfig(data_dir=tmp, grace=0, fsync=fsync))
    c.store.open()

    async def run() -> None:
        for body in batches:
            await c.ingestor.ingest(body)

    wall0, cpu0 = time.perf_counter(), time.process_time()
    asyncio.run(run())
    folded = fold_windows(c)
    # one scrape, as Prometheus would make: the histograms count the rows still waiting then
    # (collector/histogram.py ``Rows``); its own cost is the same before and after that change
    generate_latest(c.registry)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    c.ingestor.close()
    assert c.joiner.counts["complete"] == requests, c.joiner.counts
    assert folded in (None, requests), (folded, requests)
    shutil.rmtree(tmp)
    return wall, cpu


def _histograms(n: int) -> tuple[float, float]:
    """CPU µs per observe with a request_id exemplar: prometheus_client's bound child vs ours."""
    from hopline.collector.histogram import ExemplarHistogram
    from hopline.collector.metric_names import LATENCY_BUCKETS
    from prometheus_client import CollectorRegistry, Histogram

    reg = CollectorRegistry()
    theirs = Histogram("a", "a", ("x",), buckets=LATENCY_BUCKETS, registry=reg).labels("1")
    ours = ExemplarHistogram("b", "b", ("x",), buckets=LATENCY_BUCKETS, registry=reg).labels("1")
    ex = {"request_id": "5f0b8a7c9d2e4f6a8b1c3d5e7f9a0b2c"}
    values = [(i % 1000) / 500 for i in range(n)]
    return (
        cpu_us_per(lambda: [theirs.observe(v, ex) for v in values], n),
        cpu_us_per(lambda: [ours.observe(v, ex) for v in values], n),
    )


def _median(xs: list[float]) -> str:
    xs = sorted(xs)
    return f"{xs[len(xs) // 2]:.2f} [{xs[0]:.2f}, {xs[-1]:.2f}]"


def bench_ingest(requests: int, rounds: int) -> None:
    t = time.time()
    lines = [line for i in range(requests) for line in full_request(f"req-{i:09d}", t + i * 1e-3)]
    batches = batches_of(lines)
    n = len(lines)
    objs = [orjson.loads(x) for x in lines]
    tune_gc()  # as the collector's server does at start
    rows: dict[str, list[float]] = {}
    for r in range(rounds):
        order = ["batch", "none"] if r % 2 == 0 else ["none", "batch"]
        rows.setdefault("ref: orjson.loads, µs CPU/event", []).append(
            cpu_us_per(lambda: [orjson.loads(x) for x in lines], n)
        )
        rows.setdefault("ref: contract.validate_event, µs CPU/event", []).append(
            cpu_us_per(lambda: [validate_event(o) for o in objs], n)
        )
        for fsync in order:
            wall, cpu = _ingest_once(batches, fsync, requests)
            rows.setdefault(f"full ingest fsync={fsync}: µs CPU/event", []).append(cpu / n * 1e6)
            rows.setdefault(f"full ingest fsync={fsync}: events per CPU-second (k)", []).append(n / cpu / 1e3)
            rows.setdefault(f"full ingest fsync={fsync}: events/s wall (k)", []).append(n / wall / 1e3)
            rows.setdefault(f"ratio: full ingest fsync={fsync} / orjson.loads (CPU)", []).append(
                cpu / n * 1e6 / rows["ref: orjson.loads, µs CPU/event"][-1]
            )
        theirs, ours = _histograms(200_000)
        rows.setdefault("observe+exemplar, prometheus_client bound child, µs", []).append(theirs)
        rows.setdefault("observe+exemplar, ExemplarHistogram child, µs", []).append(ours)
        rows.setdefault("ratio: prometheus_client / ExemplarHistogram observe", []).append(theirs / ours)
    print(
        f"## ingest in-process: {n:,} events in {len(batches)} batches of {BATCH} (12 hops/request), {rounds} rounds"
    )
    print("| measure | median [min, max] |\n|---|---|")
    for name, values in rows.items():
        print(f"| {name} | {_median(values)} |")
    # where the time goes, one pass
    tmp = Path(tempfile.mkdtemp(prefix="hopline-bench-"))
    c = build_collector(CollectorConfig(data_dir=tmp, grace=0, fsync="batch"))
    c.store.open()
    parsed: list = []
    parse = cpu_us_per(lambda: parsed.extend(c.ingestor.parse(b, "ndjson") for b in batches), n)
    wall0 = time.perf_counter()
    stored: list = []
    store = cpu_us_per(lambda: stored.extend(c.ingestor.store_new(p) for p in parsed), n)
    store_wall = (time.perf_counter() - wall0) / len(parsed) * 1e3
    join = cpu_us_per(lambda: [c.joiner.add(*s) for s in stored], n)
    print(
        f"\nparts (one pass), µs CPU/event: parse+validate+serialize {parse:.2f} (parse thread), "
        f"dedup+store write+fsync {store:.2f} (wall {store_wall:.2f} ms per 1,000-event batch, writer thread), "
        f"join+stages+metrics {join:.2f} (event loop)"
    )
    c.ingestor.close()
    shutil.rmtree(tmp)


# -- over HTTP -----------------------------------------------------------------------------------


def _proc_cpu(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def bench_http(requests: int) -> None:
    t = time.time()
    lines = [line for i in range(requests) for line in full_request(f"h-{i:09d}", t + i * 1e-3)]
    batches = batches_of(lines)
    n = len(lines)
    tmp = Path(tempfile.mkdtemp(prefix="hopline-bench-"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pin = ["taskset", "-c", "0"] if shutil.which("taskset") else []
    proc = subprocess.Popen(
        [
            *pin,
            sys.executable,
            "-m",
            "hopline.collector",
            "--data-dir",
            str(tmp),
            "--port",
            str(port),
            "--grace",
            "0",
        ],
        stderr=subprocess.DEVNULL,
    )
    if pin:
        os.sched_setaffinity(0, {1})
    url = f"http://127.0.0.1:{port}/v1/events"
    try:
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        work = list(batches)
        lock = threading.Lock()

        def client() -> None:
            with httpx.Client(timeout=30, headers={"Content-Type": "application/x-ndjson"}) as http:
                while True:
                    with lock:
                        if not work:
                            return
                        body = work.pop()
                    r = http.post(url, content=body)
                    assert r.status_code == 200 and r.json()["accepted"] == BATCH, r.text

        cpu0, wall0 = _proc_cpu(proc.pid), time.perf_counter()
        threads = [threading.Thread(target=client) for _ in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        wall, cpu = time.perf_counter() - wall0, _proc_cpu(proc.pid) - cpu0
        print(
            f"## ingest over HTTP: {n:,} events in {len(batches)} POSTs of {BATCH} (2 client threads, fsync=batch)"
        )
        print(
            f"{n / wall:,.0f} events/s wall; server {cpu / n * 1e6:.2f} µs CPU/event = {n / cpu:,.0f} events per "
            f"server CPU-second"
        )
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        if pin:
            os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
        shutil.rmtree(tmp)


# -- memory --------------------------------------------------------------------------------------


def bench_memory(total: int, max_open: int) -> None:
    me = psutil.Process()
    rss0 = me.memory_info().rss
    tmp = Path(tempfile.mkdtemp(prefix="hopline-bench-"))
    c = build_collector(CollectorConfig(data_dir=tmp, grace=0, fsync="batch", max_open=max_open))
    c.store.open()
    print(f"## memory: {total:,} requests (4 engine hops; every 10th never finishes), max_open={max_open:,}")
    checkpoints = {100_000, 500_000, 1_000_000, total}
    chunk = 25_000
    t = time.time()
    wall0 = time.perf_counter()

    async def run() -> None:
        for start in range(0, total, chunk):
            lines = (
                line
                for i in range(start, start + chunk)
                for line in engine_request(f"m-{i:09d}", t + i * 1e-4, finishes=i % 10 != 9)
            )
            # bodies built batch by batch: a list of 100k orjson.dumps results would itself hold
            # ~4 KiB of RSS each (orjson's initial buffer, shrunk in place), hiding the collector's
            while batch := list(itertools.islice(lines, BATCH)):
                await c.ingestor.ingest(b"\n".join(batch) + b"\n")
            done = start + chunk
            if done in checkpoints:
                rss = me.memory_info().rss
                print(
                    f"after {done:>9,} requests: RSS {rss / 2**20:7.1f} MiB (+{(rss - rss0) / 2**20:6.1f} over start), "
                    f"open {len(c.joiner.open):,}, finished LRU {len(c.joiner.finished):,}, "
                    f"dedup keys {len(c.ingestor.dedup):,}, evicted {c.joiner.counts['evicted']:,}"
                )

    asyncio.run(run())
    print(f"({time.perf_counter() - wall0:.0f} s wall)")
    c.ingestor.close()
    shutil.rmtree(tmp)


# -- paced ingest with the live detector following the store -----------------------------------


def _paced_bodies(rate: int, seconds: float, prefix: str) -> list[bytes]:
    """``rate`` requests/s for ``seconds`` as 1,000-event bodies, event time starting now (the
    lines are joined a batch at a time: 1.4M separate lines would hold ~4 KiB of RSS each)."""
    t = time.time()
    lines = (
        line
        for i in range(int(rate * seconds))
        for line in full_request(f"{prefix}-{i:09d}", t + i / rate)
    )
    bodies = []
    while batch := list(itertools.islice(lines, BATCH)):
        bodies.append(b"\n".join(batch) + b"\n")
    return bodies


def _metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name) and line[len(name)] in " {":
            return float(line.rsplit(" ", 1)[1])
    return None


def _start_watch(data_dir: Path, sample: float) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = Path(sys.executable).with_name("hopline")  # the console script of this venv
    cmd = [str(exe) if exe.exists() else "hopline", "watch", "--follow", str(data_dir), "--sample", str(sample),
           "--horizon", "10m", "--listen", f"127.0.0.1:{port}"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/metrics"
    for _ in range(600):
        try:
            httpx.get(url, timeout=1)
            return proc, url
        except httpx.TransportError:
            if proc.poll() is not None:
                raise SystemExit(f"hopline watch exited with {proc.returncode}: {' '.join(cmd)}") from None
            time.sleep(0.1)
    raise SystemExit("hopline watch did not answer on --listen within 60 s")


def _peak_rss(pid: int) -> int:
    """VmHWM: the process's peak resident set, bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _live_phase(rate: int, seconds: float, watch: bool, sample: float, prefix: str) -> dict[str, float]:
    """One paced run into a fresh store, with or without ``hopline watch --follow`` on it."""
    bodies = _paced_bodies(rate, seconds, prefix)
    n = len(bodies) * BATCH
    tmp = Path(tempfile.mkdtemp(prefix="hopline-bench-live-"))
    c = build_collector(CollectorConfig(data_dir=tmp, fsync="batch"))
    c.store.open()
    proc, url = _start_watch(tmp, sample) if watch else (None, "")
    interval = 1.0 / (rate * 12 / BATCH)  # seconds between two 1,000-event bodies
    behind = 0.0

    async def run() -> None:
        nonlocal behind
        start = time.perf_counter()
        for k, body in enumerate(bodies):
            wait = start + k * interval - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            else:
                behind = max(behind, -wait)
            await c.ingestor.ingest(body)

    out: dict[str, float] = {}
    try:
        w_cpu0 = _proc_cpu(proc.pid) if proc else 0.0
        wall0, cpu0 = time.perf_counter(), time.process_time()
        asyncio.run(run())
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        out.update(events=n, wall=wall, us_per_event=cpu / n * 1e6, behind=behind)
        if proc is not None:
            finished = -1.0
            for _ in range(30):  # let the watch read the tail (it polls every second)
                time.sleep(1.0)
                now = _metric(httpx.get(url, timeout=5).text, "hopline_live_finished_requests_total") or 0.0
                if now == finished:
                    break
                finished = now
            watch_cpu = _proc_cpu(proc.pid) - w_cpu0
            watched = time.perf_counter() - wall0  # the ingest, then until the watch read it all
            text = httpx.get(url, timeout=5).text
            out.update(
                watch_cpu_share=watch_cpu / watched,
                watch_us_per_request=watch_cpu / (n / 12) * 1e6,
                watch_peak_rss=_peak_rss(proc.pid),
                watch_rss=psutil.Process(proc.pid).memory_info().rss,
                watch_finished=_metric(text, "hopline_live_finished_requests_total") or 0.0,
                watch_not_sampled=_metric(text, "hopline_live_events_not_sampled_total") or 0.0,
                watch_steps=_metric(text, "hopline_live_steps_total") or 0.0,
            )
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
        c.ingestor.close()
        shutil.rmtree(tmp)
    return out


def bench_ingest_live(rate: int, seconds: float, rounds: int, sample: float) -> None:
    """Paced ingest, detector off vs on, alternated (off, on, on, off, ...)."""
    print(f"## paced ingest: {rate:,} requests/s ({rate * 12:,} events/s) for {seconds:.0f} s a run, fsync=batch; "
          f"detector: hopline watch --follow STORE --sample {sample} --horizon 10m in its own process")  # fmt: skip
    print(f"load average at start {os.getloadavg()[0]:.1f}")
    print("| run | detector | collector µs CPU/event | events per CPU-second (k) | wall s | max lag behind pace s "
          "| watch CPU share of a core | watch CPU µs per request | watch peak RSS MiB | watch finished requests "
          "| watch steps | load |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    per: dict[bool, list[float]] = {False: [], True: []}
    for r in range(rounds):
        for watch in (False, True) if r % 2 == 0 else (True, False):
            res = _live_phase(rate, seconds, watch, sample, f"l{r}{int(watch)}")
            per[watch].append(res["us_per_event"])
            w = (
                f"{res['watch_cpu_share'] * 100:.1f}% | {res['watch_us_per_request']:.0f} | "
                f"{res['watch_peak_rss'] / 2**20:.0f} | {res['watch_finished']:,.0f} | {res['watch_steps']:.0f}"
                if watch
                else "- | - | - | - | -"
            )
            print(f"| {r + 1} | {'on' if watch else 'off'} | {res['us_per_event']:.2f} | "
                  f"{1e3 / res['us_per_event']:.1f} | {res['wall']:.1f} | {res['behind']:.2f} | {w} | "
                  f"{os.getloadavg()[0]:.1f} |")  # fmt: skip
    off, on = (sum(per[k]) / len(per[k]) for k in (False, True))
    print(f"mean collector µs CPU/event: off {off:.2f}, on {on:.2f} (on / off {on / off:.2f})")


# -- a large OTLP request vs /healthz ------------------------------------------------------------


def bench_otlp(spans: int) -> None:
    """One POST /v1/traces of ``spans`` vLLM ``llm_request`` spans (gzip protobuf) to a collector
    process, with a /healthz prober (every 20 ms) running alongside: its latency during the request."""
    sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "tests"),
                    str(Path(__file__).resolve().parents[1] / "tests" / "collector")]  # fmt: skip
    from test_collector_otlp_bounds import request_of

    import gzip

    body = gzip.compress(request_of(spans).SerializeToString())
    tmp = Path(tempfile.mkdtemp(prefix="hopline-bench-"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "hopline.collector", "--data-dir", str(tmp), "--port", str(port), "--fsync", "none"],
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            try:
                httpx.get(url + "/healthz", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        probes: list[tuple[float, float]] = []
        stop = threading.Event()

        def probe() -> None:
            with httpx.Client(base_url=url, timeout=30) as http:
                while not stop.is_set():
                    sent = time.perf_counter()
                    http.get("/healthz")
                    probes.append((sent, time.perf_counter() - sent))
                    time.sleep(0.02)

        prober = threading.Thread(target=probe)
        prober.start()
        time.sleep(1.0)
        idle = [lat for _, lat in probes]
        start = time.perf_counter()
        r = httpx.post(url + "/v1/traces", content=body, timeout=600,
                       headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"})  # fmt: skip
        end = time.perf_counter()
        stop.set()
        prober.join()
        during = sorted(lat for sent, lat in probes if start <= sent <= end)
        q = lambda xs, p: xs[min(len(xs) - 1, int(p * len(xs)))]  # noqa: E731
        idle.sort()
        print(f"## OTLP: {spans:,} spans, {len(body) / 2**20:.2f} MiB gzip, answered {r.status_code} in {end - start:.1f} s")
        print(f"/healthz idle: p50 {q(idle, 0.5) * 1e3:.1f} ms, p99 {q(idle, 0.99) * 1e3:.1f} ms (n={len(idle)})")
        print(f"/healthz during: p50 {q(during, 0.5) * 1e3:.1f} ms, p99 {q(during, 0.99) * 1e3:.1f} ms, "
              f"max {during[-1] * 1e3:.0f} ms (n={len(during)}); load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        shutil.rmtree(tmp)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("ingest", "ingest-live", "http", "memory", "otlp"))
    parser.add_argument("--live-rate", type=int, default=1000, help="--only ingest-live: requests/s")
    parser.add_argument("--live-seconds", type=float, default=30.0, help="--only ingest-live: seconds a run")
    parser.add_argument("--live-sample", type=float, default=0.0625, help="--only ingest-live: hopline watch --sample")
    parser.add_argument("--spans", type=int, default=100_000, help="spans in the OTLP request (--only otlp)")
    parser.add_argument(
        "--requests", type=int, default=20_000, help="requests for the throughput runs (x12 events)"
    )
    parser.add_argument("--memory-requests", type=int, default=1_000_000)
    parser.add_argument("--max-open", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.only in (None, "ingest"):
        bench_ingest(args.requests, args.rounds)
    if args.only in (None, "http"):
        bench_http(args.requests)
    if args.only == "otlp":
        bench_otlp(args.spans)
    if args.only == "ingest-live":
        bench_ingest_live(args.live_rate, args.live_seconds, args.rounds, args.live_sample)
    if args.only == "memory":
        bench_memory(args.memory_requests, args.max_open)
    elif args.only is None:  # in a fresh process: RSS must not include the runs above
        subprocess.run(
            [
                sys.executable,
                __file__,
                "--only",
                "memory",
                "--memory-requests",
                str(args.memory_requests),
                "--max-open",
                str(args.max_open),
            ],
            check=True,
        )


if __name__ == "__main__":
    main()
