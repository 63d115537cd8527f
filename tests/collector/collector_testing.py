"""Helpers for the collector tests: a real collector on uvicorn (127.0.0.1, a free port), event builders."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import uvicorn
from hopline.collector.app import create_app
from hopline.collector.config import CollectorConfig
from hopline.middleware.contract import new_eid

GOLDEN = json.loads((Path(__file__).parents[1] / "golden_stages.json").read_text())


class Running:
    def __init__(self, app, url: str) -> None:
        self.app = app
        self.url = url
        self.collector = app.state.collector
        self.client = httpx.Client(base_url=url, timeout=10)


@contextlib.contextmanager
def serve(config: CollectorConfig) -> Iterator[Running]:
    """A real uvicorn server running ``create_app(config)`` on a free port, in a thread."""
    app = create_app(config)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "collector did not start"
        time.sleep(0.02)
    running = Running(app, url)
    try:
        yield running
    finally:
        running.client.close()
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def event(hop: str, request_id: str, ts: float, **attrs) -> dict:
    return {"v": 1, "eid": new_eid(), "ts": ts, "request_id": request_id, "hop": hop, **attrs}


def ndjson(events: list[dict]) -> bytes:
    return b"".join(json.dumps(e).encode() + b"\n" for e in events)


def stored_lines(data_dir: Path) -> list[dict]:
    """Every event in the store's NDJSON files (complete lines only)."""
    out = []
    for path in sorted((data_dir / "events").glob("date=*/hour=*/*.ndjson")):
        data = path.read_bytes()
        data = data[: data.rfind(b"\n") + 1]
        out.extend(json.loads(line) for line in data.splitlines() if line.strip())
    return out


def env_without_hopline() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("HOPLINE_")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def collector_process(data_dir: Path, *args: str) -> Iterator[tuple[subprocess.Popen, str]]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "hopline.collector", "--data-dir", str(data_dir), "--port", str(port), *args],
        env=env_without_hopline(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        assert proc.poll() is None, proc.stderr.read().decode()
        try:
            httpx.get(url + "/healthz", timeout=0.5)
            break
        except httpx.TransportError:
            assert time.monotonic() < deadline, "collector did not start"
            time.sleep(0.05)
    try:
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
