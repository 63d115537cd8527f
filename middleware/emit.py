"""Emitting hop events without touching the host's request path.

``Emitter.emit`` is all a middleware calls per hop: it builds a small dict and appends it to a
bounded deque (no serialization, no I/O, no lock, never an exception into the host). A daemon
thread drains the deque every ``flush_interval`` seconds, gives each event its ``eid`` and hands
the batch to a sink (``hopline.middleware.sinks``), which serializes and writes it.

    emitter = Emitter("file:/var/log/hopline/events.ndjson", service="kite-chat")
    emitter.emit("client.sent", request_id, stream=True)

``get_emitter()`` returns the process-wide emitter configured from the environment
(``HOPLINE_SINK``, ``HOPLINE_SERVICE``, ``HOPLINE_REPLICA``, ``HOPLINE_MODEL``, ``HOPLINE_TOKEN``).
"""

from __future__ import annotations

import atexit
import os
import threading
from collections import deque
from typing import Any

from hopline.middleware import clock
from hopline.middleware.contract import VERSION, new_eid
from hopline.middleware.log import logger
from hopline.middleware.sinks import Sink, make_sink

DEFAULT_CAPACITY = 10_000


class Emitter:
    """Buffers hop events in memory and ships them to a sink from a background thread.

    ``capacity`` bounds the buffer: when it is full, new events are dropped and counted in
    ``dropped`` (the host is never slowed down to wait for a slow sink).
    """

    def __init__(
        self,
        sink: Sink | str | None = None,
        *,
        service: str | None = None,
        replica: str | None = None,
        model: str | None = None,
        capacity: int = DEFAULT_CAPACITY,
        flush_interval: float = 0.2,
        batch_size: int = 1000,
    ) -> None:
        self.sink = make_sink(sink) if sink is None or isinstance(sink, str) else sink
        self.static = {
            k: v for k, v in (("service", service), ("replica", replica), ("model", model)) if v
        }
        self.capacity = capacity
        self.flush_interval = flush_interval
        self.batch_size = batch_size
        self.dropped = 0  # buffer full, or the sink gave up on a batch
        self.errors = 0  # bugs inside hopline, caught
        self.sent = 0
        self._buffer: deque[dict[str, Any]] = deque()
        self._wake = threading.Event()
        self._closed = False
        self._lock = threading.Lock()  # serializes drains (worker vs flush); never held by emit
        self._thread = threading.Thread(target=self._run, name="hopline-emitter", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    # -- request path ---------------------------------------------------------------------------

    def emit(self, hop: str, request_id: str, ts: float | None = None, **attrs: Any) -> None:
        """Record one hop event. ``ts`` defaults to now (see ``hopline.middleware.clock``)."""
        try:
            if len(self._buffer) >= self.capacity:
                self.dropped += 1
                return
            event = {"v": VERSION, "ts": clock.now() if ts is None else ts, "request_id": request_id, "hop": hop}
            event.update(self.static)
            if attrs:
                event.update(attrs)
            self._buffer.append(event)
        except Exception:  # never into the host
            self.errors += 1

    # -- background -----------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(self.flush_interval)
            self._wake.clear()
            self._drain()

    def _drain(self) -> None:
        with self._lock:
            buffer = self._buffer
            while buffer:
                batch = []
                try:
                    while buffer and len(batch) < self.batch_size:
                        event = buffer.popleft()
                        if "eid" not in event:
                            event["eid"] = new_eid()
                        batch.append(event)
                except IndexError:
                    pass
                if not batch:
                    break
                try:
                    lost = self.sink.write(batch)
                except Exception as exc:
                    self.dropped += len(batch)
                    self.errors += 1
                    logger.warning("sink_write_failed", sink=repr(self.sink), events=len(batch), error=str(exc))
                else:
                    lost = lost or 0
                    self.dropped += lost
                    self.sent += len(batch) - lost

    def flush(self) -> None:
        """Write everything buffered so far (blocking; never call it on a request path)."""
        self._drain()
        try:
            self.sink.flush()
        except Exception as exc:
            self.errors += 1
            logger.warning("sink_flush_failed", sink=repr(self.sink), error=str(exc))

    def close(self) -> None:
        """Flush and stop the worker; later ``emit`` calls are still safe (and buffered)."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        self._thread.join(timeout=5)
        self.flush()
        try:
            self.sink.close()
        except Exception:
            self.errors += 1

    def stats(self) -> dict[str, int]:
        return {"buffered": len(self._buffer), "sent": self.sent, "dropped": self.dropped, "errors": self.errors}


_default: Emitter | None = None
_default_lock = threading.Lock()


def get_emitter() -> Emitter:
    """The process-wide emitter, configured from ``HOPLINE_*`` environment variables."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = Emitter(
                    os.environ.get("HOPLINE_SINK") or "stdout",
                    service=os.environ.get("HOPLINE_SERVICE"),
                    replica=os.environ.get("HOPLINE_REPLICA"),
                    model=os.environ.get("HOPLINE_MODEL"),
                )
    return _default
