"""``quantiles``: Polars' linear quantiles from one numpy sort, equal to Polars' own to the bit."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from hopline.analyzer import quantiles

QS = (0.5, 0.9, 0.99)


def _column(rng: np.random.Generator, kind: int, n: int) -> np.ndarray:
    """Skewed seconds, values rounded to the millisecond (many ties, negatives), few distinct values."""
    if kind == 0:
        return rng.lognormal(-3, 1.5, n)
    if kind == 1:
        return np.round(rng.normal(0.01, 0.05, n), 3) + 1e-4  # ties and negatives, never a zero
    return rng.integers(1, 5, n) * 0.1


@pytest.mark.parametrize("seed", range(6))
def test_equal_to_polars_with_nulls_ties_and_groups(seed):
    rng = np.random.default_rng(seed)
    for kind in range(3):
        n = int(rng.integers(1, 2000))
        column = pl.Series("x", _column(rng, kind, n))
        if n > 3:
            column = column.scatter(rng.choice(n, n // 4, replace=False), None)
        frame = pl.DataFrame({"x": column, "g": rng.integers(0, 4, n)})
        values = quantiles.values_of(frame["x"])
        assert values is not None
        assert quantiles.of_rows(values, None, QS) == [frame["x"].quantile(q, "linear") for q in QS]
        want = frame.group_by("g").agg(pl.col("x").quantile(q, "linear").alias(str(q)) for q in QS)
        groups = quantiles.row_groups(frame, "g")
        assert set(groups) == set(want["g"])
        for row in want.iter_rows(named=True):
            assert quantiles.of_rows(values, groups[row["g"]], QS) == [row[str(q)] for q in QS]


def test_no_value_is_none_and_one_value_is_itself():
    empty = quantiles.values_of(pl.Series("x", [None, None], dtype=pl.Float64))
    assert quantiles.of_rows(empty, None, QS) == [None, None, None]
    one = quantiles.values_of(pl.Series("x", [None, 0.25]))
    assert quantiles.of_rows(one, None, QS) == [0.25, 0.25, 0.25]


def test_a_nan_or_a_negative_zero_is_left_to_polars():
    """Where a NaN or -0.0 lands among equal values depends on the sort, so the numbers could
    differ from Polars' (a -0.0 median printed as "-0.0"): such a column is not taken."""
    assert quantiles.values_of(pl.Series("x", [1.0, float("nan"), None])) is None
    assert quantiles.values_of(pl.Series("x", [0.0, -0.0, 1.0])) is None
    assert quantiles.values_of(pl.Series("x", [0.0, 1.0, None])) is not None
