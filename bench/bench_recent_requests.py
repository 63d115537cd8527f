"""What ``GET /v1/requests?slowest=N`` costs: memory per kept summary, and one query beside a copy.

    .venv/bin/python bench/bench_recent_requests.py [--kept 100000] [--rounds 20]

Memory: ``tracemalloc`` over filling a full ``RecentRequests`` (request IDs of 32 hex characters,
as hopline's client makes them; scope strings shared, as the join's are). Time: the query the
endpoint runs on the scrape thread (``select``: a window holding half of the summaries, the 10
slowest) against the snapshot it takes on the event loop, the same rounds alternated; reported
as medians and as their ratio (the machine is shared: the ratio is the steadier figure).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import tracemalloc

from hopline.collector.recent import RecentRequests, Summary, select

T0 = 1767225600.0


def fill(kept: int) -> RecentRequests:
    rng = random.Random(0)
    recent = RecentRequests(kept)
    for i in range(kept):
        recent.add(
            Summary(
                T0 + i * 0.01, f"{rng.getrandbits(128):032x}", rng.random(), "client", 1 + rng.random() * 5,
                "client", "ok", "complete", "kite-chat", "llama", f"r{i % 4}",
            )
        )  # fmt: skip
    return recent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kept", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    tracemalloc.start()
    recent = fill(args.kept)
    used, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(f"{args.kept:,} summaries: {used / 2**20:.1f} MiB, {used / args.kept:.0f} bytes each")
    copies, queries = [], []
    since = T0 + args.kept * 0.01 / 2
    for _ in range(args.rounds):
        start = time.perf_counter()
        snapshot = recent.snapshot()
        copies.append(time.perf_counter() - start)
        start = time.perf_counter()
        select(snapshot, since=since, slowest=10)
        queries.append(time.perf_counter() - start)
    copy, query = statistics.median(copies), statistics.median(queries)
    print(f"snapshot (on the event loop) {copy * 1e3:.2f} ms, select (scrape thread) {query * 1e3:.1f} ms, "
          f"ratio {query / copy:.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
