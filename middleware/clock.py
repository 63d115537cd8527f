"""Wall-clock timestamps that never jump: one anchor per process plus ``perf_counter`` deltas.

``now()`` is what every hopline emitter stamps events with. The wall clock is read once, when
this module is imported; afterwards time advances with the monotonic ``perf_counter``, so an
NTP step in the middle of a request cannot make a stage negative. (Across processes and hosts
clocks still differ, which is why stages only subtract timestamps of one component.)

On Linux ``perf_counter`` is ``CLOCK_MONOTONIC``, shared by every process of the machine, so a
child forked after import keeps a valid anchor.
"""

from __future__ import annotations

import time

_perf = time.perf_counter


def _anchor() -> float:
    """The offset from ``perf_counter`` to epoch seconds, read between two ``perf_counter`` calls.

    Taking the midpoint of the two readings halves the error a preemption between the calls
    could add.
    """
    before = _perf()
    wall = time.time()
    after = _perf()
    return wall - (before + after) / 2


# Epoch seconds minus perf_counter seconds, fixed for the life of the process:
# ``now() == OFFSET + time.perf_counter()`` (the emitter's hot path inlines exactly that).
OFFSET = _anchor()


def now() -> float:
    """Unix epoch seconds: the process's wall-clock anchor plus the monotonic time since."""
    return OFFSET + _perf()


def from_perf(perf_value: float) -> float:
    """Turn a ``time.perf_counter()`` reading taken in this process into epoch seconds."""
    return OFFSET + perf_value
