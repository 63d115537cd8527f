"""Instructions per tick of the event loop lag probe (``middleware/loop.py``), under callgrind.

    python bench/tick_instructions.py     # JSON: {"per_tick", "loop_per_tick", "probe_per_tick"};
                                          # PYTHONPATH=<dir holding an exported tree as hopline/>
                                          # for another commit

The probe's timer is the one cost hopline has in a server whatever its traffic (20 ticks a
second). This runs ``LagProbe`` on a uvloop loop (vLLM's) with ``INTERVAL`` 0, so the ticks run
back to back, for 1,000 and for 6,000 ticks, each under ``valgrind --tool=callgrind``, and
divides the difference by the 5,000 ticks between them (the process start, the imports and the
loop's set-up cancel): ``per_tick``. ``loop_per_tick`` is the same for a bare callback that only
counts and schedules itself again with ``call_later`` (uvloop's own work to run a timer), and
``probe_per_tick`` the difference: what the probe's code adds (tests/middleware/test_tick_cost.py
bounds it).
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


def bare(n: int) -> None:
    import asyncio

    import uvloop

    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        count = 0

        def tick() -> None:
            nonlocal count
            count += 1
            if count == n:
                done.set_result(None)
                return
            loop.call_later(0.0, tick)

        loop.call_later(0.0, tick)
        await done

    uvloop.run(main())


def instructions(*args: str) -> int:
    run = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__, *args],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return int(re.findall(r"Collected : (\d+)", run.stderr)[-1])


if __name__ == "__main__":
    if len(sys.argv) == 2:
        ticks(int(sys.argv[1]))
    elif len(sys.argv) == 3 and sys.argv[1] == "bare":
        bare(int(sys.argv[2]))
    else:
        per_tick = (instructions("6000") - instructions("1000")) / 5_000
        loop = (instructions("bare", "6000") - instructions("bare", "1000")) / 5_000
        print(json.dumps({"ticks": 5_000, "per_tick": per_tick, "loop_per_tick": loop, "probe_per_tick": per_tick - loop}))
