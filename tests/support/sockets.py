"""Idle half-sent requests (a slowloris): what tests/*/test_*_idle_sockets.py open against a server."""

from __future__ import annotations

import resource
import socket

FD_LIMIT = 1024  # the usual default soft (and often hard) limit of open files
IDLE = 1_100  # more connections than that table holds
HALF = b"GET /healthz HTTP/1.1\r\nHost: x\r\n"  # no blank line: the headers never end


def limit_fds() -> None:
    """``preexec_fn`` of a server process: ``ulimit -n 1024`` (soft and hard)."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


def idle_sockets(port: int, count: int = IDLE) -> list[socket.socket]:
    """``count`` connections to 127.0.0.1:``port`` that each sent ``HALF`` and idle (one the server
    closed at once is kept too)."""
    held = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        try:
            sock.sendall(HALF)
        except OSError:
            pass  # closed at once: beyond the server's connection cap
        held.append(sock)
    return held


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closed (or reset) ``sock``."""
    sock.settimeout(0.01)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def all_closed(held: list[socket.socket]) -> bool:
    return all(closed_by_server(s) for s in held)
