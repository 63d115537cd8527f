"""Failover and retry logs with known truth (tests only): one replica starts answering 503 to first
attempts from a moment on, and the gateway (or the client) retries those requests elsewhere.

Built on ``synth.generate`` at true time (no clock offsets, not shuffled), rewritten as a real
stack logs a failover, then put on per-host clocks (offset and drift per engine replica and per
gateway) and shuffled:

* gateway failover: the gateway forwards attempt 0 to the failing replica (``gateway.forwarded``
  with ``upstream``), which logs ``engine.received`` and ``engine.error`` (503) at attempt 0; the
  gateway forwards attempt 1 to another replica after ``added_s`` (the failed try, inside the
  gateway stage), where every engine hop of the request happens (attempt 1); the client sees one
  request (attempt 0), later by ``added_s``.
* client retries: the gateway relays the 503 (``gateway.error``), the client logs ``client.error``
  and sends attempt 1 after ``added_s`` (the failed try and its back-off); every hop of attempt 1
  is the original request's, later by ``added_s``, on another replica.

    events, truth = failover_log(seed=3)
    truth.retried            # request IDs whose first attempt failed at ``truth.failing``
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
from hopline.analyzer.io import SCHEMA

from support.synth import DEFAULT_START, StageShift, generate

REPLICAS = ("r1", "r2", "r3", "r4")
GATEWAYS = ("gw-0", "gw-1")
# services and models not 1:1: two services share a model
SERVICES = ("kite-chat", "search-assist", "agent-runner")
MODELS = {"kite-chat": "llama-3.1-70b", "search-assist": "llama-3.1-70b", "agent-runner": "qwen-2.5-32b"}


@dataclass(frozen=True)
class FailoverTruth:
    failing: str  # the replica that answered 503
    retried: frozenset[str]  # requests whose first attempt it failed (each retried once)
    onset: float | None  # the first failed first attempt's send time (the client's clock); None: none failed
    served_by: dict[str, int]  # replica -> retried requests it served
    added_s: float  # mean time the failed try added to a retried request
    by: str  # "gateway" or "client"


def failover_log(
    seed: int = 0,
    *,
    n_requests: int = 8000,
    rate: float = 20.0,
    failing: str = "r3",
    onset_s: float = 200.0,
    added_s: float = 0.078,
    by: str = "gateway",
    shuffle: bool = True,
    incidents: tuple = (),
) -> tuple[pl.DataFrame, FailoverTruth]:
    """Events of ``n_requests`` over four replicas and two gateways where ``failing`` answers 503
    to every first attempt sent at or after ``onset_s`` (seconds from the start), retried by
    ``by`` (``gateway`` or ``client``) on one of the other replicas; and the truth."""
    if by not in ("gateway", "client"):
        raise ValueError(f"by must be 'gateway' or 'client', not {by!r}")
    rng = np.random.default_rng(seed + 1000)
    events = generate(
        n_requests, seed=seed, rate=rate, replicas=REPLICAS, services=SERVICES, models=MODELS,
        incidents=list(incidents), clock_skew_s=0.0, shuffle=False,
    )  # fmt: skip
    per = events.filter(pl.col("hop") == "engine.received").select("request_id", first=pl.col("replica"))
    sent = events.filter(pl.col("hop") == "client.sent").select("request_id", t0=pl.col("ts"))
    req = sent.join(per, on="request_id").sort("t0")
    hit = req.filter((pl.col("first") == failing) & (pl.col("t0") >= DEFAULT_START + onset_s))
    others = [r for r in REPLICAS if r != failing]
    moves = hit.with_columns(
        new=pl.Series(np.asarray(others, dtype=object)[rng.integers(0, len(others), hit.height)], dtype=pl.String),
        d=pl.Series(added_s * np.exp(0.25 * rng.standard_normal(hit.height) - 0.25**2 / 2)),
    )
    rewritten = _failover(events, moves, failing, by)
    placed = _on_host_clocks(rewritten, rng)
    if shuffle:
        placed = placed.sample(fraction=1.0, shuffle=True, seed=seed)
    served = moves.group_by("new").len()
    truth = FailoverTruth(
        failing=failing,
        retried=frozenset(moves["request_id"].to_list()),
        onset=None if moves.height == 0 else float(moves["t0"].min()),
        served_by=dict(zip(served["new"].to_list(), served["len"].to_list(), strict=True)),
        added_s=float(moves["d"].mean() or 0.0),
        by=by,
    )
    return placed, truth


def _failover(events: pl.DataFrame, moves: pl.DataFrame, failing: str, by: str) -> pl.DataFrame:
    """The moved requests' events as a failover leaves them (see the module docstring)."""
    moved = events.join(moves.select("request_id", "new", "d"), on="request_id", how="inner")
    kept = events.join(moves.select("request_id"), on="request_id", how="anti")
    hop = pl.col("hop")
    first_hops = ["client.sent", "gateway.received", "gateway.admitted", "gateway.forwarded"]
    if by == "gateway":
        later = ~hop.is_in(first_hops[:3])
        # the client sees one request: its hops keep attempt 0; the gateway's and engine's after the forward are attempt 1
        retry = moved.with_columns(
            ts=pl.when(later).then(pl.col("ts") + pl.col("d")).otherwise(pl.col("ts")),
            max_gap_at=pl.col("max_gap_at") + pl.col("d"),
            attempt=pl.when(later & ~hop.str.starts_with("client.")).then(1).otherwise(0).cast(pl.Int32),
        )
        failed_try = moved.filter(hop.is_in(["gateway.forwarded", "engine.received"]))
    else:
        retry = moved.with_columns(
            ts=pl.col("ts") + pl.col("d"), max_gap_at=pl.col("max_gap_at") + pl.col("d"), attempt=pl.lit(1, pl.Int32)
        )
        failed_try = moved.filter(hop.is_in([*first_hops, "engine.received"]))
    retry = retry.with_columns(
        replica=pl.when(hop.str.starts_with("engine.")).then(pl.col("new")).otherwise(pl.col("replica")),
        upstream=pl.when(hop == "gateway.forwarded").then(pl.col("new")).otherwise(pl.col("upstream")),
    )
    failed_try = failed_try.with_columns(
        attempt=pl.lit(0, pl.Int32),
        replica=pl.when(hop.str.starts_with("engine.")).then(pl.lit(failing)).otherwise(pl.col("replica")),
        upstream=pl.when(hop == "gateway.forwarded").then(pl.lit(failing)).otherwise(pl.col("upstream")),
    )
    error_at = failed_try.filter(hop == "engine.received").with_columns(ts=pl.col("ts") + 0.003)
    errors = [error_at.with_columns(hop=pl.lit("engine.error"), stream=None)]
    if by == "client":
        errors.append(error_at.with_columns(hop=pl.lit("gateway.error"), ts=pl.col("ts") + 0.002, stream=None))
        errors.append(error_at.with_columns(hop=pl.lit("client.error"), ts=pl.col("ts") + 0.006, stream=None))
    errors = [
        e.with_columns(status=pl.lit(503), error=pl.lit("service_unavailable"), output_tokens=None)
        for e in errors
    ]
    parts = [retry, failed_try, *errors]
    columns = list(SCHEMA)
    return pl.concat(
        [kept.select(columns), *(p.select([pl.col(c).cast(SCHEMA[c]) for c in columns]) for p in parts)]
    )


def _on_host_clocks(events: pl.DataFrame, rng: np.random.Generator) -> pl.DataFrame:
    """Two gateways (each request through one of them) and every host on its own clock: an offset
    (engines up to ±2 s, gateways ±0.2 s) and a drift (up to ±20 ppm); the clients are the reference."""
    engine_clock = {r: (rng.uniform(-2.0, 2.0), rng.uniform(-2e-5, 2e-5)) for r in REPLICAS}
    gateway_clock = {g: (rng.uniform(-0.2, 0.2), rng.uniform(-2e-5, 2e-5)) for g in GATEWAYS}
    ids = events.select(pl.col("request_id").unique().sort())
    via = ids.with_columns(gw=pl.Series(np.asarray(GATEWAYS, dtype=object)[rng.integers(0, 2, ids.height)], dtype=pl.String))
    hop = pl.col("hop")
    out = events.join(via, on="request_id").with_columns(
        replica=pl.when(hop.str.starts_with("gateway.")).then(pl.col("gw")).otherwise(pl.col("replica"))
    )
    host = pl.when(hop.str.starts_with("client.")).then(pl.lit(None)).otherwise(pl.col("replica"))
    clocks = {**engine_clock, **gateway_clock}
    offset = host.replace_strict({h: o for h, (o, _) in clocks.items()}, default=0.0, return_dtype=pl.Float64)
    drift = host.replace_strict({h: d for h, (_, d) in clocks.items()}, default=0.0, return_dtype=pl.Float64)
    skew = (offset + drift * (pl.col("ts") - DEFAULT_START)).fill_null(0.0)
    engine_gap = hop.str.starts_with("engine.") & pl.col("max_gap_at").is_not_null()
    return out.with_columns(
        ts=pl.col("ts") + skew,
        max_gap_at=pl.when(engine_gap).then(pl.col("max_gap_at") + skew).otherwise(pl.col("max_gap_at")),
    ).select(list(SCHEMA))


__all__ = ["FailoverTruth", "StageShift", "failover_log"]
