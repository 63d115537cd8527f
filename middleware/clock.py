"""Wall-clock timestamps that never jump: one anchor per process plus ``perf_counter`` deltas.

``now()`` is what every hopline emitter stamps events with. The wall clock is read once, when
this module is imported; afterwards time advances with the monotonic ``perf_counter``, so an
NTP step in the middle of a request cannot make a stage negative. (Across processes and hosts
clocks still differ, which is why stages only subtract timestamps of one component.)
"""

from __future__ import annotations

import time

_perf = time.perf_counter
_ANCHOR_PERF = _perf()
_ANCHOR_WALL = time.time()
_OFFSET = _ANCHOR_WALL - _ANCHOR_PERF


def now() -> float:
    """Unix epoch seconds: the process's wall-clock anchor plus the monotonic time since."""
    return _OFFSET + _perf()


def from_perf(perf_value: float) -> float:
    """Turn a ``time.perf_counter()`` reading taken in this process into epoch seconds."""
    return _OFFSET + perf_value
