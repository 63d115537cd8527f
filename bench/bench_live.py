"""Live detection: delay in event time, and the detector's CPU per finished request.

    .venv/bin/python bench/bench_live.py [--seeds 10] [--rate 20] [--scale-rate 200] [--scale-minutes 10]
    .venv/bin/python bench/bench_live.py --clean-hours 6 --clean-rate 100 [--clean-step 60]
    .venv/bin/python bench/bench_live.py --memory-rate 1000 --memory-minutes 3 --scope-values 50 [--keep-all]
    .venv/bin/python bench/bench_live.py --sampled-rate 1000 --sample 0.0625 --sample-horizon 600 --sample-replicas 4 50
    .venv/bin/python bench/bench_live.py --sampled-rate 1000 --sample 0.0625 --sample-horizon 1800 --sample-replicas 50 \
        --seeds 1 --sample-clean-minutes 60
    .venv/bin/python bench/bench_live.py --read-cost --sample 0.25 0.0625
    .venv/bin/python bench/bench_live.py --demo-runs DIR   (DIR/X from: hopline demo --seconds 60
                                                            --scenario X --out DIR/X --json > DIR/X.json)

Delay: for each seed, a generated log (tests/support/synth.py) of four replicas at ``--rate``
requests/s whose replica r2's queue time triples at 10:00 (no end) is replayed through
``LiveDetector`` (defaults: 10 s window and step, 30 min horizon) until the first incident fires;
the delay is the event time of that step minus the start of the first request the rise affected
(the first on r2 at or after 10:00). The finding must name queue and replica r2 (a miss is
reported). Event time: the figures do not depend on the machine.

CPU: process CPU seconds in the detector's steps (``LiveDetector.cpu_s``: taking finished requests
in, building their timelines, the analysis on the horizon, the incident book) per finished
request, for the runs above, and for a clean log at ``--scale-rate`` over ``--scale-minutes``
(the horizon grows to the whole log, so a step's cost grows with the rate).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from hopline.analyzer.live.detector import LiveConfig, LiveDetector
from support.synth import DEFAULT_START, StageShift, generate

REPLICAS = ("r1", "r2", "r3", "r4")
ONSET_S = 600.0


def batches(events: pl.DataFrame, every_s: float) -> list[pl.DataFrame]:
    slot = (pl.col("ts") / every_s).floor().alias("_slot")
    return [p.drop("_slot") for p in events.sort("ts").with_columns(slot).partition_by("_slot", maintain_order=True)]


def first_affected(events: pl.DataFrame) -> float:
    sent = events.filter((pl.col("hop") == "client.sent") & (pl.col("ts") >= DEFAULT_START + ONSET_S))
    engine = events.filter((pl.col("hop") == "engine.received") & (pl.col("replica") == "r2")).select("request_id")
    return float(sent.join(engine, on="request_id")["ts"].min())


def delay_run(seed: int, rate: float) -> dict:
    rise = StageShift("queue", 3.0, at_s=ONSET_S, scope={"replica": "r2"})
    events = generate(duration_s=ONSET_S + 300, rate=rate, seed=seed, replicas=REPLICAS, incidents=[rise])
    detector = LiveDetector(LiveConfig())
    wall = time.perf_counter()
    for part in batches(events, detector.config.every_s):
        detector.feed(part)
        if detector.book.firing():
            break
    wall = time.perf_counter() - wall
    fired = detector.book.firing()
    hit = bool(fired) and fired[0].finding.get("stage") == "queue" and fired[0].scope == {"replica": "r2"}
    delay = (detector.now - first_affected(events)) if hit else None
    return {"seed": seed, "delay_s": delay, "cpu_s": detector.cpu_s, "wall_s": wall,
            "requests": detector.finished_requests, "steps": detector.steps, "fired": [i.key for i in fired]}  # fmt: skip


def scale_run(rate: float, minutes: float) -> dict:
    events = generate(duration_s=minutes * 60, rate=rate, seed=99, replicas=REPLICAS)
    detector = LiveDetector(LiveConfig())
    for part in batches(events, detector.config.every_s):
        detector.feed(part)
    detector.flush()
    return {"cpu_s": detector.cpu_s, "requests": detector.finished_requests, "steps": detector.steps,
            "incidents": len(detector.incidents()), "horizon_rows": detector.horizon.height}  # fmt: skip


def memory_run(rate: float, minutes: float, values: int, keep_all: bool) -> dict:
    """Clean traffic at ``rate`` over ``values`` replicas for ``minutes`` through a ``LiveDetector``
    with its defaults: the horizon's bytes per request (polars' ``estimated_size``) and what a full
    30 min horizon at ``rate`` would hold; CPU per finished request. ``keep_all``: every timeline
    column kept (the horizon before ``detector.NOT_KEPT``)."""
    import resource

    from hopline.analyzer.live import detector as live_detector

    if keep_all:
        live_detector.NOT_KEPT = frozenset()
    replicas = tuple(f"r{i}" for i in range(values))
    events = generate(duration_s=minutes * 60, rate=rate, seed=98, replicas=replicas)
    detector = LiveDetector(LiveConfig())
    wall = time.perf_counter()
    for part in batches(events, detector.config.every_s):
        detector.feed(part)
    detector.flush()
    rows = detector.horizon.height
    per_row = detector.horizon.estimated_size() / rows
    full = LiveConfig().horizon_s * rate
    return {"rate": rate, "minutes": minutes, "scope_values": values, "keep_all": keep_all,
            "requests": detector.finished_requests, "steps": detector.steps, "horizon_rows": rows,
            "bytes_per_row": round(per_row, 1), "horizon_mib": round(per_row * rows / 2**20, 1),
            "horizon_30min_mib": round(per_row * full / 2**20, 1),
            "cpu_ms_per_request": round(detector.cpu_s / detector.finished_requests * 1e3, 3),
            "cpu_s_per_step": round(detector.cpu_s / detector.steps, 3), "wall_s": round(time.perf_counter() - wall, 1),
            "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}  # fmt: skip


def sampled_run(
    rate: float, n_replicas: int, sample: float, horizon_s: float, seed: int, clean_minutes: float | None = None
) -> dict:
    """Production rates: ``rate`` requests/s over ``n_replicas`` replicas, 10 minutes clean and then
    queue time x3 on replica r2 (generated a minute at a time, to bound the bench's memory), through
    a ``LiveDetector`` analysing ``sample`` of the requests with a ``horizon_s`` horizon, until the
    first incident fires (or 3 minutes after the onset). The detector's CPU (steps and the sampling
    in ``feed``) per request of all traffic and per second of event time (a core's share at that
    rate in real time); the delay from the first affected request to the step that fired.
    ``clean_minutes``: no incident, that long, every alert counted; the process' peak RSS."""
    import resource

    replicas = tuple(f"r{i}" for i in range(1, n_replicas + 1))
    cfg = LiveConfig(horizon_s=horizon_s, recent_s=min(300.0, horizon_s / 2), sample=sample)
    detector = LiveDetector(cfg)
    opened: list = []
    detector.on_step = lambda now, changed: opened.extend(i for i in changed if i.first_seen == now)
    cpu = wall = 0.0
    total, first_hit = 0, None
    for minute in range(13 if clean_minutes is None else int(clean_minutes)):
        rise = [StageShift("queue", 3.0, at_s=0, scope={"replica": "r2"})] if minute >= 10 and clean_minutes is None else []
        chunk = generate(duration_s=60, rate=rate, seed=seed * 1000 + minute, replicas=replicas,
                         start=DEFAULT_START + 60 * minute, incidents=rise)  # fmt: skip
        total += chunk["request_id"].n_unique()
        if minute == 10:
            r2 = chunk.filter((pl.col("hop") == "engine.received") & (pl.col("replica") == "r2"))["request_id"]
            sent = chunk.filter((pl.col("hop") == "client.sent") & pl.col("request_id").is_in(r2.implode()))
            first_hit = float(sent["ts"].min())
        for part in batches(chunk, cfg.every_s):
            c0, w0 = time.process_time(), time.perf_counter()
            detector.feed(part)
            cpu += time.process_time() - c0
            wall += time.perf_counter() - w0
            if detector.book.firing() and clean_minutes is None:
                break
        if detector.book.firing() and clean_minutes is None:
            break
    fired = detector.book.firing()
    hit = bool(fired) and fired[0].finding.get("stage") == "queue" and fired[0].scope == {"replica": "r2"}
    span = (detector.now or DEFAULT_START) - DEFAULT_START
    return {"rate": rate, "replicas": n_replicas, "sample": sample, "horizon_s": horizon_s, "seed": seed,
            "fired": [f"{i.key[1]} {i.scope}" for i in fired], "named_r2": hit,
            "delay_s": round(detector.now - first_hit, 1) if hit and first_hit else None,
            "requests": total, "analysed": detector.finished_requests, "horizon_rows": detector.horizon.height,
            "steps": detector.steps, "cpu_s": round(cpu, 1), "wall_s": round(wall, 1),
            "cpu_us_per_request": round(cpu / total * 1e6, 1), "core_share": round(cpu / span, 4),
            "step_cpu_s_last": round(detector.cpu_s / max(detector.steps, 1), 3), "alerts": len(opened),
            "horizon_mib": round(detector.horizon.estimated_size("mb"), 1),
            "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}  # fmt: skip


def read_cost(fractions: list[float], rounds: int = 5) -> dict:
    """What following the store costs per event (``feed.Tail.poll``: read, translate, sample,
    parse and validate), unsampled and at each fraction, on 2 minutes of generated traffic at
    100 requests/s written as NDJSON: process CPU, best of ``rounds``, alternating."""
    import tempfile

    from hopline.analyzer.live.feed import Tail
    from support.synth import write_ndjson

    events = generate(duration_s=120, rate=100, seed=7, replicas=REPLICAS)
    folder = Path(tempfile.mkdtemp())
    write_ndjson(events, folder / "events.ndjson")
    best: dict[float, float] = {}
    for _ in range(rounds):
        for fraction in [1.0, *fractions]:
            tail = Tail([folder], sample=fraction)
            c0 = time.process_time()
            tail.poll()
            took = time.process_time() - c0
            best[fraction] = min(best.get(fraction, took), took)
    return {"events": events.height, **{f"us_per_event_sample_{f:g}": round(t / events.height * 1e6, 2) for f, t in best.items()}}


DEMO_SETTINGS = dict(settle_s=1.0, lateness_s=1.0, hold_s=5.0)  # demo/live.py's watch


def demo_compare(folder: Path) -> dict:
    """One recorded demo run (``hopline demo --out FOLDER --json > FOLDER.json``) replayed with the
    demo's watch settings to its end (``drain``): every incident that fired, and whether one names
    what ``hopline analyze``'s first finding names (stage or pitfall, scope; onset within a window)."""
    import orjson
    from hopline.analyzer.live.feed import replay
    from hopline.analyzer.live.incidents import subject
    from hopline.demo.live import watch_argv
    from hopline.middleware.contract.units import to_epoch

    report = orjson.loads(Path(f"{folder}.json").read_bytes())
    first = report["findings"][0]
    argv = watch_argv(folder, 60, [])
    opt = lambda name: float(argv[argv.index(name) + 1].rstrip("s"))
    window = report["window_s"]
    cfg = LiveConfig(window_s=window, horizon_s=opt("--horizon"), recent_s=opt("--recent"), **DEMO_SETTINGS)
    detector = LiveDetector(cfg)
    fired: list = []
    # each incident as it fired (its finding and onset then; later steps refine them)
    detector.on_step = lambda now, changed: fired.extend(
        (now, SimpleNamespace(key=i.key, scope=i.scope, finding=dict(i.finding), onset=i.onset))
        for i in changed
        if i.first_seen == now
    )
    for part in replay([folder / "events"], cfg.every_s):
        detector.feed(part)
    detector.drain()
    want = (subject(first), first.get("scope") or {})
    same = [(now, i) for now, i in fired if (i.key[1], i.scope) == want]
    onset_ok = None
    if same and first.get("at"):
        onset_ok = abs(to_epoch(same[0][1].finding["at"]) - to_epoch(first["at"])) <= window
    return {
        "scenario": folder.name, "offline": f"{want[0]} {want[1]} at {first.get('at')}",
        "fired": [f"{i.key[1]} {i.scope}" for _, i in fired], "named": bool(same),
        "first_live_is_it": bool(fired) and (fired[0][1].key[1], fired[0][1].scope) == want,
        "onset_within_window": onset_ok,
        "delay_s": None if not same else same[0][0] - same[0][1].onset,
        "trusted": report.get("demo", {}).get("trusted"),
    }  # fmt: skip


def clean_chunks(hours: float, mean_rate: float, chunk_s: float = 300.0):
    """Clean traffic in ``chunk_s`` pieces (event-time order), with no incident: a daily curve
    squeezed into ``hours`` (trough ``mean_rate / 1.5``, peak 3x the trough), synth's lognormal
    stage times (heavy right tails), replica r5 joining at 1/3 and leaving at 2/3 of the run, and
    a deployment restart at 1/2: every replica gone for 30 s, then back."""
    import math as _math

    total = hours * 3600.0
    n = int(total // chunk_s)
    for i in range(n):
        t0 = i * chunk_s
        phase = 2 * _math.pi * (t0 + chunk_s / 2) / total
        rate = mean_rate * (1 - 0.5 * _math.cos(phase))  # 0.5x .. 1.5x the mean: 3x trough to peak
        replicas = REPLICAS + (("r5",) if total / 3 <= t0 < 2 * total / 3 else ())
        start, length = DEFAULT_START + t0, chunk_s
        if t0 <= total / 2 < t0 + chunk_s:  # the restart: 30 s without traffic
            gap = total / 2 - t0
            if gap > 0:
                yield generate(duration_s=gap, rate=rate, seed=10_000 + i, replicas=replicas, start=start)
            start, length = DEFAULT_START + total / 2 + 30, chunk_s - gap - 30
        yield generate(duration_s=length, rate=rate, seed=20_000 + i, replicas=replicas, start=start)


def false_alarms(hours: float, mean_rate: float, step_s: float | None) -> dict:
    """``clean_chunks`` through a ``LiveDetector`` with its defaults (``step_s``: the analysis
    every so often instead of every window): incidents opened, per hour."""
    import resource

    detector = LiveDetector(LiveConfig(step_s=step_s))
    opened: list = []
    detector.on_step = lambda now, changed: opened.extend(i for i in changed if i.first_seen == now)
    wall = time.perf_counter()
    for chunk in clean_chunks(hours, mean_rate):
        for part in batches(chunk, 60.0):
            detector.feed(part)
    detector.flush()
    return {
        "hours": hours, "requests": detector.finished_requests, "steps": detector.steps,
        "alerts": len(opened), "alerts_per_hour": len(opened) / hours,
        "opened": [(iso(i.first_seen), i.key, i.finding["summary"]) for i in opened],
        "cpu_s": detector.cpu_s, "wall_s": time.perf_counter() - wall,
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "horizon_rows": detector.horizon.height if detector.horizon is not None else 0,
        "horizon_mib": detector.horizon.estimated_size("mb") if detector.horizon is not None else 0,
        "pending_mib": detector.pending.estimated_size("mb"),
    }  # fmt: skip


def iso(ts: float) -> str:
    from hopline.analyzer.findings.model import iso_utc

    return iso_utc(ts)


def spread(values: list[float]) -> str:
    q = statistics.quantiles(values, n=10) if len(values) >= 2 else values * 9
    return (f"median {statistics.median(values):.1f}, min {min(values):.1f}, p10 {q[0]:.1f}, "
            f"p90 {q[-1]:.1f}, max {max(values):.1f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--scale-rate", type=float, default=200.0)
    parser.add_argument("--scale-minutes", type=float, default=10.0)
    parser.add_argument("--demo-runs", type=Path, help="Compare live and offline on recorded demo runs here.")
    parser.add_argument("--clean-hours", type=float, help="False alarms: replay this many hours of clean traffic.")
    parser.add_argument("--clean-rate", type=float, default=100.0, help="Its mean requests/s.")
    parser.add_argument("--clean-step", type=float, help="Run the analysis every this many s (default: window).")
    parser.add_argument("--memory-rate", type=float, help="Horizon bytes and CPU at this many requests/s.")
    parser.add_argument("--memory-minutes", type=float, default=3.0)
    parser.add_argument("--scope-values", type=int, default=50, help="Replicas in the --memory-rate run.")
    parser.add_argument("--keep-all", action="store_true", help="--memory-rate: keep every timeline column.")
    parser.add_argument("--sampled-rate", type=float, help="Delay and CPU at this many requests/s, sampled.")
    parser.add_argument("--sample", type=float, nargs="+", default=[0.0625], help="--sampled-rate: fractions.")
    parser.add_argument("--sample-horizon", type=float, default=600.0)
    parser.add_argument("--sample-replicas", type=int, nargs="+", default=[4, 50])
    parser.add_argument("--sample-clean-minutes", type=float, help="--sampled-rate: clean traffic this long.")
    parser.add_argument("--read-cost", action="store_true", help="Following the store: CPU per event, by --sample.")
    args = parser.parse_args()
    if args.read_cost:
        print(orjson_line(read_cost(args.sample)), flush=True)
        return
    if args.sampled_rate:
        for n in args.sample_replicas:
            for fraction in args.sample:
                for seed in range(args.seeds):
                    run = sampled_run(
                        args.sampled_rate, n, fraction, args.sample_horizon, seed, args.sample_clean_minutes
                    )
                    print(orjson_line(run), flush=True)
        return
    if args.memory_rate:
        run = memory_run(args.memory_rate, args.memory_minutes, args.scope_values, args.keep_all)
        print(orjson_line(run), flush=True)
        return
    if args.clean_hours:
        print(orjson_line(false_alarms(args.clean_hours, args.clean_rate, args.clean_step)), flush=True)
        return
    if args.demo_runs:
        folders = sorted(p for p in args.demo_runs.iterdir() if p.is_dir() and Path(f"{p}.json").exists())
        for folder in folders:
            print(orjson_line(demo_compare(folder)), flush=True)
        return
    runs = [delay_run(seed, args.rate) for seed in range(args.seeds)]
    for r in runs:
        print(f"seed {r['seed']}: delay {r['delay_s']} s, {r['steps']} steps, {r['requests']} requests, "
              f"CPU {r['cpu_s']:.1f} s, wall {r['wall_s']:.1f} s, fired {r['fired']}")  # fmt: skip
    delays = [r["delay_s"] for r in runs if r["delay_s"] is not None]
    print(f"delay (event time, s) over {len(delays)}/{len(runs)} seeds that fired on queue r2: {spread(delays)}")
    per = [r["cpu_s"] / r["requests"] * 1e3 for r in runs]
    print(f"CPU per finished request at {args.rate:g}/s (ms): {spread(per)}")
    steps = [r["cpu_s"] / r["steps"] for r in runs]
    print(f"CPU per step at {args.rate:g}/s, horizon up to {ONSET_S / 60 + 5:.0f} min (s): {spread(steps)}")
    if args.scale_rate:
        s = scale_run(args.scale_rate, args.scale_minutes)
        print(f"clean log at {args.scale_rate:g}/s for {args.scale_minutes:g} min: {s['requests']} requests, "
              f"{s['steps']} steps, CPU {s['cpu_s']:.1f} s = {s['cpu_s'] / s['requests'] * 1e3:.2f} ms per request, "
              f"{s['cpu_s'] / s['steps']:.2f} s per step (last horizon {s['horizon_rows']} rows), "
              f"{s['incidents']} incidents")  # fmt: skip


def orjson_line(row: dict) -> str:
    import orjson

    return orjson.dumps(row).decode()


if __name__ == "__main__":
    main()
