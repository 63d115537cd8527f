"""A real collector for tests: ``create_app(config)`` on uvicorn in a thread, and what its store holds."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from hopline.collector.app import create_app
from hopline.collector.config import CollectorConfig

from support.servers import running_server


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
