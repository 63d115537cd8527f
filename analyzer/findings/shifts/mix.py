"""A change in the traffic is not a slowdown (step 8 of the method in ``findings.shifts``).

Prefill costs about the same per computed prompt token (prompt tokens less cached ones), and
decode per output token, whoever sends the request. When a stage's time rose in a scope while
its time per unit of work did not, the requests got bigger, not the component slower: a new
tenant's long documents on a model, a batch job asking longer answers. Such a change is said as
what it is (``model.MixChange``): the stage rose, per unit it held, and the traffic that came
with it (a value of a searched attribute that began at the change: a new service), never as a
shift of the engine's stage. Traffic new to the change's scope but not to the log (a service whose
conversations the router began sending to this replica too, by its choice or by the chance of
their keys) is said as new here, with where and since when it ran before (``elsewhere``): it is
no new service, and its requests took as long there.

The rule: the requests' size (p50 prompt tokens for prefill, cached or not; output tokens for
decode) grew by ``notable_change`` or more, and the stage per
unit moved less than ``MIX_SHARE`` of the stage's own rise, in log terms (a 1.8x prefill whose
per-token time rose 1.1x is a mix change; one whose per-token time rose 1.6x is the engine's).
Both are measured in the change's scope, before it (from the segment's start) and after it (to its
end). A rise with no unit column, or fewer than ``MIN_UNITS`` requests with one on a side, is
not judged.
"""

from __future__ import annotations

import math

import polars as pl
from hopline.analyzer.findings.common import in_scope
from hopline.analyzer.findings.model import iso_utc
from hopline.analyzer.findings.shifts.stats import STATISTICS, ShiftConfig

MIX_SHARE = 0.5  # per-unit rise below this share of the stage's rise (log terms): the mix
MIN_UNITS = 10  # requests with a unit, a side, to judge
NEW_BEFORE = 0.05  # a value with at most this many requests before per request after began with the change


def _units(stage: str, columns: list[str]) -> tuple[str, pl.Expr, str, pl.Expr] | None:
    """The unit of work of ``stage`` and each request's count of it, and the size of the request
    itself (what its sender chose), when ``columns`` have them. Prefill works on the prompt tokens
    the cache did not hold, but a request is as big as its whole prompt: a prompt whose cached
    share fell (``prefix_cache_miss``) is more work, not a bigger request."""
    if stage == "prefill" and "prompt_tokens" in columns:
        cached = pl.col("cached_tokens").fill_null(0) if "cached_tokens" in columns else pl.lit(0)
        prompt = pl.col("prompt_tokens").cast(pl.Float64)
        return "computed prompt token", prompt - cached, "prompt token", prompt
    if stage == "decode" and "output_tokens" in columns:
        output = (pl.col("output_tokens") - 1).cast(pl.Float64)
        return "output token", output, "output token", output
    return None


def mix_of(
    stage: str,
    at: float,
    until: float | None,
    statistic: str,
    before_ms: float,
    after_ms: float,
    frame: pl.DataFrame,
    dims: tuple[str, ...],
    cfg: ShiftConfig,
    since: float | None = None,
    scope: dict[str, str] | None = None,
    log: pl.DataFrame | None = None,
) -> dict | None:
    """What a rise of ``stage`` at ``at`` in ``frame`` (the requests of ``scope``) is when it is a
    change of the traffic: the per-unit figures and the new traffic (see the module), else None.
    ``log``: every request (where traffic new to the scope may have run before it)."""
    unit = _units(stage, frame.columns)
    if unit is None or after_ms <= before_ms or before_ms <= 0 or stage not in frame.columns:
        return None
    name, count, size_name, size = unit
    start = pl.col("start")
    lo = since if since is not None else -math.inf
    after_mask = (start >= at) & (start < (until if until is not None else math.inf))
    rows = frame.with_columns(count.alias("_units"), size.alias("_size")).filter(pl.col(stage).is_not_null())
    before = rows.filter((start >= lo) & (start < at))
    after = rows.filter(after_mask)
    with_units = pl.col("_units").is_not_null() & (pl.col("_units") >= 1)
    b, a = before.filter(with_units), after.filter(with_units)
    if b.height < MIN_UNITS or a.height < MIN_UNITS:
        return None
    q = STATISTICS[statistic] / 100
    per_unit = pl.col(stage) / pl.col("_units")
    unit_before = b.select(per_unit.quantile(q, "linear")).item()
    unit_after = a.select(per_unit.quantile(q, "linear")).item()
    size_before, size_after = b["_size"].median(), a["_size"].median()
    per = per_unit_if_mix(
        (name, size_name), (unit_before, unit_after), (size_before, size_after), (before_ms, after_ms), cfg
    )
    if per is None:
        return None
    return {
        "per_unit": per,
        "new_traffic": _new_traffic(
            before, after, stage, dims, at, until, _elsewhere(log, scope or {}, lo, at), tuple(scope or ())
        ),
    }


def per_unit_if_mix(
    names: tuple[str, str],
    units: tuple[float | None, float | None],
    sizes: tuple[float | None, float | None],
    stage_ms: tuple[float, float],
    cfg: ShiftConfig,
) -> dict | None:
    """The rule (see the module) on a rise of ``stage_ms`` (before, after): the ``per_unit``
    figures (``names``: the unit's and the size's, ``units``: seconds per unit, ``sizes``: the
    requests' p50 size, each before and after) when the requests got bigger and the stage per
    unit held, else None."""
    (unit_before, unit_after), (size_before, size_after) = units, sizes
    if not unit_before or not unit_after or not size_before or not size_after:
        return None
    if size_after / size_before < 1 + cfg.notable_change:
        return None  # the requests did not get bigger
    if math.log(unit_after / unit_before) >= MIX_SHARE * math.log(stage_ms[1] / stage_ms[0]):
        return None  # slower per unit of work: the component
    return {
        "unit": names[0],
        "before_ms": round(unit_before * 1e3, 6),
        "after_ms": round(unit_after * 1e3, 6),
        "size": names[1],
        "units_before": round(float(size_before), 1),
        "units_after": round(float(size_after), 1),
    }


def _elsewhere(log: pl.DataFrame | None, scope: dict[str, str], lo: float, at: float) -> pl.DataFrame | None:
    """The log's requests outside ``scope`` from ``lo`` to ``at`` (the same span as the segment
    before the change), or None when the scope is all traffic or the log is not given."""
    if log is None or not scope or any(dim not in log.columns for dim in scope):
        return None
    start = pl.col("start")
    return log.filter((start >= lo) & (start < at) & ~in_scope(scope).fill_null(False))


def _new_traffic(
    before: pl.DataFrame,
    after: pl.DataFrame,
    stage: str,
    dims: tuple[str, ...],
    at: float,
    until: float | None,
    elsewhere: pl.DataFrame | None = None,
    where: tuple[str, ...] = (),
) -> dict | None:
    """The value of a searched attribute that began with the change and carries the most of the
    stage's time after it (a new service), with its rate, size and share, and ``elsewhere``: where
    and since when it ran before (``_ran_elsewhere``) when it was not new to the log, else None.
    None when none began."""
    best = None
    for dim in dims:
        if dim not in after.columns:
            continue
        seen_before = before.group_by(dim).len().rename({"len": "before"})
        grouped = (
            after.group_by(dim)
            .agg(pl.len().alias("after"), pl.col(stage).sum().alias("time"), pl.col("_size").median().alias("units"),
                 pl.col("start").min().alias("since"))
            .join(seen_before, on=dim, how="left")
            .with_columns(pl.col("before").fill_null(0))
            .filter(pl.col(dim).is_not_null() & (pl.col("before") <= NEW_BEFORE * pl.col("after")))
        )  # fmt: skip
        for row in grouped.iter_rows(named=True):
            if best is None or row["time"] > best[1]["time"]:
                best = (dim, row)
    if best is None:
        return None
    dim, row = best
    total = after[stage].sum()
    span = (until if until is not None else after["start"].max()) - at
    return {
        "scope": {dim: str(row[dim])},
        "since": iso_utc(float(row["since"])),
        "requests_per_s": round(row["after"] / span, 3) if span > 0 else None,
        "units_p50": None if row["units"] is None else round(float(row["units"]), 1),
        "share": round(row["time"] / total, 4) if total else None,
        "elsewhere": _ran_elsewhere(elsewhere, dim, row[dim], row["after"], where),
    }


def _ran_elsewhere(
    elsewhere: pl.DataFrame | None, dim: str, value: object, after: int, where: tuple[str, ...]
) -> dict | None:
    """Where requests of ``dim`` = ``value`` ran before the change outside its scope (among
    ``elsewhere``; ``where``: the scope's attributes, each with its values there) and since when,
    when there were more of them than a new value may have before it (``NEW_BEFORE``); else None:
    the traffic is new to the log."""
    if elsewhere is None or dim not in elsewhere.columns:
        return None
    earlier = elsewhere.filter(pl.col(dim) == value)
    if earlier.height <= NEW_BEFORE * after:
        return None
    places = {
        other: sorted(str(v) for v in earlier[other].drop_nulls().unique())
        for other in where
        if other != dim and other in earlier.columns and earlier[other].drop_nulls().len()
    }
    return {"where": places, "since": iso_utc(float(earlier["start"].min()))} if places else None
