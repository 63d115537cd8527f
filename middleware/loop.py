"""How late an asyncio event loop runs: one probe per loop, shared by every hopline emitter in it.

A request that reaches a busy process waits for its event loop before hopline sees it: on the
client between the caller's ``await`` and the transport, on a server (vLLM's API server, a gateway)
between the socket and the ASGI middleware. That wait is the process's, not the network's, and
this is how it is measured (DESIGN.md: "its event loop's lateness is measured"): the client puts
``loop_lag_s`` on ``client.sent`` / ``client.first_token``, the engine and gateway middlewares on
``engine.received`` / ``gateway.received``.

``loop_lag()`` is the one call a request pays: the running loop's ``LagProbe.lag()``, the probe
started on first use (None outside asyncio: trio, a thread without a loop).
"""

from __future__ import annotations

import asyncio
import weakref


class LagProbe:
    """How late one asyncio loop runs: a callback every ``INTERVAL`` s measures its own lateness.

    One per loop, made by the first request that asks (``lag_probe``) and kept only as long as
    the loop (a weak reference; its pending callback goes with a closed loop). ``lag()`` is the
    largest lateness of the last one to two ``WINDOW``s, or the current one if larger (the loop
    being late right now). It costs one callback per ``INTERVAL`` and never waits.
    """

    INTERVAL = 0.05
    WINDOW = 2.0

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = weakref.ref(loop)
        now = loop.time()
        self._since = now
        self._recent = 0.0  # largest lateness in the window starting at _since
        self._before = 0.0  # in the window before it
        self._due = now + self.INTERVAL
        loop.call_at(self._due, self._tick)

    def _roll(self, now: float) -> None:
        if now - self._since >= self.WINDOW:
            self._before = self._recent if now - self._since < 2 * self.WINDOW else 0.0
            self._recent, self._since = 0.0, now

    def _tick(self) -> None:
        loop = self.loop()
        if loop is None or loop.is_closed():
            return
        now = loop.time()
        self._roll(now)
        self._recent = max(self._recent, now - self._due)
        self._due = now + self.INTERVAL
        loop.call_at(self._due, self._tick)

    def lag(self) -> float:
        """The loop's recent largest lateness in seconds (0.0 once its loop is gone)."""
        loop = self.loop()
        if loop is None:
            return 0.0
        now = loop.time()
        self._roll(now)
        return max(self._recent, self._before, now - self._due, 0.0)


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


def loop_lag() -> float | None:
    """``lag()`` of the running loop's probe (started on first use: 0.0 then); None outside asyncio."""
    probe = lag_probe()
    return None if probe is None else probe.lag()
