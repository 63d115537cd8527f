"""A real collector for tests: ``create_app(config)`` on uvicorn in a thread, and what its store holds."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from hopline.collector.app import create_app
from hopline.collector.config import CollectorConfig

from support.servers import env_without_hopline, free_port, running_server


def parts_config(**given: Any) -> CollectorConfig:
    """A ``CollectorConfig`` for the collector's parts built alone (``Joiner.from_config``, ...): the
    declarations' defaults with ``given`` over them, and a data directory that is never created."""
    return CollectorConfig(data_dir=Path("/nonexistent/hopline-parts"), **given)


class Running:
    """A collector being served: its app, base URL, the ``Collector`` object and an HTTP client."""

    def __init__(self, app: Any, url: str) -> None:
        self.app = app
        self.url = url
        self.collector = app.state.collector
        self.client = httpx.Client(base_url=url, timeout=10)


@contextlib.contextmanager
def serve(config: CollectorConfig) -> Iterator[Running]:
    """A real uvicorn server running ``create_app(config)`` on a free port, in a thread."""
    app = create_app(config)
    with running_server(app, lifespan="on") as url:
        running = Running(app, url)
        try:
            yield running
        finally:
            running.client.close()


def stored_lines(data_dir: Path) -> list[dict[str, Any]]:
    """Every event in the store's NDJSON files (complete lines only)."""
    out = []
    for path in sorted((data_dir / "events").glob("date=*/hour=*/*.ndjson")):
        data = path.read_bytes()
        data = data[: data.rfind(b"\n") + 1]
        out.extend(json.loads(line) for line in data.splitlines() if line.strip())
    return out


@contextlib.contextmanager
def collector_process(
    data_dir: Path, *args: str, start_timeout_s: float = 60.0, port: int | None = None
) -> Iterator[tuple[subprocess.Popen, str]]:
    """``python -m hopline.collector`` on ``port`` (default: a free one; give the old one to restart
    a collector where its emitters expect it), no HOPLINE_* from this environment, up and
    answering /healthz: (process, base URL). Killed at the end if still running."""
    port = free_port() if port is None else port
    proc = subprocess.Popen(
        [sys.executable, "-m", "hopline.collector", "--data-dir", str(data_dir), "--port", str(port), *args],
        env=env_without_hopline(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + start_timeout_s  # generous: these machines are shared and busy
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
