"""Bounded connections for hopline's own HTTP servers (the collector, ``hopline watch --listen``).

uvicorn bounds only the idle time between two requests of a kept-alive connection
(``timeout_keep_alive``), and its ``limit_concurrency`` answers 503 to a request whose headers are
complete. A connection that sends nothing, or half its headers, is held forever, with a file
descriptor: about 1,000 of them fill the usual 1,024-descriptor table, and then the process can
open nothing (issue 34: ``hopline watch``'s store follower failed on ``scandir`` with EMFILE and
the process exited; the collector accepted nothing, ``/healthz`` included, and logged nothing).
uvicorn (0.55, its httptools and h11 protocols alike) has no header or body read timeout.

``ConnectionLimits.protocol()`` is the HTTP protocol uvicorn would choose (httptools', else
h11's), subclassed: uvicorn's parser, request cycle and flow control run unchanged, and only
timers and a count are added around ``connection_made`` and ``data_received`` (no socket code):

- **A connection cap**: a connection accepted while ``cap`` are open is closed at once (it never
  waits for headers). ``cap`` is ``max_connections``, lowered so that ``FD_RESERVE`` descriptors
  of the open-files limit (``RLIMIT_NOFILE``) stay for the process's own files (the store, the
  follower, compaction, logs): sockets never take the last ones.
- **A header deadline** (nginx's ``client_header_timeout``): a request line and headers must be
  complete within ``header_timeout`` seconds of the connection opening, or of the first byte of the next
  request on a kept-alive one.
- **A body timeout** (nginx's ``client_body_timeout``): while a request's body is being read, no
  byte for ``body_timeout`` seconds closes the connection (an idle time, not a total: a large body on a
  slow link is fine). Time while uvicorn paused reading, because the app has not taken what came,
  does not count.

Each close is counted in ``closed[why]`` (``over_cap``, ``header_timeout``, ``body_timeout``),
handed to ``on_close`` (a Prometheus counter) and logged, once a minute per kind
(``http_connections_closed``). uvicorn is imported only by ``protocol()``: emitting needs none
of this.

``listening_socket`` binds a server's port before anything says it started, so that a port in use
is one line and exit 1 (``ClickException``) for the collector and ``hopline watch --listen`` alike,
not a traceback or a log line from uvicorn's thread while the process goes on.
"""

from __future__ import annotations

import asyncio
import errno
import socket
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hopline.middleware.log import warn_throttled

FD_RESERVE = 256  # descriptors of the open-files limit left to the process's own files
WHY = ("over_cap", "header_timeout", "body_timeout")


def listening_socket(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A socket bound to ``host:port`` and listening (inheritable, for uvicorn's ``sockets=``), or
    ``ClickException`` (exit 1) saying why not in one line."""
    from hopline.middleware.exits import ClickException  # typer: for the CLIs only

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        why = "it is in use" if exc.errno == errno.EADDRINUSE else exc.strerror or str(exc)
        raise ClickException(f"cannot listen on {host}:{port}: {why}") from exc
    sock.set_inheritable(True)
    return sock


def open_files_limit() -> int | None:
    """The soft ``RLIMIT_NOFILE`` (None: unlimited, or no such limit on this platform)."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


@dataclass
class ConnectionLimits:
    """The bounds of one server and what they closed (see the module doc)."""

    max_connections: int = 1000
    # named as the collector's settings (--header-timeout, --body-timeout), in seconds; these
    # defaults are ``hopline watch --listen``'s, the collector passes its own
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    on_close: Callable[[str], None] | None = None  # called with the reason of each close
    closed: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        if self.max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {self.max_connections!r}")
        for name in ("header_timeout", "body_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")

    @property
    def cap(self) -> int:
        """``max_connections``, at most the open-files limit less ``FD_RESERVE`` (half of a small one)."""
        limit = open_files_limit()
        if limit is None:
            return self.max_connections
        return max(1, min(self.max_connections, max(limit - FD_RESERVE, limit // 2)))

    def close(self, transport: asyncio.BaseTransport, why: str) -> None:
        if transport.is_closing():
            return
        transport.close()
        self.closed[why] += 1
        if self.on_close is not None:
            self.on_close(why)
        warn_throttled(
            f"http_connections_closed:{why}",
            "http_connections_closed",
            why=why,
            total=self.closed[why],
            cap=self.cap,
            header_timeout_s=self.header_timeout,
            body_timeout_s=self.body_timeout,
        )

    def timeout(self, why: str) -> float:
        return self.header_timeout if why == "header_timeout" else self.body_timeout

    def protocol(self, http: str = "auto") -> type[asyncio.Protocol]:
        """uvicorn's HTTP protocol class (``http``: ``auto``, ``httptools`` or ``h11``, as uvicorn's
        ``--http``) with these bounds: give it to ``uvicorn.Config(http=...)``."""
        from uvicorn.config import HTTP_PROTOCOLS
        from uvicorn.importer import import_from_string

        return _bounded(import_from_string(HTTP_PROTOCOLS[http]), self)


def _bounded(base: type[Any], limits: ConnectionLimits) -> type[asyncio.Protocol]:
    cap = limits.cap  # the open-files limit as the server starts

    class BoundedHTTPProtocol(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._timers: dict[str, asyncio.TimerHandle] = {}  # why -> its timer

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > cap:
                limits.close(transport, "over_cap")
            else:
                self._arm("header_timeout")

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm("header_timeout", "body_timeout")
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            before = self.cycle
            super().data_received(data)
            cycle = self.cycle
            if cycle is not before:  # a request's line and headers are complete
                self._disarm("header_timeout")
            elif before is None or before.response_complete:  # a request's first bytes, or more of them
                self._arm("header_timeout", restart=False)
            if cycle is not None and cycle.more_body and not cycle.response_complete:
                self._arm("body_timeout")  # its body is being read: idle from this byte on
            else:
                self._disarm("body_timeout")

        def _arm(self, why: str, restart: bool = True) -> None:
            if restart or why not in self._timers:
                self._disarm(why)
                self._timers[why] = self.loop.call_later(limits.timeout(why), self._expired, why)

        def _disarm(self, *whys: str) -> None:
            for why in whys:
                timer = self._timers.pop(why, None)
                if timer is not None:
                    timer.cancel()

        def _expired(self, why: str) -> None:
            del self._timers[why]
            if self.flow is not None and self.flow.read_paused:  # waiting for the app, not the client
                self._arm(why)
            else:
                limits.close(self.transport, why)

    BoundedHTTPProtocol.__qualname__ = BoundedHTTPProtocol.__name__ = f"Bounded{base.__name__}"
    return BoundedHTTPProtocol
