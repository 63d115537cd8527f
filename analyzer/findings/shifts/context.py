"""What moved with a change (step 7 of the method in ``findings.shifts``): other stages and the
load before vs after, in its scope; for ``connect``, which of its parts moved."""

from __future__ import annotations

import polars as pl
from hopline.analyzer.attribution import e2e
from hopline.analyzer.findings.shifts.stats import Detection, ShiftConfig, after_change

# ``connect`` is pool wait + TCP connect + TLS (the client's ``pool_wait_s``, ``connect_s``,
# ``tls_s``). Which of them moved decides what a finding says, because the cures differ: a pool
# wait wants a bigger pool or fewer concurrent calls; new connections want keep-alive.
CONNECT_PARTS = {"pool_wait": ("pool_wait_s",), "connect": ("connect_s", "tls_s")}


def context_of(frame: pl.DataFrame, det: Detection, stages: list[str], cfg: ShiftConfig) -> dict:
    """Other stages and the load, before vs after, in the finding's scope."""
    before = frame.filter(pl.col("start") < det.at)
    after = frame.filter(after_change(det))
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


def connect_part(frame: pl.DataFrame, det: Detection) -> str | None:
    """For a ``connect`` change: the part of it that moved most in mean, which adds up
    (``CONNECT_PARTS``); None for other stages or without the parts' columns."""
    names = [c for cols in CONNECT_PARTS.values() for c in cols]
    if det.stage != "connect" or not set(names) <= set(frame.columns):
        return None
    before = frame.filter(pl.col("start") < det.at).select(pl.col(names).fill_null(0.0).mean())
    after = frame.filter(after_change(det)).select(pl.col(names).fill_null(0.0).mean())
    moved = {
        part: abs(sum((after[c].item() or 0.0) - (before[c].item() or 0.0) for c in cols))
        for part, cols in CONNECT_PARTS.items()
    }
    return max(moved, key=moved.__getitem__)
