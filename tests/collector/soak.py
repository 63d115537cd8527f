"""A soak run of a real collector process, shared by the CI test (2 minutes) and bench/ (10 minutes).

Traffic like a fleet's sinks: ``rate`` requests a second in batches every 100 ms, 8 hops each
(client, gateway, engine), a tenth never completing (no first or last token: they expire after
the TTL). The collector's RSS is sampled every 2 s, /healthz's ``open_requests`` with it, and the
latency of every POST (the sink's view of ingest) is kept for percentiles.

What bounds memory (each reached within the warm-up here): open requests by the TTL (rate x
incomplete share x TTL) and ``--max-open-bytes``; finished ones by ``--finished-cache`` (and
their summaries by ``--recent-requests``); dedup keys by two generations of ``--dedup-capacity``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
from support.collector import collector_process
from support.events import event, ndjson

FULL = ("client.sent", "gateway.received", "gateway.forwarded", "engine.received",
        "engine.first_token", "gateway.first_token", "client.first_token", "engine.last_token",
        "gateway.last_token", "client.last_token")
NEVER_COMPLETES = FULL[:4]


def percentile(xs: list[float], q: float) -> float:
    """Nearest rank: never above the largest sample (interpolating quantiles can be)."""
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class SoakReport:
    seconds: float
    warmup_s: float
    rss: list[tuple[float, int]] = field(default_factory=list)  # (elapsed s, bytes)
    open_requests: list[tuple[float, int]] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    requests: int = 0

    def after_warmup(self, series: list[tuple[float, int]]) -> list[int]:
        return [v for t, v in series if t >= self.warmup_s]

    @property
    def rss_growth(self) -> float:
        """Largest RSS after the warm-up over the RSS at its end (1.0: flat)."""
        after = self.after_warmup(self.rss)
        return max(after) / after[0]

    def percentile(self, q: float) -> float:
        return percentile(self.latencies, q)

    def summary(self) -> str:
        after = self.after_warmup(self.rss)
        return (
            f"{self.requests:,} requests in {self.seconds:.0f} s; RSS after {self.warmup_s:.0f} s warm-up "
            f"{after[0] / 2**20:.1f} -> max {max(after) / 2**20:.1f} MiB (x{self.rss_growth:.3f}); open requests "
            f"max {max(self.after_warmup(self.open_requests))}; POST latency p50 {self.percentile(0.5) * 1e3:.1f} ms, "
            f"p99 {self.percentile(0.99) * 1e3:.1f} ms, max {max(self.latencies) * 1e3:.1f} ms; statuses {self.statuses}"
        )


def run_soak(
    data_dir: Path, seconds: float, warmup_s: float, rate: int = 100, *args: str, sample_s: float = 2.0
) -> SoakReport:
    """``rate`` requests a second for ``seconds`` at a collector started with ``args``; RSS and open
    requests sampled every ``sample_s``."""
    report = SoakReport(seconds, warmup_s)
    with collector_process(data_dir, "--fsync", "interval", *args) as (proc, url):
        stop = threading.Event()
        start = time.monotonic()

        def post() -> None:
            i = 0
            with httpx.Client(base_url=url, timeout=30) as client:
                next_at = time.monotonic()
                while not stop.is_set():
                    t = time.time()
                    batch = []
                    for _ in range(rate // 10):
                        hops = NEVER_COMPLETES if i % 10 == 9 else FULL
                        rid = f"soak-{i}"
                        batch += [event(h, rid, t + n * 0.01, stream=True) for n, h in enumerate(hops)]
                        i += 1
                    before = time.perf_counter()
                    r = client.post("/v1/events", content=ndjson(batch), headers={"Content-Type": "application/x-ndjson"})
                    report.latencies.append(time.perf_counter() - before)
                    report.statuses[r.status_code] = report.statuses.get(r.status_code, 0) + 1
                    report.requests = i
                    next_at += 0.1
                    time.sleep(max(0.0, next_at - time.monotonic()))

        poster = threading.Thread(target=post, daemon=True)
        poster.start()
        process = psutil.Process(proc.pid)
        with httpx.Client(base_url=url, timeout=30) as probe:
            while (elapsed := time.monotonic() - start) < seconds:
                report.rss.append((elapsed, process.memory_info().rss))
                report.open_requests.append((elapsed, probe.get("/healthz").json()["open_requests"]))
                time.sleep(sample_s)
        stop.set()
        poster.join(timeout=30)
    return report
