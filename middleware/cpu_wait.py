"""How long the engine waited for a CPU: a busy host, told apart from a slower engine.

A CPU engine's decode (and a GPU engine's scheduler, detokenizer and API server) runs as fast as
the host gives it a CPU. When other work takes the CPUs, each forward pass waits for one and the
engine's decode slows although nothing in the engine changed. Linux counts that wait per thread:
``/proc/<pid>/task/<tid>/schedstat`` holds the time the thread ran and the time it was runnable
but waited for a CPU (the scheduler's ``run_delay``), in nanoseconds.

``CpuWait`` is one daemon thread per process (``cpu_wait_probe``; a forked child starts its own)
that every ``INTERVAL`` s adds up, over this process's threads and those of every process below
it (vLLM's engine core runs in a child of its API server, and its forward passes in a worker
process, the engine core's child: the grandchild does the compute) the time they ran and the time
they waited, and keeps the last ``SPAN`` s of those sums; not its own thread's (on a busy host each of
its wakes waits too, and a sampler must not make an idle engine look starved). ``share()`` is the share of the time those
threads wanted a CPU that they spent waiting for one, over that span: 0.0 on an idle host, 0.5
when the engine got half the CPU it asked for (a compute-bound step then takes twice as long).
The engine middleware puts it on ``engine.last`` as ``cpu_wait``; the analyzer tells a decode or
prefill rise that it accounts for as the host's (``findings.lateness``).

A read is one attribute (the share is computed with each sample). The sampling thread keeps each
thread's ``schedstat`` open and re-reads it every ``INTERVAL`` s (~70 threads for vLLM's three
processes: ~0.1 ms), and walks the process tree again every ``TREE_S`` s (a thread or worker that
starts later is counted from then).
Where there is no ``/proc`` (not Linux) or schedstat is off, ``share()`` is None and nothing is
stamped.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque

from hopline.middleware.loop import PerProcess

INTERVAL = 0.5  # seconds between samples
SPAN = 2.0  # seconds the share is taken over
MIN_BUSY_S = 0.02  # less run + wait than this over the span: nothing ran, no share
TREE_S = 5.0  # seconds between walks of the process tree (the processes below this one)
MAX_THREADS = 512  # threads sampled at most (a descriptor each): beyond, the share is over the first found


def _read(path: str) -> tuple[int, int] | None:
    try:
        with open(path, "rb") as f:
            ran, waited = f.read().split()[:2]
        return int(ran), int(waited)
    except (OSError, ValueError):
        return None


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid``: its children, theirs, and so on."""
    found: list[int] = []
    queue = _children(pid)
    while queue:
        child = queue.pop()
        if child not in found:
            found.append(child)
            queue.extend(_children(child))
    return found


def _children(pid: int) -> list[int]:
    """The child processes of ``pid`` (every thread's ``children`` file; Linux 3.5+)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                found.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue
    return found


class CpuWait:
    """See the module doc. ``share()`` never waits on the sampler's sleep."""

    def __init__(self, interval: float = INTERVAL, span: float = SPAN) -> None:
        self.pid = os.getpid()
        self.interval = interval
        self._lock = threading.Lock()
        self._last: dict[tuple[int, str], tuple[int, int]] = {}  # (pid, tid) -> its last (ran, waited)
        self._ran = self._waited = 0  # the sums of every sampled thread's increases, ns
        self._samples: deque[tuple[float, int, int]] = deque(maxlen=max(2, int(span / interval) + 1))
        self._own = ""  # the sampler's thread ID: its own waits to wake are not the engine's
        self._share: float | None = None  # share() over the samples kept, set with each sample
        self._fds: dict[tuple[int, str], int] = {}  # (pid, tid) -> its schedstat, open
        self._walked = -math.inf  # when the process tree was last walked (monotonic)
        self.available = _read(f"/proc/{self.pid}/schedstat") is not None
        if self.available:
            threading.Thread(target=self._run, name="hopline-cpu-wait", daemon=True).start()

    def _run(self) -> None:
        # the first sample is the sampler's: the caller's wake from starting it is not in the span
        self._own = str(threading.get_native_id())
        while True:
            try:
                self._sample()
            except Exception:  # a sampler never dies of one odd /proc read
                pass
            time.sleep(self.interval)

    def _walk(self) -> None:
        """Open the ``schedstat`` of every thread of this process and of those below it that is not
        open yet (kept open: a sample re-reads each at offset 0, no open or close); close those of
        threads gone. Not the sampler's own thread."""
        found = set()
        for pid in (self.pid, *_descendants(self.pid)):
            try:
                tasks = os.listdir(f"/proc/{pid}/task")
            except OSError:
                continue
            for tid in tasks:
                key = (pid, tid)
                if pid == self.pid and tid == self._own:
                    continue
                if key not in self._fds:
                    if len(self._fds) >= MAX_THREADS:
                        continue
                    try:
                        self._fds[key] = os.open(f"/proc/{pid}/task/{tid}/schedstat", os.O_RDONLY)
                    except OSError:
                        continue
                found.add(key)
        for key in [key for key in self._fds if key not in found]:
            self._drop(key)
        self._walked = time.monotonic()

    def _drop(self, key: tuple[int, str]) -> None:
        os.close(self._fds.pop(key))
        self._last.pop(key, None)

    def _sample(self) -> None:
        if time.monotonic() - self._walked >= TREE_S:
            self._walk()
        ran = waited = 0
        gone = []
        for key, fd in self._fds.items():
            try:
                fields = os.pread(fd, 64, 0).split()
                now = int(fields[0]), int(fields[1])
            except (OSError, ValueError, IndexError):  # the thread has exited
                gone.append(key)
                continue
            before = self._last.get(key)
            self._last[key] = now
            if before is not None:  # a thread seen for the first time adds from its next sample
                ran += max(0, now[0] - before[0])
                waited += max(0, now[1] - before[1])
        for key in gone:
            self._drop(key)
        with self._lock:
            self._ran += ran
            self._waited += waited
            self._samples.append((time.monotonic(), self._ran, self._waited))
            self._share = self._share_now()

    def _share_now(self) -> float | None:
        """The share over the samples kept now (caller holds ``_lock``)."""
        if len(self._samples) < 2:
            return None
        (_, ran_0, waited_0), (_, ran_1, waited_1) = self._samples[0], self._samples[-1]
        ran, waited = ran_1 - ran_0, waited_1 - waited_0
        if ran + waited < MIN_BUSY_S * 1e9:
            return None
        return round(waited / (ran + waited), 3)

    def share(self) -> float | None:
        """The share of their runnable time the threads of this process and those below it waited for
        a CPU over the last ``SPAN`` s (None: no schedstat, or nothing ran).

        Computed once per sample (``_sample``), so a read is one attribute, no lock: it is read
        for every request's ``engine.last_token``."""
        return self._share


# this process's CPU wait sampler, started on first use (again in a forked child)
cpu_wait_probe: PerProcess[CpuWait] = PerProcess(CpuWait)


def cpu_wait() -> float | None:
    """``share()`` of this process's sampler (started on first use: None until its second sample)."""
    return cpu_wait_probe().share()
