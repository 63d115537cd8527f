"""No body stalls the collector; a failure or a vanished client is one log line (issue 10, items 4, 15).

Before: 0.1 MiB of gzip holding 64 MiB of newlines left /healthz unanswered for 132 s, 8 MiB of
``{}`` lines for 11.4 s (decompression and parsing ran on the event loop); a client that went
away mid-body logged a traceback; after a 500 the keep-alive connection was closed under the
next request (ECONNRESET).
"""

from __future__ import annotations

import gzip
import signal
import socket
import threading
import time

import httpx
from support.collector import collector_process, serve
from support.events import event, ndjson
from hopline.collector.config import CollectorConfig

NDJSON = {"Content-Type": "application/x-ndjson"}
# The issue asks for 100 ms; the machine is shared and noisy, so the test asserts a bound ten
# times looser that still fails by seconds on a collector that parses on its event loop
# (bench/bench_reliability.py measures the real figure).
HEALTHZ_BOUND_S = 1.0


def hostile_bodies() -> list[tuple[bytes, dict[str, str]]]:
    gz = {**NDJSON, "Content-Encoding": "gzip"}
    return [
        (gzip.compress(b"\n" * (64 * 1024 * 1024), 9), gz),  # 0.06 MiB on the wire, 64 MiB of lines
        (b"{}\n" * (2 * 1024 * 1024 // 3), NDJSON),  # 2 MiB, 700k invalid lines
        (b"{}\n" * 40_000, NDJSON),  # under the line cap: parsed, all rejected
        (ndjson([event("client.sent", f"legit-{i}", 1767225600.0, stream=True) for i in range(20_000)]), NDJSON),
    ]


def test_healthz_answers_while_hostile_bodies_are_ingested(tmp_path):
    with collector_process(tmp_path / "data") as (_, url):
        answers: list[int] = []

        def attack() -> None:
            with httpx.Client(base_url=url, timeout=300) as client:
                for body, headers in hostile_bodies():
                    answers.append(client.post("/v1/events", content=body, headers=headers).status_code)

        attacker = threading.Thread(target=attack)
        latencies = []
        with httpx.Client(base_url=url, timeout=HEALTHZ_BOUND_S * 5) as poller:
            attacker.start()
            while attacker.is_alive():
                start = time.perf_counter()
                try:
                    assert poller.get("/healthz").status_code == 200
                except httpx.TimeoutException:
                    raise AssertionError(f"/healthz unanswered for {HEALTHZ_BOUND_S * 5} s") from None
                latencies.append(time.perf_counter() - start)
                time.sleep(0.01)
            attacker.join()
        assert answers == [413, 413, 400, 200]
        assert max(latencies) < HEALTHZ_BOUND_S, f"slowest /healthz {max(latencies):.3f} s of {len(latencies)}"
        stored = httpx.get(url + "/metrics").text
        assert 'hopline_collector_bodies_rejected_total{reason="too_many_lines"} 2.0' in stored


def test_a_client_that_disconnects_mid_body_is_one_log_line(tmp_path):
    with collector_process(tmp_path / "data") as (proc, url):
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(
                b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-ndjson\r\n"
                b"Content-Length: 100000\r\n\r\n" + b'{"v":1,' * 10
            )
            time.sleep(0.2)
        time.sleep(0.5)
        assert httpx.get(url + "/healthz").status_code == 200
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
        stderr = proc.stderr.read().decode()
    assert "Traceback" not in stderr
    assert len([x for x in stderr.splitlines() if "client_disconnected" in x]) == 1, stderr


def read_response(sock: socket.socket) -> bytes:
    """One HTTP/1.1 response with a Content-Length body; b'' when the server closed instead."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head


def test_after_a_500_the_keep_alive_connection_still_answers(tmp_path, monkeypatch):
    with serve(CollectorConfig(data_dir=tmp_path / "data")) as c:

        async def broken(*args, **kwargs):
            raise RuntimeError("a bug in the collector")

        monkeypatch.setattr(c.collector.ingestor, "ingest", broken)
        port = int(c.url.rsplit(":", 1)[1])
        body = ndjson([event("client.sent", "ka-1", 1767225600.0, stream=True)])
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(
                b"POST /v1/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-ndjson\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            assert read_response(sock).startswith(b"HTTP/1.1 500")
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            try:
                second = read_response(sock)
            except ConnectionResetError:
                second = b"ECONNRESET"
            assert second.startswith(b"HTTP/1.1 200"), second
