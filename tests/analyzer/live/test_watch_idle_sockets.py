"""Idle half-sent requests neither kill the watcher nor starve its store follower (issue 34, item 2).

A real ``hopline watch --follow DIR --listen`` process under the usual open-files limit (1,024),
and 1,100 connections that each send half a request's headers and then idle. Before, its server
took a file descriptor for each and never let go; with the table full, the follower's next
``scandir`` failed with EMFILE and the process exited. Now the connection cap
(``--max-connections``, lowered below the open-files limit) closes the ones beyond it at once and
``--header-timeout`` the rest: the process lives, /v1/findings answers, and the events written
to the store while the sockets were held are read (event time moves on to them).
"""

from __future__ import annotations

import resource
import subprocess
import sys
import time

import httpx
import orjson
from hopline.middleware.contract.units import to_epoch
from support.events import event, ndjson
from support.servers import free_port, wait_until
from support.sockets import FD_LIMIT, IDLE, all_closed, idle_sockets, limit_fds

HEADER_TIMEOUT_S = 2.0
BOUNDS = ("--header-timeout", f"{HEADER_TIMEOUT_S:g}s")
SHORT = ("--window", "10s", "--settle", "1s", "--lateness", "1s", "--poll", "0.2s", "--state", "")


def requests(start: float, seconds: int, prefix: str) -> bytes:
    """Two finished streaming requests a second from ``start`` (client hops only)."""
    out = []
    for i in range(seconds * 2):
        ts = start + i / 2
        rid = f"{prefix}-{i}"
        out += [
            event("client.sent", rid, ts, stream=True, service="chat", model="m1"),
            event("client.first_token", rid, ts + 0.1),
            event("client.last_token", rid, ts + 0.3, finish_reason="stop", output_tokens=20),
        ]
    return ndjson(out)


def event_time(url: str) -> float | None:
    found = orjson.loads(httpx.get(url + "/v1/findings", timeout=5).content)["event_time"]
    return None if found is None else to_epoch(found)


def test_idle_half_sent_sockets_neither_kill_the_watcher_nor_starve_its_follower(tmp_path):
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] > IDLE + 100, "the test itself needs the sockets"
    assert FD_LIMIT == 1024
    store = tmp_path / "store"
    store.mkdir()
    log = store / "events.ndjson"
    t0 = time.time() - 120  # in the past: --future (1 min ahead of the clock) keeps them
    log.write_bytes(requests(t0, 20, "a"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hopline.middleware.cli", "watch", "--follow", str(store), *SHORT,
         "--listen", f"127.0.0.1:{port}", *BOUNDS],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=limit_fds,
    )  # fmt: skip
    held = []
    try:
        wait_until("a step on the first events", lambda: event_time(url), timeout=60,
                   ignore=(httpx.TransportError,))  # fmt: skip
        held = idle_sockets(port, IDLE)
        with log.open("ab") as f:  # written while the sockets are held: the follower must read them
            f.write(requests(t0 + 40, 20, "b"))
        time.sleep(HEADER_TIMEOUT_S + 1)  # several polls of the follower with the sockets held
        assert proc.poll() is None, "the watcher exited"
        # generous: a loaded 2-core machine; the point is that it answers at all
        # the first batch ends at t0 + 20.3: event time past it comes from the second one (steps every 10 s)
        moved = wait_until("event time past the first batch", lambda: (event_time(url) or 0) >= t0 + 45,
                           timeout=20, interval=0.2, ignore=(httpx.TransportError,))  # fmt: skip
        assert moved
        wait_until("the idle sockets closed", lambda: all_closed(held), timeout=20, interval=0.5)
        metrics = httpx.get(url + "/metrics", timeout=5).text
        closed = {
            line.split('why="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
            for line in metrics.splitlines()
            if line.startswith("hopline_live_http_connections_closed_total{")
        }
        assert closed["header_timeout"] >= 1 and closed["over_cap"] >= 1, closed
        assert closed["header_timeout"] + closed["over_cap"] >= IDLE, closed
        assert proc.poll() is None
    finally:
        for sock in held:
            sock.close()
        proc.kill()
        _, err = proc.communicate(timeout=10)
    assert b"http_connections_closed" in err, err[-2000:]
