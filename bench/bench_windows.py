"""Window summaries (collector/windows.py, analyzer/windows.py; issue 36): quantile error of the
merged sketches, and the collector's added CPU per ingested event.

    .venv/bin/python bench/bench_windows.py                 # both (about a minute)
    .venv/bin/python bench/bench_windows.py --only error|cpu --rounds 5

Error: generated requests (tests/support/synth.py ``generate``: lognormal stages with heavy
tails, clock skew, errors; one set as the demo's incident, a tripled queue on one replica, one set
of 8 replicas at 400 requests/s), each request's stages from the collector's own stage table, split
over 3 collectors by a hash of the request ID, each collector's summaries served as
``GET /v1/windows`` answers and merged by ``analyzer/windows.py``. Against numpy's exact quantile
(method ``lower``, DDSketch's rank) of the same values, per (10 s window, replica, stage) with at
least 20 values: the largest relative error at p50, p90 and p99, per stage.

CPU, two ways. Alone: the calls the join makes for these requests (``add`` with the request's
start, scope, stage values, outcome), replayed into a fresh ``WindowSummaries``, then folded and
answered, CPU over the events: the figure that is steady on a shared machine. A/B: the same
NDJSON bodies (1,000 events) through ``Ingestor.ingest`` of an in-process collector
(fsync none, grace long enough that every request finishes whole, then ``finish_all``), without
window summaries (``--window 0s``) and with (default: 10 s, replica/model/service), alternately,
fresh each run; the "with" run includes folding every window and building the answer. CPU is
the process's (every thread). Printed: CPU µs per event each way and the difference (noisy:
the whole ingest's round-to-round spread is larger than the summaries' cost).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gzip
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from hopline.analyzer.windows import merge  # noqa: E402
from hopline.collector.app import build_collector, tune_gc  # noqa: E402
from hopline.collector.config import CollectorConfig  # noqa: E402
from hopline.collector.recent import summarize  # noqa: E402
from hopline.collector.stages import compute_stages  # noqa: E402
from hopline.collector.windows import STAGES, WindowSummaries  # noqa: E402
from hopline.middleware.contract import validate_event  # noqa: E402
from hopline.middleware.contract.errors import HoplineError  # noqa: E402
from hopline.middleware.contract.rules import describe_request  # noqa: E402
from support.synth import StageShift, generate  # noqa: E402

QS = (0.5, 0.9, 0.99)
MIN_VALUES = 10  # a (window, replica, stage) cell with fewer values is left out of the error table
WIDTH = 10.0
NO_STORE = Path("/nonexistent/hopline-bench")  # the summaries alone never touch the data directory


REPRO = Path(__file__).resolve().parents[1] / "tests" / "data" / "repro"


def load_events(paths: list[Path]) -> dict[str, list[dict]]:
    """Events of NDJSON files (``.ndjson`` or ``.ndjson.gz``) by request ID."""
    by_id: dict[str, list[dict]] = collections.defaultdict(list)
    for path in paths:
        data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        for line in data.splitlines():
            if line.strip():
                try:  # as the collector takes it (normalized), or left out as it would be
                    ev = validate_event(orjson.loads(line), owned=True)
                except (HoplineError, ValueError):
                    continue
                if "request_id" in ev:  # not the emitters' own stats
                    by_id[ev["request_id"]].append(ev)
    return by_id


def datasets(demo: Path | None = None) -> dict[str, dict[str, list[dict]]]:
    sets = {
        "demo-like: queue x3 on r2 at +60 s, 2 replicas, 40 req/s, 120 s": generate(
            duration_s=120, rate=40, seed=1, incidents=[StageShift("queue", 3.0, 60.0, {"replica": "r2"})]
        ),
        "fleet-like: 8 replicas, 400 req/s, 60 s": generate(
            duration_s=60, rate=400, seed=2, replicas=tuple(f"r{i}" for i in range(8))
        ),
    }
    out = {}
    for name, frame in sets.items():
        by_id: dict[str, list[dict]] = collections.defaultdict(list)
        for row in frame.drop("attrs").to_dicts():
            by_id[row["request_id"]].append({k: v for k, v in row.items() if v is not None})
        out[name] = by_id
    out["recorded: the 6 real vLLM floods of tests/data/repro (1 replica, 1-3 req/s)"] = load_events(
        sorted(REPRO.glob("*/*.ndjson.gz"))
    )
    if demo is not None:  # a `hopline demo --out DIR` run: its collector's store
        files = sorted(demo.rglob("events/**/*.ndjson"))
        out[f"demo: a `hopline demo --out` run ({demo.name})"] = load_events(files)
    return out


def bench_error(sets: dict[str, dict[str, list[dict]]]) -> None:
    for name, by_id in sets.items():
        # keep every window: the recordings are days apart
        config = CollectorConfig(data_dir=NO_STORE, window=WIDTH, window_settle=0.0, window_keep=1e9)
        shards = [WindowSummaries.from_config(config) for _ in range(3)]
        exact: dict[tuple, list[float]] = collections.defaultdict(list)
        for rid, events in by_id.items():
            values, described = compute_stages(events), describe_request(events)
            s = summarize(rid, events, values, described, "complete")
            shards[zlib.crc32(rid.encode()) % 3].add(
                s.started, described["scope"], values, s.outcome, s.ttft_s, s.e2e_s
            )
            start = (s.started // WIDTH) * WIDTH
            for stage in STAGES:
                v = {"ttft": s.ttft_s, "e2e": s.e2e_s}.get(stage, values.get(stage))
                if v is not None and v >= 0:
                    exact[(start, described["scope"]["replica"] or "unknown", stage)].append(v)
        merged = merge([orjson.loads(orjson.dumps(w.answer(now=time.time() + 1e9))) for w in shards])
        worst: dict[str, list[float]] = collections.defaultdict(lambda: [0.0] * len(QS))
        cells = collections.Counter()
        for (start, replica, stage), values in exact.items():
            if len(values) < MIN_VALUES:
                continue
            cells[stage] += 1
            for i, q in enumerate(QS):
                want = np.quantile(values, q, method="lower")
                got = merged.quantile(start, "replica", replica, stage, q)
                if want > 0:
                    worst[stage][i] = max(worst[stage][i], abs(got - want) / want)
        print(f"\n{name}: {len(by_id)} requests, 3 collectors merged")
        print("| stage | (window, replica) cells | max rel. error p50 | p90 | p99 |")
        print("| --- | --- | --- | --- | --- |")
        for stage in STAGES:
            if cells[stage]:
                e = worst[stage]
                print(f"| {stage} | {cells[stage]} | {e[0]:.2%} | {e[1]:.2%} | {e[2]:.2%} |")
        overall = max(max(e) for e in worst.values())
        print(f"max over stages and quantiles: {overall:.3%}")


def _run(bodies: list[bytes], events: int, window: str) -> tuple[float, int]:
    tmp = Path(tempfile.mkdtemp(prefix="hopline-bench-windows-"))
    options = {"data_dir": tmp, "window": window, "fsync": "none", "grace": "1h"}
    config = CollectorConfig.from_options(options)
    c = build_collector(config)
    c.store.open()

    async def run() -> None:
        for body in bodies:
            await c.ingestor.ingest(body)
        c.joiner.finish_all()
        if c.joiner.windows is not None:
            c.joiner.windows.answer(now=time.time() + 1e9)

    cpu0 = time.process_time()
    asyncio.run(run())
    cpu = time.process_time() - cpu0
    c.ingestor.close()
    size = c.joiner.windows.memory_bytes() if c.joiner.windows is not None else 0
    return cpu / events * 1e6, size


def _calls(by_id: dict[str, list[dict]]) -> list[tuple]:
    """What the join hands ``WindowSummaries.add`` for each request (the same stage table)."""
    calls = []
    for rid, events in by_id.items():
        values, described = compute_stages(events), describe_request(events)
        s = summarize(rid, events, values, described, "complete")
        calls.append((s.started, described["scope"], values, s.outcome, s.ttft_s, s.e2e_s))
    return calls


def _summaries_alone(calls: list[tuple]) -> float:
    """CPU seconds of the summaries' whole work for these requests: every add, every fold, the answer."""
    windows = WindowSummaries.from_config(CollectorConfig(data_dir=NO_STORE, window=WIDTH))
    cpu0 = time.process_time()
    for call in calls:
        windows.add(*call)
    windows.answer(now=time.time() + 1e9)
    return time.process_time() - cpu0


def bench_cpu(sets: dict[str, dict[str, list[dict]]], rounds: int) -> None:
    tune_gc()
    for name, by_id in sets.items():
        if name.startswith("recorded"):  # 1-3 requests/s: too few events for a CPU figure
            continue
        calls = _calls(by_id)
        lines = sorted((ev for evs in by_id.values() for ev in evs), key=lambda e: e["ts"])
        encoded = [orjson.dumps(ev) for ev in lines]
        bodies = [b"\n".join(encoded[i : i + 1000]) + b"\n" for i in range(0, len(encoded), 1000)]
        off, on, ratios, alone, size = [], [], [], [], 0
        for r in range(rounds):
            order = ("0s", "10s") if r % 2 == 0 else ("10s", "0s")
            got = {w: _run(bodies, len(encoded), w) for w in order}
            off.append(got["0s"][0])
            on.append(got["10s"][0])
            size = got["10s"][1]
            ratios.append(got["10s"][0] / got["0s"][0] - 1)
            alone.append(_summaries_alone(calls) / len(encoded) * 1e6)
        print(f"\n{name}: {len(encoded)} events, {len(by_id)} requests, {rounds} rounds (alternating)")
        for what, xs in (("without summaries", off), ("with (incl. folding, answer)", on)):
            print(f"ingest CPU µs/event {what}: {statistics.median(xs):.2f} [{min(xs):.2f}, {max(xs):.2f}]")
        share = [a / o for a, o in zip(alone, off, strict=True)]
        print(f"the summaries' work alone (add, fold, answer), same requests: {statistics.median(alone):.2f} "
              f"µs/event [{min(alone):.2f}, {max(alone):.2f}] = {statistics.median(share):.1%} "
              f"[{min(share):.1%}, {max(share):.1%}] of ingest without them (per round)")
        print(f"A/B difference: {statistics.median(ratios):+.1%} [{min(ratios):+.1%}, {max(ratios):+.1%}]; "
              f"summaries kept: {size / 1e6:.2f} MB (memory_bytes)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("error", "cpu"))
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--demo", type=Path, help="a `hopline demo --out DIR` folder: its events too")
    args = parser.parse_args()
    sets = datasets(args.demo)
    if args.only in (None, "error"):
        bench_error(sets)
    if args.only in (None, "cpu"):
        bench_cpu(sets, args.rounds)


if __name__ == "__main__":
    main()
