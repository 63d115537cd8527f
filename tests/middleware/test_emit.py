"""The emitter: what an event holds, bounded buffering, flushing on close, never raising, fork, env."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import structlog

from hopline.middleware import clock
from hopline.middleware import emit as emit_module
from hopline.middleware import log as hopline_log
from hopline.middleware.contract import EMITTER_STATS_HOP, iter_ndjson, validate_event
from hopline.middleware.emit import Emitter, get_emitter
from hopline.middleware.sinks import FileSink, HttpSink, MemorySink, NullSink


@pytest.fixture(autouse=True)
def fresh_throttle(monkeypatch) -> None:
    monkeypatch.setattr(hopline_log, "_throttle", hopline_log.Throttle())


def file_events(path: Path) -> list[dict[str, Any]]:
    parsed = list(iter_ndjson(path.read_bytes()))
    assert all(error is None for _, _, error in parsed), parsed
    return [event for _, event, _ in parsed]


class ExplodingSink:
    """A sink with a bug: every write raises."""

    def write(self, batch: list[dict[str, Any]]) -> int:
        raise RuntimeError("sink bug")

    def flush(self) -> None:
        raise RuntimeError("flush bug")

    def close(self) -> None:
        pass


def test_an_event_carries_the_contract_fields_static_fields_and_attributes() -> None:
    sink = MemorySink()
    emitter = Emitter(sink, service="kite-chat", replica="r1", model="m", flush_interval=60)
    before = time.time()
    emitter.emit("client.sent", "req-1", stream=True, attempt=0)
    emitter.emit("engine.stats", "req-1", ts=1234.5, model="served-model", queue_s=0.25)
    emitter.flush()
    first, second = sink.events
    assert validate_event(first) == first  # already in contract form
    assert first["hop"] == "client.sent" and first["request_id"] == "req-1" and first["v"] == 1
    assert first["service"] == "kite-chat" and first["replica"] == "r1" and first["model"] == "m"
    assert first["stream"] is True and first["attempt"] == 0
    assert before - 1 < first["ts"] < time.time() + 1
    assert second["ts"] == 1234.5 and second["model"] == "served-model" and second["queue_s"] == 0.25
    assert len(first["eid"]) == 16 and int(first["eid"], 16) >= 0 and first["eid"] != second["eid"]
    emitter.close()


def test_close_flushes_everything_buffered_to_the_file(tmp_path) -> None:
    path = tmp_path / "events.ndjson"
    emitter = Emitter(f"file:{path}", service="svc", flush_interval=60, batch_size=100)
    n = 2_345  # more than one batch, fewer than the capacity
    for i in range(n):
        emitter.emit("gateway.received", f"req-{i}")
    emitter.close()
    *written, report = file_events(path)
    assert len(written) == n
    assert [e["request_id"] for e in written] == [f"req-{i}" for i in range(n)]
    # the last line is the emitter's final health report, counting every event as sent
    assert report["hop"] == EMITTER_STATS_HOP and report["final"] is True
    assert report["sent"] == n and report["buffered"] == 0 and report["dropped_full"] == 0
    assert len({e["eid"] for e in written}) == n
    assert emitter.stats() == {
        "buffered": 0, "sent": n, "dropped": 0, "dropped_full": 0, "dropped_sink": 0, "dropped_closed": 0,
        "errors": 0,
    }


def test_a_full_buffer_drops_the_oldest_events_and_counts_them() -> None:
    sink = MemorySink()
    emitter = Emitter(sink, capacity=5, flush_interval=60)  # the worker sleeps through the test
    for i in range(12):
        emitter.emit("client.sent", f"req-{i}")
    assert emitter.stats()["buffered"] == 5
    assert emitter.stats()["dropped_full"] == 7
    emitter.flush()
    # the newest are kept: after an outage, what happened last arrives
    assert [e["request_id"] for e in sink.events] == [f"req-{i}" for i in range(7, 12)]
    emitter.emit("client.sent", "req-after")  # room again
    emitter.close()
    assert sink.events[-1]["request_id"] == "req-after"
    assert emitter.stats()["sent"] == 6 and emitter.stats()["dropped"] == 7


def test_the_worker_drains_without_being_asked(tmp_path) -> None:
    path = tmp_path / "events.ndjson"
    emitter = Emitter(FileSink(path), flush_interval=0.02)
    for i in range(10):
        emitter.emit("client.sent", f"req-{i}")
    deadline = time.monotonic() + 10
    while (not path.exists() or path.read_bytes().count(b"\n") < 10) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(file_events(path)) == 10  # written by the background thread; no flush() was called
    emitter.close()


def test_a_full_batch_wakes_the_worker_early() -> None:
    sink = MemorySink()
    emitter = Emitter(sink, flush_interval=60, batch_size=50)
    for i in range(50):
        emitter.emit("client.sent", f"req-{i}")
    deadline = time.monotonic() + 10
    while len(sink.events) < 50 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(sink.events) == 50  # long before the 60 s interval
    emitter.close()


def test_emit_after_close_is_dropped_and_counted() -> None:
    sink = MemorySink()
    emitter = Emitter(sink)
    emitter.emit("client.sent", "req-1")
    emitter.close()
    emitter.emit("client.sent", "req-2")
    emitter.close()  # idempotent
    assert [e["request_id"] for e in sink.events] == ["req-1"]
    assert emitter.stats()["dropped_closed"] == 1


def test_a_sink_that_raises_never_reaches_the_host() -> None:
    emitter = Emitter(ExplodingSink(), flush_interval=60)
    for i in range(3):
        emitter.emit("client.sent", f"req-{i}")
    emitter.flush()  # even the blocking flush does not raise
    emitter.close()
    stats = emitter.stats()
    assert stats["dropped_sink"] == 3 and stats["sent"] == 0 and stats["errors"] >= 2


def test_an_unwritable_file_costs_events_not_the_host(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    emitter = Emitter(f"file:{blocker}/sub/events.ndjson", flush_interval=0.01)
    for i in range(500):
        emitter.emit("client.sent", f"req-{i}")  # returns; never raises
    emitter.close()
    assert emitter.stats()["sent"] == 0 and emitter.stats()["dropped"] == 500


def test_emit_keeps_working_against_a_closed_port_and_counts_every_loss(mw) -> None:
    sink = HttpSink(mw.closed_port_url(), retry_budget=0.2, backoff=(0.01, 0.05))
    emitter = Emitter(sink, capacity=100, flush_interval=0.01, batch_size=20)
    n = 5_000
    for i in range(n):
        emitter.emit("client.sent", f"req-{i}", stream=True)
    emitter.close(timeout=2)
    stats = emitter.stats()
    assert stats["sent"] == 0
    assert stats["dropped_full"] > 0  # the buffer stayed bounded while batches were retried
    assert stats["dropped_full"] + stats["dropped_sink"] == n  # every event is accounted for
    assert stats["buffered"] == 0


def test_emit_survives_bad_arguments() -> None:
    sink = MemorySink()
    emitter = Emitter(sink, flush_interval=60)
    emitter.emit("client.sent", None)  # type: ignore[arg-type]  # the collector will reject it, not us
    emitter.emit("client.sent", "req-ok", payload=object())
    emitter.close()
    assert len(sink.events) == 2


def test_bad_configuration_is_refused_naming_the_argument() -> None:
    with pytest.raises(ValueError, match="capacity"):
        Emitter(MemorySink(), capacity=0)
    with pytest.raises(ValueError, match="batch_size"):
        Emitter(MemorySink(), batch_size=0)
    with pytest.raises(ValueError, match="'tcp://x'"):
        Emitter("tcp://x")


def test_get_emitter_is_configured_from_the_environment(tmp_path, monkeypatch) -> None:
    path = tmp_path / "events.ndjson"
    monkeypatch.setattr(emit_module, "_default", None)
    monkeypatch.setenv("HOPLINE_SINK", f"file:{path}")
    monkeypatch.setenv("HOPLINE_SERVICE", "kite-chat")
    monkeypatch.setenv("HOPLINE_REPLICA", "r2")
    monkeypatch.setenv("HOPLINE_MODEL", "llama")
    emitter = get_emitter()
    assert get_emitter() is emitter
    emitter.emit("engine.received", "req-1", stream=True)
    emitter.close()
    [event, report] = file_events(path)
    assert (event["service"], event["replica"], event["model"]) == ("kite-chat", "r2", "llama")
    assert report["hop"] == EMITTER_STATS_HOP and (report["service"], report["replica"]) == ("kite-chat", "r2")


def test_get_emitter_with_a_bad_sink_logs_it_and_discards(monkeypatch, capfd) -> None:
    monkeypatch.setattr(emit_module, "_default", None)
    monkeypatch.setenv("HOPLINE_SINK", "kafka://broker")
    emitter = get_emitter()  # no exception into the host
    assert isinstance(emitter.sink, NullSink)
    emitter.emit("client.sent", "req-1")
    emitter.close()
    assert emitter.stats()["dropped"] == 1
    err = capfd.readouterr().err
    assert '"event":"hopline_sink_invalid"' in err and "kafka://broker" in err


def test_a_forked_child_ships_its_own_events_with_its_own_worker(tmp_path) -> None:
    template = str(tmp_path / "events.{pid}.ndjson")
    emitter = Emitter(FileSink(template), flush_interval=0.01)
    for i in range(10):
        emitter.emit("client.sent", f"parent-{i}")
    emitter.flush()
    emitter.emit("client.sent", "parent-buffered")  # still buffered at the fork: the parent's to send
    pid = os.fork()
    if pid == 0:  # the child: a gunicorn worker forked after import
        code = 1
        try:
            for i in range(5):
                emitter.emit("client.sent", f"child-{i}")
            mine = Path(template.replace("{pid}", str(os.getpid())))
            deadline = time.monotonic() + 10
            # Shipped by a worker thread started lazily in the child: no flush, no close.
            while time.monotonic() < deadline:
                if mine.exists() and mine.read_bytes().count(b"\n") == 5:
                    code = 0
                    break
                time.sleep(0.01)
            emitter.close()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    emitter.close()
    assert os.waitstatus_to_exitcode(status) == 0
    *child, child_report = file_events(tmp_path / f"events.{pid}.ndjson")
    *parent, parent_report = file_events(tmp_path / f"events.{os.getpid()}.ndjson")
    assert [e["request_id"] for e in child] == [f"child-{i}" for i in range(5)]
    assert [e["request_id"] for e in parent] == [f"parent-{i}" for i in range(10)] + ["parent-buffered"]
    # the child is another emitter to the collector, with its own counts
    assert (child_report["sent"], parent_report["sent"]) == (5, 11)
    assert child_report["emitter"] != parent_report["emitter"]


def test_hopline_logging_leaves_the_host_logging_alone(tmp_path, capfd) -> None:
    seen_by_host: list[dict[str, Any]] = []

    def host_processor(logger: Any, method: str, event_dict: dict[str, Any]) -> str:
        seen_by_host.append(dict(event_dict))
        return str(event_dict)

    class HostHandler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen_by_host.append({"stdlib": record.getMessage(), "name": record.name})

    saved_structlog, was_configured = structlog.get_config(), structlog.is_configured()
    root = logging.getLogger()
    saved_root = (root.level, list(root.handlers))
    host_handler = HostHandler()
    try:
        structlog.configure(
            processors=[host_processor],
            wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL),
            cache_logger_on_first_use=False,
        )
        root.addHandler(host_handler)
        root.setLevel(logging.DEBUG)
        host_config = structlog.get_config()
        host_root = (root.level, list(root.handlers))

        blocker = tmp_path / "file"
        blocker.write_text("")
        emitter = Emitter(f"file:{blocker}/x.ndjson", flush_interval=60)
        emitter.emit("client.sent", "req-1")
        emitter.close()  # logs a warning through hopline's private logger

        assert structlog.get_config() == host_config
        assert (root.level, list(root.handlers)) == host_root
        assert seen_by_host == []  # neither the host's structlog chain nor stdlib logging saw it
        err = capfd.readouterr().err
        # hopline's line went out at WARNING although the host filters structlog at CRITICAL
        assert '"logger":"hopline"' in err and '"event":"sink_write_failed"' in err
    finally:
        if was_configured:
            structlog.configure(**saved_structlog)
        else:
            structlog.reset_defaults()
        root.removeHandler(host_handler)
        root.setLevel(saved_root[0])


def test_events_still_buffered_at_exit_are_flushed(tmp_path) -> None:
    path = tmp_path / "events.ndjson"
    script = f"""
from hopline.middleware.emit import Emitter
emitter = Emitter("file:{path}", flush_interval=3600)
for i in range(777):
    emitter.emit("client.sent", f"req-{{i}}")
# no flush, no close: the interpreter exits with everything still buffered
"""
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
    *events, report = file_events(path)
    assert [e["request_id"] for e in events] == [f"req-{i}" for i in range(777)]
    assert report["hop"] == EMITTER_STATS_HOP and report["sent"] == 777 and report["final"] is True


def test_events_are_stamped_with_the_anchored_clock_not_the_stepped_wall_clock(monkeypatch) -> None:
    sink = MemorySink()
    emitter = Emitter(sink, flush_interval=60)
    monkeypatch.setattr(time, "time", lambda: 4_000_000_000.0)  # NTP stepped the wall clock
    before = clock.now()
    emitter.emit("engine.received", "req-1")
    after = clock.now()
    emitter.close()
    assert before <= sink.events[0]["ts"] <= after


# --- health reports (emitter.stats) ------------------------------------------------------------


def test_the_worker_reports_its_counts_by_reason_as_an_emitter_stats_event() -> None:
    sink = MemorySink()
    emitter = Emitter(sink, service="svc", replica="r1", capacity=3, flush_interval=0.02, stats_interval=0.05)
    for i in range(5):  # two more than the buffer holds, before the worker drains: 2 dropped as full
        emitter.emit("client.sent", f"req-{i}")
    deadline = time.monotonic() + 5
    while not any(e["hop"] == EMITTER_STATS_HOP and e["sent"] == 3 for e in list(sink.events)):
        assert time.monotonic() < deadline, f"no report counting 3 sent: {sink.events}"
        time.sleep(0.02)
    emitter.close()
    emitter.emit("client.sent", "late")  # dropped as closed: no report can say it any more
    reports = [e for e in sink.events if e["hop"] == EMITTER_STATS_HOP]
    assert all(validate_event(r) == r for r in reports)  # contract form, without a request_id
    last = reports[-1]
    assert "request_id" not in last and (last["service"], last["replica"]) == ("svc", "r1")
    assert (last["sent"], last["dropped_full"], last["dropped_sink"], last["buffered"]) == (3, 2, 0, 0)
    assert last["final"] is True and len({r["emitter"] for r in reports}) == 1
    # reports are not events: the counters count hop events only
    assert emitter.stats()["sent"] == 3 and len([e for e in sink.events if e["hop"] != EMITTER_STATS_HOP]) == 3


def test_an_idle_emitter_does_not_repeat_an_unchanged_report() -> None:
    sink = MemorySink()
    emitter = Emitter(sink, flush_interval=0.01, stats_interval=0.02)
    emitter.emit("client.sent", "req-1")
    time.sleep(0.5)  # ~25 report intervals with nothing new
    emitter.close()
    reports = [e for e in sink.events if e["hop"] == EMITTER_STATS_HOP]
    assert 1 <= len(reports) <= 2  # the one counting req-1 (and the final one if it came after)
    assert all(r["sent"] == 1 for r in reports)


def test_memory_and_null_sinks_get_no_reports_unless_asked() -> None:
    sink = MemorySink()
    emitter = Emitter(sink, flush_interval=0.01)
    emitter.emit("client.sent", "req-1")
    emitter.close()
    assert [e["hop"] for e in sink.events] == ["client.sent"]
    assert Emitter(NullSink()).stats_interval == 0 and Emitter("stdout").stats_interval > 0


# --- configuration: explicit, then the environment, else nothing -------------------------------


def test_configure_sets_the_process_emitter_and_falls_back_to_the_environment(tmp_path, monkeypatch) -> None:
    path = tmp_path / "events.ndjson"
    monkeypatch.setattr(emit_module, "_default", None)
    monkeypatch.setenv("HOPLINE_SINK", "stdout")
    monkeypatch.setenv("HOPLINE_SERVICE", "from-env")
    monkeypatch.setenv("HOPLINE_REPLICA", "r-env")
    emitter = emit_module.configure(f"file:{path}", service="kite-chat", stats_interval=0)
    assert get_emitter() is emitter
    emitter.emit("client.sent", "req-1")
    emitter.close()
    [event] = file_events(path)
    # given arguments win; what was not given comes from the environment
    assert (event["service"], event["replica"]) == ("kite-chat", "r-env")


def test_configure_refuses_a_bad_sink_naming_it(monkeypatch) -> None:
    monkeypatch.setattr(emit_module, "_default", None)
    monkeypatch.delenv("HOPLINE_SINK", raising=False)
    with pytest.raises(ValueError, match="'kafka://broker'"):
        emit_module.configure("kafka://broker")
    with pytest.raises(ValueError, match="needs a sink"):
        emit_module.configure()
    with pytest.raises(ValueError, match="HOPLINE_TOKEN must be printable ASCII"):
        emit_module.configure("http://127.0.0.1:9400", token="t\u00f6ken")
    assert emit_module._default is None  # nothing half-configured


def _env_without_hopline() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("HOPLINE_")}


def test_without_hopline_sink_nothing_is_emitted_and_it_is_said_once_on_stderr() -> None:
    script = """
from hopline.middleware.emit import get_emitter
for i in range(3):
    get_emitter().emit("client.sent", f"req-{i}", stream=True)
print("host output")
"""
    done = subprocess.run(
        [sys.executable, "-c", script], env=_env_without_hopline(), capture_output=True, timeout=60, check=True
    )
    assert done.stdout == b"host output\n"  # the host's stdout is the host's
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 1 and '"event":"hopline_not_configured"' in lines[0] and "HOPLINE_SINK" in lines[0]


EXIT_SCRIPT = """
import sys
from hopline.middleware.emit import get_emitter
for i in range(5000):
    get_emitter().emit("client.sent", f"req-{i}", stream=True)
print("ready", flush=True)
"""


def _exit_seconds(sink: str) -> float:
    """Seconds from the script's last statement to its process ending (the exit's own cost)."""
    env = {**_env_without_hopline(), "HOPLINE_SINK": sink}
    process = subprocess.Popen(
        [sys.executable, "-c", EXIT_SCRIPT], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert process.stdout is not None
    assert process.stdout.readline() == b"ready\n"
    start = time.monotonic()
    process.wait(timeout=60)
    return time.monotonic() - start


def test_an_unreachable_collector_does_not_hold_up_the_exit(mw) -> None:
    # A closed port refuses at once (the sink retries with backoff); a blackholed collector accepts
    # connections and never answers (a request hangs until its 5 s timeout). Both used to add ~5 s
    # (the close timeout); the bound is EXIT_TIMEOUT + EXIT_GRACE = 0.5 s, asserted generously.
    import socket

    with socket.socket() as blackhole:
        blackhole.bind(("127.0.0.1", 0))
        blackhole.listen(64)  # the kernel completes handshakes; nobody ever reads
        blackholed = f"http://127.0.0.1:{blackhole.getsockname()[1]}"
        assert _exit_seconds(blackholed) < 2.0
    assert _exit_seconds(mw.closed_port_url()) < 2.0


def test_emit_later_builds_on_the_worker_in_order_and_bounds_what_waits(monkeypatch):
    """Builds run when the buffer drains (not at the call), keep their place among plain events,
    cost only their own event when they raise; past DEFER_LIMIT waiting they run at once."""
    threads: list[str] = []

    def build(n):
        threads.append(threading.current_thread().name)
        if n == 2:
            raise ValueError("a bug in one build")
        return "engine.received", f"r{n}", 1.0 + n, {"n": n}

    emitter = Emitter(MemorySink(), flush_interval=60)
    emitter.emit("engine.first_token", "r0", 1.0)  # starts the worker
    for n in (1, 2, 3):
        emitter.emit_later(build, n)
    emitter.emit("engine.last_token", "r4", 5.0)
    assert threads == []  # nothing read at the call
    emitter.flush()
    events = emitter.sink.events
    assert [(e["hop"], e["request_id"], e["ts"]) for e in events] == [
        ("engine.first_token", "r0", 1.0), ("engine.received", "r1", 2.0),
        ("engine.received", "r3", 4.0), ("engine.last_token", "r4", 5.0),
    ]
    assert emitter.errors == 1 and events[1]["n"] == 1 and "eid" in events[1]
    monkeypatch.setattr(emit_module, "DEFER_LIMIT", 2)
    for n in range(5, 9):
        emitter.emit_later(build, n)
    assert len(threads) == 3 + 2  # two waited, the two over the limit were built at the call
    emitter.flush()
    assert sorted(e["request_id"] for e in emitter.sink.events[4:]) == ["r5", "r6", "r7", "r8"]
    emitter.close()
