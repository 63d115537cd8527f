"""``prefix_cache_miss``: a replica's prefix-cache hits fell, so its prefills now compute what its
cache used to hold. "prefix-cache hits on replica r2 fell from 78% to 6% at 10:05: requests that
used to land on r2 now land elsewhere (hits on the other replicas 40% → 60%)".

A request's hit share is ``cached_tokens / prompt_tokens`` (the engine's own count; the prefill
instance's where prefill and decode are disaggregated). Per replica (``prefill_replica`` in a P/D
log, else ``replica``), the split at a window boundary where the hit shares fell most clearly (the
shift detector's rank test, ``split_z``, Bonferroni over replicas × boundaries) is a change when
the share before was at least ``min_before`` and the share after at most ``max_ratio`` of it.
What changed is read from the other replicas at the same moment: when their hits held or rose,
the requests that shared a prefix are routed elsewhere now (a routing change); when every
replica's fell, the prompts stopped sharing a prefix (one finding, for all traffic).

"Prefill time saved by the cache" is per request ``cached_tokens`` × the replica's own prefill
rate (seconds per computed prompt token: the median of ``prefill / (prompt - cached)`` over its
requests before the change); the users' seconds the miss costs are what the requests after it
saved less than the mean before. It brings the replica's prefill rise with it (``brings_rise_of``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl
from hopline.analyzer.findings.detector import Context, Detector
from hopline.analyzer.findings.model import Pitfall, Scope, Shift, pitfall
from hopline.analyzer.findings.stats import split_z, z_threshold
from hopline.analyzer.findings.words import clock


@dataclass(frozen=True)
class Miss:
    """One replica's fall: the boundary ``at``, the token-weighted hit shares before and after."""

    value: str
    at: float
    z: float
    before: float
    after: float
    rows: pl.DataFrame  # the replica's requests, with ``hit``


@dataclass(frozen=True)
class PrefixCacheMiss(Detector):
    """Per replica, the clearest fall of its hit shares (see the module docstring)."""

    name = "prefix_cache_miss"
    kind = "pitfall"
    brings_rise_of = "prefill"
    needs = ("cached_tokens", "prompt_tokens", "prefill")
    # thresholds: requests on each side of the split; the hit share before (a cache that
    # mattered); the share after at most this share of the one before; family-wise alpha over
    # replicas x boundaries; falls this close on every replica are one change (in windows)
    min_side: int = 50
    min_before: float = 0.3
    max_ratio: float = 0.5
    alpha: float = 1e-3
    same_moment_windows: float = 2.0
    # the other replicas' hit share must rise this much (absolute) to say the requests moved there
    moved: float = 0.05

    def detect(self, frame: pl.DataFrame, ctx: Context) -> list[Pitfall]:
        dim = cache_dim(frame)
        rows = hit_rows(frame, dim)
        if rows.height < 2 * self.min_side:
            return []
        parts = [(v, p) for (v,), p in rows.group_by(dim, maintain_order=True) if p.height >= 2 * self.min_side]
        origin = float(rows["start"].min())
        tests = max(1, len(parts)) * max(1, int((rows["start"].max() - origin) / ctx.window_s))
        z_crit = z_threshold(self.alpha, tests)
        misses = [m for v, p in sorted(parts) if (m := self._fall(str(v), p, origin, ctx, z_crit)) is not None]
        if not misses:
            return []
        if rows[dim].n_unique() == 1 or (
            len(parts) > 1 and len(misses) == len(parts) and self._one_moment(misses, ctx)
        ):  # one replica served everything, or every replica fell at once: a change of all traffic
            return [self._finding({}, rows, misses, origin, ctx)]
        return [self._finding({dim: m.value}, rows, [m], origin, ctx) for m in misses]

    def _fall(self, value: str, part: pl.DataFrame, origin: float, ctx: Context, z_crit: float) -> Miss | None:
        """The clearest fall of ``part``'s hit shares at a window boundary, if it is one."""
        part = part.sort("start")
        t = part["start"].to_numpy()
        bounds = origin + ctx.window_s * np.arange(1, int((t[-1] - origin) / ctx.window_s) + 1)
        splits = np.searchsorted(t, bounds)
        keep = (splits >= self.min_side) & (splits <= len(t) - self.min_side)
        if not keep.any():
            return None
        splits, bounds = splits[keep], bounds[keep]
        z = split_z(np.round(part["hit"].to_numpy(), 3), splits)
        best = int(np.argmin(z))
        if z[best] > -z_crit:
            return None
        k = int(splits[best])
        before, after = share(part[:k]), share(part[k:])
        if before < self.min_before or after > self.max_ratio * before:
            return None
        return Miss(value, float(bounds[best]), float(z[best]), before, after, part)

    def _one_moment(self, misses: list[Miss], ctx: Context) -> bool:
        ats = [m.at for m in misses]
        return max(ats) - min(ats) <= self.same_moment_windows * ctx.window_s

    def _finding(self, scope: Scope, rows: pl.DataFrame, misses: list[Miss], origin: float, ctx: Context) -> Pitfall:
        at = min(m.at for m in misses)
        mine = rows if not scope else misses[0].rows
        before_rows, after_rows = mine.filter(pl.col("start") < at), mine.filter(pl.col("start") >= at)
        before, after = share(before_rows), share(after_rows)
        rate = prefill_rate(before_rows)
        saved_before = float(before_rows["cached_tokens"].mean()) * rate
        saved_after = after_rows["cached_tokens"].cast(pl.Float64) * rate
        lost = float((saved_before - saved_after).clip(0.0).sum())
        evidence = {
            "hit_share_before": round(before, 4),
            "hit_share_after": round(after, 4),
            "prefill_ms_per_1k_computed_tokens": round(rate * 1e6, 3),
            "prefill_saved_ms_before": round(saved_before * 1e3, 2),
            "prefill_saved_ms_after": round(float(saved_after.mean() or 0.0) * 1e3, 2),
            "lost_prefill_s": round(lost, 3),
        }
        if scope:
            (dim, value), = scope.items()
            others = rows.filter(pl.col(dim) != value)
            o_before, o_after = share(others.filter(pl.col("start") < at)), share(others.filter(pl.col("start") >= at))
            evidence |= {"others_hit_share_before": round(o_before, 4), "others_hit_share_after": round(o_after, 4)}
            where = f"on {dim.replace('_', ' ')} {value}"
            why = rerouted_or_not(value, o_before, o_after, self.moved)
        elif len(misses) == 1 and (dim := cache_dim(rows)) and rows[dim].n_unique() == 1:
            where = f"on {dim.replace('_', ' ')} {misses[0].value}, which served all traffic,"
            why = "the prompts no longer share their prefix"
        else:
            where, why = "on every replica", "the prompts no longer share their prefix"
        summary = (
            f"prefix-cache hits {where} fell from {before:.0%} to {after:.0%} at {clock(at)}: {why}; "
            f"the cache saved {saved_before * 1e3:,.0f} ms of prefill a request, now {evidence['prefill_saved_ms_after']:,.0f} ms"
        )
        return pitfall(self.name, scope, after_rows.height, evidence, summary, lost, "prefill", at=at)

    def brought(self, rise: Shift, frame: pl.DataFrame, ctx: Context) -> Scope | None:
        """This detector's finding in ``rise``'s scope (all traffic, or the replica's) that began
        within a couple of windows of it: the prefill rise is the miss's."""
        for found in self.detect(frame, ctx):
            same = found.scope == rise.scope or (found.scope and all(rise.scope.get(k) == v for k, v in found.scope.items()))
            if same and found.at is not None and abs(found.at - rise.at) <= self.same_moment_windows * ctx.window_s:
                return found.scope
        return None


def rerouted_or_not(value: str, before: float, after: float, moved: float) -> str:
    """Why ``value``'s hits fell, read from the other replicas' hit shares over the same moment:
    theirs rose (the requests that shared a prefix are routed there now), fell too, or held (the
    requests still on ``value`` no longer share a prefix its cache holds)."""
    seen = f"({before:.0%} → {after:.0%})"
    if after >= before + moved:
        return f"requests that used to land on {value} now land elsewhere (hits on the other replicas {seen[1:-1]})"
    if after < 0.8 * before:
        return f"the other replicas' hits fell too {seen}"
    return f"the other replicas' hits held {seen}: the requests on {value} no longer share a prefix its cache holds"


def cache_dim(frame: pl.DataFrame) -> str:
    """Where the cache that saves prefill lives: the prefill instance of a P/D log, else the replica."""
    if "prefill_replica" in frame.columns and frame["prefill_replica"].null_count() < frame.height:
        return "prefill_replica"
    return "replica"


def hit_rows(frame: pl.DataFrame, dim: str) -> pl.DataFrame:
    """Requests with a start, a replica and prompt and cached token counts, with their ``hit`` share."""
    return frame.filter(
        pl.col("start").is_not_null()
        & pl.col(dim).is_not_null()
        & (pl.col("prompt_tokens") > 0)
        & pl.col("cached_tokens").is_not_null()
    ).select(
        "start", "request_id", "prefill", "prompt_tokens", "cached_tokens", pl.col(dim).cast(pl.String),
        hit=(pl.col("cached_tokens") / pl.col("prompt_tokens")).clip(0.0, 1.0),
    )


def share(rows: pl.DataFrame) -> float:
    """Token-weighted hit share: cached prompt tokens over prompt tokens."""
    prompt = rows["prompt_tokens"].sum()
    return float(rows["cached_tokens"].sum() / prompt) if prompt else 0.0


def prefill_rate(rows: pl.DataFrame) -> float:
    """The replica's own prefill seconds per computed (uncached) prompt token: the median over
    ``rows`` (0 when none computed any)."""
    computed = pl.col("prompt_tokens") - pl.col("cached_tokens")
    rate = rows.filter((computed > 0) & pl.col("prefill").is_not_null()).select((pl.col("prefill") / computed).median()).item()
    return float(rate or 0.0)
