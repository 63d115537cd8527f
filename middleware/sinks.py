"""Where emitted events go: ``stdout``, ``file:PATH`` or ``http://HOST:PORT``.

A sink receives batches of event dicts from the emitter's background thread, never from a
request path. ``write`` returns how many events of the batch it had to drop (0 or None: all
written).
"""

from __future__ import annotations

import sys
from typing import Any, Protocol

from hopline.middleware.contract import dumps


class Sink(Protocol):
    def write(self, batch: list[dict[str, Any]]) -> int | None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


class StdoutSink:
    """NDJSON on standard output."""

    def write(self, batch: list[dict[str, Any]]) -> int:
        out = sys.stdout.buffer
        out.write(b"".join(dumps(e) for e in batch))
        out.flush()
        return 0

    def flush(self) -> None:
        sys.stdout.flush()

    def close(self) -> None:
        self.flush()

    def __repr__(self) -> str:
        return "StdoutSink()"


class MemorySink:
    """Keeps events in a list (tests and embedding)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def write(self, batch: list[dict[str, Any]]) -> int:
        self.events.extend(batch)
        return 0

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def make_sink(spec: str | None) -> Sink:
    """Build a sink from ``stdout``, ``file:PATH``, ``http://HOST:PORT`` (or None: stdout)."""
    if spec is None or spec == "stdout":
        return StdoutSink()
    if spec == "memory":
        return MemorySink()
    # file: and http:// sinks: see FileSink / HttpSink (to be completed)
    raise ValueError(
        f"unknown HOPLINE_SINK {spec!r}: use stdout, file:PATH or http://HOST:PORT"
    )
