"""KV bytes per request and in flight per replica, from timelines."""

from __future__ import annotations

from datetime import UTC, datetime

import polars as pl
from hopline.analyzer.kv_in_flight import kv_in_flight, request_kv_bytes


def _timelines() -> pl.LazyFrame:
    t0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
    return pl.LazyFrame(
        {
            "request_id": ["a", "b", "c", "d", "e"],
            "replica": ["r1", "r1", "r1", "r2", "r2"],
            "model": ["m", "m", "m", "big", "m"],
            "engine_received": [t0, t0 + 0.5, t0 + 3.0, t0 + 0.2, None],
            "engine_last": [t0 + 1.0, t0 + 3.2, t0 + 3.5, t0 + 0.4, t0 + 1.0],
            "prompt_tokens": [10, 20, 30, 5, 7],
            "output_tokens": [1, 2, None, 3, 1],
        }
    )


def test_request_kv_bytes_per_model() -> None:
    out = request_kv_bytes(_timelines(), {"m": 10, "big": 100}).collect().sort("request_id")
    # a: 11 tokens × 10 B; b: 22 × 10; c: output unknown -> null, not a guess; d: 8 × 100
    assert out["kv_bytes"].to_list() == [110, 220, None, 800, 80]


def test_kv_in_flight_is_a_step_function_per_replica() -> None:
    steps = kv_in_flight(_timelines(), {"m": 10, "big": 100}).collect()
    r1 = steps.filter(pl.col("replica") == "r1")
    # a holds 110 B from 0.0 s; b adds 220 B at 0.5 s; a ends at 1.0 s; b ends at 3.2 s.
    # c has no output_tokens and e no engine_received: both left out.
    assert r1["kv_bytes"].to_list() == [110, 330, 220, 0]
    assert r1["requests"].to_list() == [1, 2, 1, 0]
    assert r1["time"][1] == datetime(2026, 1, 1, 0, 0, 0, 500_000, tzinfo=UTC)
    r2 = steps.filter(pl.col("replica") == "r2")
    assert r2["kv_bytes"].to_list() == [800, 0]


def test_kv_in_flight_resampled_carries_values_into_quiet_windows() -> None:
    per_s = kv_in_flight(_timelines(), 10, every="1s").collect().filter(pl.col("replica") == "r1")
    # second 0: peak 330 B (a + b); seconds 1 and 2: b alone (220 B), though nothing changes in
    # second 2; second 3: b until 3.2 s, so the peak is still 220 B.
    assert per_s["kv_bytes"].to_list() == [330, 220, 220, 220]
    assert per_s["requests"].to_list() == [2, 1, 1, 1]
