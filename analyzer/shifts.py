"""When did a stage's time change, where, by how much — said in one sentence.

"queue time tripled at 10:05 on replica r2 (p50 60 → 185 ms); prefill and decode unchanged;
arrivals on r2 up 45%"

Method, per scope (all traffic, each replica / service / model) and per stage:

1. Candidate change times are window boundaries (the findings' ``at`` is the start of the first
   window after the change).
2. For every candidate at once, a Mann-Whitney U statistic of the requests before vs after it,
   from one cumulative sum of ranks (the rank-CUSUM; O(n log n) for all splits). The split with
   the largest |z| is a change point; each side is searched again (binary segmentation), so a
   burst that ends is found with its end, and reported once, with ``until``.
3. It is reported only when it is significant after a Bonferroni correction for every scope ×
   stage × candidate tested, has at least ``min_side`` requests on each side, and is large for a
   user: the p50 (or, for stages that are mostly zero such as ``connect``, the p90) moved by
   ``min_factor`` or more and by ``min_abs_ms`` or more.
4. The narrowest scope wins: when some replicas (services, models) moved and the others did not,
   the finding names those; when every value moved, the scope is ``{}`` (all traffic).
5. Detections of one stage in several scopes within a few windows are one change.
6. What moved with it: other stages' p50, arrival rate, concurrency, prompt length and cache hits,
   before vs after, in the same scope.

The statistic is rank-based, so a few very slow requests cannot fake a shift, and skewed clocks
cannot either (stages never mix hosts' clocks). ``tests/analyzer/test_shifts.py`` measures the
false-positive rate on stationary logs with seeds the thresholds were not tuned on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np
import polars as pl
from hopline.analyzer.attribution import TTFT_PARTS, e2e

SHIFT_STAGES = TTFT_PARTS + ("decode",)
STAGE_WORDS = {
    "connect": "connect time",
    "network": "network time",
    "gateway": "gateway time",
    "frontend": "engine frontend time",
    "queue": "queue time",
    "prefill": "prefill time",
    "engine": "engine time",
    "upstream_network": "upstream network time",
    "upstream": "upstream time",
    "decode": "decode time",
}

COVARIATE_WORDS = {
    "arrivals_per_s": "arrivals",
    "concurrency": "concurrency",
    "prompt_tokens_p50": "prompt length",
    "cache_hit_ratio": "cache hits",
}


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

    @property
    def factor(self) -> float:
        return self.after_ms / self.before_ms if self.before_ms > 0 else math.inf

    @property
    def impact_s(self) -> float:
        """Users' time the change added (or saved): (after - before) x requests it affected."""
        return (self.after_ms - self.before_ms) / 1e3 * self.requests_after

    def summary(self) -> str:
        where = _scope_words(self.scope)
        text = (
            f"{STAGE_WORDS.get(self.stage, self.stage)} {_factor_words(self.factor)} "
            f"{'at ' + _clock(self.at) if self.until is None else f'from {_clock(self.at)} to {_clock(self.until)}'}"
            f"{' on ' + where if where else ''} ({self.statistic} {_ms(self.before_ms)} → {_ms(self.after_ms)} ms)"
        )
        unchanged = self.context.get("unchanged", [])
        if unchanged:
            text += f"; {_join(unchanged)} unchanged"
        for name, change in self.context.get("moved", {}).items():
            text += f"; {STAGE_WORDS.get(name, name).replace(' time', '')} {_percent_words(change)}"
        for name, change in self.context.get("moved_with", {}).items():
            where = f" on {_scope_value(self.scope)}" if self.scope else ""
            text += f"; {COVARIATE_WORDS[name]}{where} {_percent_words(change)}"
        return text

    def to_finding(self) -> dict:
        return {
            "kind": "shift",
            "summary": self.summary(),
            "stage": self.stage,
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


def _factor_words(factor: float) -> str:
    if not math.isfinite(factor):
        return "rose from zero"
    for target, word in ((2, "doubled"), (3, "tripled"), (4, "quadrupled")):
        if abs(factor / target - 1) <= 0.08:
            return word
    if abs(factor * 2 - 1) <= 0.08:
        return "halved"
    return f"rose {factor:.1f}×" if factor > 1 else f"fell {1 / factor:.1f}×"


def _percent_words(change: float) -> str:
    return f"up {change * 100:.0f}%" if change >= 0 else f"down {-change * 100:.0f}%"


def _join(names: list[str]) -> str:
    words = [STAGE_WORDS.get(n, n).replace(" time", "") for n in names]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _scope_value(scope: dict[str, str]) -> str:
    return ", ".join(scope.values())


def _scope_words(scope: dict[str, str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in scope.items())


# --- statistics -------------------------------------------------------------------------------


def _average_ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n, ties sharing their average rank (as Mann-Whitney wants)."""
    order = np.argsort(values, kind="stable")
    sorted_vals = values[order]
    _, first, counts = np.unique(sorted_vals, return_index=True, return_counts=True)
    avg = first + (counts + 1) / 2.0  # average of ranks first+1 .. first+count
    ranks = np.empty(len(values))
    ranks[order] = np.repeat(avg, counts)
    return ranks


def split_z(values: np.ndarray, splits: np.ndarray) -> np.ndarray:
    """Mann-Whitney z of "after > before" for each split index k (before = values[:k])."""
    n = len(values)
    cum = np.concatenate(([0.0], np.cumsum(_average_ranks(values))))
    k = splits.astype(np.float64)
    u_before = cum[splits] - k * (k + 1) / 2
    mean = k * (n - k) / 2
    sd = np.sqrt(k * (n - k) * (n + 1) / 12.0)
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
    for statistic, q in (("p50", 50), ("p90", 90)):
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
    cps = _change_points(t, x, boundaries, z_crit, cfg, 0, len(x))
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
                found[-1] = _Detection(
                    stage, scope, prev.at, *effect, max(prev.z, z, key=abs), edges[i + 2] - edges[first + 1]
                )
                continue
        effect = _effect(x[edges[i] : k], x[k : edges[i + 2]], z, cfg)
        found.append(None if effect is None else _Detection(stage, scope, at, *effect, z, edges[i + 2] - k))
        first = i
    out: list[_Detection] = []
    for i, det in enumerate(found):
        if det is None:
            continue
        prev = found[i - 1] if i else None
        if prev is not None and prev.until == det.at:
            continue  # folded into the previous detection
        nxt = found[i + 1] if i + 1 < len(found) else None
        if nxt is not None and nxt.up != det.up:
            back = max(nxt.after_ms, 1e-9) / max(det.before_ms, 1e-9)
            if max(back, 1 / back) < cfg.min_factor:
                det.until = nxt.at
        out.append(det)
    return out


def _after(det: _Detection) -> pl.Expr:
    after = pl.col("start") >= det.at
    return after if det.until is None else after & (pl.col("start") < det.until)


def _ratio_at(frame: pl.DataFrame, det: _Detection) -> float | None:
    """after / before of ``det``'s statistic, at ``det``'s time, in another scope's requests."""
    q = 0.5 if det.statistic == "p50" else 0.9
    before = frame.filter(pl.col("start") < det.at)[det.stage].quantile(q, "linear")
    after = frame.filter(_after(det))[det.stage].quantile(q, "linear")
    return after / before if before and after is not None else None


def _narrowest(
    found: list[_Detection], tested: dict[str, list[str]], frames: dict[str, pl.DataFrame]
) -> list[_Detection]:
    """For one stage: the scopes the change lives in (see module docstring, step 4).

    A dimension explains the change when some of its values moved and the others did not move
    even half as much (in log terms) at the same time.
    """
    overall = [d for d in found if not d.scope]
    best: list[_Detection] = []
    for dim, values in tested.items():
        hits = [d for d in found if dim in d.scope]
        hit_values = {d.scope[dim] for d in hits}
        if not hits or len(hit_values) == len(values):
            continue
        weakest = min(abs(math.log(d.factor_estimate)) for d in hits)
        others = [_ratio_at(frames[_key({dim: v})], hits[0]) for v in values if v not in hit_values]
        if any(r is not None and r > 0 and abs(math.log(r)) > weakest / 2 for r in others):
            continue
        if not best or max(d.z**2 for d in hits) > max(d.z**2 for d in best):
            best = hits
    if best and (not overall or all(d.up == overall[0].up for d in best)):
        return best
    if overall:
        return overall
    by_dim = [[d for d in found if dim in d.scope] for dim in tested]
    return next((hits for hits in by_dim if hits), [])


def _context(frame: pl.DataFrame, det: _Detection, stages: list[str], cfg: ShiftConfig) -> dict:
    """Other stages and the load, before vs after, in the finding's scope."""
    before = frame.filter(pl.col("start") < det.at)
    after = frame.filter(_after(det))
    unchanged, moved = [], {}
    for stage in stages:
        if stage == det.stage:
            continue
        b, a = before[stage].median(), after[stage].median()
        if b is None or a is None or b <= 0:
            continue
        change = a / b - 1
        if abs(change) <= cfg.unchanged_within:
            unchanged.append(stage)
        elif abs(a - b) * 1e3 >= cfg.min_abs_ms:
            moved[stage] = round(change, 3)

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
            for det in _narrowest(cluster, tested, sub_frames):
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
                    )
                )
    return sorted(shifts, key=lambda s: -abs(s.impact_s))


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
