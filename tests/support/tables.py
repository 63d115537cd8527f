"""Per-request tables side by side: the timelines one engine made against Polars' ``timelines()``."""

from __future__ import annotations

import polars as pl
from hopline.analyzer.io import SCHEMA
from hopline.analyzer.timelines import COLUMNS
from hopline.middleware.contract import validate_event
from polars.testing import assert_frame_equal


def storage_frame(events: list[dict]) -> pl.DataFrame:
    """Validated events as the analyzer's storage frame (unknown fields dropped: not needed here)."""
    rows = [validate_event(e) for e in events]
    return pl.DataFrame([{k: r.get(k) for k in SCHEMA} for r in rows], schema=SCHEMA)


def assert_same_timelines(got: pl.DataFrame, want: pl.DataFrame, abs_tol: float = 1e-9) -> None:
    """Same requests, and per request every column of ``timelines.COLUMNS`` equal (floats within
    ``abs_tol`` seconds; nulls where the other has nulls); the first differing column is named
    with the requests that differ."""
    assert sorted(got["request_id"]) == sorted(want["request_id"]), "different requests"
    got, want = got.sort("request_id"), want.sort("request_id")
    for name in COLUMNS[1:]:  # request_id first: the key
        left, right = got.select("request_id", name), want.select("request_id", name)
        try:
            assert_frame_equal(left, right, abs_tol=abs_tol, rel_tol=0.0)
        except AssertionError:
            differ = left.join(right, on="request_id", suffix="_polars").filter(
                pl.col(name).ne_missing(pl.col(f"{name}_polars"))
            )
            raise AssertionError(f"column {name} differs on {differ.height} requests: {differ.head(3).rows()}") from None


def golden_events() -> pl.DataFrame:
    """Every case of the golden fixture as one storage frame (support.golden.golden_log)."""
    from support.golden import golden_log

    return storage_frame(golden_log()[0])


def synthetic_events(requests: int = 20_000, seed: int = 7) -> pl.DataFrame:
    """A generated log with skewed clocks, 5% errors, retries, failover and duplicate events; on
    half of the retried hops the retry lacks attributes its earlier attempt had (a reused
    connection reports no ``connect_s``): the chosen event's null must win, never an earlier value."""
    from support.synth import generate, with_retries

    events = with_retries(generate(requests, seed=seed, clock_skew_s=30.0, error_rate=0.05), seed)
    lacking = (pl.col("attempt") > 0) & (pl.col("ts").hash(seed) % 2 == 0)
    return events.with_columns(
        pl.when(~lacking).then(pl.col(name)).alias(name)
        for name in ("connect_s", "queue_s", "output_tokens", "replica", "stream")
    )
