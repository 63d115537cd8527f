"""``stage_shift``: a stage's p50 (else p90) moved, found by a rank test at every window
boundary, in its narrowest scope, one incident per onset (the method: ``findings.shifts``).

``find_shifts`` runs every stage in every scope; ``StageShifts`` is it as a registered detector."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import polars as pl
from hopline.analyzer.findings.detector import Context, Detector
from hopline.analyzer.findings.model import Shift
from hopline.analyzer.findings.shifts.context import CONNECT_PARTS, connect_part, context_of
from hopline.analyzer.findings.shifts.incidents import Change, cap_reversals, clusters, incidents, part_explains
from hopline.analyzer.findings.shifts.mix import mix_of
from hopline.analyzer.findings.shifts.scopes import cell, fold_explained, key, narrowest
from hopline.analyzer.findings.shifts.stats import (
    SHIFT_STAGES,
    Detection,
    ShiftConfig,
    after_change,
    detect,
    excess_s,
    z_threshold,
)


@dataclass(frozen=True)
class Search:
    """What one run searches: the candidate change times, the scopes (all traffic first, then
    each value of each attribute with enough requests), the frame of each scope, the critical z."""

    frame: pl.DataFrame  # the requests with a start, sorted by it
    stages: list[str]
    boundaries: np.ndarray
    scopes: list[dict[str, str]]
    tested: dict[str, list[str]]  # attribute -> its values searched
    dims: tuple[str, ...]  # every scope attribute (a change of all traffic is confined along them)
    frames: ScopeFrames  # scope key -> its requests
    z_crit: float


def _search(frame: pl.DataFrame, window_s: float, dims: tuple[str, ...], cfg: ShiftConfig) -> Search:
    stages = [s for s in SHIFT_STAGES if frame[s].null_count() < frame.height]
    t_min, t_max = frame["start"].min(), frame["start"].max()
    boundaries = np.arange(math.floor(t_min / window_s) + 1, math.floor(t_max / window_s) + 1) * window_s
    scopes: list[dict[str, str]] = [{}]
    tested: dict[str, list[str]] = {}
    for dim in dims:
        counts = (
            frame.group_by(dim).len().filter(pl.col(dim).is_not_null() & (pl.col("len") >= 2 * cfg.min_side))
        )
        values = sorted(counts[dim].cast(pl.String).to_list())
        if len(values) >= 2:
            tested[dim] = values
            scopes += [{dim: v} for v in values]
    z_crit = z_threshold(cfg.alpha, len(scopes) * len(stages) * max(len(boundaries), 1))
    return Search(frame, stages, boundaries, scopes, tested, dims, ScopeFrames(frame, _scope_rows(frame, tested)), z_crit)


class ScopeFrames(dict):
    """Scope key -> its requests (in the frame's order, by start), gathered from the scope's row
    indices the first time it is asked for: the detection itself reads numpy columns only, and
    few scopes' frames are ever needed (a hit's, its dimension's other values)."""

    def __init__(self, frame: pl.DataFrame, rows: dict[str, np.ndarray]) -> None:
        super().__init__()
        self.frame = frame
        self.rows = rows

    def __missing__(self, scope_key: str) -> pl.DataFrame:
        rows = self.rows[scope_key]
        sub = self[scope_key] = self.frame if rows is None else self.frame[rows]
        return sub


def _scope_rows(frame: pl.DataFrame, tested: dict[str, list[str]]) -> dict[str, np.ndarray | None]:
    """Each searched scope's row indices in ``frame`` (ascending; None: all of them)."""
    rows: dict[str, np.ndarray | None] = {key({}): None}
    for dim, values in tested.items():
        grouped = frame.select(pl.col(dim).cast(pl.String)).with_row_index(_ROW).group_by(dim).agg(pl.col(_ROW))
        index = dict(zip(grouped[dim].to_list(), grouped[_ROW], strict=True))
        for value in values:
            rows[key({dim: value})] = index[value].to_numpy().astype(np.int64)
    return rows


_ROW = "__row"


def _detections(search: Search, cfg: ShiftConfig, seed: int) -> dict[str, list[Detection]]:
    """Every stage's detections in every scope (a seeded subsample of a scope beyond
    ``max_requests``), read as numpy columns of the rows of each scope."""
    rng = np.random.default_rng(seed)
    found: dict[str, list[Detection]] = {s: [] for s in search.stages}
    rows_of = search.frames.rows
    columns = {name: search.frame[name].to_numpy() for name in ("start", *search.stages)}
    for scope in search.scopes:
        rows = rows_of[key(scope)]
        height = search.frame.height if rows is None else len(rows)
        scale = 1.0
        if height > cfg.max_requests:
            scale = height / cfg.max_requests
            picked = np.sort(rng.choice(height, cfg.max_requests, replace=False))
            rows = picked if rows is None else rows[picked]
        starts = columns["start"] if rows is None else columns["start"][rows]
        for stage in search.stages:
            values = columns[stage] if rows is None else columns[stage][rows]
            keep = ~np.isnan(values)
            for det in detect(starts[keep], values[keep], search.boundaries, search.z_crit, cfg, stage, scope):
                det.after_n = round(det.after_n * scale)  # requests, not sampled ones
                found[stage].append(det)
    return found


def _changes(
    search: Search,
    found: dict[str, list[Detection]],
    window_s: float,
    cfg: ShiftConfig,
    complete_before: float | None = None,
) -> list[Change]:
    """Each stage's detections clustered by time, each cluster in its narrowest scope (a cell of
    two attributes where one moved), with what moved with it (the load up to ``complete_before``:
    see ``findings.detector.Context``)."""
    changes = []
    within_s = cfg.cluster_windows * window_s
    span = (float(search.frame["start"].min()), float(search.frame["start"].max()))
    if complete_before is not None:
        span = (span[0], min(span[1], complete_before))
    for dets in found.values():
        for group in clusters(dets, within_s):
            for hit in narrowest(group, search.tested, search.frames, cfg, search.dims, window_s):
                det = cell(
                    hit, search.tested, search.frames, search.boundaries, search.z_crit, cfg, within_s, window_s
                )
                frame = search.frames[key(det.scope)]
                changes.append(
                    Change(
                        det.stage,
                        det.scope,
                        det.at,
                        det.statistic,
                        det.before_ms,
                        det.after_ms,
                        det.z,
                        det.after_n,
                        context_of(frame, det, search.stages, cfg, span),
                        det.until,
                        connect_part(frame, det),
                        excess_s=_excess(frame, det),
                        mix=mix_of(
                            det.stage, det.at, det.until, det.statistic, det.before_ms, det.after_ms,
                            frame, search.dims, cfg, det.since, det.scope, search.frame,
                        ),  # fmt: skip
                    )
                )
    return changes


def _excess(frame: pl.DataFrame, det: Detection) -> float:
    """``stats.excess_s`` of the change's requests (all of its scope's, never a subsample) over
    the segment before it."""
    since = pl.col("start") >= (det.since if det.since is not None else -math.inf)
    before = frame.filter(since & (pl.col("start") < det.at))[det.stage].drop_nulls().to_numpy()
    after = frame.filter(after_change(det))[det.stage].drop_nulls().to_numpy()
    return excess_s(before, after)


# What the shift detector reads of a request (the rest of the timelines is left out before the
# frame is sorted and split by scope): its start, the stages, the scope attributes, and what
# ``context`` says moved with a change (end-to-end views, prompt and cached tokens, connect's parts).
READ_COLUMNS = (
    "start", *SHIFT_STAGES, "client_e2e", "gateway_e2e", "engine_e2e", "prompt_tokens", "cached_tokens", "output_tokens",
    "spec_acceptance_length",
    *(c for cols in CONNECT_PARTS.values() for c in cols),
)  # fmt: skip


def _read_columns(timelines: pl.DataFrame, dims: tuple[str, ...]) -> list[str]:
    wanted = dict.fromkeys((*READ_COLUMNS, *dims))
    return [c for c in timelines.columns if c in wanted]


def find_shifts(
    timelines: pl.DataFrame,
    window_s: float,
    dims: tuple[str, ...] = ("replica", "service", "model"),
    config: ShiftConfig = ShiftConfig(),
    seed: int = 0,
    complete_before: float | None = None,
) -> list[Change]:
    """Shifts in ``timelines`` (collected), each in its narrowest scope, largest impact first.

    ``window_s`` sets the candidate change times (window boundaries); ``dims`` the scopes
    searched besides all traffic; ``seed`` the subsample of scopes above ``max_requests``;
    ``complete_before``: see ``findings.detector.Context``.
    """
    cfg = config
    frame = timelines.select(_read_columns(timelines, dims)).filter(pl.col("start").is_not_null()).sort("start")
    if frame.height < 2 * cfg.min_side:
        return []
    search = _search(frame, window_s, dims, cfg)
    changes = _changes(search, _detections(search, cfg, seed), window_s, cfg, complete_before)
    spread = max(cfg.cluster_windows * window_s, cfg.onset_spread_s)
    changes = fold_explained(changes, frame, list(search.tested), spread, cfg, window_s)
    # a change of the traffic heads no incident: what it brought on for others (a queue) pages on its own
    # (unless a part of its stage rose with it: a thinking model's longer reasoning leads its decode)
    within = cfg.onset_windows * window_s
    mixes = [c for c in changes if c.mix is not None and not part_explains(c, changes, within)]
    leads = incidents([c for c in changes if c not in mixes], within) + mixes
    cap_reversals(leads)
    return sorted(leads, key=lambda s: (-abs(s.impact_s), s.at))


@dataclass(frozen=True)
class StageShifts(Detector):
    """A stage's p50 (else p90) moved, in its narrowest scope: ``find_shifts``."""

    name = "stage_shift"
    kind = "shift"
    needs = ("start",)
    config: ShiftConfig = ShiftConfig()

    @property
    def min_requests(self) -> int:  # type: ignore[override]
        return 2 * self.config.min_side  # find_shifts needs this many, on the two sides of a change

    def detect(self, frame: pl.DataFrame, ctx: Context) -> list[Shift]:
        found = find_shifts(
            frame, ctx.window_s, dims=ctx.scopes, config=self.config, seed=ctx.seed, complete_before=ctx.complete_before
        )
        return [change.finding() for change in found]
