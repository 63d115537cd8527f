"""The shift detector's method on merged window summaries instead of requests (issue 36): what
``hopline watch --collector`` runs at each step (``live/windowed.py``, through ``findings.registry``).

``WindowSeries`` holds the collectors' windows merged: per window, scope value and stage, the
DDSketch's bins as numpy arrays (``windows.decode_bins``); ``find_window_shifts`` turns the windows
of the horizon into findings. Cost follows windows × scope values × stages, never requests.

- the rank test is the same Mann-Whitney z (``split_z``'s formula, ties corrected), computed from
  the pooled bins: each bin's requests share the average rank of their millisecond (the request
  level ranks values to ``RANK_RESOLUTION_S``; a bin is 2% wide, so values a bin apart tie as they
  do there); candidate splits are the window boundaries, as offline;
- binary segmentation (``max_depth``), ``min_side`` requests a side, Bonferroni over scopes ×
  stages × boundaries (``z_threshold``), the effect on the p50 else p90 (``min_factor``,
  ``min_abs_ms``), a ramp as one change, a burst ended by a return (``until``), the log's first
  window no baseline, a fresh step placed where the rank test puts it with ``SETTLE_MIN_AFTER``
  requests after and waiting for ``min_side`` (``stats._settle_step``), then moved past a return
  in its first ``min_side`` requests (``stats._past_return``);
- the narrowest scope: the values of an attribute that moved while the others seen on both sides
  did not move half as much (``scopes.narrowest``), or a change of all traffic confined to its one
  value that moved (``scopes.confine``, ``CONFINE_MIN_SIDE``);
- one incident per onset and the reversal cap (``shifts.incidents``), the sentence from
  ``Change.finding`` (``shifts.words``), context from the windows: other stages' p50 (unchanged
  within ``unchanged_within``), arrivals/s, concurrency (Σ e2e / span), prompt p50, cache hits
  (exact sums), ``impact_s`` as ``excess_s`` from exact sums (Σ after − n_after × mean before).

What it does not do, for want of single requests in the windows: no two-attribute cell (the
windows hold one attribute at a time), no ``connect`` part (pool wait vs new connections), no
new traffic named in a mix change (which service's requests a replica's windows hold is not kept),
no step-5 folding of one change seen from correlated scopes, nor step 4's choice of the attribute
that holds another's change (``scopes.holding``: of two that explain it, the more significant
here), no pitfall. A change of the traffic
is judged as on requests (``mix``): the requests' size p50 (prompt or output tokens, from the
sketches) grew and the stage per unit of work held; per unit is the ratio of the exact sums' means
(the stage's mean over the mean computed prompt tokens, or output tokens less the first), the
windows having no single request's ratio. Such a change is a ``MixChange``: noted, never paged (a
tenant's long prompts routed to a replica are no slower prefill).

Each side's loop lateness (capped at each request's network time) and the engine host's CPU wait
are kept (``lateness.MEASURED``) and merged for the incident book, which tells from them, as on
requests, a rise that is the calling process's own event loop running late (noted, not paged).
Quantiles are the sketches' (1% relative).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
from ddsketch import LogarithmicMapping
from hopline.analyzer.findings.lateness import MEASURED
from hopline.analyzer.findings.model import Finding
from hopline.analyzer.findings.shifts.context import COVARIATES
from hopline.analyzer.findings.shifts.incidents import Change, cap_reversals, incidents, part_explains
from hopline.analyzer.findings.shifts.mix import MIN_UNITS, per_unit_if_mix
from hopline.analyzer.findings.shifts.scopes import CONFINE_MIN_SIDE
from hopline.analyzer.findings.shifts.stats import (
    RANK_RESOLUTION_S,
    RETURN_MIN,
    SETTLE_MIN_AFTER,
    SHIFT_STAGES,
    STATISTICS,
    ShiftConfig,
    _large,
    _returns,
    _stretches,
    log_move,
    z_threshold,
)
from hopline.analyzer.windows import KINDS, decode_bins

ALL = ("", "")  # the series key of all traffic
TIMINGS = ("ttft", "e2e")  # the collectors' outermost views, for the users' time and concurrency
TOKENS = ("prompt_tokens", "cached_tokens", "output_tokens")
# the measures the detector and the incident book read (others are not merged): each side's loop
# lateness and the engine host's CPU wait for the book's ``lateness.explained`` (a busy caller,
# server or host, not a slower hop)
READ = frozenset((*SHIFT_STAGES, *TIMINGS, *TOKENS, *MEASURED))


# -- the windows, as numpy ---------------------------------------------------------------------------


@dataclass
class Bins:
    """One measure in one window and scope: contiguous bin counts from key ``first``, zeros apart,
    exact count and sum."""

    first: int
    counts: np.ndarray
    zeros: float
    count: int
    total: float

    def add(self, first: int, counts: np.ndarray, zeros: float, count: int, total: float) -> None:
        self.zeros += zeros
        self.count += count
        self.total += total
        if not len(counts):
            return
        if not len(self.counts):
            self.first, self.counts = first, counts.copy()
            return
        lo = min(self.first, first)
        hi = max(self.first + len(self.counts), first + len(counts))
        if lo != self.first or hi != self.first + len(self.counts):
            grown = np.zeros(hi - lo)
            grown[self.first - lo : self.first - lo + len(self.counts)] = self.counts
            self.first, self.counts = lo, grown
        self.counts[first - self.first : first - self.first + len(counts)] += counts


@dataclass
class WindowSeries:
    """Merged windows: window index -> (attribute, value) -> measure -> ``Bins``, and arrivals.
    All traffic is the sum of the values of the first attribute (each request has one value of it,
    ``unknown`` or ``other`` included)."""

    width_s: float | None = None
    relative_accuracy: float | None = None
    by: tuple[str, ...] = ()
    windows: dict[int, dict[tuple[str, str], dict[str, Bins]]] = field(default_factory=dict)
    arrivals: dict[int, dict[tuple[str, str], int]] = field(default_factory=dict)
    requests: int = 0  # requests taken in (all windows ever merged)
    versions: dict[int, int] = field(default_factory=dict)  # window index -> parts merged into it

    def add_part(self, start: float, part: dict) -> None:
        index = round(start / self.width_s)
        scopes = self.windows.setdefault(index, {})
        arrivals = self.arrivals.setdefault(index, defaultdict(int))
        self.requests += part["requests"]
        self.versions[index] = self.versions.get(index, 0) + 1
        for attribute, values in part["scopes"].items():
            total = attribute == self.by[0]
            for value, summary in values.items():
                keys = [(attribute, value), ALL] if total else [(attribute, value)]
                for k in keys:
                    arrivals[k] += summary["arrivals"]
                for kind in KINDS:
                    for name, s in summary.get(kind, {}).items():  # a collector before issue 39: no lateness
                        if name not in READ:
                            continue
                        first, counts, zeros = decode_bins(s["sketch"], self.relative_accuracy)
                        for k in keys:
                            measures = scopes.setdefault(k, {})
                            found = measures.get(name)
                            if found is None:
                                measures[name] = Bins(first, counts.copy(), zeros, s["count"], s["sum"])
                            else:
                                found.add(first, counts, zeros, s["count"], s["sum"])

    def forget_before(self, index: int) -> None:
        for old in [i for i in self.windows if i < index]:
            del self.windows[old]
            self.arrivals.pop(old, None)
            self.versions.pop(old, None)


# -- the rank test on bins ---------------------------------------------------------------------------


class Matrix:
    """One (scope, stage)'s windows over the horizon as a dense matrix: rows are windows (``starts``),
    columns the bins from the zero bin then keys ``first``.., with each column's value (seconds)
    and millisecond tie group (``RANK_RESOLUTION_S``)."""

    def __init__(self, starts: np.ndarray, rows: list[Bins | None], gamma: float) -> None:
        present = [b for b in rows if b is not None and len(b.counts)]
        lo = min((b.first for b in present), default=0)
        hi = max((b.first + len(b.counts) for b in present), default=0)
        self.starts = starts
        self.m = np.zeros((len(rows), 1 + hi - lo))
        for i, b in enumerate(rows):
            if b is None:
                continue
            self.m[i, 0] = b.zeros
            if len(b.counts):
                self.m[i, 1 + b.first - lo : 1 + b.first - lo + len(b.counts)] = b.counts
        keys = np.arange(lo, hi)
        self.values = np.concatenate(([0.0], np.power(gamma, keys) * (2.0 / (1 + gamma))))
        self.groups = np.round(self.values / RANK_RESOLUTION_S).astype(np.int64)
        self.n = self.m.sum(axis=1)
        self.counts = rows
        self.cum = np.concatenate(([0.0], np.cumsum(self.n)))

    def pooled(self, lo: int, hi: int) -> np.ndarray:
        return self.m[lo:hi].sum(axis=0)

    def quantile(self, lo: int, hi: int, q: float) -> float | None:
        """The ``q`` quantile (seconds) of windows [lo, hi): the bin of rank q·(n−1) (DDSketch's)."""
        counts = self.pooled(lo, hi)
        n = counts.sum()
        if n <= 0:
            return None
        cum = np.cumsum(counts)
        return float(self.values[int(np.searchsorted(cum, q * (n - 1), side="right"))])

    def _ranks(self, lo: int, hi: int) -> tuple[np.ndarray, float, float]:
        """Cumulative rank sums of windows [lo, hi) (average ranks by millisecond), their count,
        and the variance's tie correction."""
        pooled = self.pooled(lo, hi)
        n = pooled.sum()
        _, inverse = np.unique(self.groups, return_inverse=True)
        per_group = np.bincount(inverse, weights=pooled)
        below = np.cumsum(per_group) - per_group
        avg = (below + (per_group + 1) / 2.0)[inverse]
        rank_sums = np.concatenate(([0.0], np.cumsum(self.m[lo:hi] @ avg)))
        tied = per_group[per_group > 0]
        ties = float(np.sum(tied**3 - tied)) / (n * (n - 1)) if n > 1 else 0.0
        return rank_sums, n, ties

    def z(self, lo: int, hi: int, splits: np.ndarray) -> np.ndarray:
        """Mann-Whitney z of "after > before" at each split window index in (lo, hi), as ``split_z``:
        the windows before the split as a stretch lower than the rest."""
        return self.stretch_z(lo, hi, np.full_like(splits, lo), splits)

    def stretch_z(self, lo: int, hi: int, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
        """Mann-Whitney z of "windows [start, stop) are lower than the rest of [lo, hi)", as
        ``findings.stats.stretch_z``."""
        rank_sums, n, ties = self._ranks(lo, hi)
        m = self.cum[stops] - self.cum[starts]
        u = rank_sums[stops - lo] - rank_sums[starts - lo] - m * (m + 1) / 2
        mean = m * (n - m) / 2
        sd = np.sqrt(np.maximum(m * (n - m) / 12.0 * ((n + 1) - ties), 1e-300))
        return (mean - u) / sd


@dataclass
class Found:
    """A change in one series (as ``stats.Detection``, indices are windows)."""

    stage: str
    scope: dict[str, str]
    at: int  # the first window after the change
    statistic: str
    before_ms: float
    after_ms: float
    z: float
    before_at: int  # the first window of the segment before
    end: int  # the end (exclusive) of the segment after
    until: int | None = None
    steps: int = 1

    @property
    def up(self) -> bool:
        return self.after_ms > self.before_ms

    @property
    def factor_estimate(self) -> float:
        return max(self.after_ms, 1e-9) / max(self.before_ms, 1e-9)


def _effect(mx: Matrix, a: tuple[int, int], b: tuple[int, int], z: float, cfg: ShiftConfig):
    """``stats._effect`` on windows: (statistic, before ms, after ms) when the p50, else the p90,
    moved enough for a user, the way the test says."""
    for statistic, q in STATISTICS.items():
        before, after = mx.quantile(*a, q / 100), mx.quantile(*b, q / 100)
        if before is None or after is None:
            return None
        bm, am = before * 1e3, after * 1e3
        lo, hi = min(am, bm), max(am, bm)
        if hi - lo >= cfg.min_abs_ms and (lo <= 0 or hi / lo >= cfg.min_factor) and (am > bm) == (z > 0):
            return statistic, bm, am
    return None


def _change_points(mx: Matrix, lo: int, hi: int, z_crit: float, cfg: ShiftConfig, depth: int = 0) -> list:
    n = mx.cum[hi] - mx.cum[lo]
    if n < 2 * cfg.min_side or depth > cfg.max_depth or hi - lo < 2:
        return []
    splits = np.arange(lo + 1, hi)
    k = mx.cum[splits] - mx.cum[lo]
    ok = (k >= cfg.min_side) & (k <= n - cfg.min_side)
    if not ok.any():
        return []
    splits = splits[ok]
    z = mx.z(lo, hi, splits)
    best = int(np.argmax(np.abs(z)))
    if abs(z[best]) < z_crit:
        return []
    s = int(splits[best])
    return (
        _change_points(mx, lo, s, z_crit, cfg, depth + 1)
        + [(s, float(z[best]))]
        + _change_points(mx, s, hi, z_crit, cfg, depth + 1)
    )


def detect_windows(mx: Matrix, z_crit: float, cfg: ShiftConfig, stage: str, scope: dict) -> list[Found]:
    """``stats.detect`` on one series' windows (see the module doc)."""
    cps = _change_points(mx, 0, len(mx.starts), z_crit, cfg)
    edges = [0] + [s for s, _ in cps] + [len(mx.starts)]
    found: list[Found | None] = []
    first = 0
    for i, (s, z) in enumerate(cps):
        prev = found[-1] if found else None
        if prev is not None and (z > 0) == prev.up:  # a ramp: one change
            effect = _effect(mx, (edges[first], edges[first + 1]), (s, edges[i + 2]), z, cfg)
            if effect is not None:
                found[-1] = Found(
                    stage,
                    scope,
                    prev.at,
                    *effect,
                    max(prev.z, z, key=abs),
                    edges[first],
                    edges[i + 2],
                    steps=prev.steps + 1,
                )
                continue
        effect = _effect(mx, (edges[i], s), (s, edges[i + 2]), z, cfg)
        found.append(None if effect is None else Found(stage, scope, s, *effect, z, edges[i], edges[i + 2]))
        first = i
    real = [f for f in found if f is not None]
    out: list[Found] = []
    i = 0
    while i < len(real):
        det = real[i]
        if det.before_at == 0 and (
            det.at <= 1 or (det.at <= cfg.cluster_windows and mx.cum[det.at - 1] < cfg.min_side)
        ):
            i += 1  # the horizon's first window alone is no baseline (``stats._from_first_window``)
            continue
        end = next(
            (j for j in range(i + 1, len(real)) if real[j].up != det.up and _returns(det, real[j], cfg)), None
        )
        out.append(det)
        if end is None:
            i += 1
            continue
        det.until = real[end].at
        det.end = real[end].at
        q = STATISTICS[det.statistic] / 100
        det.after_ms = (mx.quantile(det.at, det.until, q) or 0.0) * 1e3
        i = end + 1
    return [d for d in out if _settled(mx, d, z_crit, cfg)]


def _settled(mx: Matrix, det: Found, z_crit: float, cfg: ShiftConfig) -> bool:
    """``stats._settle_step`` on windows: a fresh step's onset where the rank test puts it once
    ``SETTLE_MIN_AFTER`` requests follow, and ``min_side`` requests after it asked for; then
    ``stats._past_return``."""
    if det.until is not None or det.steps > 1:
        return True
    lo, hi = det.before_at, det.end
    splits = np.arange(det.at, hi)
    after = mx.cum[hi] - mx.cum[splits]
    splits = splits[after >= SETTLE_MIN_AFTER]
    if len(splits):
        z = mx.z(lo, hi, splits) * (1 if det.up else -1)
        best = int(splits[int(np.argmax(z))])
        if best != det.at:
            q = STATISTICS[det.statistic] / 100
            b, a = mx.quantile(lo, best, q), mx.quantile(best, hi, q)
            if b is not None and a is not None and _large(b * 1e3, a * 1e3, det.up, cfg):
                det.at, det.before_ms, det.after_ms = best, b * 1e3, a * 1e3
    if min(mx.cum[det.at] - mx.cum[lo], mx.cum[hi] - mx.cum[det.at]) < cfg.min_side:
        return False
    return _past_return(mx, det, z_crit, cfg)


def _past_return(mx: Matrix, det: Found, z_crit: float, cfg: ShiftConfig) -> bool:
    """``stats._past_return`` on windows: a step's onset moved past a return in its first
    ``min_side`` requests, and whether it still holds from there."""
    lo, hi = det.at, det.end
    if hi - lo < 3 or mx.cum[hi] - mx.cum[lo] < 2 * RETURN_MIN:
        return True
    ks = mx.cum[lo + 1 : hi] - mx.cum[lo]  # requests before each boundary inside the after side
    starts, stops = _stretches(ks, RETURN_MIN, min(cfg.min_side, mx.cum[hi] - mx.cum[lo] - RETURN_MIN + 1))
    if len(starts) == 0:
        return True
    # back to window indices: the boundary of each count (the first, where windows are empty)
    w_starts, w_stops = lo + 1 + np.searchsorted(ks, starts), lo + 1 + np.searchsorted(ks, stops)
    z = mx.stretch_z(lo, hi, w_starts, w_stops) * (1 if det.up else -1)
    q = STATISTICS[det.statistic] / 100
    floor = cfg.min_abs_ms
    mid = math.sqrt(max(det.before_ms, floor) * max(det.after_ms, floor))
    for i in np.argsort(-z, kind="stable"):
        if z[i] < z_crit:
            return True
        level = mx.quantile(int(w_starts[i]), int(w_stops[i]), q)
        if level is not None and (level * 1e3 < mid) == det.up:
            break
    else:
        return True
    if starts[i] >= cfg.min_side:
        return True
    at = int(w_stops[i])
    b, a = mx.quantile(det.before_at, at, q), mx.quantile(at, hi, q)
    if b is None or a is None:
        return False
    det.at, det.before_ms, det.after_ms = at, b * 1e3, a * 1e3
    return _large(det.before_ms, det.after_ms, det.up, cfg) and mx.cum[hi] - mx.cum[at] >= cfg.min_side


# -- the search ------------------------------------------------------------------------------------


def _scope_of(key: tuple[str, str]) -> dict[str, str]:
    return {} if key == ALL else {key[0]: key[1]}


DEFAULT_SHIFTS = ShiftConfig()
SCREEN = 0.8  # a series is searched in full when its coarse rank test reaches this much of the critical z
RANK_CELL = 8  # the coarse test's categories: 8 DDSketch bins (~17%) above 12.5 ms, milliseconds below
CATEGORIES = 1 << 20  # categories are below this (keys are clamped to a day)


def categories(keys: np.ndarray, gamma: float) -> np.ndarray:
    """The coarse test's category of DDSketch keys (monotone; 0: under half a millisecond)."""
    keys = np.minimum(keys, math.ceil(math.log(86400.0) / math.log(gamma)))
    values = np.power(gamma, keys) * (2.0 / (1 + gamma))
    small = values < 12.5e-3
    cut = math.ceil(math.log(12.5e-3) / math.log(gamma))
    return np.where(small, np.round(values / RANK_RESOLUTION_S), 13 + (keys - cut) // RANK_CELL).astype(
        np.int64
    )


class Screen:
    """Every searched series' first split at once, per stage, on coarse categories (``RANK_CELL``),
    vectorized over scopes from each window's sparse counts (kept per window version in
    ``cache``): the largest |z| of the rank test over the window boundaries with ``min_side``
    requests a side. Only the series that come near the critical z are searched in full
    (``Matrix``, ``detect_windows``): the cost of a step follows scopes × windows in numpy, and
    Python per series only where something may have moved."""

    def __init__(
        self, series: WindowSeries, starts: list[int], searched: list, gamma: float, cache: dict
    ) -> None:
        self.series, self.starts, self.searched, self.gamma, self.cache = (
            series,
            starts,
            searched,
            gamma,
            cache,
        )
        self.index = {key: n for n, key in enumerate(searched)}

    def _window(self, i: int, stage: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        version = self.series.versions.get(i, 0)
        kept = self.cache.get((i, stage))
        if kept is not None and kept[0] == version and kept[1] == tuple(self.searched):
            return kept[2]
        owners, firsts, lengths, counts, zeros = [], [], [], [], []
        for key, measures in self.series.windows[i].items():
            n = self.index.get(key)
            b = measures.get(stage) if n is not None else None
            if b is None:
                continue
            owners.append(n)
            firsts.append(b.first)
            lengths.append(len(b.counts))
            counts.append(b.counts)
            zeros.append(b.zeros)
        if owners:  # one entry per (scope, category) of the window
            lengths_ = np.array(lengths)
            total = int(lengths_.sum())
            offsets = np.arange(total) - np.repeat(np.cumsum(lengths_) - lengths_, lengths_)
            keys = np.repeat(np.array(firsts), lengths_) + offsets
            s = np.concatenate((np.repeat(np.array(owners), lengths_), np.array(owners)))
            c = np.concatenate((categories(keys, self.gamma), np.zeros(len(owners), np.int64)))
            counts.append(np.array(zeros, dtype=float))
            pair, where = np.unique(s * CATEGORIES + c, return_inverse=True)
            n = np.bincount(where, weights=np.concatenate(counts))
            made = (pair // CATEGORIES, pair % CATEGORIES, n)
        else:
            made = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0))
        self.cache[(i, stage)] = (version, tuple(self.searched), made)
        return made

    def candidates(self, stage: str, cfg: ShiftConfig, z_near: float) -> list:
        parts = [self._window(i, stage) for i in self.starts]
        for i in list(self.cache):
            if i[1] == stage and i[0] not in self.starts:
                del self.cache[i]
        if not parts:
            return []
        w = np.concatenate([np.full(len(p[0]), j) for j, p in enumerate(parts)])
        s = np.concatenate([p[0] for p in parts])
        c = np.concatenate([p[1] for p in parts])
        n = np.concatenate([p[2] for p in parts])
        if not len(n):
            return []
        S, W = len(self.searched), len(parts)
        c = c - c.min()
        C = int(c.max()) + 1
        pooled = np.bincount(s * C + c, weights=n, minlength=S * C).reshape(S, C)
        avg = np.cumsum(pooled, axis=1) - pooled + (pooled + 1) / 2.0
        ranks = np.bincount(s * W + w, weights=n * avg[s, c], minlength=S * W).reshape(S, W)
        counts = np.bincount(s * W + w, weights=n, minlength=S * W).reshape(S, W)
        k = np.cumsum(counts, axis=1)[:, :-1]
        r = np.cumsum(ranks, axis=1)[:, :-1]
        total = counts.sum(axis=1, keepdims=True)
        ties = np.sum(pooled**3 - pooled, axis=1, keepdims=True) / np.maximum(total * (total - 1), 1)
        sd = np.sqrt(np.maximum(k * (total - k) / 12.0 * ((total + 1) - ties), 1e-300))
        z = (k * (total - k) / 2 - (r - k * (k + 1) / 2)) / sd
        ok = (k >= cfg.min_side) & (total - k >= cfg.min_side)
        best = np.where(ok, np.abs(z), 0.0).max(axis=1) if W > 1 else np.zeros(S)
        return [self.searched[j] for j in np.flatnonzero(best >= z_near)]


def find_window_shifts(
    series: WindowSeries,
    starts: list[int],
    attributes: tuple[str, ...],
    cfg: ShiftConfig = DEFAULT_SHIFTS,
    cache: dict | None = None,
) -> list[Finding]:
    """The shift detector's findings on the windows ``starts`` (indices, ascending), scoped by the
    values of ``attributes`` (the watcher's ``LiveConfig.scopes``); ``cache``: the coarse test's
    per-window counts, kept from step to step (``Screen``)."""
    width = series.width_s
    gamma = LogarithmicMapping(series.relative_accuracy).gamma
    index = np.array(starts)
    scopes = [ALL] + sorted(
        {k for i in starts for k in series.windows[i] if k != ALL and k[0] in attributes}
    )
    stages = [s for s in SHIFT_STAGES if any(s in series.windows[i].get(ALL, {}) for i in starts)]

    def matrix(key: tuple[str, str], stage: str) -> Matrix:
        return Matrix(index, [series.windows[i].get(key, {}).get(stage) for i in starts], gamma)

    # scopes searched: all traffic, and each value of an attribute with 2 x min_side requests, when
    # the attribute has two such values or more (as ``_search``)
    totals: dict[tuple[str, str], int] = defaultdict(int)
    for i in starts:
        for k, n in series.arrivals.get(i, {}).items():
            totals[k] += n
    tested: dict[str, list[str]] = defaultdict(list)
    for attribute, value in scopes[1:]:
        if totals[(attribute, value)] >= 2 * cfg.min_side:
            tested[attribute].append(value)
    tested = {a: v for a, v in tested.items() if len(v) >= 2}
    searched = [ALL] + [(a, v) for a, vs in tested.items() for v in vs]
    z_crit = z_threshold(cfg.alpha, len(searched) * max(len(stages), 1) * max(len(starts) - 1, 1))
    matrices: dict[tuple, Matrix] = {}
    found: dict[str, list[Found]] = {s: [] for s in stages}
    screen = Screen(series, starts, searched, gamma, cache if cache is not None else {})
    for stage in stages:
        for key in screen.candidates(stage, cfg, SCREEN * z_crit):
            mx = matrices[(key, stage)] = matrix(key, stage)
            found[stage] += detect_windows(mx, z_crit, cfg, stage, _scope_of(key))

    def mx_of(key: tuple[str, str], stage: str) -> Matrix:
        if (key, stage) not in matrices:
            matrices[(key, stage)] = matrix(key, stage)
        return matrices[(key, stage)]

    changes: list[Change] = []
    within = cfg.cluster_windows
    for stage, dets in found.items():
        for group in _clusters(dets, within):
            for det in _narrowest(group, tested, mx_of, cfg, stage, z_crit):
                changes.append(_change(det, series, starts, mx_of, stages, cfg))
    # a change of the traffic heads no incident, as on requests (``find_shifts``)
    within_s = cfg.onset_windows * width
    mixes = [c for c in changes if c.mix is not None and not part_explains(c, changes, within_s)]
    leads = incidents([c for c in changes if c not in mixes], within_s) + mixes
    cap_reversals(leads)
    leads.sort(key=lambda s: (-abs(s.impact_s), s.at))
    return [c.finding() for c in leads]


def _clusters(dets: list[Found], within: float) -> list[list[Found]]:
    groups: list[list[Found]] = []
    for det in sorted(dets, key=lambda d: d.at):
        if groups and det.at - groups[-1][0].at <= within:
            groups[-1].append(det)
        else:
            groups.append([det])
    return groups


def _moved(mx: Matrix, det: Found, cfg: ShiftConfig) -> float | None:
    """``stats.moved_at`` on windows: |log(after / before)| of det's statistic at its time in
    another scope, None without requests on a side."""
    q = STATISTICS[det.statistic] / 100
    end = det.until if det.until is not None else len(mx.starts)
    before, after = mx.quantile(0, det.at, q), mx.quantile(det.at, end, q)
    if before is None or after is None:
        return None
    return log_move(before, after, cfg)


def _narrowest(
    group: list[Found], tested: dict, mx_of, cfg: ShiftConfig, stage: str, z_crit: float
) -> list[Found]:
    """``scopes.narrowest`` on windows (no two-attribute cell: see the module doc)."""
    overall = [d for d in group if not d.scope]
    best: list[Found] = []
    for dim, values in tested.items():
        hits = [d for d in group if dim in d.scope]
        hit_values = {d.scope[dim] for d in hits}
        if not hits or len(hit_values) == len(values):
            continue
        weakest = min(abs(math.log(d.factor_estimate)) for d in hits)
        others = [_moved(mx_of((dim, v), stage), hits[0], cfg) for v in values if v not in hit_values]
        if any(r is None or r > weakest / 2 for r in others):
            continue
        if not best or max(d.z**2 for d in hits) > max(d.z**2 for d in best):
            best = hits
    if best and (not overall or all(d.up == overall[0].up for d in best)):
        return best
    if overall:
        return [_confine(d, tested, mx_of, cfg, stage) for d in overall]
    by_dim = [[d for d in group if dim in d.scope] for dim in tested]
    return next((hits for hits in by_dim if hits), [])


def _confine(det: Found, tested: dict, mx_of, cfg: ShiftConfig, stage: str) -> Found:
    """``scopes.confine`` on windows: all traffic's change in the one value that moved."""
    end = det.until if det.until is not None else None
    half = abs(math.log(det.factor_estimate)) / 2
    best, best_z = det, 0.0
    values = {}
    for dim, vals in tested.items():
        seen = []
        for v in vals:
            mx = mx_of((dim, v), stage)
            stop = end if end is not None else len(mx.starts)
            if min(mx.cum[det.at], mx.cum[stop] - mx.cum[det.at]) >= CONFINE_MIN_SIDE:
                seen.append(v)
        values[dim] = seen
    crit = z_threshold(cfg.alpha, max(sum(len(v) for v in values.values()), 1))
    for dim, vals in values.items():
        moved = {v: _moved(mx_of((dim, v), stage), det, cfg) for v in vals}
        hit = [v for v, r in moved.items() if r is not None and r > half]
        if len(vals) < 2 or len(hit) != 1 or any(r is None for r in moved.values()):
            continue
        mx = mx_of((dim, hit[0]), stage)
        stop = end if end is not None else len(mx.starts)
        z = float(mx.z(0, stop, np.array([det.at]))[0])
        if abs(z) < crit or (z > 0) != det.up or abs(z) <= abs(best_z):
            continue
        q = STATISTICS[det.statistic] / 100
        b, a = mx.quantile(0, det.at, q), mx.quantile(det.at, stop, q)
        best = Found(
            stage, {dim: hit[0]}, det.at, det.statistic, b * 1e3, a * 1e3, z, 0, stop, det.until, det.steps
        )
        best_z = z
    return best


def _sum(series: WindowSeries, key, name: str, windows: Iterable[int]) -> tuple[float, int]:
    total, count = 0.0, 0
    for i in windows:
        b = series.windows.get(i, {}).get(key, {}).get(name)
        if b is not None:
            total, count = total + b.total, count + b.count
    return total, count


def _load(series: WindowSeries, key, windows: list[int], span: float) -> dict[str, float | None]:
    """``context.load`` from windows: arrivals/s, concurrency (Σ e2e over the span), prompt p50
    (the merged sketch's), cache hits (exact sums)."""
    if span <= 0 or not windows:
        return {"span_s": None, **dict.fromkeys(COVARIATES)}
    arrivals = sum(series.arrivals.get(i, {}).get(key, 0) for i in windows)
    busy, _ = _sum(series, key, "e2e", windows)
    prompt, _ = _sum(series, key, "prompt_tokens", windows)
    cached, _ = _sum(series, key, "cached_tokens", windows)
    gamma = LogarithmicMapping(series.relative_accuracy).gamma
    mx = Matrix(
        np.array(windows),
        [series.windows.get(i, {}).get(key, {}).get("prompt_tokens") for i in windows],
        gamma,
    )
    p50 = mx.quantile(0, len(windows), 0.5)
    return {
        "span_s": span,
        "arrivals_per_s": arrivals / span,
        "concurrency": busy / span if busy else None,
        "prompt_tokens_p50": p50,
        "cache_hit_ratio": cached / prompt if prompt else None,
        "spec_acceptance_length_p50": None,
    }


def _change(
    det: Found, series: WindowSeries, starts: list[int], mx_of, stages: list[str], cfg: ShiftConfig
) -> Change:
    """The ``Change`` (the shift detector's own type: its incidents, words and finding) of a window
    detection, with its context from the windows."""
    width = series.width_s
    key = ALL if not det.scope else next(iter(det.scope.items()))
    end = det.until if det.until is not None else len(starts)
    before_w, after_w = starts[: det.at], starts[det.at : end]
    unchanged, moved = [], {}
    for stage in stages:
        if stage == det.stage:
            continue
        mx = mx_of(key, stage)
        b, a = mx.quantile(0, det.at, 0.5), mx.quantile(det.at, end, 0.5)
        if b is None or a is None:
            continue
        if b > 0 and abs(a / b - 1) <= cfg.unchanged_within:
            unchanged.append(stage)
        elif abs(a - b) * 1e3 >= cfg.min_abs_ms:
            moved[stage] = {"before_ms": round(b * 1e3, 3), "after_ms": round(a * 1e3, 3)}
    at_s = starts[det.at] * width
    first_s = starts[0] * width
    last_s = (starts[end - 1] + 1) * width
    lb = _load(series, key, before_w, at_s - first_s)
    la = _load(series, key, after_w, last_s - at_s)
    covariates = {
        k: round(la[k] / lb[k] - 1, 3) for k in lb if k in COVARIATES and lb[k] and la[k] is not None
        and k != "spec_acceptance_length_p50"
    }  # fmt: skip
    context = {
        "unchanged": unchanged,
        "moved": moved,
        "covariates": covariates,
        "moved_with": {k: v for k, v in covariates.items() if abs(v) >= cfg.notable_change},
        "before": {k: None if v is None else round(float(v), 4) for k, v in lb.items()},
        "after": {k: None if v is None else round(float(v), 4) for k, v in la.items()},
    }
    b_sum, b_n = _sum(series, key, det.stage, before_w)
    a_sum, a_n = _sum(series, key, det.stage, after_w)
    excess = a_sum - a_n * (b_sum / b_n) if b_n else 0.0
    return Change(
        det.stage, det.scope, at_s, det.statistic, det.before_ms, det.after_ms, det.z, a_n, context,
        None if det.until is None else starts[det.until] * width if det.until < len(starts) else last_s,
        excess_s=excess, mix=_mix(det, series, key, before_w, after_w, cfg),
    )  # fmt: skip


# a stage's unit of work in the windows: (unit, size, the size's measure, the measure taken off
# the size for the work: cached prompt tokens, or the first output token of each request)
UNITS = {
    "prefill": ("computed prompt token", "prompt token", "prompt_tokens", "cached_tokens"),
    "decode": ("output token", "output token", "output_tokens", None),
}


def _mix(
    det: Found, series: WindowSeries, key: tuple[str, str], before_w: list[int], after_w: list[int], cfg: ShiftConfig
) -> dict | None:
    """``mix.mix_of`` on windows (see the module): the per-unit figures of a rise of prefill or
    decode that is a change of the traffic (``new_traffic`` unknown: None), else None."""
    unit = UNITS.get(det.stage)
    if unit is None or det.after_ms <= det.before_ms or det.before_ms <= 0:
        return None
    name, size_name, measure, less = unit
    gamma = LogarithmicMapping(series.relative_accuracy).gamma

    def side(windows: list[int]) -> tuple[float, float] | None:
        """(the stage's mean over the mean unit count, the size p50) of ``windows``."""
        stage, n = _sum(series, key, det.stage, windows)
        size, m = _sum(series, key, measure, windows)
        off = _sum(series, key, less, windows)[0] if less is not None else float(m)
        if n < MIN_UNITS or m < MIN_UNITS or size - off <= 0 or stage <= 0:
            return None
        p50 = Matrix(np.array(windows), [series.windows.get(i, {}).get(key, {}).get(measure) for i in windows], gamma)
        return (stage / n) / ((size - off) / m), p50.quantile(0, len(windows), 0.5) or 0.0

    before, after = side(before_w), side(after_w)
    if before is None or after is None:
        return None
    units, sizes = (before[0], after[0]), (before[1], after[1])
    per = per_unit_if_mix((name, size_name), units, sizes, (det.before_ms, det.after_ms), cfg)
    return None if per is None else {"per_unit": per | {"statistic": "mean"}, "new_traffic": None}


def bin_quantiles(b: Bins, q: np.ndarray, gamma: float) -> np.ndarray:
    """The quantiles ``q`` (seconds) of one ``Bins``: the bin of rank q·(count − 1)."""
    counts = np.concatenate(([b.zeros], b.counts))
    values = np.concatenate(
        ([0.0], np.power(gamma, np.arange(b.first, b.first + len(b.counts))) * (2.0 / (1 + gamma)))
    )
    cum = np.cumsum(counts)
    picks = np.searchsorted(cum, q * (cum[-1] - 1), side="right")
    return values[np.minimum(picks, len(values) - 1)]
