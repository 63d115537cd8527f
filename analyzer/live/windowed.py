"""``hopline watch --collector URL…``: live detection on the collectors' window summaries (issue 36).

Each collector keeps, per window of requests' starts and per value of its ``--window-by``
attributes, a DDSketch of each stage (``collector/windows.py``) and serves the settled ones at
``GET /v1/windows``. ``CollectorFeed`` reaches every collector over HTTP at each poll, asks each for
the windows from the newest one it served, and every ``LOOKBACK_EVERY_S`` for those of the last
``LOOKBACK_S`` (a window's late parts, folded after its first answer, come with them), and merges
each part it has not taken yet (a part is known by its window, its fold time and its size, so a
restarted collector's new parts are taken and none twice) into ``WindowSeries``: per scope value
and stage, per window, the sketch's bins as numpy arrays (``windows.decode_bins``).
Cost follows windows × scope values × stages, never requests.

``WindowDetector`` steps on event time (a step at each window's end, once every collector served
the window or a newer one: ``CollectorFeed.ready_start``) and runs the shift detector's method on
the window bins: ``find_window_shifts`` (``findings/shifts/windows.py``, whose doc says what it
does and does not do), reached through ``findings.registry``. The alerts carry no example
request IDs and no ``common`` labels.

The incident book (``live.incidents``) reads a per-request frame; here it gets a frame
of pseudo-requests made from the windows of the last ``recent_s`` (``pseudo_frame``): per window,
attribute and value, at most ``PSEUDO_ROWS`` rows whose stage values are the window's quantiles at
(i + ½)/rows and whose ``client_ttft`` / ``client_e2e`` carry the window's exact sums spread over
its rows and attributes, so that the users' time since an onset (``live_share``) is the windows'
own sum. Where the book asks whose lateness a network rise is, or whether a busy host explains a slower
prefill or decode (``findings.lateness``), the rows carry the windows' quantiles of each side's loop
lateness and of the engine host's CPU wait at the same ranks: a busy caller's network time is
noted, not paged, as on requests. A row names its attribute's value, and another attribute's only where that attribute had one value
in the window (every request had it: ``common`` labels then, as on requests), else null: two
scopes of different attributes are one place (``same_place``) only then.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import numpy as np
import polars as pl
from ddsketch import LogarithmicMapping
from hopline.analyzer.findings.lateness import EXPLAINED_STAGES, MEASURED
from hopline.analyzer.findings.model import Finding, Shift
from hopline.analyzer.findings.registry import (
    ALL,
    SHIFT_STAGES,
    TIMINGS,
    ShiftConfig,
    WindowSeries,
    bin_quantiles,
    find_window_shifts,
)
from hopline.analyzer.live.detector import LiveConfig
from hopline.analyzer.live.incidents import Incident, IncidentBook
from hopline.analyzer.windows import SKETCH_FORMAT, WindowsError

LOOKBACK_S = (
    120.0  # a poll every LOOKBACK_EVERY_S asks for the windows that started this long before the newest
)
LOOKBACK_EVERY_S = 10.0  # (the other polls: from the newest window taken on)
# a collector whose newest window has not moved this long (wall clock), while another's is newer,
# is not waited for (``CollectorFeed.ready_start``): an idle one, or one not serving at all
STALL_S = 30.0
PSEUDO_ROWS = 16  # the book's pseudo-requests per window, attribute and value


@dataclass
class CollectorFeed:
    """Polls each collector's ``GET /v1/windows`` and merges the parts not taken yet (module doc).
    A collector that does not answer is counted (``failures``) and said (``warn``, once per
    collector until it answers again); the others' windows are merged all the same."""

    urls: list[str]
    token: str | None = None
    timeout_s: float = 10.0
    series: WindowSeries = field(default_factory=WindowSeries)
    taken: dict[str, set[tuple]] = field(default_factory=dict)  # url -> parts merged
    failures: int = 0
    down: set[str] = field(default_factory=set)
    newest: dict[str, float] = field(default_factory=dict)  # url -> the newest window it served
    moved: dict[str, float] = field(default_factory=dict)  # url -> when (monotonic) that last moved
    warn: Callable[[str], None] | None = None
    client: httpx.Client | None = None
    _looked_back: float = -math.inf
    _first_window: float | None = None  # when (monotonic) a collector first served a window

    def poll(self) -> int:
        """Merge what is new; return the parts merged."""
        client = self.client or httpx.Client(timeout=self.timeout_s)
        self.client = client
        # the newest window on, and every LOOKBACK_EVERY_S the last LOOKBACK_S (late parts): the
        # answer re-sends parts already taken, so asking for the whole lookback each poll would
        # move ~12 windows of sketches a poll
        back = 0.0
        if time.monotonic() - self._looked_back >= LOOKBACK_EVERY_S:
            back, self._looked_back = LOOKBACK_S, time.monotonic()
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        merged = 0
        for url in self.urls:  # each from its own newest window: one behind the others loses none
            since = self.newest.get(url)
            params = {} if since is None else {"since": repr(since - back)}
            try:
                response = client.get(url.rstrip("/") + "/v1/windows", params=params, headers=headers)
                if response.status_code != 200:
                    raise WindowsError(f"answered {response.status_code}: {response.text[:200]}")
                answer = response.json()
            except (httpx.HTTPError, ValueError, WindowsError) as exc:
                self.failures += 1
                if url not in self.down and self.warn is not None:
                    self.warn(
                        f"hopline watch: collector {url} not read ({type(exc).__name__}: {exc}); going on"
                    )
                self.down.add(url)
                continue
            self.down.discard(url)
            merged += self._merge(url, answer)
        return merged

    def _merge(self, url: str, answer: dict) -> int:
        series = self.series
        if answer.get("sketch") != SKETCH_FORMAT:
            raise WindowsError(f"{url}: sketches as {answer.get('sketch')!r}, not {SKETCH_FORMAT}")
        if series.width_s is None:
            series.width_s, series.relative_accuracy = answer["width_s"], answer["relative_accuracy"]
            series.by = tuple(answer["by"])
        elif (answer["width_s"], answer["relative_accuracy"], tuple(answer["by"])) != (
            series.width_s, series.relative_accuracy, series.by,
        ):  # fmt: skip
            raise WindowsError(
                f"{url} keeps windows of {answer['width_s']} s by {','.join(answer['by'])}: the collectors "
                f"must share --window and --window-by ({series.width_s} s by {','.join(series.by)})"
            )
        taken = self.taken.setdefault(url, set())
        merged = 0
        for window in answer["windows"]:
            start = window["start"]
            for part in window["parts"]:
                identity = (start, part["folded_at"], part["requests"])
                if identity in taken:
                    continue
                taken.add(identity)
                series.add_part(start, part)
                merged += 1
            if start > self.newest.get(url, -math.inf):
                self.newest[url], self.moved[url] = start, time.monotonic()
                if self._first_window is None:
                    self._first_window = self.moved[url]
        if self.newest_start is not None:  # forget what no poll asks for again
            oldest = self.newest_start - 2 * LOOKBACK_S
            self.taken[url] = {p for p in taken if p[0] >= oldest}
        return merged

    @property
    def newest_start(self) -> float | None:
        """The newest window any collector served."""
        return max(self.newest.values(), default=None)

    def ready_start(self) -> float | None:
        """The newest window every collector served (so the steps up to its end read every
        collector's part of each window), None before one is: the collectors settle and are fed on
        their own, and a step on one's windows alone would read a fraction of the requests. Not
        waited for: a collector down (said), and one whose newest window has not moved for
        ``STALL_S`` while another's is newer (idle, or serving nothing since the first window)."""
        if self.newest_start is None:
            return None
        now = time.monotonic()
        waited = [
            self.newest.get(url, -math.inf)
            for url in self.urls
            if url not in self.down
            and self.newest.get(url, -math.inf) < self.newest_start
            and now - self.moved.get(url, self._first_window or now) <= STALL_S
        ]
        ready = min(waited, default=self.newest_start)
        return None if ready == -math.inf else ready

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


# -- the detector ------------------------------------------------------------------------------------


class _Horizon:
    """What ``GET /v1/findings`` reads of a detector's horizon: its requests."""

    def __init__(self, height: int) -> None:
        self.height = height


@dataclass
class WindowDetector:
    """The live detector on merged window summaries (module doc), with ``LiveDetector``'s face for
    ``Watch``, ``/metrics`` and ``/v1/findings``: ``step``, ``drain``, ``incidents``, ``on_step``,
    ``newest``, ``now``, ``steps``, ``cpu_s``, ``finished_requests``."""

    feed: CollectorFeed
    config: LiveConfig = field(default_factory=LiveConfig)
    shifts: ShiftConfig = field(default_factory=ShiftConfig)
    on_step: Callable[[float, list[Incident]], None] | None = None

    def __post_init__(self) -> None:
        cfg = self.config
        hold = 2 * cfg.window_s if cfg.hold_s is None else cfg.hold_s
        self.book = IncidentBook(
            cfg.window_s, cfg.horizon_s, recent_s=cfg.recent_s, hold_s=hold, dims=cfg.scopes,
            scope_time=self._scope_time,
        )  # fmt: skip
        self._recent: list[int] = []  # the windows of the book's frame (``step``)
        self.next_step: float | None = None
        self.now: float | None = None
        self.newest: float | None = None
        self.steps = 0
        self.cpu_s = 0.0
        self.findings: list[Finding] = []
        self.events_not_sampled = 0
        self.events_from_future = 0
        self.horizon = _Horizon(0)
        self._frames: dict[int, tuple[tuple, pl.DataFrame]] = {}
        self._screen: dict = {}

    @property
    def finished_requests(self) -> int:
        return self.feed.series.requests

    def poll(self) -> list[Incident]:
        """Take what the collectors have; run the steps the newest served window's end passed."""
        self.feed.poll()
        series = self.feed.series
        ready = self.feed.ready_start()
        if ready is None:
            return []
        width = series.width_s
        if abs(width - self.config.window_s) > 1e-9:
            raise WindowsError(
                f"the collectors keep {width:g} s windows: run hopline watch with --window {width:g}s"
            )
        end = ready + width
        self.newest = end
        if self.next_step is None:
            self.next_step = min(series.windows) * width + width
        changed: list[Incident] = []
        while self.next_step <= end:
            changed += self.step(self.next_step)
            self.next_step += width
        return _unique(changed)

    def drain(self) -> list[Incident]:
        """The end for good: steps on without new windows (the findings of the windows there are)
        until nothing fires or the horizon passed, as ``LiveDetector.drain``."""
        changed: list[Incident] = []
        if self.next_step is None or self.newest is None:
            return changed
        last = self.feed.newest_start + self.feed.series.width_s  # every window served, waited for or not
        while self.next_step <= last:
            changed += self.step(self.next_step)
            self.next_step += self.feed.series.width_s
        self.newest = max(self.newest, last)
        end = self.newest + self.config.horizon_s
        while self.book.firing() and self.next_step <= end:
            changed += self.step(self.next_step)
            self.next_step += self.config.window_s
        return _unique(changed)

    def step(self, now: float) -> list[Incident]:
        started = time.process_time()
        series = self.feed.series
        width = series.width_s
        series.forget_before(round((now - self.config.horizon_s) / width))
        starts = sorted(i for i in series.windows if i * width < now)
        self.horizon = _Horizon(sum(series.arrivals.get(i, {}).get(ALL, 0) for i in starts))
        scopes = self.config.scopes
        self.findings = (
            find_window_shifts(series, starts, scopes, self.shifts, self._screen) if starts else []
        )
        wanted = {f.stage for f in self.findings if isinstance(f, Shift)}
        for incident in self.book.firing():
            wanted |= {
                f.stage
                for f in (incident.finding, incident.fired, *incident.co_movers)
                if isinstance(f, Shift)
            }
        self._recent = [i for i in starts if i * width >= now - self.config.recent_s]
        frame = self._frame(self._recent, tuple(sorted(wanted)))
        changed = self.book.step(now, self.findings, frame, newest=self.newest)
        for incident in changed:  # pseudo-requests have no ID: an alert here names no example request
            incident.examples = [e for e in incident.examples if e is not None]
        self.now = now
        self.steps += 1
        self.cpu_s += time.process_time() - started
        if self.on_step is not None:
            self.on_step(now, changed)
        return changed

    def _frame(self, starts: list[int], stages: tuple[str, ...]) -> pl.DataFrame:
        """``pseudo_frame`` of these windows with the ``stages`` the book reads (those of the
        findings and the firing incidents), each window's rows made once per version of it."""
        series = self.feed.series
        cache = self._frames
        for i in list(cache):
            if i not in starts:
                del cache[i]
        parts = []
        for i in starts:
            version = (series.versions.get(i, 0), stages)
            kept = cache.get(i)
            if kept is None or kept[0] != version:
                kept = cache[i] = (version, pseudo_frame(series, [i], self.config, stages))
            if kept[1].height:
                parts.append(kept[1])
        if not parts:  # no request in the recent windows: no rows, but the columns the book reads
            return pseudo_frame(series, [], self.config, stages)
        return pl.concat(parts, how="vertical")

    # (the frame's stage columns are only those the book reads: a finding's stage, ``returned``)

    def _scope_time(self, scope: dict, onset: float) -> dict[str, float] | None:
        """A one-attribute scope's users' time since ``onset`` (``incidents.scope_share``) from the
        windows' exact sums, the window of the onset in part, as the frame's rows since it: the frame
        spreads a window's sums over its attributes' rows, so its rows in one scope hold a share
        of that scope's. None for a scope of several attributes (not in the summaries)."""
        if len(scope) != 1:
            return None
        ((attribute, value),) = scope.items()
        series = self.feed.series
        width = series.width_s
        totals = {"first_output": 0.0, "e2e": 0.0}
        for i in self._recent:
            part = min(1.0, max(0.0, ((i + 1) * width - onset) / width))
            measures = series.windows.get(i, {}).get((attribute, value)) if part > 0 else None
            for name, total in (("ttft", "first_output"), ("e2e", "e2e")):
                b = (measures or {}).get(name)
                if b is not None and b.count:
                    totals[total] += part * b.total
        return totals

    def incidents(self) -> list[Incident]:
        return list(self.book.incidents)


def _unique(incidents_: list[Incident]) -> list[Incident]:
    return list({id(i): i for i in incidents_}.values())


def pseudo_frame(
    series: WindowSeries, starts: list[int], config: LiveConfig, stages: tuple[str, ...] = SHIFT_STAGES
) -> pl.DataFrame:
    """The incident book's frame of pseudo-requests (module doc), with these stages' columns."""
    width = series.width_s
    gamma = LogarithmicMapping(series.relative_accuracy).gamma
    attributes = [a for a in series.by if a in config.scopes] or [series.by[0]]
    late = MEASURED if any(s in EXPLAINED_STAGES for s in stages) else ()
    columns: dict[str, list] = defaultdict(list)
    for i in starts:
        # an attribute with one value in the window (not unknown, not other): every request had it
        values: dict[str, list[str]] = defaultdict(list)
        for attribute, value in series.windows[i]:
            values[attribute].append(value)
        shared = {a: v[0] for a, v in values.items() if len(v) == 1 and v[0] not in ("unknown", "other")}
        for (attribute, value), measures in series.windows[i].items():
            if attribute not in attributes:
                continue
            n = series.arrivals.get(i, {}).get((attribute, value), 0)
            rows = min(PSEUDO_ROWS, n)
            if rows == 0:
                continue
            q = (np.arange(rows) + 0.5) / rows
            columns["start"] += list(i * width + q * width)
            for a in attributes:
                columns[a] += [value if a == attribute else shared.get(a)] * rows
            for name in (*stages, *late):  # every measure's quantiles at the same ranks, row by row
                b = measures.get(name)
                if b is None or b.count == 0:
                    columns[name] += [None] * rows
                    continue
                columns[name] += bin_quantiles(b, q, gamma).tolist()
            ttft, e2e = measures.get("ttft"), measures.get("e2e")
            share = rows * len(attributes)
            columns["client_ttft"] += [ttft.total / share if ttft is not None and ttft.count else None] * rows
            columns["client_e2e"] += [e2e.total / share if e2e is not None and e2e.count else None] * rows
    schema = {"start": pl.Float64, **{a: pl.String for a in attributes}, **{s: pl.Float64 for s in (*stages, *late)}}
    schema |= {"client_ttft": pl.Float64, "client_e2e": pl.Float64}
    frame = pl.DataFrame({k: columns[k] for k in schema}, schema=schema)
    views = [pl.lit(None, pl.Float64).alias(f"{v}_{t}") for v in ("gateway", "engine") for t in TIMINGS]
    return frame.with_columns(pl.lit(None, pl.String).alias("request_id"), *views)
