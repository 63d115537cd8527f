"""What moved with a change (step 7 of the method in ``findings.shifts``): other stages and the
load before vs after, in its scope; for ``connect``, which of its parts moved."""

from __future__ import annotations

import math

import polars as pl
from hopline.analyzer.attribution import e2e
from hopline.analyzer.findings.shifts.stats import Detection, ShiftConfig, after_change

# ``connect`` is pool wait + TCP connect + TLS (the client's ``pool_wait_s``, ``connect_s``,
# ``tls_s``). Which of them moved decides what a finding says, because the cures differ: a pool
# wait wants a bigger pool or fewer concurrent calls; new connections want keep-alive.
CONNECT_PARTS = {"pool_wait": ("pool_wait_s",), "connect": ("connect_s", "tls_s")}


def context_of(
    frame: pl.DataFrame, det: Detection, stages: list[str], cfg: ShiftConfig, span: tuple[float, float]
) -> dict:
    """Other stages and the load, before vs after, in the finding's scope. ``span``: the log's
    first and last request start (live: the last complete one, ``Context.complete_before``); the
    before interval runs from the first to the change, the after interval from the change to its
    end (``until``) or the last."""
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
    lb = load(frame, span[0], det.at)
    last = math.nextafter(span[1], math.inf)
    la = load(frame, det.at, last if det.until is None else min(det.until, last))
    covariates = {
        k: round(la[k] / lb[k] - 1, 3)
        for k in lb
        if k in COVARIATES and lb[k] and la[k] is not None and det.stage in COVARIATE_STAGES.get(k, (det.stage,))
    }
    return {
        "unchanged": unchanged,
        "moved": moved,
        "covariates": covariates,
        "moved_with": {k: v for k, v in covariates.items() if abs(v) >= cfg.notable_change},
        "before": {k: _round(v) for k, v in lb.items()},
        "after": {k: _round(v) for k, v in la.items()},
    }


COVARIATES = ("arrivals_per_s", "concurrency", "prompt_tokens_p50", "cache_hit_ratio", "spec_acceptance_length_p50")
# A covariate said only with shifts of these stages: speculative decoding's acceptance length sets
# how many tokens a decode step yields, nothing before the first token.
COVARIATE_STAGES = {"spec_acceptance_length_p50": ("decode",)}


def load(frame: pl.DataFrame, lo: float, hi: float) -> dict[str, float | None]:
    """The load of ``frame``'s requests over the interval [``lo``, ``hi``) it names (``span_s``
    long): requests that started in it per second, and the mean number in flight (each request
    counted for the part of its end-to-end time inside the interval), so neither can exceed what
    the log's requests allow; the prompts' median length and the cache hits of those that started."""
    span = hi - lo
    if span <= 0:
        return {"span_s": None, **dict.fromkeys(COVARIATES)}
    inside = frame.filter((pl.col("start") >= lo) & (pl.col("start") < hi))
    start = pl.col("start")
    busy = frame.select(
        ((start + e2e().fill_null(0.0)).clip(lo, hi) - start.clip(lo, hi)).sum()
    ).item()
    prompt, cached = inside["prompt_tokens"].sum(), inside["cached_tokens"].sum()
    accept = inside["spec_acceptance_length"].median() if "spec_acceptance_length" in inside.columns else None
    return {
        "span_s": span,
        "arrivals_per_s": inside.height / span,
        "concurrency": busy / span if busy else None,
        "prompt_tokens_p50": inside["prompt_tokens"].median(),
        "cache_hit_ratio": cached / prompt if prompt else None,
        "spec_acceptance_length_p50": accept,
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
