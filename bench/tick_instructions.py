"""Instructions per tick of the event loop lag probe (``middleware/loop.py``), under callgrind.

    python bench/tick_instructions.py            # JSON: {"per_tick": ...}; PYTHONPATH=<dir holding
                                                 # an exported tree as hopline/> for another commit

The probe's timer is the one cost hopline has in a server whatever its traffic (20 ticks a
second). This runs ``LagProbe`` on a uvloop loop (vLLM's) with ``INTERVAL`` 0, so the ticks run
back to back, for 2,000 and for 12,000 ticks, each under ``valgrind --tool=callgrind``, and
divides the difference by the 10,000 ticks between them (the process start, the imports and the
loop's set-up cancel). A tick here includes the loop's own work to run a timer callback.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys


def ticks(n: int) -> None:
    import asyncio

    import uvloop
    from hopline.middleware.loop import LagProbe

    LagProbe.INTERVAL = 0.0

    async def main() -> None:
        done = asyncio.get_running_loop().create_future()
        probe = LagProbe(asyncio.get_running_loop())
        tick = probe._tick
        count = 0

        def counted() -> None:  # the same few instructions in both runs and for every version
            nonlocal count
            count += 1
            if count == n:
                probe.loop = lambda: None  # the next tick stops
                done.set_result(None)
            tick()

        probe._tick = counted  # the probe schedules self._tick: this instance attribute
        await done

    uvloop.run(main())


def instructions(n: int) -> int:
    run = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__, str(n)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return int(re.findall(r"Collected : (\d+)", run.stderr)[-1])


if __name__ == "__main__":
    if len(sys.argv) == 2:
        ticks(int(sys.argv[1]))
    else:
        small, large = instructions(2_000), instructions(12_000)
        print(json.dumps({"ticks": 10_000, "per_tick": (large - small) / 10_000}))
