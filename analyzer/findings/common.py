"""What several pitfall detectors share: milliseconds for evidence, the scopes a check is
judged in, the narrowest scope of its hits, and how a change in what callers asked for is said."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl
from hopline.analyzer.findings.model import Pitfall, iso_utc


def ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1e3, 2)


def in_scope(scope: dict[str, str]) -> pl.Expr:
    """Whether a request is in ``scope`` (every key equal to its value; ``{}``: all traffic)."""
    return pl.all_horizontal([pl.col(k).cast(pl.String) == v for k, v in scope.items()] or [pl.lit(True)])


def columns(frame: pl.DataFrame, *names: str) -> pl.DataFrame:
    """``frame`` with only those of ``names`` it has: a detector filters and groups the columns it
    reads, not the whole timelines (~80 columns)."""
    return frame.select(list(dict.fromkeys(n for n in names if n in frame.columns)))


def scoped(tl: pl.DataFrame, dim: str, min_requests: int) -> list[tuple[dict, pl.DataFrame]]:
    """``[({}, all)]`` plus one entry per value of ``dim`` with enough requests."""
    out = [({}, tl)]
    if dim in tl.columns:
        for (value,), part in tl.filter(pl.col(dim).is_not_null()).group_by(dim, maintain_order=True):
            if part.height >= min_requests:
                out.append(({dim: value}, part))
    return out


def narrow(hits: list[tuple[dict, Pitfall]], scopes: int) -> list[Pitfall]:
    """All-traffic finding when every value of the dimension (or only all traffic) is hit, else
    the values that are."""
    overall = [f for scope, f in hits if not scope]
    narrower = [f for scope, f in hits if scope]
    if narrower and len(narrower) < scopes - 1:
        return narrower
    return overall or narrower


@dataclass(frozen=True)
class Asked:
    """Requests that asked for one ``max_tokens``: how many, since when, their p50 output tokens."""

    max_tokens: int
    requests: int
    since: float
    output_tokens_p50: float


@dataclass(frozen=True)
class RequestedMix:
    """A change in what a caller asked for: requests asking max_tokens values it had not asked
    before (``new``, the first of them at ``at``), next to the values it asked all along (``kept``,
    their p50 output tokens before and after ``at``: ``kept_p50``). Longer answers that come from
    it are a mix change, said as one, never as the caller's answers (or decode) getting longer."""

    new: tuple[Asked, ...]
    kept: tuple[int, ...]
    kept_p50: tuple[float, float] | None

    @property
    def at(self) -> float:
        return min(a.since for a in self.new)

    @property
    def new_clause(self) -> str:
        """``the requests asking 160 tokens are new from 12:54:47 (329 requests, p50 160 tokens)``"""
        asked = " and ".join(str(a.max_tokens) for a in self.new)
        requests = sum(a.requests for a in self.new)
        p50 = " and ".join(f"{a.output_tokens_p50:,.0f}" for a in self.new)
        return (
            f"the requests asking {asked} tokens are new from {iso_utc(self.at)[11:19]} "
            f"({requests:,} request{'s' if requests != 1 else ''}, p50 {p50} tokens)"
        )

    @property
    def sentence(self) -> str:
        """``new_clause``, then the others as they were: ``...; the others ask 48 (p50 48 -> 48 tokens)``"""
        if not self.kept or self.kept_p50 is None:
            return self.new_clause
        before, after = self.kept_p50
        kept = " and ".join(str(m) for m in self.kept)
        return f"{self.new_clause}; the others ask {kept} (p50 {before:,.0f} -> {after:,.0f} tokens)"


def requested_mix(rows: pl.DataFrame, window_s: float, min_requests: int) -> RequestedMix | None:
    """How the requested ``max_tokens`` of ``rows`` (one caller's requests: ``start``,
    ``max_tokens``, ``output_tokens``) changed: the values first asked more than a window after
    its first request, by ``min_requests`` requests or more; None when none was."""
    asked = rows.filter(pl.col("max_tokens").is_not_null() & pl.col("start").is_not_null())
    if asked.height == 0:
        return None
    origin = asked["start"].min()
    per = asked.group_by("max_tokens").agg(
        first=pl.col("start").min(), requests=pl.len(), p50=pl.col("output_tokens").median()
    )
    new = per.filter((pl.col("first") > origin + window_s) & (pl.col("requests") >= min_requests)).sort("max_tokens")
    if new.height == 0:
        return None
    at = float(new["first"].min())
    asking = new.select("max_tokens", "requests", "first", "p50").iter_rows()
    others = asked.filter(~pl.col("max_tokens").is_in(new["max_tokens"].implode()))
    before, after = others.filter(pl.col("start") < at), others.filter(pl.col("start") >= at)
    kept = sorted(set(before["max_tokens"].to_list()) & set(after["max_tokens"].to_list()))
    like = pl.col("max_tokens").is_in(kept)
    p50 = before.filter(like)["output_tokens"].median(), after.filter(like)["output_tokens"].median()
    return RequestedMix(
        new=tuple(Asked(int(m), int(n), float(t), float(p or 0.0)) for m, n, t, p in asking),
        kept=tuple(int(m) for m in kept),
        kept_p50=None if None in p50 else (float(p50[0]), float(p50[1])),
    )
