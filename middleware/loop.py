"""How late an asyncio event loop runs: one probe per loop, shared by every hopline emitter in it.

A request that reaches a busy process waits for its event loop before hopline sees it: on the
client between the caller's ``await`` and the transport, on a server (vLLM's API server, a gateway)
between the socket and the ASGI middleware. That wait is the process's, not the network's, and
this is how it is measured (DESIGN.md: "its event loop's lateness is measured"): the client puts
``loop_lag_s`` on ``client.sent`` / ``client.first_token``, the engine and gateway middlewares on
``engine.received`` / ``gateway.received``.

``loop_lag()`` is the one call a request pays: the running loop's ``LagProbe.lag()``, the probe
started on first use (None outside asyncio: trio, a thread without a loop). A caller without a
loop (the sync client in a thread) reads ``thread_probe()``: how late the process's threads wake,
which is what its blocking read of the response waits for on a busy host.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class _Lateness:
    """The window arithmetic both probes share: the largest lateness of the last one to two
    ``WINDOW``s, or the current one if larger (late right now)."""

    INTERVAL = 0.05
    WINDOW = 2.0

    def _start(self, now: float) -> None:
        self._since = now
        self._recent = 0.0  # largest lateness in the window starting at _since
        self._before = 0.0  # in the window before it
        self._due = now + self.INTERVAL

    def _roll(self, now: float) -> None:
        if now - self._since >= self.WINDOW:
            self._before = self._recent if now - self._since < 2 * self.WINDOW else 0.0
            self._recent, self._since = 0.0, now

    def _woke(self, now: float) -> None:
        """The probe woke at ``now`` (it was due at ``_due``); the next one is due an interval on."""
        self._roll(now)
        self._recent = max(self._recent, now - self._due)
        self._due = now + self.INTERVAL

    def _lag(self, now: float) -> float:
        self._roll(now)
        return max(self._recent, self._before, now - self._due, 0.0)


class LagProbe(_Lateness):
    """How late one asyncio loop runs: a callback every ``INTERVAL`` s measures its own lateness.

    One per loop, made by the first request that asks (``lag_probe``) and kept only as long as
    the loop (a weak reference; its pending callback goes with a closed loop). ``lag()`` is the
    largest lateness of the last one to two ``WINDOW``s, or the current one if larger (the loop
    being late right now). It costs one callback per ``INTERVAL`` and never waits.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = weakref.ref(loop)
        self._start(loop.time())
        loop.call_at(self._due, self._tick)

    def _tick(self) -> None:
        # ``_woke`` inlined and ``call_later`` (uvloop's ``call_at`` is ``call_later`` after a
        # subtraction): the one cost the probe has whatever the traffic, 20 times a second. Only
        # a running loop runs it (a closed one never does): no ``is_closed`` check
        loop = self.loop()
        if loop is None:
            return
        now = loop.time()
        if now - self._since >= self.WINDOW:
            self._roll(now)
        late = now - self._due
        if late > self._recent:
            self._recent = late
        self._due = now + self.INTERVAL
        loop.call_later(self.INTERVAL, self._tick)

    def lag(self) -> float:
        """The loop's recent largest lateness in seconds (0.0 once its loop is gone)."""
        loop = self.loop()
        if loop is None:
            return 0.0
        return self._lag(loop.time())


class ThreadProbe(_Lateness):
    """How late this process's threads run, for callers without an event loop (a sync client in
    a thread): a daemon thread sleeps ``INTERVAL`` s at a time and measures how late it wakes.

    A thread wakes late when the process waits for a CPU (a busy host) or for the GIL (another
    thread's Python work): what a sync caller's read of its response waits for too. One per
    process (``thread_probe``; a forked child starts its own), its reads and its ticks under one
    lock held for a few arithmetic operations; ``lag()`` never waits on the probe's sleep.
    """

    def __init__(self) -> None:
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._start(time.monotonic())
        threading.Thread(target=self._run, name="hopline-lag-probe", daemon=True).start()

    def _run(self) -> None:
        while True:
            time.sleep(max(0.0, self._due - time.monotonic()))
            with self._lock:
                self._woke(time.monotonic())

    def lag(self) -> float:
        """The process's recent largest thread lateness in seconds."""
        with self._lock:
            return self._lag(time.monotonic())


_PROBES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LagProbe] = weakref.WeakKeyDictionary()
_last: LagProbe | None = None  # the probe last asked for: a server has one loop, so nearly always its own


def lag_probe() -> LagProbe | None:
    """The running asyncio loop's lag probe, started on first use (None outside asyncio)."""
    global _last
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # trio, or no loop
        return None
    probe = _last
    if probe is not None and probe.loop() is loop:
        return probe
    probe = _PROBES.get(loop)
    if probe is None:
        probe = _PROBES[loop] = LagProbe(loop)
    _last = probe
    return probe


class PerProcess(Generic[T]):
    """One ``make()`` per process, made on first use (again in a forked child: a thread does
    not survive a fork); a call is one attribute read and a PID compare."""

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._lock = threading.Lock()
        self._made: tuple[int, T] | None = None  # (the PID it was made in, it)

    def __call__(self) -> T:
        made = self._made
        if made is not None and made[0] == os.getpid():
            return made[1]
        with self._lock:
            if self._made is None or self._made[0] != os.getpid():
                self._made = (os.getpid(), self._make())
            return self._made[1]


# this process's thread lateness probe, started on first use (again in a forked child)
thread_probe: PerProcess[ThreadProbe] = PerProcess(ThreadProbe)


def loop_lag() -> float | None:
    """``lag()`` of the running loop's probe (started on first use: 0.0 then); None outside asyncio."""
    probe = lag_probe()
    return None if probe is None else probe.lag()
