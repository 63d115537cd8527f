"""The statistics of a shift: a rank test at every window boundary, binary segmentation, and
the edges of a burst (steps 1-3 of the method in ``findings.shifts``)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl
from hopline.analyzer.attribution import TTFT_PARTS
from hopline.analyzer.findings.stats import STATISTICS, split_z, stretch_z, z_threshold  # noqa: F401 (the shift's own too)

SHIFT_STAGES = TTFT_PARTS + ("decode", "reasoning")  # reasoning: a thinking model's time to first content




RANK_RESOLUTION_S = 1e-3  # values are ranked to the millisecond (min_abs_ms is 5)


RETURN_REMAINDER = 0.05  # a burst's end that leaves at most this share of its change is a return


@dataclass(frozen=True)
class ShiftConfig:
    """Thresholds. Tuned on stationary and injected logs of seeds 0-9 only."""

    min_factor: float = 1.5  # p50 (or p90) after / before, or its inverse
    min_abs_ms: float = 5.0  # and at least this many ms apart
    min_side: int = 50  # requests on each side of the split
    alpha: float = 1e-3  # family-wise, Bonferroni over scopes x stages x candidate splits
    max_depth: int = 3  # binary segmentation: up to 2**4 - 1 change points per scope and stage
    cluster_windows: float = 3.0  # detections in different scopes this close are one change
    max_requests: int = 200_000  # per scope; a seeded subsample beyond (plenty for a rank test)
    unchanged_within: float = 0.15  # another stage within ±15% counts as unchanged
    notable_change: float = 0.2  # a covariate that moved 20% or more is mentioned
    onset_windows: float = 1.0  # shifts of one scope starting this close are one incident
    onset_spread_s: float = 15.0  # one change's onset as seen from different scopes (a queue builds up)


@dataclass
class Detection:
    stage: str
    scope: dict[str, str]
    at: float
    statistic: str
    before_ms: float
    after_ms: float
    z: float
    after_n: int
    until: float | None = None  # the change reverted here (a transient incident)
    index: int = 0  # the first request after the change, in the scope's sorted requests
    before_index: int = 0  # the first request of the segment before it
    since: float | None = None  # Unix seconds: the start of that first request (the baseline's start)
    steps: int = 1  # change points it is made of (a ramp: the same stage moving the same way again)

    @property
    def up(self) -> bool:
        return self.after_ms > self.before_ms

    @property
    def factor_estimate(self) -> float:
        return max(self.after_ms, 1e-9) / max(self.before_ms, 1e-9)


def _change_points(
    t: np.ndarray,
    x: np.ndarray,
    boundaries: np.ndarray,
    z_crit: float,
    cfg: ShiftConfig,
    lo: int,
    hi: int,
    depth: int = 0,
) -> list[tuple[int, float, float]]:
    """Binary segmentation: ``(index, boundary, z)`` of every significant split of x[lo:hi]."""
    n = hi - lo
    if n < 2 * cfg.min_side or depth > cfg.max_depth:
        return []
    inside = boundaries[(boundaries > t[lo]) & (boundaries <= t[hi - 1])]
    ks = np.searchsorted(t[lo:hi], inside)  # requests before each boundary
    ok = (ks >= cfg.min_side) & (ks <= n - cfg.min_side)
    if not ok.any():
        return []
    ks, inside = ks[ok], inside[ok]
    z = split_z(x[lo:hi], ks)
    best = int(np.argmax(np.abs(z)))
    if abs(z[best]) < z_crit:
        return []
    k = lo + int(ks[best])
    return (
        _change_points(t, x, boundaries, z_crit, cfg, lo, k, depth + 1)
        + [(k, float(inside[best]), float(z[best]))]
        + _change_points(t, x, boundaries, z_crit, cfg, k, hi, depth + 1)
    )


def _effect(
    before: np.ndarray, after: np.ndarray, z: float, cfg: ShiftConfig
) -> tuple[str, float, float] | None:
    """(statistic, before ms, after ms) when the p50 — else the p90 — moved enough for a user."""
    for statistic, q in STATISTICS.items():
        b, a = np.percentile(before, q) * 1e3, np.percentile(after, q) * 1e3
        lo, hi = min(a, b), max(a, b)
        if hi - lo >= cfg.min_abs_ms and (lo <= 0 or hi / lo >= cfg.min_factor) and (a > b) == (z > 0):
            return statistic, float(b), float(a)
    return None


def detect(
    t: np.ndarray,
    x: np.ndarray,
    boundaries: np.ndarray,
    z_crit: float,
    cfg: ShiftConfig,
    stage: str,
    scope: dict[str, str],
) -> list[Detection]:
    """Changes of one stage in one scope; a change that reverts later is one detection with
    ``until`` (its before / after are the segments next to it, so a burst is not diluted)."""
    # ranked at RANK_RESOLUTION_S: a trend among values no user tells apart (a queue of 0.035 ms
    # easing to 0.011 after a flood) must not decide where a split falls
    cps = _change_points(t, np.round(x / RANK_RESOLUTION_S), boundaries, z_crit, cfg, 0, len(x))
    edges = [0] + [k for k, _, _ in cps] + [len(x)]
    found: list[Detection | None] = []
    first = 0  # index of the change point where the current run of same-direction steps began
    for i, (k, at, z) in enumerate(cps):
        prev = found[-1] if found else None
        if prev is not None and (z > 0) == prev.up:
            # the same stage moving the same way again right after: a change in steps (a ramp) is
            # one change, from the segment before its first step to the segment after its last
            effect = _effect(x[edges[first] : edges[first + 1]], x[k : edges[i + 2]], z, cfg)
            if effect is not None:
                start = edges[first + 1]
                found[-1] = Detection(
                    stage,
                    scope,
                    prev.at,
                    *effect,
                    max(prev.z, z, key=abs),
                    edges[i + 2] - start,
                    index=start,
                    before_index=edges[first],
                    steps=prev.steps + 1,
                )
                continue
        effect = _effect(x[edges[i] : k], x[k : edges[i + 2]], z, cfg)
        found.append(
            None
            if effect is None
            else Detection(stage, scope, at, *effect, z, edges[i + 2] - k, index=k, before_index=edges[i])
        )
        first = i
    # A burst ends at the first later change that brings the stage back; the steps between (it
    # eased or rose again on the way, or moved too little for a user: None) are part of it.
    real = [det for det in found if det is not None]
    out: list[Detection] = []
    i = 0
    while i < len(real):
        det = real[i]
        if _from_first_window(t, boundaries, det, cfg):
            i += 1  # the log's first window alone is no baseline: what follows it is (a start-up)
            continue
        end = next(
            (j for j in range(i + 1, len(real)) if real[j].up != det.up and _returns(det, real[j], cfg)), None
        )
        out.append(det)
        if end is None:
            i += 1
            continue
        _settle_burst(t, x, boundaries, det, real[end], cfg)  # one finding from its onset, with its end
        if _from_first_window(t, boundaries, det, cfg):  # its onset fell back to the log's first window
            out.pop()
            i = end  # its end is the change
            continue
        i = end + 1
    settled = [det for det in out if _settled(t, x, boundaries, det, z_crit, cfg)]
    for det in settled:
        det.since = float(t[det.before_index])
    return settled


def _settled(
    t: np.ndarray, x: np.ndarray, boundaries: np.ndarray, det: Detection, z_crit: float, cfg: ShiftConfig
) -> bool:
    """A step placed where its requests say (``_settle_step``, then past a return inside it:
    ``_past_return``); a burst (placed by ``_settle_burst``) and a ramp as found."""
    if det.until is not None or det.steps > 1:
        return True
    return _settle_step(t, x, boundaries, det, cfg) and _past_return(t, x, boundaries, det, z_crit, cfg)


def _settle_step(t: np.ndarray, x: np.ndarray, boundaries: np.ndarray, det: Detection, cfg: ShiftConfig) -> bool:
    """Place a step's onset where the rank test puts it once its floor of requests after the
    split is lifted, and whether ``min_side`` requests still follow it.

    Binary segmentation needs ``min_side`` requests after a split. Followed live, a change only
    seconds old has fewer: the split that the rank test finds significant then falls before the
    change, as far back as ``min_side`` requests go (a flood's first ten slow answers, and forty
    untouched ones before them), and says an onset 15-25 s early, a level diluted by the
    untouched, and another stage's co-mover first. Among the boundaries from the found one on
    (``min_side`` can only have pulled it early), the one with the largest rank z over the same
    requests, with at least ``SETTLE_MIN_AFTER`` after it, is the onset; such a change then waits
    until it has ``min_side`` of its own. In a log, where they have long arrived, the found split
    is that one already."""
    lo, hi = det.before_index, det.index + det.after_n
    later = boundaries[(boundaries >= det.at) & (boundaries <= t[hi - 1])]
    ks = np.searchsorted(t[lo:hi], later)
    keep = ks <= (hi - lo) - SETTLE_MIN_AFTER
    if not keep.any():
        return det.after_n >= cfg.min_side and det.index - lo >= cfg.min_side
    later, ks = later[keep], ks[keep]
    z = split_z(np.round(x[lo:hi] / RANK_RESOLUTION_S), ks) * (1 if det.up else -1)
    best = int(np.argmax(z))
    at = float(later[best])
    if at != det.at:
        q = STATISTICS[det.statistic]
        ms = x * 1e3
        index = lo + int(ks[best])
        before_ms, after_ms = _level(ms[lo:index], q), _level(ms[index:hi], q)
        if _large(before_ms, after_ms, det.up, cfg):  # else the split the test found stays
            det.at, det.index, det.before_ms, det.after_ms, det.after_n = at, index, before_ms, after_ms, hi - index
    return min(det.index - lo, det.after_n) >= cfg.min_side


def _past_return(
    t: np.ndarray, x: np.ndarray, boundaries: np.ndarray, det: Detection, z_crit: float, cfg: ShiftConfig
) -> bool:
    """Move a step's onset past a return right after it, and whether the step still holds from there.

    A stretch of fewer than ``min_side`` requests is no change point of its own. So a transient
    (the host's hiccup: the API server's frontend 13 -> 110 ms for 12 s, ~35 requests), its return
    (11 ms for 10 s) and a later rise (a flood: 40 ms) were found as one step from the transient's
    start, 20 s early, its after side the three of them. The return is the stretch between two
    window boundaries after the onset, of ``RETURN_MIN`` to ``min_side`` requests, that is the most
    significantly lower than the rest of the after side (the rank test, at the detection's
    ``z_crit``), and nearer the before level than the after level. When fewer than ``min_side``
    requests came between the onset and it (a transient too short to be judged on its own), the
    change that holds began after it: the onset is its end, the before side everything up to
    there, and the step must again be large with ``min_side`` requests after it (until then it is
    not reported: a rise after it is found once it has them). A return after a longer rise is part
    of the change (it goes and comes back), which keeps its onset."""
    lo, hi = det.index, det.index + det.after_n
    inside = boundaries[(boundaries > det.at) & (boundaries <= t[hi - 1])]
    if len(inside) < 2 or hi - lo < 2 * RETURN_MIN:
        return True
    ks = np.searchsorted(t[lo:hi], inside)
    starts, stops = _stretches(ks, RETURN_MIN, min(cfg.min_side, hi - lo - RETURN_MIN + 1))
    if len(starts) == 0:
        return True
    sign = 1 if det.up else -1
    z = stretch_z(sign * np.round(x[lo:hi] / RANK_RESOLUTION_S), starts, stops)
    q = STATISTICS[det.statistic]
    ms = x[lo:hi] * 1e3
    floor = cfg.min_abs_ms
    mid = math.sqrt(max(det.before_ms, floor) * max(det.after_ms, floor))  # the levels' midpoint, in log terms
    for i in np.argsort(-z, kind="stable"):
        if z[i] < z_crit:
            return True
        if (_level(ms[starts[i] : stops[i]], q) < mid) == det.up:
            break  # the return
    else:
        return True
    if starts[i] >= cfg.min_side:
        return True
    index = lo + int(stops[i])
    before_ms, after_ms = _level(x[det.before_index : index] * 1e3, q), _level(x[index:hi] * 1e3, q)
    det.at = float(inside[np.searchsorted(ks, stops[i])])
    det.index, det.before_ms, det.after_ms, det.after_n = index, before_ms, after_ms, hi - index
    return _large(before_ms, after_ms, det.up, cfg) and det.after_n >= cfg.min_side


def _stretches(ks: np.ndarray, shortest: int, longer_than: int) -> tuple[np.ndarray, np.ndarray]:
    """(starts, stops) of every stretch between two of the sorted indices ``ks`` with at least
    ``shortest`` and fewer than ``longer_than`` items: the pairs a few boundaries apart, not all."""
    starts, stops = [], []
    for d in range(1, len(ks)):
        m = ks[d:] - ks[:-d]
        ok = (m >= shortest) & (m < longer_than)
        starts.append(ks[:-d][ok])
        stops.append(ks[d:][ok])
        if m.min() >= longer_than:
            break  # a stretch only grows with the boundaries it spans
    if not starts:
        return np.empty(0, dtype=ks.dtype), np.empty(0, dtype=ks.dtype)
    return np.concatenate(starts), np.concatenate(stops)


RETURN_MIN = 20  # requests of a stretch back at the before level that a step's onset is moved past

SETTLE_MIN_AFTER = 10  # requests after a settled onset the rank test weighs it on (min_side is then asked of it)


def _large(before_ms: float, after_ms: float, up: bool, cfg: ShiftConfig) -> bool:
    """Whether a move from ``before_ms`` to ``after_ms`` is one ``_effect`` reports, the same way."""
    lo, hi = min(before_ms, after_ms), max(before_ms, after_ms)
    return hi - lo >= cfg.min_abs_ms and (lo <= 0 or hi / lo >= cfg.min_factor) and (after_ms > before_ms) == up


def _from_first_window(t: np.ndarray, boundaries: np.ndarray, det: Detection, cfg: ShiftConfig) -> bool:
    """Whether ``det``'s before-side is only the scope's first window: the requests of the log's
    first seconds against everything after them. A log starts at an arbitrary moment (a client
    warming up, a cache filling); a change from there, or a "burst" from there until the real
    onset, would frame the healthy part of the log as the incident. The real onset, if any, is
    then a change of its own, from what followed the first window."""
    if det.before_index != 0:
        return False
    earlier = boundaries[(boundaries > t[0]) & (boundaries < det.at)]
    if len(earlier) == 0:
        return True  # the first window
    # a scope's first split with ``min_side`` requests before it, within the log's first few windows
    # (a change later than that, at a scope's first possible split, is a short log's real one)
    width = boundaries[1] - boundaries[0] if len(boundaries) > 1 else math.inf
    first_few = len(earlier) < cfg.cluster_windows and det.at - t[0] <= cfg.cluster_windows * width
    return first_few and not (np.searchsorted(t, earlier) >= cfg.min_side).any()


def _settle_burst(
    t: np.ndarray, x: np.ndarray, boundaries: np.ndarray, det: Detection, end: Detection, cfg: ShiftConfig
) -> None:
    """``det`` as the burst that ``end`` ends: its ``until``, and its onset and end placed where
    the burst's requests part from those around it.

    Binary segmentation keeps ``min_side`` requests on each side of a split. When a scope has
    fewer than that in a burst (2-3 chat requests a window during a real vLLM's flood), a split
    next to it can only fall at the ``min_side``-th request from the burst's other edge: the end
    windows after the stage came back, or the onset windows before it moved. And where a burst
    parts cleanly from its surroundings, every boundary in the gap between them splits the ranks
    perfectly, and the rank test's |z| then prefers the more even split: a last queued request
    (1.3 s against 0.0 after and 2.8 s in the flood) was left out of its burst.

    Once the burst is known (significant, and back), each edge is the boundary between the
    segments next to it with the fewest requests on the wrong side of it: a request belongs to the
    burst when it is nearer the burst's level than the level around it, in log terms (values
    floored at ``min_abs_ms``). The end is placed first (against the segment after ``end``), then the onset
    (against the segment before ``det``); the before / after values are then the segments' own."""
    q = STATISTICS[det.statistic]
    ms = x * 1e3
    hi = end.index + end.after_n
    until = edge(
        t, ms, boundaries[(boundaries > det.at) & (boundaries <= t[hi - 1])], det.index, hi,
        _level(ms[det.index : end.index], q), _level(ms[end.index : hi], q), cfg, burst_first=True,
    )  # fmt: skip
    det.until = end.at if until is None else until
    stop = int(np.searchsorted(t, det.until))
    around = boundaries[(boundaries > t[det.before_index]) & (boundaries < det.until)]
    at = edge(
        t, ms, around, det.before_index, stop,
        _level(ms[det.index : stop], q), _level(ms[det.before_index : det.index], q), cfg, burst_first=False,
    )  # fmt: skip
    if at is not None:
        det.at, det.index = at, int(np.searchsorted(t, at))
    det.before_ms = _level(ms[det.before_index : det.index], q)
    det.after_ms = _level(ms[det.index : stop], q)
    det.after_n = stop - det.index


def _level(ms: np.ndarray, q: float) -> float:
    return float(np.percentile(ms, q))


def edge(
    t: np.ndarray,
    ms: np.ndarray,
    candidates: np.ndarray,
    lo: int,
    hi: int,
    burst_ms: float,
    around_ms: float,
    cfg: ShiftConfig,
    burst_first: bool,
) -> float | None:
    """The one of ``candidates`` that splits ms[lo:hi] into the burst and the rest around it
    (``burst_first``: the burst before the split) with the fewest requests on the wrong side, and
    some on each side. Of boundaries as good, the one nearest the burst: the burst is as short as
    its requests allow, so a stray slow request before it cannot pull its onset earlier."""
    ks = np.searchsorted(t[lo:hi], candidates)
    keep = (ks > 0) & (ks < hi - lo)
    if not keep.any():
        return None
    candidates, ks = candidates[keep], ks[keep]
    floor = cfg.min_abs_ms
    split = math.sqrt(max(burst_ms, floor) * max(around_ms, floor))  # the levels' midpoint, in log terms
    part = ms[lo:hi]
    in_burst = part > split if burst_ms > around_ms else part < split
    seen = np.concatenate(([0], np.cumsum(in_burst)))  # burst-like requests before each index
    before_k, after_k = seen[ks], seen[-1] - seen[ks]
    if burst_first:  # the rest-like before the split, the burst-like after it
        wrong = (ks - before_k) + after_k
        return float(candidates[int(np.argmin(wrong))])
    wrong = before_k + ((hi - lo - ks) - after_k)
    return float(candidates[len(wrong) - 1 - int(np.argmin(wrong[::-1]))])


def _near(value_ms: float, level_ms: float, cfg: ShiftConfig) -> bool:
    """Whether ``value_ms`` is at ``level_ms`` for a user: within ``min_factor`` or ``min_abs_ms``."""
    ratio = max(value_ms, 1e-9) / max(level_ms, 1e-9)
    return max(ratio, 1 / ratio) < cfg.min_factor or abs(value_ms - level_ms) < cfg.min_abs_ms


def _returns(det: Detection, nxt: Detection, cfg: ShiftConfig) -> bool:
    """Whether ``nxt`` brings ``det``'s stage back to where it was before ``det``: within
    ``min_factor``, within ``min_abs_ms`` (from a near-zero baseline, 0.3 → 115 → 0.7 ms is a
    return although 0.7 / 0.3 is not within any factor), or with at most ``RETURN_REMAINDER`` of
    the change left (a real vLLM's flood: queue 0.0 → 4969 → 37 ms; 10x → 2x leaves 11%: a change
    of its own)."""
    left = abs(nxt.after_ms - det.before_ms)
    return _near(nxt.after_ms, det.before_ms, cfg) or left <= RETURN_REMAINDER * abs(
        det.after_ms - det.before_ms
    )


def excess_s(before: np.ndarray, after: np.ndarray) -> float:
    """Users' seconds the ``after`` requests spent beyond their counterfactual baseline, quantile
    by quantile: each after-request's value minus the ``before`` distribution's value at the same
    quantile (its rank among the after-requests), summed. A change that lives in the tail (a
    fifth of the requests 0.8 s slower, the median barely moving) counts in full, and a doubling of
    a skewed stage counts its mean's rise, not its median's: Δp50 × requests misses both."""
    before, after = before[~np.isnan(before)], np.sort(after[~np.isnan(after)])
    if len(before) == 0 or len(after) == 0:
        return 0.0
    q = (np.arange(len(after)) + 0.5) / len(after)
    return float(np.sum(after - quantiles_linear(before, q)))


def quantiles_linear(values: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``np.quantile(values, q)`` (method "linear") to the bit, from one sort: numpy partitions
    around every requested index, which for as many quantiles as requests (``excess_s``) cost
    ~4 CPU-s on 1M requests against ~0.1 s for the sort. The same steps as numpy's ``_quantile``
    and ``_lerp`` (numpy 2.x) on the sorted values; a -0.0, whose place among zeros the
    partition and the sort may choose differently, and a NaN go to numpy."""
    n = len(values)
    if n == 0 or np.isnan(values).any() or np.any((values == 0) & np.signbit(values)):
        return np.quantile(values, q)
    ordered = np.sort(values)
    virtual = (n - 1) * q
    previous = np.floor(virtual)
    following = previous + 1
    above = virtual >= n - 1
    previous[above], following[above] = -1, -1
    previous, following = previous.astype(np.intp), following.astype(np.intp)
    gamma = np.asanyarray(virtual - previous, dtype=virtual.dtype)
    a, b = ordered[previous], ordered[following]
    diff = b - a
    out = np.add(a, diff * gamma)
    np.subtract(b, diff * (1 - gamma), out=out, where=gamma >= 0.5, casting="unsafe")
    return out


def after_change(det: Detection) -> pl.Expr:
    after = pl.col("start") >= det.at
    return after if det.until is None else after & (pl.col("start") < det.until)


def moved_at(frame: pl.DataFrame, det: Detection, cfg: ShiftConfig, window_s: float = 0.0) -> float | None:
    """|log(after / before)| of ``det``'s statistic, at ``det``'s time, in another scope's
    requests (``inf`` for a move from or to zero); None when that scope has no requests on one
    side: a value that was not there cannot show that it stayed put.

    Nor can a value that began with the change: ``det.at`` is a window boundary and the change
    began within ``window_s`` of it, so a value whose requests before ``det.at`` mostly fall in
    the window just before it has no level before (a batch job that began the change 0.3 s
    before the boundary has a dozen requests there, already waiting)."""
    q = STATISTICS[det.statistic] / 100
    earlier = frame.filter(pl.col("start") < det.at)
    settled = earlier.filter(pl.col("start") < det.at - window_s).height
    if settled < earlier.height - settled:
        return None
    before = earlier[det.stage].quantile(q, "linear")
    after = frame.filter(after_change(det))[det.stage].quantile(q, "linear")
    if before is None or after is None:
        return None
    return log_move(before, after, cfg)


def log_move(before: float, after: float, cfg: ShiftConfig) -> float:
    """|log(after / before)| of two levels in seconds; ``inf`` for a move from or to zero of at
    least ``min_abs_ms``, 0 for a smaller one."""
    if before <= 0 or after <= 0:
        return 0.0 if abs(after - before) * 1e3 < cfg.min_abs_ms else math.inf
    return abs(math.log(after / before))
