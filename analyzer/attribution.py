"""Where the time went, in numbers: stage percentiles, shares of TTFT and end-to-end, per scope
and per window, and goodput against SLO targets.

Everything takes the per-request frame of ``timelines.timelines`` (lazy) and returns lazy
frames of aggregates; the report collects. Percentiles interpolate linearly (numpy's default),
as GenAI-Perf / AIPerf and ``vllm bench serve`` do, so the numbers line up with theirs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl
from hopline.analyzer import quantiles
from hopline.middleware.contract import STAGES, TIME_STAGES, TTFT_STAGES
from hopline.middleware.contract.rules import TTFT_PARTS as RULES_TTFT_PARTS
from hopline.middleware.contract.units import parse_duration

VIEW_STAGES = tuple(s.name for s in STAGES if s.kind == "view")
# What TTFT is made of when the split is unavailable (DESIGN.md fallbacks) — candidates to dominate.
TTFT_PARTS = RULES_TTFT_PARTS  # the terms of the TTFT sum and the fallbacks (rules.STAGE_LOOKS)
REPORTED = TIME_STAGES + VIEW_STAGES
QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
SCOPES = ("replica", "model", "service")
NICE_WINDOWS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)
TARGET_WINDOWS = 200  # auto window: the smallest nice width giving at most this many windows


def ttft() -> pl.Expr:
    """TTFT as the best available view sees it: the client's, else the gateway's, else the engine's."""
    return pl.coalesce("client_ttft", "gateway_ttft", "engine_ttft")


def e2e() -> pl.Expr:
    """End-to-end time, best available view."""
    return pl.coalesce("client_e2e", "gateway_e2e", "engine_e2e")


def itl() -> pl.Expr:
    """Per-token latency (benchmark tools' ITL / vLLM's TPOT), best available view."""
    return pl.coalesce("client_itl", "gateway_itl", "engine_itl")


def auto_window(span_s: float) -> float:
    """A window width that suits the data's span: 1 s for a one-minute log, 1 min for hours."""
    for width in NICE_WINDOWS_S:
        if span_s / width <= TARGET_WINDOWS:
            return float(width)
    return float(NICE_WINDOWS_S[-1])


def choose_window(spec: str | None, span_s: float) -> float:
    if spec is None or spec == "auto":
        return auto_window(span_s)
    width = parse_duration(spec)
    if width <= 0:
        raise ValueError(f"window must be positive, got {spec!r}")
    return width


@dataclass(frozen=True)
class Slo:
    """Per-request targets in seconds; None = no target. A request is good when it meets all."""

    ttft: float | None = None
    itl: float | None = None
    e2e: float | None = None

    @classmethod
    def parse(cls, text: str) -> Slo:
        """``ttft=500ms,itl=50ms,e2e=20s``."""
        targets: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            name, sep, value = part.partition("=")
            name = name.strip().lower()
            if not sep or name not in ("ttft", "itl", "e2e"):
                raise ValueError(f"bad SLO {part!r}: use ttft=500ms,itl=50ms,e2e=20s")
            targets[name] = parse_duration(value)
        if not targets:
            raise ValueError("empty SLO: use ttft=500ms,itl=50ms,e2e=20s")
        return cls(**targets)

    def met(self) -> pl.Expr:
        """True when every target is met; a missing ITL (one output token) counts as met, as in
        ``vllm bench serve`` (TPOT 0); a missing TTFT / e2e (failed request) does not."""
        checks = [pl.lit(True)]
        if self.ttft is not None:
            checks.append((ttft() <= self.ttft).fill_null(False))
        if self.itl is not None:
            checks.append((itl() <= self.itl).fill_null(True))
        if self.e2e is not None:
            checks.append((e2e() <= self.e2e).fill_null(False))
        return pl.all_horizontal(checks)

    def to_dict(self) -> dict[str, float]:
        return {
            f"{k}_ms": v * 1e3
            for k, v in (("ttft", self.ttft), ("itl", self.itl), ("e2e", self.e2e))
            if v is not None
        }


SPLIT_TOLERANCE_S = 1e-6  # a request's TTFT parts must add up to its TTFT within this
MIN_SPLIT_REQUESTS = 20  # fewer requests with a complete split decide no "largest part"


def complete_split() -> pl.Expr:
    """True for a request whose TTFT parts (terms and stand-ins, rules.TTFT_PARTS) that have a
    value add up to its TTFT (best view), none negative: the common set TTFT shares are over.

    Every deployment shape qualifies (with or without gateway, client or engine split): each
    formula of the stage table makes the parts it yields sum to the view it starts from."""
    parts = [pl.col(p) for p in TTFT_PARTS]
    total = pl.sum_horizontal(parts)
    return (
        pl.col("_ttft").is_not_null()
        & pl.any_horizontal([p.is_not_null() for p in parts])
        & ~pl.any_horizontal([(p < -SPLIT_TOLERANCE_S).fill_null(False) for p in parts])
        & ((total - pl.col("_ttft")).abs() <= SPLIT_TOLERANCE_S)
    ).fill_null(False)


def _stage_aggs(stages: tuple[str, ...] = REPORTED, with_quantiles: bool = True) -> list[pl.Expr]:
    split = pl.col("_split")
    ttft_total = pl.col("_ttft").filter(split).sum()
    aggs: list[pl.Expr] = [pl.len().alias("count"), split.sum().alias("split_requests")]
    for stage in stages:
        col = pl.col(stage)
        aggs.append(col.count().alias(f"{stage}:n"))
        aggs.append((col.mean() * 1e3).alias(f"{stage}:mean_ms"))
        if with_quantiles:
            aggs += [
                (col.quantile(q, "linear") * 1e3).alias(f"{stage}:{name}_ms") for name, q in QUANTILES.items()
            ]
        # share of TTFT: over the requests with a complete split only, so the parts add up to 100%
        aggs.append((col.filter(split).fill_null(0.0).sum() / ttft_total).alias(f"{stage}:share_of_ttft"))
        both = col.is_not_null() & pl.col("_e2e").is_not_null()
        aggs.append(
            (col.filter(both).sum() / pl.col("_e2e").filter(both).sum()).alias(f"{stage}:share_of_e2e")
        )
    aggs.append(pl.col("negative").list.len().gt(0).sum().alias("negative_requests"))
    return aggs


def _with_views(timelines: pl.LazyFrame) -> pl.LazyFrame:
    return timelines.with_columns(_ttft=ttft(), _e2e=e2e()).with_columns(_split=complete_split())


def stage_stats(timelines: pl.LazyFrame, by: list[str] | None = None) -> pl.LazyFrame:
    """One row (per group of ``by``): count, ``split_requests`` (requests with a complete TTFT
    split), and per stage ``n``, mean / p50 / p90 / p99 in ms (all requests with the stage),
    ``share_of_ttft`` (over the complete splits) and ``share_of_e2e`` (columns ``"{stage}:{stat}"``)."""
    frame = _with_views(timelines)
    return frame.group_by(by).agg(_stage_aggs()) if by else frame.select(_stage_aggs())


def stage_table(row: dict) -> dict[str, dict]:
    """The findings contract's ``stages`` object from one ``stage_stats`` row: every stage that
    has values, with p50/p90/p99 in ms and its share of TTFT (null for stages after it, and for
    parts no complete split has)."""
    table = {}
    split = row.get("split_requests") or 0
    for stage in REPORTED:
        if not row.get(f"{stage}:n"):
            continue
        share = row[f"{stage}:share_of_ttft"] if stage in TTFT_PARTS and split else None
        table[stage] = {
            "p50_ms": _num(row[f"{stage}:p50_ms"]),
            "p90_ms": _num(row[f"{stage}:p90_ms"]),
            "p99_ms": _num(row[f"{stage}:p99_ms"]),
            "share_of_ttft": _num(share),
            "share_of_e2e": _num(row[f"{stage}:share_of_e2e"]) if stage in TIME_STAGES else None,
            "mean_ms": _num(row[f"{stage}:mean_ms"]),
            "count": row[f"{stage}:n"],
        }
    return table


def dominant(table: dict[str, dict], split_requests: int) -> str | None:
    """The TTFT part with the largest share of TTFT (the stage to look at first), or None when
    fewer than ``MIN_SPLIT_REQUESTS`` requests have a complete split: a handful decides nothing."""
    if split_requests < MIN_SPLIT_REQUESTS:
        return None
    shares = {
        s: v["share_of_ttft"] for s, v in table.items() if s in TTFT_PARTS and v["share_of_ttft"] is not None
    }
    return max(shares, key=shares.__getitem__) if shares and max(shares.values()) > 0 else None


def _num(value: float | None, digits: int = 4) -> float | None:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return None
    return round(float(value), digits)


STATS_COLUMNS = (*REPORTED, "_ttft", "_e2e", "_split", "negative")  # what ``_stage_aggs`` reads


def scope_stats(timelines: pl.DataFrame, dims: tuple[str, ...] = ()) -> tuple[dict, dict[str, list[dict]]]:
    """``stage_stats``' row of all the requests, and the rows of each value of each of ``dims``
    (sorted by value, null left out): the same numbers, with every quantile taken from one numpy
    sort of a stage per scope (``quantiles``) instead of one Polars sort per quantile."""
    views = _with_views(timelines.lazy()).select(
        *(pl.col(d).cast(pl.String) for d in dims), *STATS_COLUMNS
    ).collect()  # fmt: skip
    values = {stage: quantiles.values_of(views[stage]) for stage in REPORTED}
    if any(v is None for v in values.values()):  # a NaN or a negative zero: Polars sorts them its way
        overall = stage_stats(timelines.lazy()).collect().row(0, named=True)
        return overall, {dim: _polars_scope_rows(timelines, dim) for dim in dims}
    overall = views.select(_stage_aggs(with_quantiles=False)).row(0, named=True) | _quantile_row(values, None)
    groups = {dim: quantiles.row_groups(views, dim) for dim in dims}
    names = {dim: sorted(groups[dim]) for dim in dims}
    sums = _scope_sums(views, values, groups, names)
    return overall, {
        dim: [{dim: name} | _figures(sums[dim], i) | _quantile_row(values, groups[dim][name]) for i, name in enumerate(names[dim])]
        for dim in dims
    }  # fmt: skip


MAX_CELLS = 1 << 16  # scope sums by cells of every dimension at once while there are at most this many


def _scope_sums(views: pl.DataFrame, values: dict[str, np.ndarray], groups: dict, names: dict) -> dict[str, dict]:
    """``_sums`` of each value of each dimension (``names[dim][i]``'s rows ``groups[dim][name]``;
    index ``len(names[dim])``: rows without a value). The rows are summed once into cells of
    every dimension (a value of each), each dimension's sums then from the cells': one pass over
    the requests instead of one per dimension. Dimensions with too many cells: one pass each."""
    sizes = [len(names[dim]) + 1 for dim in names]
    if math.prod(sizes) > MAX_CELLS and len(names) > 1:
        return {d: _scope_sums(views, values, {d: groups[d]}, {d: names[d]})[d] for d in names}
    cell = np.zeros(views.height, dtype=np.intp)
    stride = 1
    strides = {}
    for dim, size in zip(names, sizes):
        codes = np.full(views.height, size - 1, dtype=np.intp)
        for i, name in enumerate(names[dim]):
            codes[groups[dim][name]] = i
        cell += codes * stride
        strides[dim] = stride
        stride *= size
    per_cell = _sums(views, values, cell, stride)
    out = {}
    for dim, size in zip(names, sizes):
        of_cell = np.arange(stride) // strides[dim] % size
        out[dim] = {k: np.bincount(of_cell, v, size) for k, v in per_cell.items()}
    return out


def _sums(views: pl.DataFrame, values: dict[str, np.ndarray], codes: np.ndarray, bins: int) -> dict[str, np.ndarray]:
    """Per code (``np.bincount``: one pass a sum): what ``_stage_aggs``' counts, means and shares
    are made of. Float sums may differ from Polars' in the last bits (the summation's order);
    every figure is rounded far above them."""

    def total(weights: np.ndarray | None) -> np.ndarray:
        return np.bincount(codes, weights, bins).astype(np.float64)

    split = views["_split"].to_numpy()
    ttft_v, e2e_v = (views[c].fill_null(0.0).to_numpy() for c in ("_ttft", "_e2e"))
    has_e2e = views["_e2e"].is_not_null().to_numpy()
    out = {
        "count": total(None),
        "split_requests": total(split),
        "negative_requests": total(views["negative"].list.len().gt(0).fill_null(False).to_numpy()),
        "_ttft": total(np.where(split, ttft_v, 0.0)),
    }
    for stage, x in values.items():
        present = ~np.isnan(x)
        x0 = np.where(present, x, 0.0)
        both = present & has_e2e
        out |= {
            f"{stage}:n": total(present),
            f"{stage}:sum": total(x0),
            f"{stage}:split_sum": total(np.where(split, x0, 0.0)),
            f"{stage}:both_sum": total(np.where(both, x0, 0.0)),
            f"{stage}:both_e2e": total(np.where(both, e2e_v, 0.0)),
        }
    return out


def _figures(sums: dict[str, np.ndarray], i: int) -> dict[str, float | int | None]:
    """Group ``i``'s counts, means (ms) and shares from ``_sums``, as the Polars row has them
    (counts as int; 0 / 0 as None)."""

    def ratio(a: float, b: float) -> float | None:
        return None if b == 0 else a / b  # Polars' NaN or inf: None in the stage table

    out: dict[str, float | int | None] = {k: int(sums[k][i]) for k in ("count", "split_requests", "negative_requests")}
    for stage in REPORTED:
        n = sums[f"{stage}:n"][i]
        out[f"{stage}:n"] = int(n)
        mean = ratio(float(sums[f"{stage}:sum"][i]), float(n))
        out[f"{stage}:mean_ms"] = None if mean is None else mean * 1e3
        out[f"{stage}:share_of_ttft"] = ratio(float(sums[f"{stage}:split_sum"][i]), float(sums["_ttft"][i]))
        out[f"{stage}:share_of_e2e"] = ratio(float(sums[f"{stage}:both_sum"][i]), float(sums[f"{stage}:both_e2e"][i]))
    return out


def _quantile_row(values: dict[str, np.ndarray], rows: np.ndarray | None) -> dict[str, float | None]:
    out = {}
    for stage, column in values.items():
        found = quantiles.of_rows(column, rows, tuple(QUANTILES.values()))
        out |= {f"{stage}:{name}_ms": None if v is None else v * 1e3 for name, v in zip(QUANTILES, found)}
    return out


def _polars_scope_rows(timelines: pl.DataFrame, dim: str) -> list[dict]:
    frame = stage_stats(timelines.lazy(), [dim]).with_columns(pl.col(dim).cast(pl.String)).collect()
    return list(frame.filter(pl.col(dim).is_not_null()).sort(dim).iter_rows(named=True))


def by_scope(timelines: pl.LazyFrame, scopes: tuple[str, ...] = SCOPES) -> dict[str, list[dict]]:
    """Per scope dimension, per value: count, the stage table and the dominant stage."""
    return scope_tables(scope_stats(timelines.collect(), scopes)[1])


def scope_tables(rows_by_dim: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """``by_scope`` from ``scope_stats``' rows of each dimension."""
    out: dict[str, list[dict]] = {}
    for dim, stats in rows_by_dim.items():
        rows = []
        for row in stats:
            table = stage_table(row)
            rows.append(
                {
                    "scope": {dim: row[dim]},
                    "requests": row["count"],
                    "split_requests": row["split_requests"],
                    "dominant": dominant(table, row["split_requests"]),
                    "stages": table,
                }
            )
        out[dim] = rows
    return out


def windowed(
    timelines: pl.LazyFrame,
    window_s: float,
    by: str | None = None,
    stages: tuple[str, ...] = TTFT_PARTS + ("decode",),
) -> pl.LazyFrame:
    """Per window (and per value of ``by``): request count and p50 / p90 / p99 of each stage
    (and of TTFT and e2e, best view) in ms. ``window`` is the window's start (UTC datetime)."""
    every = f"{max(1, round(window_s * 1e6))}us"
    frame = _with_views(timelines).with_columns(
        window=pl.from_epoch((pl.col("start") * 1e6).cast(pl.Int64), time_unit="us").dt.replace_time_zone(
            "UTC"
        )
    )
    aggs = [pl.len().alias("count")]
    for stage in stages + ("_ttft", "_e2e"):
        name = stage.lstrip("_")
        aggs += [
            (pl.col(stage).quantile(q, "linear") * 1e3).alias(f"{name}:{k}_ms") for k, q in QUANTILES.items()
        ]
    keys = ["window"] + ([by] if by else [])
    return frame.with_columns(pl.col("window").dt.truncate(every)).group_by(keys).agg(aggs).sort(keys)


def goodput(timelines: pl.LazyFrame, slo: Slo) -> dict:
    """Requests meeting every target, per second of the log; which stage made the others miss.

    The culprit is the stage whose mean grows most from requests that met the targets to those
    that missed (``excess_ms``): the time the misses spent there beyond normal.
    """
    frame = _with_views(timelines).with_columns(_good=slo.met())
    parts = TTFT_PARTS + ("decode",)
    stats = (
        frame.select(
            pl.len().alias("requests"),
            pl.col("_good").sum().alias("good"),
            (pl.col("start").max() - pl.col("start").min()).alias("span_s"),
            *[
                (pl.col(s).filter(~pl.col("_good")).mean() - pl.col(s).filter(pl.col("_good")).mean()).alias(
                    s
                )
                for s in parts
            ],
        )
        .collect()
        .row(0, named=True)
    )
    span = stats["span_s"] or 0.0
    excess = {s: round(stats[s] * 1e3, 3) for s in parts if stats[s] is not None}
    missed = stats["requests"] - stats["good"]
    return {
        "targets": slo.to_dict(),
        "requests": stats["requests"],
        "good": stats["good"],
        "good_share": _num(stats["good"] / stats["requests"]) if stats["requests"] else None,
        "goodput_rps": _num(stats["good"] / span) if span > 0 else None,
        "missed": missed,
        "culprit": max(excess, key=excess.__getitem__) if missed and excess else None,
        "excess_ms": excess,
    }
