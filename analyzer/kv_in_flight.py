"""Each replica's KV-cache footprint over time, from per-request timelines.

A request holds its tokens from ``engine.received`` until ``engine.last_token`` (a step function);
the bytes per token come from ``hopline.middleware.contract.kv``.
"""

from __future__ import annotations

from collections.abc import Mapping

import polars as pl


def _token_bytes(timelines: pl.LazyFrame, bytes_per_token: int | Mapping[str, int]) -> pl.LazyFrame:
    """Add ``kv_bytes_per_token``: one number for all, or per ``model`` (unlisted models: null)."""
    if isinstance(bytes_per_token, Mapping):
        table = pl.LazyFrame(
            {"model": list(bytes_per_token), "kv_bytes_per_token": list(bytes_per_token.values())},
            schema={"model": pl.String, "kv_bytes_per_token": pl.Int64},
        )
        return timelines.join(table, on="model", how="left")
    return timelines.with_columns(kv_bytes_per_token=pl.lit(bytes_per_token, dtype=pl.Int64))


def request_kv_bytes(timelines: pl.LazyFrame, bytes_per_token: int | Mapping[str, int]) -> pl.LazyFrame:
    """Add ``kv_tokens`` (prompt + output) and ``kv_bytes``: what each request holds at its end.

    Null when a token count is unknown: a guess would hide the gap.
    """
    return (
        _token_bytes(timelines, bytes_per_token)
        .with_columns(
            kv_tokens=pl.col("prompt_tokens") + pl.col("output_tokens"),
        )
        .with_columns(kv_bytes=pl.col("kv_tokens") * pl.col("kv_bytes_per_token"))
    )


def kv_in_flight(
    timelines: pl.LazyFrame,
    bytes_per_token: int | Mapping[str, int],
    every: str | None = None,
) -> pl.LazyFrame:
    """Each replica's KV bytes and requests in flight over time.

    A request holds its end-of-request KV (prompt + output tokens) from ``engine_received`` to
    ``engine_last``: an upper bound (the cache fills during prefill and grows per output token),
    which is what capacity planning needs. Requests without engine times or token counts are
    left out. The result is a step function: one row per change, ``(replica, time, kv_bytes,
    requests)``, the value holding until the replica's next row. With ``every`` (``"1s"``,
    ``"1m"``) it is resampled to the peak in each window (windows aligned like ``dt.truncate``).
    """
    held = (
        request_kv_bytes(timelines, bytes_per_token)
        .filter(
            pl.col("engine_received").is_not_null()
            & pl.col("engine_last").is_not_null()
            & pl.col("kv_bytes").is_not_null()
        )
        .select("replica", "engine_received", "engine_last", "kv_bytes")
    )
    changes = pl.concat(
        [
            held.select("replica", ts=pl.col("engine_received"), d_bytes=pl.col("kv_bytes"), d_req=pl.lit(1)),
            held.select("replica", ts=pl.col("engine_last"), d_bytes=-pl.col("kv_bytes"), d_req=pl.lit(-1)),
        ]
    )
    steps = (
        changes.group_by("replica", "ts")
        .agg(pl.col("d_bytes").sum(), pl.col("d_req").sum())
        .sort("replica", "ts")
        .select(
            "replica",
            time=pl.from_epoch(
                (pl.col("ts") * 1_000_000).round().cast(pl.Int64), time_unit="us"
            ).dt.replace_time_zone("UTC"),
            kv_bytes=pl.col("d_bytes").cum_sum().over("replica"),
            requests=pl.col("d_req").cum_sum().over("replica"),
        )
    )
    if every is None:
        return steps
    # Each window also starts with the value carried over from before it (a join_asof on a
    # grid of window starts), so a window with no change still reports what was held.
    grid = (
        steps.group_by("replica")
        .agg(time=pl.datetime_range(pl.col("time").min().dt.truncate(every), pl.col("time").max(), every))
        .explode("time")
        .sort("time")
    )
    carried = grid.join_asof(
        steps.sort("time"), on="time", by="replica", strategy="backward", check_sortedness=False
    ).select("replica", "time", pl.col("kv_bytes").fill_null(0), pl.col("requests").fill_null(0))
    return (
        pl.concat([steps, carried])
        .group_by("replica", pl.col("time").dt.truncate(every))
        .agg(pl.col("kv_bytes").max(), pl.col("requests").max())
        .sort("replica", "time")
    )
