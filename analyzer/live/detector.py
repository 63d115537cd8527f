"""``LiveDetector``: hop events in (event-time order, in batches), incidents out, on event time.

Events wait in ``pending`` until their request is finished: the outermost component it reached
(client, else gateway, else engine) sent its final hop (``contract.FINAL_HOPS``) and ``settle_s``
of event time passed since the request's newest event (``engine.stats`` and other components'
hops arrive a little after it, on clocks that disagree by seconds), or it had no event for
``idle_s`` (a request that never ended). A finished request becomes one timeline row
(``analyzer.timelines``) in the horizon, which keeps the requests that started in the last
``horizon_s``: memory is bounded by the horizon (rows) plus ``idle_s`` of events.

Event time: the newest ``ts`` seen, less ``lateness_s`` (events from other hosts arrive late and
on skewed clocks), is the watermark; every ``step_s`` of it (the window by default) the detector
runs the analysis on the horizon (``detect.findings_now``) and hands the findings to the
incident book (``incidents``). Nothing in detection reads the wall clock: a recorded log replays
through it at any speed and gives the same incidents at the same event times.

No single sender moves event time (the contract takes any ``ts`` before 2100: one event dated a
year ahead would empty the horizon and resolve what fires, dated a year ahead). Two guards, both
counted in ``events_from_future`` when they drop an event:

- ``future_s`` (``hopline watch --follow`` only, where events are live): an event more than this
  ahead of this host's wall clock (``clock``) is dropped as it arrives. A replay has no relation
  to the wall clock and sets None.
- The leap rule (always): an event more than ``horizon_s`` past the newest event time (the first
  batch: its median) is a leap. Leaps wait in ``ahead``; event time jumps to them only once events
  of ``LEAP_QUORUM`` different requests agree on one (the earliest leap and those within
  ``horizon_s`` after it), as the first batch after a real pause of the traffic has. One request
  never moves it. A held leap is taken as an ordinary event once event time reaches it; the rest
  are dropped at ``flush`` (and beyond ``LEAP_HELD`` held events, the furthest ahead first). A
  clock wrong by less than the horizon, or one wrong for many requests in a replay, is not caught.

A step re-analyses the whole horizon, so its cost grows with requests/s x horizon. Above a few
hundred requests/s, ``sample`` < 1 keeps a fixed fraction of the requests: those whose ID's
BLAKE2b digest falls below it (``sampled``), the same requests on every watcher, shard and run,
with all their events. Every figure of a finding is then the sample's (its quantiles estimate the
traffic's, its counts are the sample's); each finding carries ``sample`` and an alert's evidence
says it (``Incident.sample``). bench/README.md measures the cost and the detection delay it buys.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from hashlib import blake2b

import polars as pl
from hopline.analyzer import attribution
from hopline.analyzer.findings.model import Finding
from hopline.analyzer.io import SCHEMA
from hopline.analyzer.live.detect import findings_now
from hopline.analyzer.live.incidents import Incident, IncidentBook
from hopline.analyzer.timelines import COLUMNS, timelines
from hopline.middleware.contract import FINAL_HOPS, normalize_request_id
from hopline.middleware.contract.rules import SCOPE_SOURCES

LEAP_QUORUM = 3  # requests that must agree before event time leaps more than the horizon ahead
LEAP_HELD = 10_000  # leaping events held while they wait for agreement (more: dropped, furthest first)
OUTERMOST = ("client", "gateway", "engine")  # the first one a request reached tells when it ended
# What a request's end decides (its decode, end-to-end time, speed): unknown for the requests still
# running, so the horizon's newest rows would hold only the short ones (see ``_survivors``).
END_COLUMNS = tuple(c for c in COLUMNS if c == "decode" or c.endswith(("_e2e", "_itl", "_last", "_decode_s")))
# Timeline columns the horizon does not keep: no detector and not the incident book reads them (the
# raw hop times but the engine's first token, the durations the stages were computed from, IDs,
# pool and loop gauges, the per-request lists of missing and negative stages, the request's
# parameters and outcome the stages already reflect (but max_tokens: verbose_outputs compares
# requests that asked for the same), the per-token speeds an SLO reads): 47% of a
# row's bytes. ``tests/analyzer/live/test_live_horizon.py`` checks that the findings do not change.
NOT_KEPT = frozenset(
    (
        "trace_id", "attempts", "client_first", "client_last", "gateway_received", "gateway_forwarded",
        "gateway_first", "gateway_last", "engine_received", "engine_scheduled", "engine_last",
        "client_delay_s", "stats_queue_s", "stats_prefill_s", "stats_decode_s", "gateway_reported_queue_s",
        "gateway_reported_prefill_s", "gateway_reported_decode_s", "client_reported_queue_s",
        "client_reported_prefill_s", "client_reported_decode_s", "pool_full", "pool_limit", "loop_lag_s",
        "gateway_upstream", "client_max_gap_s", "client_max_gap_at", "negative", "missing", "stream", "n",
        "outcome", "client_itl", "gateway_itl", "engine_itl",
    )
)  # fmt: skip


@dataclass(frozen=True)
class LiveConfig:
    window_s: float = 10.0  # the analysis' window (a shift's onset is a window boundary)
    step_s: float | None = None  # how often the analysis runs, in event time (None: every window)
    horizon_s: float = 1800.0  # finished requests kept, by start time
    recent_s: float = 300.0  # only a finding with an onset this recent opens an incident
    settle_s: float = 5.0  # after a request's final hop, wait this long for its stragglers
    idle_s: float = 300.0  # a request without an event for this long is finished as it is
    lateness_s: float = 5.0  # the watermark trails the newest event by this much
    hold_s: float | None = None  # found at every step this long before it fires (None: 2 windows)
    scopes: tuple[str, ...] = attribution.SCOPES
    sample: float = 1.0  # the fraction of requests analysed (``sampled``; see the module doc)
    # --follow: an event more than this ahead of the wall clock is dropped (None: a replay, no wall clock)
    future_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("window_s", "horizon_s", "recent_s", "settle_s", "idle_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")
        if not 0 < self.sample <= 1:
            raise ValueError(f"sample must be a fraction in (0, 1], got {self.sample!r}")
        if self.future_s is not None and not self.future_s >= 0:
            raise ValueError(f"future_s must be a duration of 0 or more, got {self.future_s!r}")
        if self.horizon_s < 2 * self.recent_s:
            raise ValueError(
                f"horizon_s ({self.horizon_s:g}) must be at least twice recent_s ({self.recent_s:g})"
            )

    @property
    def every_s(self) -> float:
        return self.step_s or self.window_s


def in_sample(request_id: str, fraction: float) -> bool:
    """Whether a request is in the sample: the BLAKE2b digest of its ID (normalized, so that an
    engine's ``chatcmpl-<id>`` is its ID) has its first 8 bytes, as a fraction of 2**64, below
    ``fraction``: the same in every process, shard and Python version."""
    digest = blake2b(normalize_request_id(request_id).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") < fraction * 2**64


def sampled(ids: pl.Series, fraction: float) -> pl.Series:
    """Whether each request ID is in the sample (``in_sample``); a null ID is not."""
    kept = [i for i in ids.unique().drop_nulls().to_list() if in_sample(i, fraction)]
    return ids.is_in(pl.Series(kept, dtype=pl.String).implode()).fill_null(False)


def _finished(pending: pl.DataFrame, now: float, cfg: LiveConfig, idle_s: float) -> pl.Series:
    """The request IDs in ``pending`` that are finished at ``now`` (see the module doc; a request
    without an event for ``idle_s`` is finished as it is)."""
    comp = pl.col("hop").str.split_exact(".", 1).struct.field("field_0")
    final = pl.col("hop").is_in([h for hops in FINAL_HOPS.values() for h in hops])
    reached = [(comp == c).any().alias(c) for c in OUTERMOST]
    ended = [(final & (comp == c)).any().alias(f"{c}_end") for c in OUTERMOST]
    per = pending.group_by("request_id").agg(pl.col("ts").max().alias("last"), *reached, *ended)
    outer_ended = (
        pl.when(pl.col("client"))
        .then(pl.col("client_end"))
        .when(pl.col("gateway"))
        .then(pl.col("gateway_end"))
        .otherwise(pl.col("engine_end"))
    )
    done = (outer_ended & (pl.col("last") <= now - cfg.settle_s)) | (pl.col("last") <= now - idle_s)
    return per.filter(done)["request_id"]


def _running_since(pending: pl.DataFrame, now: float, idle_s: float) -> float:
    """The earliest first event of the requests still running (not idle for ``idle_s``): every
    request that started before it has finished."""
    if pending.height == 0:
        return now
    per = pending.group_by("request_id").agg(
        pl.col("ts").min().alias("first"), pl.col("ts").max().alias("last")
    )
    running = per.filter(pl.col("last") > now - idle_s)["first"].min()
    return now if running is None else min(float(running), now)


def _survivors(horizon: pl.DataFrame, cut: float) -> pl.DataFrame:
    """The horizon with the end columns of requests started at or after ``cut`` nulled: among the
    requests that started then, only those that ended quickly are finished yet, a sample biased
    toward short answers (a "decode fell" out of nothing). Their TTFT parts are kept: the stages
    before the first token do not decide how long a request runs."""
    late = pl.col("start") >= cut
    present = [c for c in END_COLUMNS if c in horizon.columns]
    return horizon.with_columns(pl.when(~late).then(pl.col(c)).alias(c) for c in present)


@dataclass
class LiveDetector:
    """See the module doc. ``feed`` and ``flush`` return the incidents that changed (opened,
    updated, resolved) in the steps they ran; ``on_step(now, changed)`` is called after each step.
    ``clock`` is the wall clock ``LiveConfig.future_s`` is measured from (read only when it is set)."""

    config: LiveConfig = field(default_factory=LiveConfig)
    on_step: Callable[[float, list[Incident]], None] | None = None
    clock: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        cfg = self.config
        hold = 2 * cfg.window_s if cfg.hold_s is None else cfg.hold_s
        self.book = IncidentBook(
            cfg.window_s,
            cfg.horizon_s,
            recent_s=cfg.recent_s,
            hold_s=hold,
            dims=cfg.scopes,
            sample=cfg.sample if cfg.sample < 1 else None,
        )
        self.pending = pl.DataFrame(schema=SCHEMA)
        self.horizon: pl.DataFrame | None = None
        self.newest: float | None = None  # the newest event ts seen
        self.next_step: float | None = None
        self.now: float | None = None  # the last step's event time
        self.finished_requests = 0
        self.events_not_sampled = 0  # events of requests outside the sample (``LiveConfig.sample``)
        self.events_from_future = 0  # events dropped: ahead of the wall clock, or an unconfirmed leap
        self.ahead = pl.DataFrame(schema=SCHEMA)  # leaping events waiting for agreement (module doc)
        self.steps = 0
        self.cpu_s = 0.0  # process CPU seconds spent in steps
        self.findings: list[Finding] = []  # the last step's findings (all of them)
        self._extra = tuple(d for d in cfg.scopes if d not in SCOPE_SOURCES)
        self._idle_s = cfg.idle_s  # a request without an event this long is finished (``drain``: settle_s)

    def feed(self, events: pl.DataFrame) -> list[Incident]:
        """Add a batch of events (``io.SCHEMA`` columns); run the steps the watermark passed."""
        if events.height == 0:
            return []
        events = events.select(
            [
                pl.col(n).cast(t) if n in events.columns else pl.lit(None, t).alias(n)
                for n, t in SCHEMA.items()
            ]
        )
        if self.config.future_s is not None:  # --follow: nothing from past the wall clock's bound
            live = pl.col("ts") <= self.clock() + self.config.future_s
            kept = events.filter(live)
            self.events_from_future += events.height - kept.height
            events = kept
        events = self._admit(events)
        if events.height == 0:
            return []
        top, first = events["ts"].max(), events["ts"].min()
        if self.config.sample < 1:
            kept = events.filter(sampled(events["request_id"], self.config.sample))
            self.events_not_sampled += events.height - kept.height
            events = kept
        self.pending = pl.concat([self.pending, events], how="vertical")
        self.newest = top if self.newest is None else max(self.newest, top)
        every = self.config.every_s
        if self.next_step is None:
            self.next_step = math.floor(first / every) * every + every
        watermark = self.newest - self.config.lateness_s
        if watermark - self.next_step > self.config.horizon_s:  # a gap longer than the horizon
            self.next_step = math.floor((watermark - self.config.horizon_s) / every) * every
        changed: list[Incident] = []
        while self.next_step <= watermark:
            changed += self.step(self.next_step)
            self.next_step += every
        return _unique(changed)

    def flush(self) -> list[Incident]:
        """The end of a replay: steps as if time ran on without events, past the newest event
        and until every request is finished (its final hop settled, or idle for ``idle_s``). Leaps
        no other request confirmed (``ahead``) are dropped."""
        self.events_from_future += self.ahead.height
        self.ahead = self.ahead.clear()
        if self.newest is None or self.next_step is None:
            return []
        changed: list[Incident] = []
        while self.next_step <= self.newest or (
            self.pending.height and self.next_step <= self.newest + self._idle_s + self.config.every_s
        ):
            changed += self.step(self.next_step)
            self.next_step += self.config.every_s
        return _unique(changed)

    def drain(self) -> list[Incident]:
        """The end of the stream for good (a demo's last request, a log that will not grow): a
        request without its final hop will never get one, so it is finished as it is once
        settled (not after ``idle_s``); after ``flush``, time runs on without events, in strides
        of a tenth of the horizon, until no incident fires (a shift then resolves once its scope
        stayed quiet, see ``incidents``) or the horizon and four strides passed. Those strides
        only resolve: the analysis of a horizon that empties without new requests is not news,
        and an end is dated at most the newest event (``IncidentBook.step``), so Alertmanager
        gets an ``endsAt`` it has passed already, not one in the future."""
        self._idle_s = self.config.settle_s
        changed = self.flush()
        if self.newest is None or self.next_step is None:
            return changed
        stride = max(self.config.every_s, self.config.horizon_s / 10)
        end = self.newest + self.config.horizon_s + 4 * stride
        while self.book.firing() and self.next_step <= end:
            changed += self.step(self.next_step, analyse=False)
            self.next_step += stride
        return _unique(changed)

    def _admit(self, events: pl.DataFrame) -> pl.DataFrame:
        """The events (with those held in ``ahead``) that event time takes in: the leap rule of the
        module doc. The leaps still waiting stay in ``ahead``."""
        span = self.config.horizon_s
        anchor = self.newest if self.newest is not None else events["ts"].median()
        if anchor is None:  # no event
            return events
        if self.ahead.height == 0 and events["ts"].max() <= anchor + span:  # the usual batch
            return events
        pool = pl.concat([self.ahead, events], how="vertical")
        taken = []
        while True:
            near = pool["ts"] <= anchor + span
            taken.append(pool.filter(near))
            pool = pool.filter(~near)
            if pool.height == 0:
                break
            leap = pool.filter(pl.col("ts") <= pool["ts"].min() + span)
            if leap["request_id"].n_unique() < LEAP_QUORUM:
                break
            anchor = leap["ts"].max()
        if pool.height > LEAP_HELD:
            pool = pool.sort("ts")
            self.events_from_future += pool.height - LEAP_HELD
            pool = pool.head(LEAP_HELD)
        self.ahead = pool
        return pl.concat(taken, how="vertical")

    def step(self, now: float, analyse: bool = True) -> list[Incident]:
        """One step at event time ``now``: finished requests into the horizon, the analysis on
        it (``analyse``; else no finding: the firing incidents are only checked for their end),
        the incident book updated."""
        started = time.process_time()
        cfg = self.config
        done = pl.Series([], dtype=pl.String)
        if self.pending.height:
            done = _finished(self.pending, now, cfg, self._idle_s)
        if done.len():
            finished = self.pending.filter(pl.col("request_id").is_in(done.implode()))
            self.pending = self.pending.filter(~pl.col("request_id").is_in(done.implode()))
            rows = timelines(finished.lazy(), scopes=self._extra)
            rows = rows.select(c for c in rows.collect_schema().names() if c not in NOT_KEPT).collect()
            self.finished_requests += rows.height
            parts = [self.horizon, rows] if self.horizon is not None else [rows]
            self.horizon = pl.concat(parts, how="diagonal_relaxed")
        if self.horizon is not None:
            self.horizon = self.horizon.filter(pl.col("start") >= now - cfg.horizon_s)
        frame = self.horizon if self.horizon is not None else pl.DataFrame()
        cut = _running_since(self.pending, now, self._idle_s)
        if frame.height:
            frame = _survivors(frame, cut)
        self.findings = findings_now(frame, cfg.window_s, cfg.scopes, complete_before=cut) if analyse else []
        changed = self.book.step(now, self.findings, frame, newest=self.newest)
        self.now = now
        self.steps += 1
        self.cpu_s += time.process_time() - started
        if self.on_step is not None:
            self.on_step(now, changed)
        return changed

    def incidents(self) -> list[Incident]:
        return list(self.book.incidents)


def _unique(incidents: list[Incident]) -> list[Incident]:
    return list({id(i): i for i in incidents}.values())
