"""hopline's own logging: a private structlog logger that never configures the host.

``structlog.configure`` is never called and nothing is taken from structlog's global
configuration (wrapper class, processors and context class are all given explicitly), so a host
that configured structlog or stdlib ``logging`` its own way keeps exactly that, and hopline's
lines do not pass through the host's processors. Lines are JSON on standard error.

The level is decided when the logger is configured, not when this module is imported:
``configure(level)`` sets it explicitly; otherwise the first line logged reads
``HOPLINE_LOG_LEVEL`` (default ``info``), so a host may set that variable after importing hopline.

Problems that repeat per batch (a collector that is down, lines it rejects) go through
``warn_throttled``, which lets one line per kind through every minute and says how many it held
back, so a dead collector cannot flood the host's standard error.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson
import structlog


class _StderrLogger:
    """Writes rendered lines to the *current* ``sys.stderr`` and swallows write errors.

    Looking ``sys.stderr`` up per line (rather than binding it once like ``PrintLogger``) follows
    hosts and test runners that replace it; a closed or broken stderr must not raise into the
    emitter thread.
    """

    def msg(self, message: str) -> None:
        try:
            sys.stderr.write(message + "\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - logging must never fail the caller
            pass

    debug = info = warning = error = critical = msg


def _level(level: str | int | None) -> int:
    """A ``logging`` level from a name or number; None: ``HOPLINE_LOG_LEVEL`` (unknown names: info)."""
    if isinstance(level, int):
        return level
    name = (level if level is not None else os.environ.get("HOPLINE_LOG_LEVEL", "info")).upper()
    number = logging.getLevelName(name)
    return number if isinstance(number, int) else logging.INFO


def _render(obj: Any, **_: Any) -> str:
    return orjson.dumps(obj, default=str).decode()


def _bound_logger(level: int) -> Any:
    return structlog.wrap_logger(
        _StderrLogger(),
        wrapper_class=structlog.make_filtering_bound_logger(level),
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.JSONRenderer(serializer=_render),
        ],
        context_class=dict,
        cache_logger_on_first_use=True,
    ).bind(logger="hopline")


class HoplineLogger:
    """hopline's logger: structlog's filtering bound logger, built at ``configure`` or first use.

    Every part imports this one object (``from hopline.middleware.log import logger``);
    ``logger.warning(...)`` and the other methods are the bound logger's.
    """

    __slots__ = ("_bound",)

    def __init__(self) -> None:
        self._bound: Any = None

    def configure(self, level: str | int | None = None) -> None:
        """Set the level (``"debug"``, ``logging.WARNING`` …; None: ``HOPLINE_LOG_LEVEL``)."""
        self._bound = _bound_logger(_level(level))

    def __getattr__(self, name: str) -> Any:
        if self._bound is None:
            self.configure()
        return getattr(self._bound, name)


logger = HoplineLogger()
configure = logger.configure


class Throttle:
    """Lets one message per key through every ``interval`` seconds and counts the rest."""

    def __init__(self, interval: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self._clock = clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def allow(self, key: str) -> int | None:
        """None when this message is held back; else how many of its kind were held back before."""
        now = self._clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.interval:
                self._held[key] = self._held.get(key, 0) + 1
                return None
            self._last[key] = now
            return self._held.pop(key, 0)


_throttle = Throttle()


def _after_fork_in_child() -> None:
    # A fork while another thread held the throttle's lock would leave it held forever here.
    _throttle._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def warn_throttled(key: str, event: str, **fields: Any) -> None:
    """``logger.warning(event, **fields)`` at most once a minute per ``key``."""
    held = _throttle.allow(key)
    if held is not None:
        logger.warning(event, suppressed_since_last=held, **fields)
