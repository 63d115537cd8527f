"""What the event loop lag probe's tick costs, in instructions under callgrind (issue 39).

The probe's timer (``middleware/loop.py``) runs 20 times a second in every server hopline is in,
whatever its traffic. bench/tick_instructions.py runs the ticks back to back on a uvloop loop and
takes the instructions per tick, less those of a bare timer callback (uvloop's own work): what the
probe's code adds. It was 7.05k before the tick was cut on 2026-12-05 and is 2.8k since
(bench/README.md, "the loop lag probe's tick"); the bound fails on the code before.
"""

from __future__ import annotations

from support.callgrind import bench_figures

MAX_PROBE_PER_TICK = 4_000


def test_a_tick_of_the_lag_probe_costs_under_4k_instructions_over_the_loops_own():
    figures = bench_figures("tick_instructions.py")
    # the loop's own timer (uvloop, a counting callback): a sanity check of the harness
    assert 2_000 < figures["loop_per_tick"] < 20_000, figures
    assert 0 < figures["probe_per_tick"] <= MAX_PROBE_PER_TICK, figures
