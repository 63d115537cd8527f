"""``hopline watch --collector`` (analyzer/live/windowed.py; issue 36): the watcher's CPU per step
against traffic, and how soon a small scope's change is alerted, on event-time replays.

    .venv/bin/python bench/bench_live_windows.py cost  [--rates 1000,3000,10000] [--values 200]
    .venv/bin/python bench/bench_live_windows.py delay [--case big|small] [--seeds 5] [--seed-from 0]
        [--settle 30] [--onset 180] [--after 120]
    .venv/bin/python bench/bench_live_windows.py request-level [--rl-rate 1000] [--rl-sample 0.0625]
    .venv/bin/python bench/bench_live_windows.py clean [--clean-rate 1000] [--clean-minutes 30] [--values 200]
    .venv/bin/python bench/bench_live_windows.py clean6h [--clean-rate 1010] [--hours 6]

The collectors are in-process ``collector.windows.WindowSummaries`` (the collector's own window
code: ``add`` per finished request, folds, ``answer`` as ``GET /v1/windows`` serves it), not
processes behind HTTP: 10,000 requests/s of collector ingest over HTTP does not fit on this 2-core
machine next to the watcher. The watcher's side is the real one: ``CollectorFeed._merge`` of each
answer (the JSON's parts, decoded from DDSketch's protobuf) and ``WindowDetector`` steps; its CPU is
measured around those two only (``time.process_time``), not around the collectors' work.

Requests are drawn with numpy: Poisson-like uniform starts, replica, service (5), model (replica
mod 5), lognormal stages (network 5 ms, gateway 2 ms, frontend 4 ms, queue 40 ms, prefill 80 ms,
decode 2 s), tokens; each request is handed to the collector of its shard (a hash of its index)
when it finishes (start + e2e), in finish order, with the collectors' clock at the replay's event
time. The collectors settle a window ``--settle`` after its end (the collector's default, 30 s).

cost: at each rate, the same scope values (``--values``: replicas + 5 services + 5 models, the
replicas being the rest), ``--horizon`` of windows; the watcher's CPU per step (merge + step)
over the steps after the horizon filled. Also the same for 100 and 1,000 scope values at 1,000
requests/s (``--by-values``).

delay: a 3x queue from a window boundary on one replica: 1 of 1,000 replicas at 10,000 requests/s
over 10 collectors, and 1 of 50 at 1,000 over 3. The replay's clock at which the alert first
fires (an incident that pages) minus the onset, event time, per seed, and the median.

clean6h: bench_live.py's 6 h clean traffic (its ``clean_chunks``: daily curve, synth's heavy-tailed
stages, a replica joining and leaving, a restart), the hop events turned into finished requests by
the analyzer's timelines, through the collectors and the watcher with its defaults: every alert
that pages is a false alarm; the noted incidents and the findings seen at any step are listed.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from hopline.analyzer.live.detector import LiveConfig
from hopline.analyzer.live.windowed import CollectorFeed, WindowDetector
from hopline.collector.windows import TIME_STAGES, TOKENS, WindowSummaries

WIDTH = 10.0
START = 1_767_607_200.0  # 2026-01-05T10:00:00Z
STAGES = {
    "network": 0.005,
    "gateway": 0.002,
    "frontend": 0.004,
    "queue": 0.040,
    "prefill": 0.080,
    "decode": 2.0,
}
BY = ("replica", "model", "service")
SCOPE = ("service", "model", "replica")  # a request frame's scope columns (``request_frame``)


def summaries(settle_s: float, clock) -> WindowSummaries:
    """The collector's window summaries with a cap above the bench's replicas (the default cap,
    128 values per attribute and window, would fold 1,000 replicas into ``other``)."""
    try:
        return WindowSummaries(
            window=WIDTH,
            window_keep=3600.0,
            window_by=BY,
            window_scope_cap=4096,
            window_settle=settle_s,
            clock=clock,
        )
    except TypeError:  # the constructor's earlier keywords
        return WindowSummaries(
            width_s=WIDTH, keep_s=3600.0, by=BY, scope_cap=4096, settle_s=settle_s, clock=clock
        )


def requests(rate: float, seconds: float, replicas: int, seed: int, shifted: int | None, onset_s: float):
    """Columns of ``rate * seconds`` requests; queue x3 on replica ``shifted`` from ``onset_s``."""
    rng = np.random.default_rng(seed)
    n = int(rate * seconds)
    start = START + np.sort(rng.uniform(0, seconds, n))
    replica = rng.integers(0, replicas, n)
    service = rng.integers(0, 5, n)
    values = {s: rng.lognormal(np.log(m), 0.35, n) for s, m in STAGES.items()}
    if shifted is not None:
        hit = (replica == shifted) & (start >= START + onset_s)
        values["queue"][hit] *= 3.0
    ttft = sum(values[s] for s in STAGES if s != "decode")
    e2e = ttft + values["decode"]
    prompt = rng.integers(200, 2000, n)
    return start, replica, service, values, ttft, e2e, prompt


class Replay:
    """Requests handed to in-process collectors as they finish, the watcher polling each second
    of event time; ``watch_cpu`` is the watcher's CPU (merge + steps), ``fired`` the first paging
    incidents' (clock, incident)."""

    def __init__(self, shards: int, settle_s: float, config: LiveConfig) -> None:
        self.clock = START
        self.collectors = [summaries(settle_s, lambda: self.clock) for _ in range(shards)]
        self.feed = _InProcess(urls=[f"c{i}" for i in range(shards)], replay=self)
        self.detector = WindowDetector(self.feed, config)
        self.fired: list[tuple[float, object]] = []
        self.found: dict[tuple, float] = {}  # (stage, scope) -> the replay's clock when first found
        self.noted: list[tuple[float, object]] = []  # incidents opened that do not page
        self.sentences: dict[tuple, tuple[float, str]] = {}  # any finding -> (clock first seen, sentence)
        self.detector.on_step = self._on_step
        self.step_cpu: list[
            float
        ] = []  # the watcher's CPU per step: its merges since the last step and the step
        self.merge_per_step: list[float] = []  # of which merging the collectors' answers
        self.merge_cpu = 0.0

    def _on_step(self, now, changed) -> None:
        for f in self.detector.findings:
            if getattr(f, "stage", None) and (f.stage, tuple(f.scope.items())) not in self.found:
                self.found[(f.stage, tuple(f.scope.items()))] = self.clock
            key = (type(f).__name__, getattr(f, "stage", None), tuple(sorted((f.scope or {}).items())))
            if key not in self.sentences:
                self.sentences[key] = (self.clock, f.sentence)
        for incident in changed:
            if incident.state == "firing" and incident.first_seen == now:
                (self.fired if incident.pages else self.noted).append((self.clock, incident))

    def run(self, cols, replicas: int, until_s: float) -> None:
        start, replica, service, values, ttft, e2e, prompt = cols
        finish = start + e2e
        order = np.argsort(finish, kind="stable")
        names = [f"r{i:04d}" for i in range(replicas)]
        scopes = {
            (r, s): {"replica": names[r], "model": f"m{r % 5}", "service": f"s{s}"}
            for r in range(replicas) for s in range(5)
        }  # fmt: skip
        stage_names = [*STAGES, "prompt_tokens", "output_tokens", "cached_tokens"]
        ends = finish[order]
        adds = [c.add for c in self.collectors]
        k = 0
        tick = START + 1.0
        while tick <= START + until_s:
            stop = int(np.searchsorted(ends, tick, side="right"))
            if stop > k:  # this second's finished requests, as plain Python values
                idx = order[k:stop]
                columns = [values[s][idx] for s in STAGES] + [
                    prompt[idx],
                    np.full(len(idx), 200),
                    np.zeros(len(idx)),
                ]
                rows = np.column_stack(columns).tolist()
                shards = ((idx * 2654435761 % 2**32) % len(self.collectors)).tolist()
                keys = zip(replica[idx].tolist(), service[idx].tolist(), strict=True)
                for j, key in enumerate(keys):
                    i = idx[j]
                    adds[shards[j]](
                        float(start[i]),
                        scopes[key],
                        dict(zip(stage_names, rows[j])),
                        "ok",
                        float(ttft[i]),
                        float(e2e[i]),
                    )
                k = stop
            self._tick(tick)
            tick += 1.0

    def run_frames(self, frames, after_s: float) -> tuple[int, float, float]:
        """Requests in frames (``request_frame``'s columns; each frame's requests start no earlier
        than the previous frame's), each handed to its shard's collector once it finishes, a tick
        a second of event time, until ``after_s`` past the last start. A frame is read before the
        ticks up to its first start run, so every request that finishes by a tick is in hand; the
        ones that finish later carry over. Returns (requests, first start, last start)."""
        names = [*TIME_STAGES, *TOKENS]
        columns = ["start", *SCOPE, "outcome", "ttft", "e2e", *names]
        scopes: dict[tuple, dict] = {}
        adds = [c.add for c in self.collectors]
        shards = len(adds)
        carry: pl.DataFrame | None = None
        tick = START + 1.0
        total, first, last = 0, None, START
        for frame in itertools.chain(frames, [None]):  # one frame at a time: 6 h do not fit in memory
            if frame is not None:
                if frame.height == 0:
                    continue
                first = float(frame["start"].min()) if first is None else first
                last = max(last, float(frame["start"].max()))
                until = float(frame["start"].min())  # no later request starts (or ends) before
            else:
                until = last + after_s
            pending = carry
            if pending is not None and pending.height:
                finish = pending["finish"].to_numpy()
                k = 0
                while tick < until:
                    stop = int(np.searchsorted(finish, tick, side="right"))
                    if stop > k:
                        for row in pending.slice(k, stop - k).select(columns).iter_rows():
                            key = row[1:4]
                            scope = scopes.get(key)
                            if scope is None:
                                scope = scopes[key] = dict(zip(SCOPE, key, strict=True))
                            adds[(total * 2654435761 % 2**32) % shards](
                                row[0], scope, dict(zip(names, row[7:], strict=True)), row[4], row[5], row[6]
                            )
                            total += 1
                        k = stop
                    self._tick(tick)
                    tick += 1.0
                carry = pending.slice(k)
            else:
                while tick < until:
                    self._tick(tick)
                    tick += 1.0
            if frame is not None:
                carry = frame if carry is None or not carry.height else pl.concat([carry, frame])
                carry = carry.sort("finish")
        return total, first if first is not None else START, last

    def _tick(self, tick: float) -> None:
        """The collectors' clock at ``tick``: they fold, the watcher polls (its CPU counted)."""
        self.clock = tick
        for c in self.collectors:
            c.fold(tick)
        before, stepped = self.detector.steps, self.detector.cpu_s
        t0 = time.process_time()
        self.detector.poll()
        spent = time.process_time() - t0 - self.feed.collector_cpu
        self.feed.collector_cpu = 0.0
        self.merge_cpu += spent - (self.detector.cpu_s - stepped)
        if self.detector.steps > before:
            steps = self.detector.steps - before
            self.step_cpu.append(spent / steps)
            self.merge_per_step.append(self.merge_cpu / steps)
            self.merge_cpu = 0.0


class _InProcess(CollectorFeed):
    """``CollectorFeed`` reading the in-process collectors' answers (``answer`` is the collector's
    work: its CPU is taken out of the watcher's)."""

    def __init__(self, urls, replay: Replay) -> None:
        super().__init__(urls=urls)
        self.replay = replay
        self.collector_cpu = 0.0

    def poll(self) -> int:
        merged = 0
        since = None if self.newest_start is None else self.newest_start - 120.0
        for url, c in zip(self.urls, self.replay.collectors, strict=True):
            t0 = time.process_time()
            answer = c.answer(since=since, now=self.replay.clock)
            self.collector_cpu += time.process_time() - t0
            merged += self._merge(url, answer)
        return merged


def load() -> str:
    return open("/proc/loadavg").read().split()[0]


def cost(args) -> None:
    horizon = args.horizon
    config = LiveConfig(window_s=WIDTH, horizon_s=horizon, recent_s=horizon / 2)
    print(f"cost: horizon {horizon:.0f} s, {args.shards} collectors, settle {args.settle:.0f} s")
    print(
        f"{'req/s':>7} {'values':>6} {'requests':>9} {'steps':>5} {'CPU ms/step (median)':>21} {'p90':>6} "
        f"{'merge':>6} {'load':>5}"
    )
    cases = [(r, args.values) for r in args.rates] + [(args.by_rate, v) for v in args.by_values]
    medians = {}
    for rate, values in cases:
        replicas = values - 10
        seconds = horizon + 120.0
        cols = requests(rate, seconds, replicas, seed=1, shifted=None, onset_s=0)
        replay = Replay(args.shards, args.settle, config)
        replay.run(cols, replicas, seconds + args.settle + 2 * WIDTH)
        filled = int((horizon + args.settle) / WIDTH)  # steps once the horizon is full
        steady = replay.step_cpu[filled:] or replay.step_cpu
        ms = sorted(1e3 * x for x in steady)
        merge = statistics.median(1e3 * x for x in replay.merge_per_step[filled:] or replay.merge_per_step)
        med = statistics.median(ms)
        medians[(rate, values)] = med
        print(
            f"{rate:>7.0f} {values:>6} {len(cols[0]):>9,} {len(ms):>5} {med:>21.1f} "
            f"{ms[int(0.9 * (len(ms) - 1))]:>6.1f} "
            f"{merge:>6.1f} {load():>5}"
        )
    base = [medians[(r, args.values)] for r in args.rates]
    print(f"max/min across rates at {args.values} values: {max(base) / min(base):.2f}x")


def request_level(args) -> None:
    """The request-level watcher (``LiveDetector``, what ``--follow`` runs) on the same shape of
    traffic: generated hop events (tests/support/synth.py) at ``--rl-rate`` over the same scope
    values, the same horizon, ``--rl-sample`` of the requests (1/16: what bench/README.md's
    production-rate runs use); its CPU per step (``LiveDetector.cpu_s``) after the horizon filled."""
    from hopline.analyzer.live.detector import LiveDetector
    from hopline.analyzer.live.feed import replay
    from support.synth import generate

    horizon, replicas = args.horizon, args.values - 10
    services = tuple(f"s{i}" for i in range(5))
    models = {s: f"m{i}" for i, s in enumerate(services)}
    seconds = horizon + 120.0
    events = generate(
        duration_s=seconds, rate=args.rl_rate, seed=1, replicas=tuple(f"r{i:04d}" for i in range(replicas)),
        services=services, models=models,
    )  # fmt: skip
    config = LiveConfig(window_s=WIDTH, horizon_s=horizon, recent_s=horizon / 2, sample=args.rl_sample)
    detector = LiveDetector(config)
    per_step = []
    with_tmp = Path("/tmp") / f"bench-live-windows-{args.rl_rate:.0f}.parquet"
    events.write_parquet(with_tmp)
    for batch in replay([with_tmp], WIDTH):
        before_cpu, before = detector.cpu_s, detector.steps
        detector.feed(batch)
        if detector.steps > before:
            per_step.append((detector.cpu_s - before_cpu) / (detector.steps - before))
    with_tmp.unlink()
    filled = int(horizon / WIDTH)
    ms = sorted(1e3 * x for x in per_step[filled:] or per_step)
    print(
        f"request-level (LiveDetector, sample {args.rl_sample:g}): {args.rl_rate:.0f} req/s, "
        f"{args.values} values, "
        f"{events['request_id'].n_unique():,} requests, {len(ms)} steps: CPU ms/step median "
        f"{statistics.median(ms):.1f}, p90 {ms[int(0.9 * (len(ms) - 1))]:.1f} (load {load()})"
    )


def clean(args) -> None:
    """No change at all: ``--clean-minutes`` of stationary traffic at ``--clean-rate`` over
    ``--values`` scope values, the default horizon (30 min) and recent (5 min): the alerts that page
    (each one a false alarm) and the findings seen at any step."""
    replicas = args.values - 10
    seconds = args.clean_minutes * 60.0
    config = LiveConfig(window_s=WIDTH)
    cols = requests(args.clean_rate, seconds, replicas, seed=args.seed_from, shifted=None, onset_s=0)
    replay = Replay(args.shards, args.settle, config)
    t0 = time.process_time()
    replay.run(cols, replicas, seconds)
    print(
        f"clean: {args.clean_rate:.0f} req/s, {args.values} values, {args.clean_minutes:g} min, "
        f"{len(cols[0]):,} requests, {replay.detector.steps} steps: {len(replay.fired)} paged alerts, "
        f"{len(replay.found)} (stage, scope) ever found; replay CPU {time.process_time() - t0:.0f} s, "
        f"load {load()}"
    )
    for (stage, scope), at in sorted(replay.found.items(), key=lambda kv: kv[1]):
        print(f"  found {stage} {dict(scope)} at +{at - START:.0f} s")


def request_frame(events: pl.DataFrame) -> pl.DataFrame:
    """Generated hop events as finished requests, one row each, as a collector hands them to its
    window summaries: start, the rule book's scope, outcome, the outermost TTFT and end-to-end, the
    stage table's time stages and tokens (the analyzer's timelines, which compute the same stage
    table as the collector's join), and ``finish`` (start + end-to-end: when it is handed over)."""
    from hopline.analyzer.timelines import COLUMNS, timelines

    names = [*TIME_STAGES, *TOKENS]
    views = ("client", "gateway", "engine")
    outer = [f"{v}_{m}" for v in views for m in ("ttft", "e2e")]
    wanted = ("start", "service", "model", "replica", "outcome", *names, *outer)
    rows = timelines(events.lazy(), columns=tuple(c for c in wanted if c in COLUMNS)).collect()
    return rows.select(
        "start", "service", "model", "replica", pl.col("outcome").cast(pl.String),
        pl.coalesce(*(f"{v}_ttft" for v in views)).alias("ttft"),
        pl.coalesce(*(f"{v}_e2e" for v in views)).alias("e2e"),
        *(pl.col(n) if n in rows.columns else pl.lit(None, pl.Float64).alias(n) for n in names),
    ).with_columns(finish=pl.col("start") + pl.col("e2e").fill_null(0.0))  # fmt: skip


def clean6h(args) -> None:
    """bench_live.py's clean replay (``clean_chunks``: a daily curve, synth's lognormal stages,
    replica r5 joining at 1/3 and leaving at 2/3, a restart at 1/2 with 30 s without traffic) at
    ``--clean-rate`` mean requests/s for ``--hours``, its hop events turned into finished requests
    (``request_frame``) and handed to ``--shards`` in-process collectors as they finish, the
    watcher with its defaults (30-min horizon, 5-min recent): the alerts that page (each one a
    false alarm), the incidents noted (opened, not paged), every finding seen at any step."""
    import resource

    from bench_live import clean_chunks

    replay = Replay(args.shards, args.settle, LiveConfig(window_s=WIDTH))
    t0, w0 = time.process_time(), time.perf_counter()

    def frames():
        for i, chunk in enumerate(clean_chunks(args.hours, args.clean_rate)):
            if i % 12 == 0:  # progress, an hour of event time at a time
                print(
                    f"  at +{replay.clock - START:,.0f} s: {replay.detector.steps} steps, "
                    f"{len(replay.fired)} paged, {len(replay.noted)} noted, {len(replay.sentences)} "
                    f"findings; CPU {time.process_time() - t0:.0f} s, load {load()}",
                    flush=True,
                )
            yield request_frame(chunk)

    total, first, last = replay.run_frames(frames(), args.settle + 60.0)
    cpu, wall = time.process_time() - t0, time.perf_counter() - w0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    span = last - first
    print(
        f"clean6h: {args.hours:g} h, mean {args.clean_rate:.0f} req/s asked, {total:,} requests over "
        f"{span:,.0f} s = {total / span:,.1f} req/s, {args.shards} collectors, settle {args.settle:.0f} s, "
        f"{replay.detector.steps} steps: {len(replay.fired)} paged alerts, {len(replay.noted)} noted "
        f"incidents, {len(replay.sentences)} findings ever seen"
    )
    print(
        f"  replay CPU {cpu:.0f} s (wall {wall:.0f} s; the watcher's steps {replay.detector.cpu_s:.0f} s), "
        f"max RSS {rss:,.0f} MiB, load {load()}"
    )
    for what, incidents in (("paged", replay.fired), ("noted", replay.noted)):
        for clock, i in incidents:
            print(f"  {what} at +{clock - START:.0f} s: {i.key[1]} {i.scope} {i.severity}: {i.words}")
    for (kind, stage, scope), (clock, sentence) in sorted(replay.sentences.items(), key=lambda kv: kv[1][0]):
        print(f"  finding {kind} {stage} {dict(scope)} first at +{clock - START:.0f} s: {sentence}")


def delay(args) -> None:
    cases = {
        "big": [(10_000.0, 1000, 10)],
        "small": [(1_000.0, 50, 3)],
        "both": [(10_000.0, 1000, 10), (1_000.0, 50, 3)],
    }
    onset = args.onset
    config = LiveConfig(window_s=WIDTH, horizon_s=args.horizon, recent_s=args.horizon / 2)
    for rate, replicas, shards in cases[args.case]:
        delays, founds = [], []
        for seed in range(args.seed_from, args.seed_from + args.seeds):
            cols = requests(rate, onset + args.after, replicas, seed=seed, shifted=7, onset_s=onset)
            replay = Replay(shards, args.settle, config)
            t0 = time.process_time()
            replay.run(cols, replicas, onset + args.after)
            hit = [
                (clock, i)
                for clock, i in replay.fired
                if i.scope == {"replica": "r0007"} and i.key[1] == "queue"
            ]
            others = [i for _, i in replay.fired if i.scope != {"replica": "r0007"}]
            said = hit[0][1].words[:90] if hit else "-"
            d = hit[0][0] - (START + onset) if hit else float("nan")
            seen = replay.found.get(("queue", (("replica", "r0007"),)))
            found = seen - (START + onset) if seen is not None else float("nan")
            delays.append(d)
            founds.append(found)
            print(
                f"{rate:>7.0f} req/s, 1 of {replicas} replicas, {shards} collectors, seed {seed}: found "
                f"{found:.0f} s after onset, alerted {d:.0f} s, {len(others)} other alerts; {said!r} "
                f"(replay CPU {time.process_time() - t0:.0f} s, load {load()})"
            )
        print(
            f"  median: found {statistics.median(founds):.0f} s, alerted {statistics.median(delays):.0f} s "
            f"(settle {args.settle:.0f} s)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=("cost", "delay", "request-level", "clean", "clean6h"))
    parser.add_argument("--hours", type=float, default=6.0)
    parser.add_argument("--clean-rate", type=float, default=1000.0)
    parser.add_argument("--clean-minutes", type=float, default=30.0)
    parser.add_argument("--rl-rate", type=float, default=1000.0)
    parser.add_argument("--rl-sample", type=float, default=0.0625)
    parser.add_argument(
        "--rates", type=lambda s: [float(x) for x in s.split(",")], default=[1000.0, 3000.0, 10000.0]
    )
    parser.add_argument("--values", type=int, default=200)
    parser.add_argument("--by-rate", type=float, default=1000.0)
    parser.add_argument(
        "--by-values", type=lambda s: [int(x) for x in s.split(",") if x], default=[100, 1000]
    )
    parser.add_argument("--horizon", type=float, default=300.0)
    parser.add_argument("--shards", type=int, default=3)
    parser.add_argument("--settle", type=float, default=30.0)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--seed-from", type=int, default=0)
    parser.add_argument("--case", choices=("big", "small", "both"), default="both")
    parser.add_argument("--onset", type=float, default=180.0)
    parser.add_argument("--after", type=float, default=120.0)
    args = parser.parse_args()
    modes = {"cost": cost, "delay": delay, "request-level": request_level, "clean": clean, "clean6h": clean6h}
    modes[args.what](args)


if __name__ == "__main__":
    main()
