"""A restarted collector's start-up rebuild (collector/restart.py; issue 36): what it costs against
ingesting the same events.

    .venv/bin/python bench/bench_restart.py [--requests 5000] [--older 200000] [--rounds 3]

Each round: generated requests (tests/support/synth.py ``generate``, ~12 events each, started in the
last minute) are ingested as NDJSON bodies of 1,000 events through ``Ingestor.ingest`` of an
in-process collector (fsync none, default windows; timed: ingest, then ``finish_all``), after
``--older`` events of about two hours' span written straight into the same hour's file ahead of them
(ending ~400 s before now: what hours of traffic leave before a kill; the rebuild bisects past
them). Then a second
collector is built on the same data directory and ``restart.rebuild`` timed (no
``windows.settled``: everything from ``window_settle`` + 2 windows + the margin back is read).
Printed per round: wall and CPU seconds of each, and rebuild / ingest.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from hopline.collector.app import build_collector  # noqa: E402
from hopline.collector.config import CollectorConfig  # noqa: E402
from hopline.collector.restart import rebuild  # noqa: E402
from hopline.collector.store import NDJSON_NAME, hour_dir  # noqa: E402
from hopline.middleware.contract import dumps  # noqa: E402
from support.synth import generate  # noqa: E402


def bodies(n: int, now: float) -> list[bytes]:
    frame = generate(n, seed=7, rate=n / 50.0, start=now - 60, clock_skew_s=0.0).drop("attrs")
    events = [{k: v for k, v in row.items() if v is not None} for row in frame.to_dicts()]
    lines = [dumps(e) for e in events]
    return [b"".join(lines[i : i + 1000]) for i in range(0, len(lines), 1000)]


def older_lines(n: int, now: float) -> bytes:
    frame = generate(max(1, n // 12), seed=8, rate=n / 12 / 7000, start=now - 7400, clock_skew_s=0.0)
    events = [{k: v for k, v in row.items() if v is not None} for row in frame.drop("attrs").to_dicts()]
    events.sort(key=lambda e: e["ts"])
    return b"".join(dumps(e) for e in events)


def one_round(args: argparse.Namespace) -> tuple[float, float, float, float, int]:
    now = time.time()
    data_dir = Path(tempfile.mkdtemp(prefix="hopline-bench-restart-"))
    try:
        config = CollectorConfig(data_dir=data_dir, fsync="none", grace=3600.0)
        path = hour_dir(data_dir / "events", int(now) // 3600 * 3600) / NDJSON_NAME
        path.parent.mkdir(parents=True)
        path.write_bytes(older_lines(args.older, now))
        c = build_collector(config)
        c.store.open()
        payload = bodies(args.requests, now)

        async def ingest() -> None:
            for body in payload:
                await c.ingestor.ingest(body, "ndjson")

        wall, cpu = time.perf_counter(), time.process_time()
        asyncio.run(ingest())
        c.joiner.finish_all()
        ingest_wall, ingest_cpu = time.perf_counter() - wall, time.process_time() - cpu
        c.ingestor.close()
        again = build_collector(config)
        wall, cpu = time.perf_counter(), time.process_time()
        done = rebuild(again)
        rebuild_wall, rebuild_cpu = time.perf_counter() - wall, time.process_time() - cpu
        assert done.rebuilt == args.requests, done
        return ingest_wall, ingest_cpu, rebuild_wall, rebuild_cpu, done.events
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--older", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = collections.defaultdict(list)
    for r in range(args.rounds):
        ingest_wall, ingest_cpu, rebuild_wall, rebuild_cpu, events = one_round(args)
        rows["ratio"].append(rebuild_cpu / ingest_cpu)
        print(
            f"round {r + 1}: {events} events read back ({args.older} older ones before them): "
            f"ingest {ingest_wall:.2f} s wall / {ingest_cpu:.2f} s CPU, "
            f"rebuild {rebuild_wall:.2f} s wall / {rebuild_cpu:.2f} s CPU, "
            f"rebuild / ingest CPU {rebuild_cpu / ingest_cpu:.2f}"
        )


if __name__ == "__main__":
    main()
