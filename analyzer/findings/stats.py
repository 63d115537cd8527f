"""Statistics more than one detector uses: the statistics a finding names as percentiles, the
Mann-Whitney rank test at every split at once (``split_z``: the shift detector's change points,
``prefix_cache_miss``'s cache-hit drops), its Bonferroni critical value (``z_threshold``), and
how much requests that move together overstate its evidence (``design_effect``)."""

from __future__ import annotations

import math

import numpy as np

STATISTICS = {"p50": 50, "p90": 90}  # a finding's statistic (the p50, else the p90) as a percentile


def _average_ranks(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ranks 1..n, ties sharing their average rank (as Mann-Whitney wants), and the size of each
    group of equal values (for the variance's tie correction), in the order of the values.

    Values ranked to the millisecond are whole numbers over a range rarely much wider than their
    count: they are counted (``np.bincount``, linear) instead of sorted; the same numbers."""
    counted = _counted_ranks(values)
    if counted is not None:
        return counted
    order = np.argsort(values, kind="stable")
    sorted_vals = values[order]
    _, first, counts = np.unique(sorted_vals, return_index=True, return_counts=True)
    avg = first + (counts + 1) / 2.0  # average of ranks first+1 .. first+count
    ranks = np.empty(len(values))
    ranks[order] = np.repeat(avg, counts)
    return ranks, counts


COUNTED_RANGE = 4  # count instead of sort while the values' range is at most this many times their count


def _counted_ranks(values: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """``_average_ranks`` of whole numbers by counting them, or None when they are not whole or
    spread too widely for counting to pay."""
    n = len(values)
    if n == 0:
        return None
    lo, hi = values.min(), values.max()
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi - lo > COUNTED_RANGE * n + 1024:
        return None
    offsets = (values - lo).astype(np.int64)
    if not np.array_equal(offsets, values - lo):
        return None
    per_value = np.bincount(offsets)
    below = np.cumsum(per_value) - per_value  # values smaller than each: its group's first index
    avg = below + (per_value + 1) / 2.0
    return avg[offsets], per_value[per_value > 0]


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


def design_effect(t: np.ndarray, values: np.ndarray, width: float) -> float:
    """How many times a rank test over ``values`` (ordered by their times ``t``) overstates its
    evidence because requests of the same ``width``-second window move together: Kish's design
    effect ``1 + (m - 1) * rho`` of the windows as clusters (``m`` their size weighted by itself,
    ``rho`` the intraclass correlation of the values' ranks, its ANOVA estimator, floored at 0).

    Independent requests (a healthy engine on its own hardware) give 1. A host whose own speed
    swings for seconds at a time (a CPU engine beside other work, a client whose loop runs late)
    slows every request of those seconds together: n such requests carry the evidence of fewer,
    and a rank test that counts them as n finds "changes" in the host's weather. Fewer than three
    windows, or values all equal: 1 (nothing to tell it by). So that a few windows of
    independent requests, differing by chance, never weaken a test, the windows must first differ
    more than independent requests' would (between / within their variance beyond its 99th
    percentile, ``CLUSTERED_Z``)."""
    n = len(values)
    if n < 3:
        return 1.0
    ranks, _ = _average_ranks(values)
    _, cluster, sizes = np.unique(np.floor(t / width), return_inverse=True, return_counts=True)
    groups = len(sizes)
    if groups < 3 or groups >= n:
        return 1.0
    means = np.bincount(cluster, ranks) / sizes
    between = float(np.sum(sizes * (means - ranks.mean()) ** 2)) / (groups - 1)
    within = float(np.sum((ranks - means[cluster]) ** 2)) / (n - groups)
    m0 = (n - float(np.sum(sizes.astype(np.float64) ** 2)) / n) / (groups - 1)
    denominator = between + (m0 - 1) * within
    if denominator <= 0 or between <= within * chi2_quantile(CLUSTERED_Z, groups - 1) / (groups - 1):
        return 1.0  # the windows differ no more than independent requests' would (F test, 1%)
    rho = max((between - within) / denominator, 0.0)
    return 1.0 + (float(np.sum(sizes.astype(np.float64) ** 2)) / n - 1.0) * rho


CLUSTERED_Z = 2.326  # the normal 99th percentile: windows differ beyond chance at 1% (design_effect)


def chi2_quantile(z: float, dof: int) -> float:
    """The chi-square quantile with ``dof`` degrees of freedom at the normal quantile ``z``
    (Wilson-Hilferty; within 1% from 3 degrees of freedom up)."""
    k = float(dof)
    return k * (1 - 2 / (9 * k) + z * math.sqrt(2 / (9 * k))) ** 3
