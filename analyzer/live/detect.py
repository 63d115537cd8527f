"""The one place live detection reads the analysis.

``findings_now`` is all the live side knows of how findings are made: a frame of per-request
timeline rows (``analyzer.timelines``) in, the findings JSON dicts of the contract
(docs/contract.md) out, minor ones included (the live side weighs a finding by the users' time
since its onset, not over the whole horizon; see ``incidents.live_share``). When the detector
registry lands, this function becomes ``[f.to_dict() for f in detect_all(frame, ctx)]``.
"""

from __future__ import annotations

import polars as pl
from hopline.analyzer.report import analyze


def findings_now(frame: pl.DataFrame, window_s: float, scopes: tuple[str, ...]) -> list[dict]:
    """Every finding (shifts and pitfalls, minor ones too) on ``frame``, ``window_s`` windows,
    searched in ``scopes``."""
    if frame.height == 0:
        return []
    result = analyze(frame, window=f"{window_s:g}s", by=scopes)
    return result["findings"] + result["minor"]
