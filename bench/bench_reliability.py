"""Collector reliability figures (issue 10): fuzzing, /healthz under hostile bodies, scrape vs ingest,
SIGKILL rounds, soak.

    .venv/bin/python bench/bench_reliability.py                  # everything but the soak (minutes)
    .venv/bin/python bench/bench_reliability.py --only fuzz      # 10,000 hypothesis cases
    .venv/bin/python bench/bench_reliability.py --only healthz   # /healthz latency, idle vs hostile bodies
    .venv/bin/python bench/bench_reliability.py --only scrape    # POST latency, idle vs during big scrapes
    .venv/bin/python bench/bench_reliability.py --only sigkill   # rounds of SIGKILL during ingest
    .venv/bin/python bench/bench_reliability.py --only soak      # 10 minutes, RSS after 5 of warm-up

Everything runs against a real collector: ``python -m hopline.collector`` in its own process for
healthz, scrape, sigkill and soak; uvicorn in a thread of this process for fuzz. The case
generators and runners are the CI tests' own (``tests/collector/ingest_fuzz.py``, ``soak.py``):
the bench runs them longer. Latencies are reported side by side with an idle baseline measured in
the same run (the machine is shared: the ratio is the steadier figure).
"""

from __future__ import annotations

import argparse
import gzip
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "collector"))

from collector_testing import collector_process, event, ndjson, serve, stored_lines
from hopline.collector.config import CollectorConfig
from soak import percentile as pct

NDJSON = {"Content-Type": "application/x-ndjson"}


def ms(xs: list[float]) -> str:
    return f"p50 {pct(xs, 0.5) * 1e3:.1f} ms, p99 {pct(xs, 0.99) * 1e3:.1f} ms, max {max(xs) * 1e3:.1f} ms (n={len(xs)})"


def poll(url: str, path: str, while_alive: threading.Thread | None, seconds: float = 0.0) -> list[float]:
    """Latencies of GET ``path`` every 10 ms, on one keep-alive connection."""
    out = []
    end = time.monotonic() + seconds
    with httpx.Client(base_url=url, timeout=300) as client:
        while (while_alive.is_alive() if while_alive else time.monotonic() < end):
            start = time.perf_counter()
            client.get(path).raise_for_status()
            out.append(time.perf_counter() - start)
            time.sleep(0.01)
    return out


def bench_fuzz(cases: int) -> None:
    from ingest_fuzz import run_fuzz

    tmp = Path(tempfile.mkdtemp(prefix="hopline-fuzz-"))
    config = CollectorConfig(data_dir=tmp, fsync="none", grace=0.0)
    start = time.perf_counter()
    with serve(config) as c:
        report = run_fuzz(c.url, cases)
    stored = {e["eid"]: e for e in stored_lines(tmp)}
    missing = report.expected.keys() - stored.keys()
    differ = [e for e, ev in report.expected.items() if e in stored and stored[e] != ev]
    print(f"## fuzz: {report.cases:,} hypothesis cases in {time.perf_counter() - start:.0f} s")
    print(
        f"valid lines {report.valid_lines:,}, invalid lines {report.invalid_lines:,}; 5xx: {len(report.server_errors)}; "
        f"wrong answers (a valid line not accepted, an invalid one not rejected with its reason): "
        f"{len(report.wrong_answers)}; valid events not stored: {len(missing)}; stored differently: {len(differ)}"
    )
    for problem in (report.server_errors + report.wrong_answers)[:5]:
        print("  ", problem[:300])


def hostile_bodies() -> list[tuple[str, bytes, dict[str, str]]]:
    gz = {**NDJSON, "Content-Encoding": "gzip"}
    legit = ndjson([event("client.sent", f"legit-{i}", 1767225600.0, stream=True) for i in range(40_000)])
    return [
        ("0.06 MiB gzip of 64 MiB newlines", gzip.compress(b"\n" * (64 * 2**20), 9), gz),
        ("8 MiB of {} lines (2.8M lines)", b"{}\n" * (8 * 2**20 // 3), NDJSON),
        ("49,000 {} lines (under the line cap)", b"{}\n" * 49_000, NDJSON),
        ("40,000 valid events (7.5 MiB)", legit, NDJSON),
    ]


def bench_healthz() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="hopline-healthz-"))
    with collector_process(tmp / "data") as (_, url):
        idle = poll(url, "/healthz", None, seconds=5.0)
        print("## /healthz while hostile bodies are ingested (collector process, one keep-alive poller)")
        print("| body | answer | ingest s | /healthz during | p99 ratio to idle |\n|---|---|---|---|---|")
        print(f"| (idle) | | | {ms(idle)} | 1.0 |")
        for name, body, headers in hostile_bodies():
            answer: list[int] = []
            start = time.perf_counter()

            def post(body: bytes = body, headers: dict = headers, answer: list = answer) -> None:
                answer.append(httpx.post(url + "/v1/events", content=body, headers=headers, timeout=600).status_code)

            poster = threading.Thread(target=post)
            poster.start()
            during = poll(url, "/healthz", poster)
            took = time.perf_counter() - start
            print(f"| {name} | {answer[0]} | {took:.2f} | {ms(during)} | {pct(during, 0.99) / pct(idle, 0.99):.1f} |")


def bench_scrape(combinations: int = 2048) -> None:
    """/metrics after ``combinations`` (service, model, replica) scopes; POST latency during scrapes."""
    tmp = Path(tempfile.mkdtemp(prefix="hopline-scrape-"))
    with collector_process(tmp / "data") as (_, url):
        batch = []
        for i in range(combinations):
            rid, t = f"c{i}", 1767225600.0
            batch += [
                event("client.sent", rid, t, stream=False, service=f"s{i % 16}"),
                event("engine.received", rid, t + 0.1, stream=False, model=f"m{i // 16 % 16}", replica=f"r{i // 256}"),
                event("engine.last_token", rid, t + 0.5, replica=f"r{i // 256}"),
                event("client.last_token", rid, t + 0.6),
            ]
        httpx.post(url + "/v1/events", content=ndjson(batch), headers=NDJSON, timeout=60).raise_for_status()
        time.sleep(3)  # the grace period (2 s): every request finished and observed
        start = time.perf_counter()
        size = len(httpx.get(url + "/metrics", timeout=60).content)
        scrape_s = time.perf_counter() - start

        def posts(seconds: float) -> list[float]:
            out, end, i = [], time.monotonic() + seconds, 0
            with httpx.Client(base_url=url, timeout=60) as client:
                while time.monotonic() < end:
                    body = ndjson([event("client.sent", f"p{i}-{j}", 1767225600.0, stream=True) for j in range(100)])
                    i += 1
                    t0 = time.perf_counter()
                    client.post("/v1/events", content=body, headers=NDJSON).raise_for_status()
                    out.append(time.perf_counter() - t0)
                    time.sleep(0.01)
            return out

        idle = posts(5.0)
        stop = threading.Event()

        def scrape_loop() -> None:
            with httpx.Client(base_url=url, timeout=60) as client:
                while not stop.is_set():
                    client.get("/metrics", headers={"Accept": "application/openmetrics-text"})

        scraper = threading.Thread(target=scrape_loop)
        scraper.start()
        during = posts(5.0)
        stop.set()
        scraper.join()
    print(f"## /metrics after {combinations:,} (service, model, replica) combinations (scope cap 128)")
    print(f"exposition {size / 2**20:.2f} MiB, one scrape {scrape_s:.2f} s")
    print(f"POST of 100 events, idle: {ms(idle)}")
    print(f"POST of 100 events, during back-to-back scrapes: {ms(during)}; p99 ratio {pct(during, 0.99) / pct(idle, 0.99):.1f}")


def bench_sigkill(rounds: int) -> None:
    from test_collector_process import ingest_until_killed

    tmp = Path(tempfile.mkdtemp(prefix="hopline-sigkill-"))
    acked: set[str] = set()
    print(f"## SIGKILL during sustained ingest, {rounds} rounds")
    for n in range(rounds):
        acked |= set(ingest_until_killed(tmp / "data", n, at_least=2000 + 1000 * (n % 5)))
        on_disk = {e["eid"] for e in stored_lines(tmp / "data")}
        print(f"round {n}: acknowledged so far {len(acked):,}, missing on disk {len(acked - on_disk)}")
    from hopline.analyzer.io import scan_events

    frame, _ = scan_events([tmp / "data"])
    read = set(frame.select("eid").collect()["eid"].to_list())
    print(f"read back by the analyzer: {len(acked & read):,} of {len(acked):,} acknowledged")


def bench_soak(seconds: float, warmup_s: float) -> None:
    from soak import run_soak

    tmp = Path(tempfile.mkdtemp(prefix="hopline-soak-"))
    report = run_soak(
        tmp / "data", seconds, warmup_s, 100, "--ttl", "60s", "--finished-cache", "10000",
        "--recent-requests", "10000", "--dedup-capacity", "100000",
    )  # fmt: skip
    print(f"## soak: 100 requests/s, 10% never complete, TTL 60 s, {seconds:.0f} s")
    print(report.summary())
    print("RSS MiB every 30 s:", " ".join(f"{r / 2**20:.0f}" for t, r in report.rss[::15]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("fuzz", "healthz", "scrape", "sigkill", "soak"))
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--soak-seconds", type=float, default=600.0)
    parser.add_argument("--warmup-seconds", type=float, default=300.0)
    args = parser.parse_args()
    if args.only in (None, "fuzz"):
        bench_fuzz(args.cases)
    if args.only in (None, "healthz"):
        bench_healthz()
    if args.only in (None, "scrape"):
        bench_scrape()
    if args.only in (None, "sigkill"):
        bench_sigkill(args.rounds)
    if args.only == "soak":
        bench_soak(args.soak_seconds, args.warmup_seconds)


if __name__ == "__main__":
    main()
