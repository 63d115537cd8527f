"""The engine's CPU wait (middleware/cpu_wait.py) on real processes: a busy child process that
shares its CPU with two others waits for it about two thirds of the time, and the share says so;
so does a busy grandchild (vLLM's forward passes run in the engine core's child); the same child
alone on a CPU waits far less; a process where nothing ran has no share."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

BURN = "while True: pass"
# A process that measures itself and the processes below it, all pinned to CPU ``cpu``: one busy
# process ``depth`` levels down (1: its child; 2: a child of an idle child); prints the share over
# the last 2 s, after ``settle`` s.
MEASURE = """
import json, os, subprocess, sys, time
from hopline.middleware.cpu_wait import CpuWait, _descendants
cpu, settle, nice, depth = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
os.sched_setaffinity(0, {cpu})
burn = [sys.executable, "-c", "while True: pass"]
for _ in range(depth - 1):  # an idle parent that waits on the rest
    burn = [sys.executable, "-c", f"import subprocess; subprocess.run({burn!r})"]
child = subprocess.Popen(["nice", "-n", str(nice), *burn], process_group=0)  # same session: one autogroup
deadline = time.monotonic() + 60
while len(_descendants(os.getpid())) < depth and time.monotonic() < deadline:
    time.sleep(0.05)  # the processes below have started before the probe first walks them
probe = CpuWait(interval=0.25, span=2.0)
time.sleep(settle)
print(json.dumps({"share": probe.share()}))
os.killpg(child.pid, 9)
"""

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/schedstat"), reason="Linux schedstat only")


def measured(cpu: int, burners: int, nice: int = 0, burners_nice: int = 0, depth: int = 1) -> float:
    """The share a busy child (``depth`` 2: grandchild) pinned to ``cpu`` (at ``nice``) waits, with
    ``burners`` other busy processes pinned there (at ``burners_nice``; not the measured process's
    children: they are not counted)."""
    others = [
        subprocess.Popen(
            ["nice", "-n", str(burners_nice), sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\n{BURN}"],
            stdout=subprocess.DEVNULL,
        )
        for _ in range(burners)
    ]
    try:
        time.sleep(0.3)
        out = subprocess.run(
            [sys.executable, "-c", MEASURE, str(cpu), "3.0", str(nice), str(depth)], capture_output=True, text=True, timeout=60, check=True
        )
    finally:
        for proc in others:
            proc.kill()
            proc.wait()
    return json.loads(out.stdout)["share"]


def test_a_busy_child_sharing_its_cpu_with_two_others_waits_most_of_the_time():
    cpu = max(os.sched_getaffinity(0))
    crowded = measured(cpu, burners=2)
    # three busy processes on one CPU: each runs a third of the time; other load only adds
    assert crowded >= 0.5, crowded
    # the less of the CPU it is given, the more it waits, whatever else runs on the host: behind
    # two busy processes of higher priority it waits nearly always; ahead of two of lower
    # priority, only for what the host's other work takes
    behind = measured(cpu, burners=2, nice=19)
    ahead = measured(cpu, burners=2, burners_nice=19)
    assert behind >= 0.9 and ahead < behind, (ahead, behind)


def test_a_busy_grandchild_is_measured_as_the_child_is():
    # vLLM's API server -> engine core -> worker: the worker, two levels down, runs the forward passes
    cpu = max(os.sched_getaffinity(0))
    assert measured(cpu, burners=2, depth=2) >= 0.5


IDLE = """
import json, time
from hopline.middleware.cpu_wait import CpuWait
probe = CpuWait(interval=0.1, span=0.5)
time.sleep(0.8)
print(json.dumps({"available": probe.available, "share": probe.share()}))
"""


def test_no_share_where_nothing_ran():
    # a fresh process without children that sleeps: the probe's own reads are far under MIN_BUSY_S
    out = subprocess.run([sys.executable, "-c", IDLE], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(out.stdout) == {"available": True, "share": None}
