"""A real collector that is down, then failing, then healthy again, fed by a real http sink:
the emitter's losses are counted by reason, reach the collector as hopline_emitter_* once it
recovers, and what is emitted after the recovery is delivered (no timing asserts: bench/
bench_sink_faults.py measures latency and memory)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

import uvicorn
from fault_collector import FaultInjector
from hopline.collector.app import create_app
from hopline.collector.config import CollectorConfig
from hopline.middleware.emit import Emitter
from hopline.middleware.sinks import HttpSink


def wait_until(what: str, condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def emit_request(emitter: Emitter, rid: str) -> None:
    t = time.time()
    emitter.emit("engine.received", rid, t, stream=True)
    emitter.emit("engine.first_token", rid, t + 0.01)
    emitter.emit("engine.last_token", rid, t + 0.02, output_tokens=3)


def test_drops_while_the_collector_is_down_or_failing_are_counted_exported_and_delivery_resumes(tmp_path):
    app = FaultInjector(create_app(CollectorConfig(data_dir=tmp_path / "data", grace=0.0)), mode="error")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused (the collector is down)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    sink = HttpSink(url, retry_budget=0.2, backoff=(0.01, 0.05))
    emitter = Emitter(sink, service="svc", replica="r1", capacity=30, flush_interval=0.01, batch_size=6,
                      stats_interval=0.05)  # fmt: skip
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    try:
        # down: batches are retried, then dropped (sink); meanwhile the full buffer sheds its oldest
        for i in range(300):
            emit_request(emitter, f"down-{i}")
        wait_until("drops while down", lambda: emitter.dropped_sink > 0 and emitter.dropped_full > 0)
        # up, but answering 500 to every batch
        thread.start()
        wait_until("the collector", lambda: server.started)
        sink_drops = emitter.dropped_sink
        for i in range(60):
            emit_request(emitter, f"failing-{i}")
        wait_until("drops while failing", lambda: emitter.dropped_sink > sink_drops)
        # healthy again: what is emitted from now on arrives, with the reports of what was lost
        app.mode = "ok"
        collector = app.app.state.collector
        for i in range(20):  # at the pace the sink drains (a burst larger than the buffer sheds its oldest)
            wait_until("room in the buffer", lambda: len(emitter._buffer) <= emitter.capacity - 3)
            emit_request(emitter, f"after-{i}")
        wait_until(
            "delivery after recovery",
            lambda: all(collector.joiner.lookup(f"after-{i}") is not None for i in range(20)),
        )
        emitter.close()
        stats = emitter.stats()
        registry = collector.registry

        def exported(name: str, **labels: str) -> float | None:
            return registry.get_sample_value(name, {"service": "svc", "replica": "r1", **labels})

        assert stats["sent"] >= 60  # at least the 20 requests after the recovery
        assert exported("hopline_emitter_events_sent_total") == stats["sent"]
        for reason in ("full", "sink", "closed"):
            assert exported("hopline_emitter_events_dropped_total", reason=reason) == stats[f"dropped_{reason}"]
        assert stats["dropped_full"] > 0 and stats["dropped_sink"] > 0
        assert exported("hopline_emitter_events_buffered") == 0
        # every event is accounted for: delivered or counted as dropped
        assert stats["sent"] + stats["dropped"] == 3 * (300 + 60 + 20)
    finally:
        emitter.close()
        server.should_exit = True
        if thread.is_alive():
            thread.join(timeout=10)
        sock.close()
