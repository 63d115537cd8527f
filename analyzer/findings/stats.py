"""Statistics more than one detector uses: the statistics a finding names as percentiles, the
Mann-Whitney rank test at every split at once (``split_z``: the shift detector's change points,
``prefix_cache_miss``'s cache-hit drops) and its Bonferroni critical value (``z_threshold``)."""

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
    variance corrected for ties: the z of values[:k] as a stretch lower than the rest."""
    return stretch_z(values, np.zeros_like(splits), splits)


def stretch_z(values: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """Mann-Whitney z of "the stretch is lower than the rest" for each stretch values[start:stop]
    against the other values, with the variance corrected for ties."""
    n = len(values)
    ranks, counts = _average_ranks(values)
    cum = np.concatenate(([0.0], np.cumsum(ranks)))
    m = (stops - starts).astype(np.float64)
    u_stretch = cum[stops] - cum[starts] - m * (m + 1) / 2
    mean = m * (n - m) / 2
    tied = counts.astype(np.float64)
    ties = float(np.sum(tied**3 - tied)) / (n * (n - 1)) if n > 1 else 0.0
    sd = np.sqrt(np.maximum(m * (n - m) / 12.0 * ((n + 1) - ties), 1e-300))
    return (mean - u_stretch) / sd


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

