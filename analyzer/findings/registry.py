"""The detectors, registered in one place, and ``detect_all`` to run them on a frame.

``REGISTRY`` is the one list of what ``hopline analyze`` looks for: the shift detector, then the
pitfalls in the order the README explains them. A new detector is one module (a ``Detector``
that owns its thresholds and its wording) and one line here.

The shift detector's method on collectors' window summaries (``findings/shifts/windows.py``) is
reached here too, by ``hopline watch --collector`` (``live/windowed.py``): ``find_window_shifts``,
the ``WindowSeries`` it reads (``ALL``: all traffic's key; ``TIMINGS``: the users' views) and
``bin_quantiles``, with ``ShiftConfig`` and ``SHIFT_STAGES``.
"""

from __future__ import annotations

import polars as pl
from hopline.analyzer.findings.detector import Context, Detector
from hopline.analyzer.findings.failover import Failover
from hopline.analyzer.findings.long_prefill_stall import LongPrefillStall
from hopline.analyzer.findings.model import Finding
from hopline.analyzer.findings.new_connection_per_request import NewConnectionPerRequest
from hopline.analyzer.findings.no_max_tokens import NoMaxTokens
from hopline.analyzer.findings.prefix_cache_miss import PrefixCacheMiss
from hopline.analyzer.findings.shifts.detector import StageShifts
from hopline.analyzer.findings.shifts.windows import (
    ALL,
    SHIFT_STAGES,
    TIMINGS,
    ShiftConfig,
    WindowSeries,
    bin_quantiles,
    find_window_shifts,
)
from hopline.analyzer.findings.user_vs_engine_gap import UserVsEngineGap
from hopline.analyzer.findings.verbose_outputs import VerboseOutputs

__all__ = [
    "ALL",
    "REGISTRY",
    "SHIFT_STAGES",
    "TIMINGS",
    "Context",
    "Detector",
    "ShiftConfig",
    "WindowSeries",
    "bin_quantiles",
    "detect_all",
    "find_window_shifts",
]

REGISTRY: tuple[Detector, ...] = (
    StageShifts(),
    UserVsEngineGap(),
    NewConnectionPerRequest(),
    LongPrefillStall(),
    NoMaxTokens(),
    VerboseOutputs(),
    Failover(),
    PrefixCacheMiss(),
)


def detect_all(frame: pl.DataFrame, ctx: Context, registry: tuple[Detector, ...] = REGISTRY) -> list[Finding]:
    """Every finding of every detector that can run on ``frame`` (enough requests, the columns it
    needs), in registry order, each detector's in its own order. Undecided: no relations, no
    ``share_of_users_time``, no ranking (``rank.decide``)."""
    return [finding for d in registry if d.runs_on(frame) for finding in d.detect(frame, ctx)]
