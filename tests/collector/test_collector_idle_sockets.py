"""Idle half-sent requests neither stop nor starve the collector (issue 34, item 2).

A real collector process under the usual open-files limit (1,024), and 1,100 connections that each
send half a request's headers and then idle. Before, nothing closed them: they took every file
descriptor, and the collector refused every ingest and /healthz while they were held, logging
nothing. Now the connection cap (``--max-connections``, lowered below the open-files limit) closes
the ones beyond it at once, and ``--header-timeout`` closes the rest once it has passed: every one
of the 1,100 is closed by the collector, counted, and /healthz and ingest answer.
"""

from __future__ import annotations

import resource
import socket
import subprocess
import sys
import time

import httpx
import pytest
from hopline.middleware.http_limits import ConnectionLimits
from prometheus_client.parser import text_string_to_metric_families
from support.events import event, ndjson
from support.servers import env_without_hopline, free_port, running_server, wait_until
from support.sockets import IDLE, all_closed, closed_by_server, idle_sockets, limit_fds

HEADER_TIMEOUT_S = 2.0
BOUNDS = ("--header-timeout", f"{HEADER_TIMEOUT_S:g}s")


def test_idle_half_sent_sockets_neither_stop_nor_starve_the_collector(tmp_path):
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] > IDLE + 100, "the test itself needs the sockets"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hopline.collector", "--data-dir", str(tmp_path), "--port", str(port),
         *BOUNDS],  # fmt: skip
        env=env_without_hopline(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=limit_fds,
    )
    held: list[socket.socket] = []
    try:
        wait_until("the collector", lambda: httpx.get(url + "/healthz").status_code == 200,
                   timeout=60, ignore=(httpx.TransportError,))  # fmt: skip
        held = idle_sockets(port, IDLE)
        time.sleep(HEADER_TIMEOUT_S)
        assert proc.poll() is None, "the collector exited"
        # generous: a loaded 2-core machine; the point is that it answers at all (before: never)
        health = wait_until("/healthz", lambda: httpx.get(url + "/healthz", timeout=5),
                            timeout=20, interval=0.2, ignore=(httpx.TransportError,))  # fmt: skip
        assert health.status_code == 200
        batch = ndjson([event("client.sent", "idle-1", time.time(), stream=True)])
        kind = {"Content-Type": "application/x-ndjson"}
        posted = httpx.post(url + "/v1/events", content=batch, headers=kind, timeout=10)
        assert posted.status_code == 200, posted.text
        # every idle connection was closed by the collector: beyond the cap at once, the rest at the deadline
        wait_until("the idle sockets closed", lambda: all_closed(held), timeout=20, interval=0.5)
        text = httpx.get(url + "/metrics", timeout=10).text
        closed = {
            s.labels["why"]: s.value
            for f in text_string_to_metric_families(text)
            if f.name == "hopline_collector_http_connections_closed"
            for s in f.samples
            if s.name.endswith("_total")
        }
        assert closed["header_timeout"] >= 1 and closed["over_cap"] >= 1, closed
        assert closed["header_timeout"] + closed["over_cap"] >= IDLE, closed
        assert proc.poll() is None
    finally:
        for sock in held:
            sock.close()
        proc.kill()
        _, err = proc.communicate(timeout=10)
    assert b"http_connections_closed" in err, err[-2000:]  # said in the log, not only counted


async def echo_length(scope, receive, send) -> None:
    """Reads the whole body, answers its length."""
    if scope["type"] != "http":
        return
    size, more = 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        size, more = size + len(message.get("body", b"")), message.get("more_body", False)
    length = str(len(str(size))).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", length)]})
    await send({"type": "http.response.body", "body": str(size).encode()})


def trickle(sock: socket.socket, data: bytes, every_s: float) -> bool:
    """Send ``data`` a byte every ``every_s``; False once the server closed the connection."""
    for byte in data:
        try:
            sock.sendall(bytes([byte]))
        except OSError:
            return False
        time.sleep(every_s)
        if closed_by_server(sock):
            return False
    return True


@pytest.mark.parametrize("http", ["httptools", "h11"])
def test_the_header_deadline_is_a_total_and_the_body_timeout_an_idle_time(http):
    """Headers a byte every 0.2 s are closed at the 1-s deadline (slowloris' way around an idle
    timeout), on a new connection and on a kept-alive one; a body a byte every 0.2 s is read whole
    under a 1-s body timeout, a body that stops is closed."""
    limits = ConnectionLimits(header_timeout=1.0, body_timeout=1.0)
    with running_server(echo_length, http=limits.protocol(http)) as url:
        port = int(url.rsplit(":", 1)[1])
        slow = socket.create_connection(("127.0.0.1", port), timeout=10)
        assert not trickle(slow, b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 50, 0.2)  # 10 s of headers
        kept = socket.create_connection(("127.0.0.1", port), timeout=10)
        kept.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert kept.recv(4096).startswith(b"HTTP/1.1 200")
        assert not trickle(kept, b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 50, 0.2)
        body = socket.create_connection(("127.0.0.1", port), timeout=10)
        body.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n")
        assert trickle(body, b"0123456789", 0.2)  # 2 s in all: idle 0.2 s at a time
        assert body.recv(4096).endswith(b"\r\n\r\n10")
        stalled = socket.create_connection(("127.0.0.1", port), timeout=10)
        stalled.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n01234")
        wait_until("the stalled body closed", lambda: closed_by_server(stalled), timeout=15, interval=0.1)
        for sock in (slow, kept, body, stalled):
            sock.close()
    assert limits.closed == {"header_timeout": 2, "body_timeout": 1}
