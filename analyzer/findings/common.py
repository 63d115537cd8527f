"""What several pitfall detectors share: milliseconds for evidence, the scopes a check is
judged in, and the narrowest scope of its hits."""

from __future__ import annotations

import polars as pl
from hopline.analyzer.findings.model import Pitfall


def ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1e3, 2)


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
