"""Real servers for tests: uvicorn in a thread on 127.0.0.1, TLS from a throwaway CA, free ports, waiting."""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import uvicorn

T = TypeVar("T")


@dataclass
class ServerTLS:
    """A certificate for 127.0.0.1 signed by a throwaway CA, and an SSL context trusting that CA."""

    certfile: str  # private key + certificate chain, PEM
    client_context: ssl.SSLContext


def make_server_tls(directory: Path) -> ServerTLS:
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    path = directory / "server.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(path))
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return ServerTLS(str(path), context)


def listening_socket() -> socket.socket:
    """A TCP socket on 127.0.0.1, on a port the OS chose, already listening (nothing races for it)."""
    return socket.create_server(("127.0.0.1", 0), backlog=1024)  # SO_REUSEADDR set on POSIX


def free_port() -> int:
    """A port that was free a moment ago, for programs that must be told one (Prometheus, a child)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def closed_port_url() -> str:
    """An http:// URL on which nothing listens (the port was just free)."""
    return f"http://127.0.0.1:{free_port()}"


@contextlib.contextmanager
def running_server(
    app: Any, tls: ServerTLS | None = None, *, lifespan: str = "auto", http: Any = "auto"
) -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free 127.0.0.1 port in a thread; yield its base URL.

    ``lifespan="on"`` for apps whose startup must run (the collector opens its store there);
    ``http``: uvicorn's protocol (``ConnectionLimits.protocol()`` for hopline's bounded one).
    """
    sock = listening_socket()
    config = uvicorn.Config(
        app,
        http=http,
        log_level="warning",
        lifespan=lifespan,
        ssl_certfile=tls.certfile if tls else None,
        timeout_graceful_shutdown=2,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def wait_until(
    what: str,
    ready: Callable[[], T],
    *,
    timeout: float = 15.0,
    interval: float = 0.05,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``ready`` until it returns something truthy and return that; AssertionError naming
    ``what`` after ``timeout`` seconds.

    Exceptions of the types in ``ignore`` (e.g. ``httpx.HTTPError`` while a server starts) count as
    not ready yet.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = ready()
        except ignore:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def env_without_hopline() -> dict[str, str]:
    """This process's environment without ``HOPLINE_*`` (a child configured only by its arguments)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("HOPLINE_")}
