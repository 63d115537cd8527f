"""Whose own lateness a finding's time is: a busy process that measures, not the wire.

Every hopline component that runs on an asyncio loop measures how late its loop runs (a probe
due every 50 ms, ``middleware.loop``): the client when it reads the first token
(``client_read_lag_s``), the gateway and the engine when their middleware takes a request in
(``gateway_loop_lag_s``, ``engine_loop_lag_s``). Time a late loop adds lands in the remainder of
the stage table, ``network``, since no endpoint stamps it. A rise of that remainder which the
loops' lateness accounts for is not the network's: it is the side whose loop was late (a busy
engine API server is the engine's; a busy caller is the client's), and the time before the
caller sent its request (``client_delay``) is the caller's own by definition.

The engine's host is measured the same way (``middleware.cpu_wait``): the share of the time the
engine's processes were runnable that they spent waiting for a CPU (``engine_cpu_wait``, on
``engine.last``). A compute-bound step that gets a share ``1 - w`` of the CPU it asks for takes
``1 / (1 - w)`` as long, so a rise of prefill or decode that the rise of that wait accounts for
(``(1 - w_before) / (1 - w_after)`` against the stage's own factor) is the host's (``host``):
other work took the engine's CPUs, the engine did not get slower.

``explained`` answers for one finding, from the per-request timeline rows: which side's lateness
accounts for at least ``SHARE`` of its time (of a rise: of the rise; of a standing condition: of
its level), or None. Each request's lateness counts at most its own network time (a probe's
lateness bounds how late a request was taken, it is not a measure of it).
"""

from __future__ import annotations

import polars as pl
from hopline.analyzer.findings.common import in_scope
from hopline.analyzer.findings.model import Finding, Pitfall, Shift

LAG_COLUMNS = {"client": "client_read_lag_s", "gateway": "gateway_loop_lag_s", "engine": "engine_loop_lag_s"}
REMAINDERS = ("network", "upstream_network")  # the stages a late loop's time lands in
OWN_LATENESS = {"client_delay": "client"}  # stages that are one side's lateness by definition
HOST_COLUMN = "engine_cpu_wait"
HOST_STAGES = ("prefill", "decode")  # the engine's compute: as slow as the CPU it gets
SHARE = 0.5
MIN_REQUESTS = 10
MIN_CPU_SHARE = 0.05  # 1 - the wait: a host that leaves the engine less is "all of it"
EXPLAINED_STAGES = (*REMAINDERS, *HOST_STAGES)  # the stages whose rise a side's lateness can explain


def capped(col: str, stage: str) -> str:
    """The column of ``col``'s lateness already capped at each request's own ``stage`` time, where
    a frame has no requests to cap it on: the collectors' window summaries keep the capped values'
    quantiles (``collector/windows.py``), and a frame of pseudo-requests made of them carries them."""
    return f"{col}@{stage}"


# what window summaries keep of all this: each side's lateness capped at each remainder, the host's wait
MEASURED = (*(capped(col, stage) for stage in REMAINDERS for col in LAG_COLUMNS.values()), HOST_COLUMN)


def _measured(rows: pl.DataFrame, stage: str, col: str) -> bool:
    return col in rows.columns or capped(col, stage) in rows.columns


def _medians(rows: pl.DataFrame, stage: str, col: str) -> tuple[float, float, int]:
    """Over the requests of ``rows`` that measured ``col``: the median of ``stage`` and of the
    loop lateness (each request's capped at its own ``stage`` time: ``capped`` where the frame
    has it so), seconds, and their count."""
    pre = capped(col, stage)
    if pre in rows.columns:
        seen, late_ = rows.filter(pl.col(pre).is_not_null()), pl.col(pre)
    else:
        seen = rows.filter(pl.col(col).is_not_null())
        late_ = pl.min_horizontal(pl.col(col), pl.col(stage).clip(lower_bound=0.0))
    if seen.height == 0:
        return 0.0, 0.0, 0
    total, late = seen.select(pl.col(stage).median(), late_.median()).row(0)
    return float(total or 0.0), float(late or 0.0), seen.height


def explained(finding: Finding, frame: pl.DataFrame) -> str | None:
    """The side whose own loop lateness accounts for ``finding``'s time, else None (see the
    module doc): per side, over the requests that measured its lateness, the rise of the capped
    lateness against the rise of the stage (a shift), or their levels (a standing pitfall)."""
    if isinstance(finding, Shift):
        if finding.stage in OWN_LATENESS:
            return OWN_LATENESS[finding.stage] if finding.up else None
        stage = finding.stage
        if stage not in (*REMAINDERS, *HOST_STAGES) or not finding.up or stage not in frame.columns:
            return None
        rows = frame.filter(in_scope(finding.scope).fill_null(False) & pl.col(stage).is_not_null())
        before = rows.filter(pl.col("start") < finding.at)
        after = rows.filter(pl.col("start") >= finding.at)
        if finding.until is not None:
            after = after.filter(pl.col("start") < finding.until)
        if stage in HOST_STAGES:
            return _decide(host_part(before, after, stage))
        parts = {}
        for side, col in LAG_COLUMNS.items():
            if not _measured(rows, stage, col):
                continue
            total_0, late_0, n_0 = _medians(before, stage, col)
            total_1, late_1, n_1 = _medians(after, stage, col)
            if min(n_0, n_1) >= MIN_REQUESTS and total_1 > total_0:
                parts[side] = (late_1 - late_0) / (total_1 - total_0)
        return _decide(parts)
    if isinstance(finding, Pitfall) and finding.spent_in in frame.columns:
        found = level(frame.filter(in_scope(finding.scope).fill_null(False)), finding.spent_in)
        return None if found is None else found[0]
    return None


def told(finding: Finding, frame: pl.DataFrame) -> bool:
    """Whether ``frame`` still holds what ``explained`` weighs ``finding`` on: ``MIN_REQUESTS`` of
    its scope's requests with its stage from before its onset (a frame of the recent requests loses
    them as the onset ages, and ``explained`` then says None for want of them, not because no
    side's lateness accounts for it). True for a finding it never explains."""
    if not isinstance(finding, Shift) or finding.stage not in EXPLAINED_STAGES or not finding.up:
        return True
    if finding.stage not in frame.columns or "start" not in frame.columns:
        return False
    before = in_scope(finding.scope).fill_null(False) & pl.col(finding.stage).is_not_null() & (pl.col("start") < finding.at)
    return frame.select(before.sum()).item() >= MIN_REQUESTS


def host_part(before: pl.DataFrame, after: pl.DataFrame, stage: str) -> dict[str, float]:
    """``{"host": share}``: how much of ``stage``'s rise (its median's factor - 1) the rise of
    the engine's CPU wait accounts for, over the requests that measured it (see the module doc);
    empty when too few did or neither rose."""
    if HOST_COLUMN not in before.columns:
        return {}
    medians = []
    for rows in (before, after):
        seen = rows.filter(pl.col(HOST_COLUMN).is_not_null())
        if seen.height < MIN_REQUESTS:
            return {}
        medians.append(seen.select(pl.col(stage).median(), pl.col(HOST_COLUMN).median()).row(0))
    (t_0, w_0), (t_1, w_1) = medians
    if not t_0 or not t_1 or t_1 <= t_0 or w_1 is None or w_0 is None or w_1 <= w_0:
        return {}
    expected = (1.0 - w_0) / max(1.0 - w_1, MIN_CPU_SHARE)
    return {"host": (expected - 1.0) / (t_1 / t_0 - 1.0)}


# what a late side's share of a finding's time is, said after its sentence (``said``)
SAID = {
    "client": "the caller took it in late (its own event loop or threads ran late), not the wire",
    "gateway": "the gateway's server took the requests in late (its event loop ran late), not the wire",
    "engine": "the engine's API server took the requests in late (its event loop ran late), not the wire",
}


def said(finding: Finding, side: str | None) -> str:
    """The clause that says whose lateness ``finding``'s time is (``explained``'s ``side``), for
    a finding of a remainder stage (network time no endpoint stamps) or of the engine's compute
    that its host's CPU wait accounts for; '' otherwise."""
    stage = finding.stage if isinstance(finding, Shift) else getattr(finding, "spent_in", None)
    if side == "host" and stage in HOST_STAGES:
        return "; mostly the engine's host being busy (its processes waited longer for a CPU), not a slower engine"
    if side is None or side not in SAID:
        return ""
    return f"; mostly {SAID[side]}" if stage in REMAINDERS else ""


def level(rows: pl.DataFrame, stage: str) -> tuple[str, float] | None:
    """The side whose loop lateness accounts for at least ``SHARE`` of ``stage``'s level over
    ``rows`` (a standing condition), with that lateness' median in ms; None when none does."""
    if stage not in REMAINDERS or stage not in rows.columns:
        return None
    shares, late_ms = {}, {}
    for side, col in LAG_COLUMNS.items():
        if _measured(rows, stage, col):
            total, late, n = _medians(rows.filter(pl.col(stage).is_not_null()), stage, col)
            if n >= MIN_REQUESTS and total > 0:
                shares[side], late_ms[side] = late / total, late * 1e3
    side = _decide(shares)
    return None if side is None else (side, late_ms[side])


def _decide(shares: dict[str, float]) -> str | None:
    """The side whose lateness accounts for at least ``SHARE`` of the time (the largest). A side
    accounts for all of it at most: of sides that each account for all of it (processes busy
    together: one host, one loop), the first in ``LAG_COLUMNS``' order, the caller's before the
    servers' (a rise the caller's own lateness accounts for whole is not the serving's doing)."""
    if not shares:
        return None
    whole = {side: min(share, 1.0) for side, share in shares.items()}
    side = max(whole, key=whole.__getitem__)
    return side if whole[side] >= SHARE else None
