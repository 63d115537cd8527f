"""The one place live detection reads the analysis: the same detector registry as
``hopline analyze`` (``findings.rank.find``), so live and offline say the same sentence about the
same incident.

``findings_now`` takes a frame of per-request timeline rows (``analyzer.timelines``) and returns
the findings as typed values (``findings.model``), minor ones included (the live side
weighs a finding by the users' time since its onset, not over the whole horizon; see
``incidents.live_share``).
"""

from __future__ import annotations

import polars as pl
from hopline.analyzer.findings.detector import Context, scopes_to_search
from hopline.analyzer.findings.model import Finding
from hopline.analyzer.findings.rank import find


def findings_now(
    frame: pl.DataFrame, window_s: float, scopes: tuple[str, ...], complete_before: float | None = None
) -> list[Finding]:
    """Every finding (shifts and pitfalls, minor ones too) on ``frame``, ``window_s`` windows,
    searched in ``scopes`` (plus the attributes ``hopline analyze`` adds by itself);
    ``complete_before``: see ``findings.detector.Context``."""
    if frame.height == 0:
        return []
    ctx = Context(window_s=window_s, scopes=scopes_to_search(frame, scopes), complete_before=complete_before)
    decided = find(frame, ctx)
    return [*decided.findings, *decided.minor]
