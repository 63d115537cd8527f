"""Where a change lives: the narrowest scope (step 4 of the method in ``findings.shifts``), one
cell of two attributes, and one change seen from several scopes said once (step 5)."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
from hopline.analyzer.findings.common import in_scope
from hopline.analyzer.findings.shifts.incidents import Change
from hopline.analyzer.findings.shifts.stats import (
    RANK_RESOLUTION_S,
    STATISTICS,
    Detection,
    ShiftConfig,
    after_change,
    detect,
    log_move,
    moved_at,
    split_z,
    z_threshold,
)

MAX_CELL_VALUES = 8  # a second scope attribute refines a hit only when it has at most this many values


def narrowest(
    found: list[Detection],
    tested: dict[str, list[str]],
    frames: dict[str, pl.DataFrame],
    cfg: ShiftConfig,
    dims: tuple[str, ...] = (),
    window_s: float = 0.0,
) -> list[Detection]:
    """For one stage: the scopes the change lives in (see module docstring, step 4).

    A dimension explains the change when some of its values moved and the others, seen on both
    sides of it, did not move even half as much (in log terms) at the same time; of several that
    do, the one whose values hold the others' change (``holding``). A change found
    in all traffic only is then ``confine``d along ``dims`` (default: the tested attributes).
    ``window_s``: a value that began with the change says nothing (``moved_at``).
    """
    overall = [d for d in found if not d.scope]
    candidates: list[list[Detection]] = []
    for dim, values in tested.items():
        hits = [d for d in found if dim in d.scope]
        hit_values = {d.scope[dim] for d in hits}
        if not hits or len(hit_values) == len(values):
            continue
        weakest = min(abs(math.log(d.factor_estimate)) for d in hits)
        others = [moved_at(frames[key({dim: v})], hits[0], cfg, window_s) for v in values if v not in hit_values]
        if any(r is None or r > weakest / 2 for r in others):
            continue
        candidates.append(hits)
    best = holding(candidates, frames, cfg, window_s)
    if best and (not overall or all(d.up == overall[0].up for d in best)):
        return best
    if overall:
        confined = [confine(d, dims or tuple(tested), frames, cfg, window_s) for d in overall]
        return [d for d, _ in confined]
    by_dim = [[d for d in found if dim in d.scope] for dim in tested]
    return next((hits for hits in by_dim if hits), [])


CONFINE_MIN_SIDE = 10  # a value's requests on each side of a known change, to say whether it moved


def confine(
    det: Detection, dims: tuple[str, ...], frames: dict[str, pl.DataFrame], cfg: ShiftConfig, window_s: float = 0.0
) -> tuple[Detection, float]:
    """A change of all traffic confined to one value of an attribute — when that value's requests
    moved at its time (a rank test at that one split, significant after a Bonferroni correction
    over the values tried) and every other value's did not move even half as much (in log terms) —
    as ``(its detection, z)``; else ``(det, 0)``. The time is known, only the scope is tested, so
    this needs ``CONFINE_MIN_SIDE`` requests a side, not ``min_side``: in a 20-second run a
    service of 90 requests is too small to be searched on its own, yet its change is plain.
    A value that began with the change (``moved_at`` with ``window_s``) cannot say it stayed put."""
    frame = frames[key({})]
    before, after = pl.col("start") < det.at, after_change(det)
    values = {dim: _seen_on_both_sides(frame, dim, before, after) for dim in dims if dim in frame.columns}
    z_crit = z_threshold(cfg.alpha, max(sum(len(v) for v in values.values()), 1))
    half = abs(math.log(det.factor_estimate)) / 2
    passed: list[Detection] = []
    for dim, vals in values.items():
        subs = {v: frame.filter(pl.col(dim).cast(pl.String) == v) for v in vals}
        moved = {v: moved_at(f, det, cfg, window_s) for v, f in subs.items()}
        hit = [v for v, r in moved.items() if r is not None and r > half]
        if len(vals) < 2 or len(hit) != 1 or any(r is None for r in moved.values()):
            continue
        sub = subs[hit[0]].filter(pl.col(det.stage).is_not_null())
        x = np.round(sub[det.stage].to_numpy() / RANK_RESOLUTION_S)
        k = sub.filter(before).height
        z = float(split_z(x[: sub.filter(before | after).height], np.array([k]))[0])
        if abs(z) < z_crit or (z > 0) != det.up:
            continue
        q = STATISTICS[det.statistic]
        b, a = sub.filter(before)[det.stage].to_numpy(), sub.filter(after)[det.stage].to_numpy()
        scope = {dim: hit[0]}
        frames[key(scope)] = subs[hit[0]]
        found = Detection(
            det.stage, scope, det.at, det.statistic, float(np.percentile(b, q) * 1e3),
            float(np.percentile(a, q) * 1e3), z, len(a), det.until, since=det.since,
        )  # fmt: skip
        passed.append(found)
    best = holding([[d] for d in passed], frames, cfg, window_s)
    return (best[0], best[0].z) if best else (det, 0.0)


def holding(
    candidates: list[list[Detection]],
    frames: dict[str, pl.DataFrame],
    cfg: ShiftConfig,
    window_s: float = 0.0,
) -> list[Detection]:
    """Of several attributes' scopes that each explain one change, the one that holds the others'
    (``holds``): a service's network rising in full on both replicas is not a replica's change
    because most of one replica's requests are that service's (its p50 moved, the other's did not).
    Among those no other holds (each holds the other: both), the most significant; ``[]`` for none."""
    if len(candidates) < 2:
        return candidates[0] if candidates else []
    frame = frames[key({})]
    pairs = [(i, j) for i in range(len(candidates)) for j in range(len(candidates)) if i != j]
    held = {(i, j): holds(candidates[i], candidates[j], frame, cfg, window_s) for i, j in pairs}
    kept = [
        c for i, c in enumerate(candidates) if not any(held[j, k] and not held[k, j] for j, k in pairs if k == i)
    ]
    return max(kept or candidates, key=lambda c: max(d.z**2 for d in c))  # none kept: a cycle, by z


def holds(
    a: list[Detection], b: list[Detection], frame: pl.DataFrame, cfg: ShiftConfig, window_s: float = 0.0
) -> bool:
    """Whether ``a``'s scopes hold ``b``'s change: ``b``'s requests outside them (the residual)
    did not move even half as much (in log terms) at ``b``'s time (``stayed``), or there are none
    (``b`` lies inside ``a``). A residual with fewer than ``CONFINE_MIN_SIDE`` requests a side
    cannot tell."""
    lead = max(b, key=lambda d: d.z**2)
    rest = residual(frame, [d.scope for d in b], [d.scope for d in a])
    if rest.height == 0:
        return True
    sides = rest.select(b=(pl.col("start") < lead.at).sum(), a=after_change(lead).sum()).row(0)
    return min(sides) >= CONFINE_MIN_SIDE and stayed(rest, lead, lead.factor_estimate, cfg, window_s)


def residual(
    frame: pl.DataFrame, inside: list[dict[str, str]], outside: list[dict[str, str]]
) -> pl.DataFrame:
    """The requests in any of the ``inside`` scopes and in none of the ``outside`` ones."""
    either = lambda scopes: pl.any_horizontal([in_scope(s) for s in scopes]).fill_null(False)  # noqa: E731
    return frame.filter(either(inside) & ~either(outside))


def stayed(
    rest: pl.DataFrame, change: Detection | Change, factor: float, cfg: ShiftConfig, window_s: float = 0.0
) -> bool:
    """Whether a residual's requests (``residual``) moved less than half as much (in log terms) as
    a change of ``factor`` did, at its time (``moved_at``): the test behind ``holds`` and
    ``explains``. A residual that began with the change cannot say (False)."""
    moved = moved_at(rest, change, cfg, window_s)  # type: ignore[arg-type]  # a Change has what it reads
    return moved is not None and _within(moved, abs(math.log(max(factor, 1e-9))) / 2)


def _seen_on_both_sides(frame: pl.DataFrame, dim: str, before: pl.Expr, after: pl.Expr) -> list[str]:
    """The values of ``dim`` with ``CONFINE_MIN_SIDE`` requests before and after a change."""
    sides = frame.group_by(pl.col(dim).cast(pl.String)).agg(b=before.sum(), a=after.sum())
    enough = pl.col(dim).is_not_null() & (pl.min_horizontal("b", "a") >= CONFINE_MIN_SIDE)
    return sorted(sides.filter(enough)[dim].to_list())


def cell(
    det: Detection,
    tested: dict[str, list[str]],
    frames: dict[str, pl.DataFrame],
    boundaries: np.ndarray,
    z_crit: float,
    cfg: ShiftConfig,
    within_s: float,
    window_s: float = 0.0,
) -> Detection:
    """``det`` (one attribute's value) confined to one cell of a second attribute when exactly one
    cell moved and the others, seen on both sides, did not move even half as much: the rule of
    ``narrowest`` one level down. The cell's own detection at the change (as significant as any)
    replaces ``det``; its frame lands in ``frames``. Else ``det`` itself."""
    if len(det.scope) != 1:
        return det
    ((dim, value),) = det.scope.items()
    scope_frame = frames[key(det.scope)]
    weakest = abs(math.log(det.factor_estimate))
    for other, values in tested.items():
        if other == dim or len(values) > MAX_CELL_VALUES:
            continue
        cells = {v: scope_frame.filter(pl.col(other).cast(pl.String) == v) for v in values}
        cells = {v: f for v, f in cells.items() if f.height >= 2 * cfg.min_side}
        if len(cells) < 2:
            continue  # the scope has one value of it (model follows service, say): nothing to refine
        moved = {v: moved_at(f, det, cfg, window_s) for v, f in cells.items()}
        if any(r is None for r in moved.values()):
            continue
        hit = [v for v, r in moved.items() if r > weakest / 2]
        if len(hit) != 1:
            continue
        order = list(tested)  # the scope's attributes in the order they are searched (replica first)
        scope = dict(sorted({dim: value, other: hit[0]}.items(), key=lambda kv: order.index(kv[0])))
        frame = cells[hit[0]]
        tested_frame = frame  # a seeded subsample beyond ``max_requests``, as for every scope
        if frame.height > cfg.max_requests:
            tested_frame = frame.sample(cfg.max_requests, seed=0).sort("start")
        t, x = tested_frame["start"].to_numpy(), tested_frame[det.stage].to_numpy()
        keep = ~np.isnan(x)
        near = [
            d
            for d in detect(t[keep], x[keep], boundaries, z_crit, cfg, det.stage, scope)
            if d.up == det.up and abs(d.at - det.at) <= within_s
        ]
        if near:
            frames[key(scope)] = frame
            best = min(near, key=lambda d: abs(d.at - det.at))
            best.after_n = round(best.after_n * frame.height / tested_frame.height)  # requests, not sampled
            return best
    return det


def explains(
    a: Change, b: Change, frame: pl.DataFrame, spread_s: float, cfg: ShiftConfig, window_s: float = 0.0
) -> bool:
    """Whether ``a``'s change holds ``b``'s: the same stage moving the same way while ``a``'s
    change lasts (``b``'s onset from ``spread_s`` before ``a``'s to ``a``'s end), and ``b``'s
    requests outside ``a``'s scope — the residual ``a`` does not explain — did not move even half
    as much (in log terms) at ``b``'s time, or are too few to tell (``b``'s scope lies inside
    ``a``'s) and the onsets are within ``spread_s``. Requests outside ``a`` that came with the
    change (a batch job that began it, too new to have a before) are measured against ``b``'s
    level before it: waiting like ``a``'s, they are the change's too. A correlated scope (a model mostly served by the replica that moved) seen moving
    later than the replica, as its share of moved requests grew, is held all the same."""
    if a.stage != b.stage or a.up != b.up or a.scope == b.scope or b.at < a.at - spread_s:
        return False
    if a.until is not None and b.at >= a.until:
        return False
    rest = residual(frame, [b.scope], [a.scope])
    after = rest.filter(after_change(b))  # type: ignore[arg-type]  # a Change has what after reads
    if after.height >= cfg.min_side and rest.filter(pl.col("start") < b.at - window_s).height < cfg.min_side:
        # requests outside ``a`` that came with the change (a batch job that began it): measured
        # against ``b``'s level before it, they show whether the change reached them too
        level = after[b.stage].quantile(STATISTICS[b.statistic] / 100, "linear")
        half = abs(math.log(max(b.factor, 1e-9))) / 2
        return level is None or _within(log_move(b.before_ms / 1e3, level, cfg), half)
    if min(rest.height - after.height, after.height) < cfg.min_side:
        return abs(a.at - b.at) <= spread_s  # too few to tell: held only when they began together
    return stayed(rest, b, b.factor, cfg, window_s)


def _within(moved: float, half: float) -> bool:
    """A residual's move (``log_move``) within half of the change's; from zero (``half`` infinite)
    only a residual that stayed at zero is."""
    return moved <= half if math.isfinite(half) else moved < half


def fold_explained(
    shifts: list[Change],
    frame: pl.DataFrame,
    order: list[str],
    spread_s: float,
    cfg: ShiftConfig,
    window_s: float = 0.0,
) -> list[Change]:
    """Step 4 across onsets: one change seen from several scopes at moments a few windows apart
    (a queue that builds up shows at 19:41:50 for service batch-eval, 19:41:59 on replica r2 and
    19:42:03 for all traffic) is said once, in the scope that holds it: a shift another one
    explains (``explains``) is dropped, unless it explains that one too; then the one with fewer
    requests stays, on a tie the one whose attribute is searched first (replica first)."""

    def rank(shift: Change) -> tuple[int, list[int]]:
        size = frame.filter(in_scope(shift.scope)).height
        return size, sorted(order.index(k) if k in order else len(order) for k in shift.scope)

    kept: list[Change] = []
    for b in shifts:
        others = (a for a in shifts if a is not b)
        if not any(
            explains(a, b, frame, spread_s, cfg, window_s)
            and (not explains(b, a, frame, spread_s, cfg, window_s) or rank(a) < rank(b))
            for a in others
        ):
            kept.append(b)
    return kept


def key(scope: dict[str, str]) -> str:
    return repr(sorted(scope.items()))
