"""When did a stage's time change, where, by how much — said in one sentence.

"queue time tripled at 10:05 on replica r2 (p50 60 → 185 ms); prefill and decode unchanged;
arrivals on r2 up 45%"

Method, per scope (all traffic, each replica / service / model) and per stage:

1. Candidate change times are window boundaries (the findings' ``at`` is the start of the first
   window after the change).
2. For every candidate at once, a Mann-Whitney U statistic of the requests before vs after it,
   from one cumulative sum of ranks (the rank-CUSUM; O(n log n) for all splits). The split with
   the largest |z| is a change point; each side is searched again (binary segmentation), so a
   burst that ends is found with its end. When the end brings the stage back (within
   ``min_factor``, or within ``min_abs_ms``: 0.3 → 115 → 0.7 ms came back), the burst is one
   finding from its onset, with ``until``; an end that stops part way is a change of its own,
   never ranked above the onset it undoes. A burst's edges are then placed from its requests
   (the boundary with the fewest of them on the wrong side of it), since the segmentation's
   floor of ``min_side`` requests a side, and the rank test's taste for even splits, would put
   them where the stage had not moved yet. Values are ranked to the millisecond.
3. It is reported only when it is significant after a Bonferroni correction for every scope ×
   stage × candidate tested, has at least ``min_side`` requests on each side, and is large for a
   user: the p50 (or, for stages that are mostly zero such as ``connect``, the p90) moved by
   ``min_factor`` or more and by ``min_abs_ms`` or more.
4. The narrowest scope wins: when some replicas (services, models) moved and the others, seen on
   both sides of the change, did not, the finding names those; else the scope is ``{}``. A
   single-attribute scope is then refined by the same rule along one more attribute with at most
   ``MAX_CELL_VALUES`` values: when exactly one cell of it moved (replica r2 × model m1) and the
   other cells of r2 did not, the finding names both (``{"replica": "r2", "model": "m1"}``).
   Only a hit is refined, and only along attributes with few values, so the search stays bounded.
5. Detections of one stage in several scopes within a few windows are one change. A change
   whose onset shows at moments further apart from different scopes (a queue building up: 15 s,
   ``onset_spread_s``, or the few windows if longer) is said once too: a shift is dropped when
   another one of the same stage and direction holds it (its requests outside that one's scope
   did not move), the scope with fewer requests staying when each holds the other.
6. One incident per onset: the shifts of one scope that start within ``onset_windows`` are said
   from the one that explains the users' time (the largest; a client's pool wait is a
   consequence of any stage its connections are held for that rose with it), the others "with
   it"; ``impact_s`` is the sum (stages add up). A ``connect`` shift names the part that moved:
   the client's pool wait or new connections (TCP + TLS), since their cures differ.
7. What moved with it: other stages' p50, arrival rate, concurrency, prompt length and cache hits,
   before vs after, in the same scope. A ratio within ``PERCENT_RANGE`` is said as a percentage,
   any other change (from a near-zero baseline) as its two values; a headline factor beyond
   ``SPOKEN_FACTOR`` likewise.

Findings are ordered by the users' time they cost (``impact_s``), the onset first on a tie.
The statistic is rank-based, so a few very slow requests cannot fake a shift, and skewed clocks
cannot either (stages never mix hosts' clocks). ``tests/analyzer/test_shifts.py`` measures the
false-positive rate on stationary logs with seeds the thresholds were not tuned on.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np
import polars as pl
from hopline.analyzer.attribution import TTFT_PARTS, e2e
from hopline.middleware.contract.rules import LOOK, STAGE_ORDER

SHIFT_STAGES = TTFT_PARTS + ("decode",)
STATISTICS = {"p50": 50, "p90": 90}  # a shift's statistic (the p50, else the p90) as a percentile
RANK_RESOLUTION_S = 1e-3  # values are ranked to the millisecond (min_abs_ms is 5)
RETURN_REMAINDER = 0.05  # a burst's end that leaves at most this share of its change is a return
# How a stage is said in a sentence (the rule book's vocabulary), plus the part of ``connect``
# that is the client's own pool wait (see CONNECT_PARTS).
STAGE_WORDS = {name: LOOK[name].words for name in STAGE_ORDER} | {"pool_wait": "client pool wait"}
# ``connect`` is pool wait + TCP connect + TLS (the client's ``pool_wait_s``, ``connect_s``,
# ``tls_s``). Which of them moved decides what a finding says, because the cures differ: a pool
# wait wants a bigger pool or fewer concurrent calls; new connections want keep-alive.
CONNECT_PARTS = {"pool_wait": ("pool_wait_s",), "connect": ("connect_s", "tls_s")}
PART_MEANING = {"pool_wait": "the client waited for a connection from its pool"}
# Stages a connection is held for once taken from the pool: when one of them rose at the same
# moment, a pool wait is their consequence (connections busy = calls x time each is held).
HELD_STAGES = tuple(s for s in SHIFT_STAGES if s != "connect")

# name: (words, format of one value); a covariate is said as a percentage or as before → after.
COVARIATE_WORDS = {
    "arrivals_per_s": ("arrivals", "{:.1f}/s"),
    "concurrency": ("concurrency", "{:.1f}"),
    "prompt_tokens_p50": ("prompt length", "{:.0f} tokens"),
    "cache_hit_ratio": ("cache hits", "{:.0%}"),
}
MAX_CELL_VALUES = 8  # a second scope attribute refines a hit only when it has at most this many values
SPOKEN_FACTOR = 10.0  # beyond 10x either way a change reads better as its two values
PERCENT_RANGE = (0.5, 2.0)  # a co-mover's ratio said as a percentage; outside it, as two values


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
class Shift:
    stage: str
    scope: dict[str, str]
    at: float  # Unix seconds: the first window boundary after the change
    statistic: str
    before_ms: float
    after_ms: float
    z: float
    requests_after: int
    context: dict = field(default_factory=dict)
    until: float | None = None  # Unix seconds: where the change reverted, if it did
    part: str | None = None  # for ``connect``: which of its parts moved (``CONNECT_PARTS``)
    consequences: list[Shift] = field(default_factory=list)  # shifts that started with this one
    impact_cap_s: float | None = None  # this change undoes part of an earlier one: never more

    @property
    def factor(self) -> float:
        return self.after_ms / self.before_ms if self.before_ms > 0 else math.inf

    @property
    def up(self) -> bool:
        return self.after_ms > self.before_ms

    @property
    def own_impact_s(self) -> float:
        """Users' time this stage's change added (or saved): (after - before) x requests it affected."""
        return (self.after_ms - self.before_ms) / 1e3 * self.requests_after

    @property
    def impact_s(self) -> float:
        """Users' time the incident cost: this change and its consequences (stages add up)."""
        total = self.own_impact_s + sum(c.own_impact_s for c in self.consequences)
        if self.impact_cap_s is not None and abs(total) > self.impact_cap_s:
            total = math.copysign(self.impact_cap_s, total)
        return total

    @property
    def label(self) -> str:
        return STAGE_WORDS.get(self.part or self.stage, self.stage)

    def summary(self) -> str:
        where = _scope_words(self.scope)
        change, values = _headline_words(self.before_ms, self.after_ms, self.statistic)
        text = (
            f"{self.label} {change} at {_clock(self.at)}"
            f"{'' if self.until is None else ' until ' + _clock(self.until)}"
            f"{' on ' + where if where else ''} {values}"
        )
        if self.part in PART_MEANING:
            text += f": {PART_MEANING[self.part]}"
        if self.consequences:
            text += "; with it, " + ", ".join(
                f"{_short(c.part or c.stage)} {c.statistic} {_ms(c.before_ms)} → {_ms(c.after_ms)} ms"
                for c in self.consequences
            )
        unchanged = self.context.get("unchanged", [])
        if unchanged:
            text += f"; {_join(unchanged)} unchanged"
        for name, moved in self.context.get("moved", {}).items():
            text += f"; {_short(name)} {_change_words(moved['before_ms'], moved['after_ms'], _ms_words)}"
        before, after = self.context.get("before", {}), self.context.get("after", {})
        for name in self.context.get("moved_with", {}):
            label, unit = COVARIATE_WORDS[name]
            on = f" on {_scope_value(self.scope)}" if self.scope else ""
            text += f"; {label}{on} {_change_words(before[name], after[name], unit.format)}"
        return text

    def to_finding(self) -> dict:
        return {
            "kind": "shift",
            "summary": self.summary(),
            "stage": self.stage,
            "part": self.part,
            "at": iso_utc(self.at),
            "until": None if self.until is None else iso_utc(self.until),
            "scope": self.scope,
            "statistic": self.statistic,
            "before_ms": round(self.before_ms, 3),
            "after_ms": round(self.after_ms, 3),
            "factor": round(self.factor, 3) if math.isfinite(self.factor) else None,
            "z": round(self.z, 2),
            "affected_requests": self.requests_after,
            "impact_s": round(self.impact_s, 3),
            "with": [
                {
                    "stage": c.stage,
                    "part": c.part,
                    "at": iso_utc(c.at),
                    "statistic": c.statistic,
                    "before_ms": round(c.before_ms, 3),
                    "after_ms": round(c.after_ms, 3),
                    "impact_s": round(c.own_impact_s, 3),
                }
                for c in self.consequences
            ],
            "with_pitfalls": [],  # pitfalls it brought with it (report.fold_into_shifts)
            "context": self.context,
        }


# --- words ------------------------------------------------------------------------------------


def iso_utc(ts: float) -> str:
    """Unix seconds as ISO-8601 UTC to the second (the findings contract's time format)."""
    return datetime.fromtimestamp(round(ts), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _clock(ts: float) -> str:
    moment = datetime.fromtimestamp(round(ts), tz=UTC)
    return moment.strftime("%H:%M" if moment.second == 0 else "%H:%M:%S")


def _ms(value: float) -> str:
    return f"{value:.0f}" if value >= 10 else f"{value:.1f}"


def _headline_words(before_ms: float, after_ms: float, statistic: str) -> tuple[str, str]:
    """("tripled", "(p50 40 → 120 ms)"), or the two values when no factor reads well:
    ("rose from 0.3 to 115 ms", "(p50)") — a factor from a near-zero baseline says nothing."""
    direction = "rose" if after_ms > before_ms else "fell"
    if before_ms <= 0:
        return f"rose from zero to {_ms(after_ms)} ms", f"({statistic})"
    factor = after_ms / before_ms
    if after_ms <= 0 or not 1 / SPOKEN_FACTOR <= factor <= SPOKEN_FACTOR:
        return f"{direction} from {_ms(before_ms)} to {_ms(after_ms)} ms", f"({statistic})"
    return _factor_words(factor), f"({statistic} {_ms(before_ms)} → {_ms(after_ms)} ms)"


def _factor_words(factor: float) -> str:
    for target, word in ((2, "doubled"), (3, "tripled"), (4, "quadrupled")):
        if abs(factor / target - 1) <= 0.08:
            return word
    if abs(factor * 2 - 1) <= 0.08:
        return "halved"
    return f"rose {factor:.1f}×" if factor > 1 else f"fell {1 / factor:.1f}×"


def _change_words(before: float, after: float, show: Callable[[float], str]) -> str:
    """ "up 45%" while the ratio is within ``PERCENT_RANGE``, else "0.3 ms → 115 ms": a percentage
    from a near-zero baseline ("up 5372911%") tells a reader nothing."""
    if before > 0 and PERCENT_RANGE[0] <= after / before <= PERCENT_RANGE[1]:
        change = after / before - 1
        return f"up {change * 100:.0f}%" if change >= 0 else f"down {-change * 100:.0f}%"
    return f"{show(before)} → {show(after)}"


def _ms_words(value: float) -> str:
    return f"{_ms(value)} ms"


def _short(name: str) -> str:
    return STAGE_WORDS.get(name, name).replace(" time", "")


def _join(names: list[str]) -> str:
    words = [_short(n) for n in names]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _scope_value(scope: dict[str, str]) -> str:
    return ", ".join(scope.values())


def _scope_words(scope: dict[str, str]) -> str:
    """``replica r2``; a cell of two attributes ``replica r2 for model m1``."""
    return " for ".join(f"{k} {v}" for k, v in scope.items())


# --- statistics -------------------------------------------------------------------------------


def _average_ranks(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ranks 1..n, ties sharing their average rank (as Mann-Whitney wants), and the size of each
    group of equal values (for the variance's tie correction)."""
    order = np.argsort(values, kind="stable")
    sorted_vals = values[order]
    _, first, counts = np.unique(sorted_vals, return_index=True, return_counts=True)
    avg = first + (counts + 1) / 2.0  # average of ranks first+1 .. first+count
    ranks = np.empty(len(values))
    ranks[order] = np.repeat(avg, counts)
    return ranks, counts


def split_z(values: np.ndarray, splits: np.ndarray) -> np.ndarray:
    """Mann-Whitney z of "after > before" for each split index k (before = values[:k]), with the
    variance corrected for ties."""
    n = len(values)
    ranks, counts = _average_ranks(values)
    cum = np.concatenate(([0.0], np.cumsum(ranks)))
    k = splits.astype(np.float64)
    u_before = cum[splits] - k * (k + 1) / 2
    mean = k * (n - k) / 2
    tied = counts.astype(np.float64)
    ties = float(np.sum(tied**3 - tied)) / (n * (n - 1)) if n > 1 else 0.0
    sd = np.sqrt(np.maximum(k * (n - k) / 12.0 * ((n + 1) - ties), 1e-300))
    return (mean - u_before) / sd


def z_threshold(alpha: float, tests: int) -> float:
    """Two-sided normal critical value for ``alpha / tests`` (bisection on erfc)."""
    target = alpha / max(tests, 1)
    lo, hi = 0.0, 40.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if math.erfc(mid / math.sqrt(2)) > target:
            lo = mid
        else:
            hi = mid
    return hi


@dataclass
class _Detection:
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


def _detect(
    t: np.ndarray,
    x: np.ndarray,
    boundaries: np.ndarray,
    z_crit: float,
    cfg: ShiftConfig,
    stage: str,
    scope: dict[str, str],
) -> list[_Detection]:
    """Changes of one stage in one scope; a change that reverts later is one detection with
    ``until`` (its before / after are the segments next to it, so a burst is not diluted)."""
    # ranked at RANK_RESOLUTION_S: a trend among values no user tells apart (a queue of 0.035 ms
    # easing to 0.011 after a flood) must not decide where a split falls
    cps = _change_points(t, np.round(x / RANK_RESOLUTION_S), boundaries, z_crit, cfg, 0, len(x))
    edges = [0] + [k for k, _, _ in cps] + [len(x)]
    found: list[_Detection | None] = []
    first = 0  # index of the change point where the current run of same-direction steps began
    for i, (k, at, z) in enumerate(cps):
        prev = found[-1] if found else None
        if prev is not None and (z > 0) == prev.up:
            # the same stage moving the same way again right after: a change in steps (a ramp) is
            # one change, from the segment before its first step to the segment after its last
            effect = _effect(x[edges[first] : edges[first + 1]], x[k : edges[i + 2]], z, cfg)
            if effect is not None:
                start = edges[first + 1]
                found[-1] = _Detection(
                    stage,
                    scope,
                    prev.at,
                    *effect,
                    max(prev.z, z, key=abs),
                    edges[i + 2] - start,
                    index=start,
                    before_index=edges[first],
                )
                continue
        effect = _effect(x[edges[i] : k], x[k : edges[i + 2]], z, cfg)
        found.append(
            None
            if effect is None
            else _Detection(stage, scope, at, *effect, z, edges[i + 2] - k, index=k, before_index=edges[i])
        )
        first = i
    # A burst ends at the first later change that brings the stage back; the steps between (it
    # eased or rose again on the way, or moved too little for a user: None) are part of it.
    real = [det for det in found if det is not None]
    out: list[_Detection] = []
    i = 0
    while i < len(real):
        det = real[i]
        end = next(
            (j for j in range(i + 1, len(real)) if real[j].up != det.up and _returns(det, real[j], cfg)), None
        )
        out.append(det)
        if end is None:
            i += 1
            continue
        _settle_burst(t, x, boundaries, det, real[end], cfg)  # one finding from its onset, with its end
        i = end + 1
    return out


def _settle_burst(
    t: np.ndarray, x: np.ndarray, boundaries: np.ndarray, det: _Detection, end: _Detection, cfg: ShiftConfig
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
    until = _edge(
        t, ms, boundaries[(boundaries > det.at) & (boundaries <= t[hi - 1])], det.index, hi,
        _level(ms[det.index : end.index], q), _level(ms[end.index : hi], q), cfg, burst_first=True,
    )  # fmt: skip
    det.until = end.at if until is None else until
    stop = int(np.searchsorted(t, det.until))
    around = boundaries[(boundaries > t[det.before_index]) & (boundaries < det.until)]
    at = _edge(
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


def _edge(
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


def _returns(det: _Detection, nxt: _Detection, cfg: ShiftConfig) -> bool:
    """Whether ``nxt`` brings ``det``'s stage back to where it was before ``det``: within
    ``min_factor``, within ``min_abs_ms`` (from a near-zero baseline, 0.3 → 115 → 0.7 ms is a
    return although 0.7 / 0.3 is not within any factor), or with at most ``RETURN_REMAINDER`` of
    the change left (a real vLLM's flood: queue 0.0 → 4969 → 37 ms; 10x → 2x leaves 11%: a change
    of its own)."""
    left = abs(nxt.after_ms - det.before_ms)
    return _near(nxt.after_ms, det.before_ms, cfg) or left <= RETURN_REMAINDER * abs(
        det.after_ms - det.before_ms
    )


def _after(det: _Detection) -> pl.Expr:
    after = pl.col("start") >= det.at
    return after if det.until is None else after & (pl.col("start") < det.until)


def _moved_at(frame: pl.DataFrame, det: _Detection, cfg: ShiftConfig) -> float | None:
    """|log(after / before)| of ``det``'s statistic, at ``det``'s time, in another scope's
    requests (``inf`` for a move from or to zero); None when that scope has no requests on one
    side: a value that was not there cannot show that it stayed put."""
    q = STATISTICS[det.statistic] / 100
    before = frame.filter(pl.col("start") < det.at)[det.stage].quantile(q, "linear")
    after = frame.filter(_after(det))[det.stage].quantile(q, "linear")
    if before is None or after is None:
        return None
    if before <= 0 or after <= 0:
        return 0.0 if abs(after - before) * 1e3 < cfg.min_abs_ms else math.inf
    return abs(math.log(after / before))


def _narrowest(
    found: list[_Detection], tested: dict[str, list[str]], frames: dict[str, pl.DataFrame], cfg: ShiftConfig
) -> list[_Detection]:
    """For one stage: the scopes the change lives in (see module docstring, step 4).

    A dimension explains the change when some of its values moved and the others, seen on both
    sides of it, did not move even half as much (in log terms) at the same time.
    """
    overall = [d for d in found if not d.scope]
    best: list[_Detection] = []
    for dim, values in tested.items():
        hits = [d for d in found if dim in d.scope]
        hit_values = {d.scope[dim] for d in hits}
        if not hits or len(hit_values) == len(values):
            continue
        weakest = min(abs(math.log(d.factor_estimate)) for d in hits)
        others = [_moved_at(frames[_key({dim: v})], hits[0], cfg) for v in values if v not in hit_values]
        if any(r is None or r > weakest / 2 for r in others):
            continue
        if not best or max(d.z**2 for d in hits) > max(d.z**2 for d in best):
            best = hits
    if best and (not overall or all(d.up == overall[0].up for d in best)):
        return best
    if overall:
        return overall
    by_dim = [[d for d in found if dim in d.scope] for dim in tested]
    return next((hits for hits in by_dim if hits), [])


def _cell(
    det: _Detection,
    tested: dict[str, list[str]],
    frames: dict[str, pl.DataFrame],
    boundaries: np.ndarray,
    z_crit: float,
    cfg: ShiftConfig,
    within_s: float,
) -> _Detection:
    """``det`` (one attribute's value) confined to one cell of a second attribute when exactly one
    cell moved and the others, seen on both sides, did not move even half as much: the rule of
    ``_narrowest`` one level down. The cell's own detection at the change (as significant as any)
    replaces ``det``; its frame lands in ``frames``. Else ``det`` itself."""
    if len(det.scope) != 1:
        return det
    ((dim, value),) = det.scope.items()
    scope_frame = frames[_key(det.scope)]
    weakest = abs(math.log(det.factor_estimate))
    for other, values in tested.items():
        if other == dim or len(values) > MAX_CELL_VALUES:
            continue
        cells = {v: scope_frame.filter(pl.col(other).cast(pl.String) == v) for v in values}
        cells = {v: f for v, f in cells.items() if f.height >= 2 * cfg.min_side}
        if len(cells) < 2:
            continue  # the scope has one value of it (model follows service, say): nothing to refine
        moved = {v: _moved_at(f, det, cfg) for v, f in cells.items()}
        if any(r is None for r in moved.values()):
            continue
        hit = [v for v, r in moved.items() if r > weakest / 2]
        if len(hit) != 1:
            continue
        order = list(tested)  # the scope's attributes in the order they are searched (replica first)
        scope = dict(sorted({dim: value, other: hit[0]}.items(), key=lambda kv: order.index(kv[0])))
        frame = cells[hit[0]]
        tested_frame = frame  # a seeded subsample beyond ``max_requests``, as for every scope
        if frame.height > cfg.max_requests:
            tested_frame = frame.sample(cfg.max_requests, seed=0).sort("start")
        t, x = tested_frame["start"].to_numpy(), tested_frame[det.stage].to_numpy()
        keep = ~np.isnan(x)
        near = [
            d
            for d in _detect(t[keep], x[keep], boundaries, z_crit, cfg, det.stage, scope)
            if d.up == det.up and abs(d.at - det.at) <= within_s
        ]
        if near:
            frames[_key(scope)] = frame
            best = min(near, key=lambda d: abs(d.at - det.at))
            best.after_n = round(best.after_n * frame.height / tested_frame.height)  # requests, not sampled
            return best
    return det


def _context(frame: pl.DataFrame, det: _Detection, stages: list[str], cfg: ShiftConfig) -> dict:
    """Other stages and the load, before vs after, in the finding's scope."""
    before = frame.filter(pl.col("start") < det.at)
    after = frame.filter(_after(det))
    unchanged, moved = [], {}
    for stage in stages:
        if stage == det.stage:
            continue
        b, a = before[stage].median(), after[stage].median()
        if b is None or a is None:
            continue
        if b > 0 and abs(a / b - 1) <= cfg.unchanged_within:
            unchanged.append(stage)
        elif abs(a - b) * 1e3 >= cfg.min_abs_ms:
            moved[stage] = {"before_ms": round(b * 1e3, 3), "after_ms": round(a * 1e3, 3)}

    def load(part: pl.DataFrame) -> dict[str, float | None]:
        span = (part["start"].max() or 0) - (part["start"].min() or 0)
        busy = part.select(e2e().sum()).item()
        prompt, cached = part["prompt_tokens"].sum(), part["cached_tokens"].sum()
        return {
            "arrivals_per_s": part.height / span if span > 0 else None,
            "concurrency": busy / span if span > 0 and busy else None,
            "prompt_tokens_p50": part["prompt_tokens"].median(),
            "cache_hit_ratio": cached / prompt if prompt else None,
        }

    lb, la = load(before), load(after)
    covariates = {k: round(la[k] / lb[k] - 1, 3) for k in lb if lb[k] and la[k] is not None}
    return {
        "unchanged": unchanged,
        "moved": moved,
        "covariates": covariates,
        "moved_with": {k: v for k, v in covariates.items() if abs(v) >= cfg.notable_change},
        "before": {k: _round(v) for k, v in lb.items()},
        "after": {k: _round(v) for k, v in la.items()},
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(float(value), 4)


def find_shifts(
    timelines: pl.DataFrame,
    window_s: float,
    dims: tuple[str, ...] = ("replica", "service", "model"),
    config: ShiftConfig = ShiftConfig(),
    seed: int = 0,
) -> list[Shift]:
    """Shifts in ``timelines`` (collected), each in its narrowest scope, largest impact first.

    ``window_s`` sets the candidate change times (window boundaries); ``dims`` the scopes
    searched besides all traffic; ``seed`` the subsample of scopes above ``max_requests``.
    """
    cfg = config
    frame = timelines.filter(pl.col("start").is_not_null()).sort("start")
    if frame.height < 2 * cfg.min_side:
        return []
    stages = [s for s in SHIFT_STAGES if frame[s].null_count() < frame.height]
    t_min, t_max = frame["start"].min(), frame["start"].max()
    boundaries = np.arange(math.floor(t_min / window_s) + 1, math.floor(t_max / window_s) + 1) * window_s
    scopes: list[dict[str, str]] = [{}]
    tested: dict[str, list[str]] = {}
    for dim in dims:
        counts = (
            frame.group_by(dim).len().filter(pl.col(dim).is_not_null() & (pl.col("len") >= 2 * cfg.min_side))
        )
        values = sorted(counts[dim].cast(pl.String).to_list())
        if len(values) >= 2:
            tested[dim] = values
            scopes += [{dim: v} for v in values]
    z_crit = z_threshold(cfg.alpha, len(scopes) * len(stages) * max(len(boundaries), 1))
    rng = np.random.default_rng(seed)
    found: dict[str, list[_Detection]] = {s: [] for s in stages}
    sub_frames: dict[str, pl.DataFrame] = {}
    for scope in scopes:
        sub = frame
        for dim, value in scope.items():
            sub = sub.filter(pl.col(dim).cast(pl.String) == value)
        sub_frames[_key(scope)] = sub
        scale = 1.0
        if sub.height > cfg.max_requests:
            scale = sub.height / cfg.max_requests
            sub = sub[np.sort(rng.choice(sub.height, cfg.max_requests, replace=False))]
        starts = sub["start"].to_numpy()
        for stage in stages:
            values = sub[stage].to_numpy()
            keep = ~np.isnan(values)
            for det in _detect(starts[keep], values[keep], boundaries, z_crit, cfg, stage, scope):
                det.after_n = round(det.after_n * scale)  # requests, not sampled ones
                found[stage].append(det)
    shifts = []
    for stage, dets in found.items():
        for cluster in _clusters(dets, cfg.cluster_windows * window_s):
            for hit in _narrowest(cluster, tested, sub_frames, cfg):
                det = _cell(hit, tested, sub_frames, boundaries, z_crit, cfg, cfg.cluster_windows * window_s)
                shifts.append(
                    Shift(
                        det.stage,
                        det.scope,
                        det.at,
                        det.statistic,
                        det.before_ms,
                        det.after_ms,
                        det.z,
                        det.after_n,
                        _context(sub_frames[_key(det.scope)], det, stages, cfg),
                        det.until,
                        _connect_part(sub_frames[_key(det.scope)], det),
                    )
                )
    spread = max(cfg.cluster_windows * window_s, cfg.onset_spread_s)
    shifts = _fold_explained(shifts, frame, list(tested), spread, cfg)
    incidents = _incidents(shifts, cfg.onset_windows * window_s)
    _cap_reversals(incidents)
    return sorted(incidents, key=lambda s: (-abs(s.impact_s), s.at))


def in_scope(scope: dict[str, str]) -> pl.Expr:
    return pl.all_horizontal([pl.col(k).cast(pl.String) == v for k, v in scope.items()] or [pl.lit(True)])


def _explains(a: Shift, b: Shift, frame: pl.DataFrame, spread_s: float, cfg: ShiftConfig) -> bool:
    """Whether ``a``'s change holds ``b``'s: the same stage moving the same way, onsets within
    ``spread_s``, and ``b``'s requests outside ``a``'s scope did not move even half as much (in
    log terms) at ``b``'s time, or are too few to tell (``b``'s scope lies inside ``a``'s)."""
    if a.stage != b.stage or a.up != b.up or a.scope == b.scope or abs(a.at - b.at) > spread_s:
        return False
    rest = frame.filter(in_scope(b.scope) & ~in_scope(a.scope).fill_null(False))
    after = rest.filter(_after(b)).height  # type: ignore[arg-type]  # a Shift has what _after reads
    if min(rest.height - after, after) < cfg.min_side:
        return True
    moved = _moved_at(rest, b, cfg)  # type: ignore[arg-type]
    return moved is not None and moved <= abs(math.log(max(b.factor, 1e-9))) / 2


def _fold_explained(
    shifts: list[Shift], frame: pl.DataFrame, order: list[str], spread_s: float, cfg: ShiftConfig
) -> list[Shift]:
    """Step 4 across onsets: one change seen from several scopes at moments a few windows apart
    (a queue that builds up shows at 19:41:50 for service batch-eval, 19:41:59 on replica r2 and
    19:42:03 for all traffic) is said once, in the scope that holds it: a shift another one
    explains (``_explains``) is dropped, unless it explains that one too; then the one with fewer
    requests stays, on a tie the one whose attribute is searched first (replica first)."""

    def rank(shift: Shift) -> tuple[int, list[int]]:
        size = frame.filter(in_scope(shift.scope)).height
        return size, sorted(order.index(k) if k in order else len(order) for k in shift.scope)

    kept: list[Shift] = []
    for b in shifts:
        others = (a for a in shifts if a is not b)
        if not any(
            _explains(a, b, frame, spread_s, cfg)
            and (not _explains(b, a, frame, spread_s, cfg) or rank(a) < rank(b))
            for a in others
        ):
            kept.append(b)
    return kept


def _connect_part(frame: pl.DataFrame, det: _Detection) -> str | None:
    """For a ``connect`` change: the part of it that moved most in mean, which adds up
    (``CONNECT_PARTS``); None for other stages or without the parts' columns."""
    names = [c for cols in CONNECT_PARTS.values() for c in cols]
    if det.stage != "connect" or not set(names) <= set(frame.columns):
        return None
    before = frame.filter(pl.col("start") < det.at).select(pl.col(names).fill_null(0.0).mean())
    after = frame.filter(_after(det)).select(pl.col(names).fill_null(0.0).mean())
    moved = {
        part: abs(sum((after[c].item() or 0.0) - (before[c].item() or 0.0) for c in cols))
        for part, cols in CONNECT_PARTS.items()
    }
    return max(moved, key=moved.__getitem__)


def _holds_connections(shift: Shift, others: list[Shift]) -> bool:
    """A pool wait that rose while a stage a connection is held for rose too: its consequence."""
    return (
        shift.part == "pool_wait"
        and shift.up
        and any(o.stage in HELD_STAGES and o.up for o in others if o is not shift)
    )


def _incidents(shifts: list[Shift], within_s: float) -> list[Shift]:
    """Shifts of one scope starting within ``within_s`` of each other are one incident, said from
    the change that explains the users' time: the largest one, except that a client's pool
    wait follows from the stages its connections are held for. The others are its consequences
    (``with``), no longer stages that merely moved or stayed put in its context."""
    groups: list[list[Shift]] = []
    for shift in sorted(shifts, key=lambda s: s.at):
        group = next(
            (g for g in groups if g[0].scope == shift.scope and shift.at - g[0].at <= within_s), None
        )
        if group is None:
            groups.append([shift])
        else:
            group.append(shift)
    leads = []
    for group in groups:
        lead = min(group, key=lambda s: (_holds_connections(s, group), -abs(s.own_impact_s)))
        lead.consequences = sorted((s for s in group if s is not lead), key=lambda s: -abs(s.own_impact_s))
        said = {s.stage for s in lead.consequences}
        lead.context["unchanged"] = [s for s in lead.context.get("unchanged", []) if s not in said]
        lead.context["moved"] = {k: v for k, v in lead.context.get("moved", {}).items() if k not in said}
        leads.append(lead)
    return leads


def _cap_reversals(shifts: list[Shift]) -> None:
    """A change that undoes part of an earlier one in the same stage and scope (a burst's end that
    did not come all the way back: it moves the other way, and no further than the earlier one
    moved) never outranks the change it undoes."""
    for shift in sorted(shifts, key=lambda s: s.at):
        undone = [
            s
            for s in shifts
            if s.stage == shift.stage
            and s.scope == shift.scope
            and s.at < shift.at
            and s.up != shift.up
            and abs(shift.after_ms - shift.before_ms) <= abs(s.after_ms - s.before_ms)
        ]
        if undone:
            shift.impact_cap_s = abs(max(undone, key=lambda s: s.at).impact_s)


def _clusters(dets: list[_Detection], within_s: float) -> list[list[_Detection]]:
    """Detections of one stage grouped by time: one change seen from several scopes."""
    groups: list[list[_Detection]] = []
    for det in sorted(dets, key=lambda d: d.at):
        if groups and det.at - groups[-1][0].at <= within_s:
            groups[-1].append(det)
        else:
            groups.append([det])
    return groups


def _key(scope: dict[str, str]) -> str:
    return repr(sorted(scope.items()))
