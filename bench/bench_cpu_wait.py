"""The engine middleware's CPU-wait sampler (middleware/cpu_wait.py): CPU per sample over a
process tree shaped like vLLM's on CPU (API server 12 threads -> engine core 13 -> worker 46, idle).

    python bench/bench_cpu_wait.py            # the code on sys.path
    PYTHONPATH=/old/tree python bench/bench_cpu_wait.py

Prints the threads sampled, the CPU-us of one sample and of one walk of the process tree (where
the code has one), and what the sampler costs a core at its ``INTERVAL`` and ``TREE_S``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

SHAPE = (12, 13, 46)  # threads of vLLM's API server, engine core and worker (ps -L, 2026-12-06)


def tree_level(level: int) -> None:
    """One level of the tree: its threads asleep, the next level its child."""
    for _ in range(SHAPE[level] - 1):
        threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
    if level + 1 < len(SHAPE):
        subprocess.Popen([sys.executable, __file__, "--level", str(level + 1)])
    time.sleep(3600)


def measure(pid: int, samples: int = 2000) -> None:
    from hopline.middleware import cpu_wait

    probe = cpu_wait.CpuWait(interval=3600.0)  # its own thread samples this process once, then sleeps
    time.sleep(0.5)
    probe.pid, probe._last = pid, {}  # sampled here instead, over the tree below ``pid``
    if hasattr(probe, "_fds"):
        probe._fds, probe._walked = {}, float("-inf")
    probe._sample()
    probe._sample()
    t = time.process_time()
    for _ in range(samples):
        probe._sample()
    per_sample = (time.process_time() - t) / samples
    per_walk = 0.0
    if hasattr(probe, "_walk"):
        t = time.process_time()
        for _ in range(samples // 10):
            probe._walk()
        per_walk = (time.process_time() - t) / (samples // 10)
    threads = len(probe._fds) if getattr(probe, "_fds", None) else len(probe._last)
    per_s = per_sample / cpu_wait.INTERVAL + per_walk / getattr(cpu_wait, "TREE_S", float("inf"))
    print(
        f"threads sampled {threads}; a sample {per_sample * 1e6:.0f} us; a tree walk {per_walk * 1e6:.0f} us;"
        f" {per_s * 100:.3f}% of a core"
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--level"]:
        tree_level(int(sys.argv[2]))
    root = subprocess.Popen([sys.executable, __file__, "--level", "0"])
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until the worker's threads are all there
            found = subprocess.run(["ps", "-e", "-o", "ppid=,nlwp="], capture_output=True, text=True).stdout
            if any(line.split()[1] == str(SHAPE[-1]) for line in found.splitlines() if line.split()):
                break
            time.sleep(0.1)
        measure(root.pid)
    finally:
        subprocess.run(["pkill", "-f", f"{os.path.basename(__file__)} --level"], check=False)
