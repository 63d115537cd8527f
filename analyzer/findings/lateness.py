"""Whose own lateness a finding's time is: a busy process that measures, not the wire.

Every hopline component that runs on an asyncio loop measures how late its loop runs (a probe
due every 50 ms, ``middleware.loop``): the client when it reads the first token
(``client_read_lag_s``), the gateway and the engine when their middleware takes a request in
(``gateway_loop_lag_s``, ``engine_loop_lag_s``). Time a late loop adds lands in the remainder of
the stage table, ``network``, since no endpoint stamps it. A rise of that remainder which the
loops' lateness accounts for is not the network's: it is the side whose loop was late (a busy
engine API server is the engine's; a busy caller is the client's), and the time before the
caller sent its request (``client_delay``) is the caller's own by definition.

``explained`` answers for one finding, from the per-request timeline rows: which side's lateness
accounts for at least ``SHARE`` of its time (of a rise: of the rise; of a standing condition: of
its level), or None. Each request's lateness counts at most its own network time (a probe's
lateness bounds how late a request was taken, it is not a measure of it).
"""

from __future__ import annotations

import polars as pl
from hopline.analyzer.findings.model import Finding, Pitfall, Shift

LAG_COLUMNS = {"client": "client_read_lag_s", "gateway": "gateway_loop_lag_s", "engine": "engine_loop_lag_s"}
REMAINDERS = ("network", "upstream_network")  # the stages a late loop's time lands in
OWN_LATENESS = {"client_delay": "client"}  # stages that are one side's lateness by definition
SHARE = 0.5
MIN_REQUESTS = 10


def _in_scope(scope: dict[str, str]) -> pl.Expr:
    return pl.all_horizontal(pl.lit(True), *[pl.col(k).cast(pl.String) == v for k, v in scope.items()])


def _lags(rows: pl.DataFrame, stage: str) -> dict[str, float]:
    """Per side: the median over ``rows`` of its loop lateness, each request's capped at its own
    ``stage`` time (seconds); sides without the column are left out."""
    present = {side: col for side, col in LAG_COLUMNS.items() if col in rows.columns}
    if not present or rows.height == 0:
        return {}
    capped = {
        side: pl.min_horizontal(pl.col(col).fill_null(0.0), pl.col(stage).clip(lower_bound=0.0)).median()
        for side, col in present.items()
    }
    values = rows.select(**capped).row(0, named=True)
    return {side: float(v or 0.0) for side, v in values.items()}


def explained(finding: Finding, frame: pl.DataFrame) -> str | None:
    """The side whose own loop lateness accounts for ``finding``'s time, else None (see the
    module doc)."""
    if isinstance(finding, Shift):
        if finding.stage in OWN_LATENESS:
            return OWN_LATENESS[finding.stage] if finding.up else None
        if finding.stage not in REMAINDERS or not finding.up or finding.stage not in frame.columns:
            return None
        rows = frame.filter(_in_scope(finding.scope).fill_null(False) & pl.col(finding.stage).is_not_null())
        before = _lags(rows.filter(pl.col("start") < finding.at), finding.stage)
        after_rows = rows.filter(pl.col("start") >= finding.at)
        if finding.until is not None:
            after_rows = after_rows.filter(pl.col("start") < finding.until)
        after = _lags(after_rows, finding.stage)
        if after_rows.height < MIN_REQUESTS or not after:
            return None
        rise = {side: (after[side] - before.get(side, 0.0)) * 1e3 for side in after}
        return _decide(rise, finding.after_ms - finding.before_ms)
    if isinstance(finding, Pitfall) and finding.spent_in in REMAINDERS and finding.spent_in in frame.columns:
        stage = finding.spent_in
        rows = frame.filter(_in_scope(finding.scope).fill_null(False) & pl.col(stage).is_not_null())
        if rows.height < MIN_REQUESTS:
            return None
        level = _lags(rows, stage)
        total = rows[stage].median()
        return _decide({side: v * 1e3 for side, v in level.items()}, float(total or 0.0) * 1e3)
    return None


def _decide(parts_ms: dict[str, float], total_ms: float) -> str | None:
    if total_ms <= 0 or not parts_ms:
        return None
    if sum(max(v, 0.0) for v in parts_ms.values()) < SHARE * total_ms:
        return None
    return max(parts_ms, key=parts_ms.__getitem__)
