"""Emitting hop events without touching the host's request path.

``Emitter.emit`` is all a middleware calls per hop: it builds a small dict and appends it to a
bounded deque (no serialization, no I/O, never an exception into the host; beyond starting the
worker at its first call, the only lock it touches is the worker's wake-up event, once per
``batch_size`` events, and no lock it takes is ever held across I/O).
A daemon thread, started at the first ``emit``, drains the deque every ``flush_interval`` seconds
(or as soon as a batch is full), gives each event its ``eid`` and hands the batch to a sink
(``hopline.middleware.sinks``), which serializes and writes it. The ``eid`` is given once, when
the event leaves the buffer, so every retry of a batch resends the same IDs and the collector
can drop the duplicates.

    emitter = Emitter("file:/var/log/hopline/events.ndjson", service="kite-chat")
    emitter.emit("client.sent", request_id, stream=True)

``get_emitter()`` returns the process-wide emitter: the one given to ``configure(...)``, else one
configured from the environment (``HOPLINE_SINK``, ``HOPLINE_SERVICE``, ``HOPLINE_REPLICA``,
``HOPLINE_MODEL``, ``HOPLINE_TOKEN``), as structlog and prometheus_client let code configure
them and fall back to defaults. With neither, hopline emits nothing and says so once on stderr
(it never writes to the host's stdout unless ``stdout`` is asked for).

``Emitter.emit_later(build, *args)`` is for an event whose attributes are costly to read
(a request body's JSON, a stream's remaining chunks): the request path queues ``build`` and its
arguments, and the worker calls it when it drains the buffer, in order with the other events,
where the same code runs many times in a row (warm) instead of once between the host's own code.
At most ``DEFER_LIMIT`` such items wait at a time, which bounds the memory their arguments hold;
beyond that (a slow sink), ``build`` runs at once on the caller's thread.

Losing events is preferred to slowing the host: when the buffer is full (the sink is slower
than the traffic, or the collector is down and a batch is being retried), the *oldest* buffered
event makes room for the new one (as observability pipelines do: after an outage the most
recent events arrive), and it is counted (``stats()``, ``dropped_full``). Every
``stats_interval`` seconds the worker sends the counters along with the events as one
``emitter.stats`` event (``contract.EMITTER_STATS_HOP``), so the collector can show drops.
Every emitter is closed (flushed) at interpreter exit, within ``EXIT_TIMEOUT`` seconds in all
(an unreachable collector does not hold the process up). A process forked after events were
emitted (gunicorn and uvicorn workers) starts with an empty buffer and its own worker thread at
its first ``emit``; the parent keeps shipping its own events.

A sink that delivers on threads of its own (``sharded_sink.ShardedHttpSink``: one per
collector) takes a batch without blocking and keeps counts of what it delivered, lost and still
holds (``delivery_counts()``, and per collector ``target_counts()``); for such a sink,
``stats()`` and the reports count an event as sent when its collector took it, and the reports
carry the per-collector counts as ``targets``.
"""

from __future__ import annotations

import atexit
import os
import random
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

from hopline.middleware import clock
from hopline.middleware.contract.events import EMITTER_STATS_HOP, VERSION, new_eid
from hopline.middleware.log import logger, warn_throttled
from hopline.middleware.sinks import NullSink, Sink, make_sink

DEFAULT_CAPACITY = 10_000
CLOSE_TIMEOUT = 5.0
CLOSE_GRACE = 1.0
# At interpreter exit every emitter gets this long in all to flush, and a drainer stuck in a
# sink call (a collector that accepts but never answers) this much more: then the process exits.
EXIT_TIMEOUT = 0.4
EXIT_GRACE = 0.1
STATS_INTERVAL = 10.0  # seconds between emitter.stats reports (when a counter changed)
STATS_HEARTBEAT = 300.0  # ... and at least this often, so the collector knows the emitter lives
# emit_later: the most deferred builds waiting in the buffer (each holds its arguments' memory)
DEFER_LIMIT = 512

# clock.now() inlined into emit (a Python call less: ~20% of emit's cost).
_CLOCK_OFFSET = clock.OFFSET
_perf = time.perf_counter
# The drainer's event IDs: its own generator (as contract.new_eid's, reseeded in a forked child)
_eid_bits = random.Random()
os.register_at_fork(after_in_child=_eid_bits.seed)


def _eids(count: int) -> str:
    """``count`` (at least one) event IDs in a row: ``new_eid``'s form (a random 64-bit number as
    16 hex characters) each, from one ``getrandbits`` of ``64 * count`` bits."""
    count = max(count, 1)
    return f"{_eid_bits.getrandbits(64 * count):0{16 * count}x}"


# What an emit_later build returns: emit's (hop, request_id, ts, attrs)
Built = tuple[str, str, float | None, dict[str, Any]]


class Emitter:
    """Buffers hop events in memory and ships them to a sink from a background thread.

    Args:
        sink: a sink object, or a spec for ``make_sink`` (``stdout``, ``file:PATH``,
            ``http://HOST:PORT``…); None means stdout.
        service, replica, model: added to every event (an ``emit`` keyword overrides them).
        capacity: the most events buffered; when full, the oldest is dropped (and counted) to
            make room for the new one.
        flush_interval: seconds between drains when fewer than ``batch_size`` events wait.
        batch_size: the most events handed to the sink at once.
        stats_interval: seconds between ``emitter.stats`` reports sent down the sink (one at
            close too); 0 turns them off. Default ``STATS_INTERVAL``, or off for a sink whose
            ``reports_stats`` is False (memory, null: nothing reads them there).

    Raises ``ValueError`` (naming the argument) for a bad sink spec or a non-positive size.
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
        stats_interval: float | None = None,
    ) -> None:
        for name, value in (("capacity", capacity), ("flush_interval", flush_interval), ("batch_size", batch_size)):
            if not value > 0:
                raise ValueError(f"{name} must be positive, got {value!r}")
        if stats_interval is not None and not stats_interval >= 0:
            raise ValueError(f"stats_interval must be >= 0 (0: no reports), got {stats_interval!r}")
        self.sink: Sink = make_sink(sink) if sink is None or isinstance(sink, str) else sink
        if stats_interval is None:
            stats_interval = STATS_INTERVAL if getattr(self.sink, "reports_stats", True) else 0.0
        self.stats_interval = stats_interval
        # A sink with its own delivery threads says what it delivered (see the module docstring).
        self._delivery = getattr(self.sink, "delivery_counts", None)
        self._per_target = getattr(self.sink, "target_counts", None)
        self.static = {k: v for k, v in (("service", service), ("replica", replica), ("model", model)) if v}
        self.capacity = capacity
        self.flush_interval = flush_interval
        self.batch_size = batch_size
        self.sent = 0  # handed to the sink and not lost there (delivered, unless _delivery says otherwise)
        self.dropped_full = 0  # buffer full: the oldest made room (written by emitting threads only)
        self.dropped_sink = 0  # the sink could not deliver them (written by the drainer only)
        self.dropped_closed = 0  # emitted after close()
        self.errors = 0  # bugs inside hopline or its sink, caught and counted
        self._buffer: deque[dict[str, Any]] = deque()
        self._wake_at = batch_size - 1  # buffer length at which an emit wakes the worker early
        self._closed = False
        self._close_deadline: float | None = None  # monotonic; past it, drains drop instead of write
        self._limit = 0  # what emit compares the buffer length with: see _admit
        self._worker: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self._lock = threading.Lock()  # serializes drains (worker vs flush/close); never taken by emit
        self._wake = threading.Event()
        self._disabled = False  # see disabled(): emit drops without counting
        self._new_reporter()
        _live.add(self)

    @classmethod
    def disabled(cls) -> Emitter:
        """An emitter that takes every ``emit`` and does nothing with it: no worker, no counts
        (what ``get_emitter()`` gives when hopline is not configured)."""
        emitter = cls(NullSink(), stats_interval=0)
        emitter._disabled = emitter._closed = True
        return emitter

    @property
    def closed(self) -> bool:
        """``close()`` was called (or the emitter is disabled): events are dropped from now on."""
        return self._closed

    def _new_reporter(self) -> None:
        """A fresh identity for ``emitter.stats`` (per process: a forked child is another emitter)."""
        self.instance = new_eid()
        self._last_report: tuple[int, ...] | None = None
        self._next_report = time.monotonic() + self.stats_interval
        self._heartbeat_at = 0.0

    # -- request path ---------------------------------------------------------------------------

    def emit(self, hop: str, request_id: str, ts: float | None = None, **attrs: Any) -> None:
        """Record one hop event. ``ts`` defaults to now (see ``hopline.middleware.clock``)."""
        self.emit_attrs(hop, request_id, ts, attrs)

    def emit_attrs(self, hop: str, request_id: str, ts: float | None, attrs: dict[str, Any]) -> None:
        """``emit(hop, request_id, ts, **attrs)`` for attributes already in a dict (no keyword
        arguments packed and unpacked again); ``attrs`` is read, not kept."""
        try:
            buffer = self._buffer
            queued = len(buffer)
            if queued >= self._limit and not self._admit():
                return
            buffer.append(
                {
                    "v": VERSION,
                    "ts": _CLOCK_OFFSET + _perf() if ts is None else ts,
                    "request_id": request_id,
                    "hop": hop,
                    **self.static,
                    **attrs,
                }
            )
            if queued == self._wake_at:
                self._wake.set()
        except Exception:  # noqa: BLE001 - never into the host
            self.errors += 1

    def emit_later(self, build: Callable[..., Built | None], *args: Any) -> None:
        """Record one hop event whose attributes ``build(*args)`` reads, on the worker thread.

        ``build`` returns ``(hop, request_id, ts, attrs)`` (what ``emit`` takes) or None (no
        event). It runs when the worker drains the buffer, in order with the events around it;
        while ``DEFER_LIMIT`` or more events wait (or the worker is not running yet), it runs
        here and now instead. The caller must not touch what ``args`` hold afterwards. An
        exception in ``build`` is counted in ``errors`` and costs that event only.
        """
        try:
            buffer = self._buffer
            queued = len(buffer)
            if queued < DEFER_LIMIT and queued < self._limit:
                buffer.append((build, args))  # a tuple: _drain builds it
                if queued == self._wake_at:
                    self._wake.set()
                return
            if self._disabled:
                return
            built = build(*args)
            if built is not None:
                hop, request_id, ts, attrs = built
                self.emit_attrs(hop, request_id, ts, attrs)
        except Exception:  # noqa: BLE001 - never into the host
            self.errors += 1

    def _built(self, item: tuple[Callable[..., Built | None], tuple[Any, ...]]) -> dict[str, Any] | None:
        """The event of an ``emit_later`` item (worker side), shaped as ``emit`` shapes it."""
        build, args = item
        try:
            built = build(*args)
        except Exception as exc:  # noqa: BLE001 - a bug costs this event, nothing more
            self.errors += 1
            warn_throttled("emit_later_build_failed", "emit_later_build_failed", error=repr(exc))
            return None
        if built is None:
            return None
        hop, request_id, ts, attrs = built
        return {
            "v": VERSION,
            "ts": _CLOCK_OFFSET + _perf() if ts is None else ts,
            "request_id": request_id,
            "hop": hop,
            **self.static,
            **attrs,
        }

    def _admit(self) -> bool:
        """The slow path of ``emit``: ``_limit`` is 0 until a worker runs in this process (first
        emit, first emit after a fork) and after close, so one comparison guards all three cases
        and a full buffer. Starts the worker when there is none (the only lock on this path, taken
        once per process); on a full buffer drops the oldest event (counted) to make room; False,
        counted, when the new event must be dropped (closed)."""
        if self._closed:
            if not self._disabled:
                self.dropped_closed += 1
            return False
        if not self._limit:
            with self._start_lock:
                if self._worker is None and not self._closed:
                    self._start_worker()
        buffer = self._buffer
        while len(buffer) >= self.capacity:
            try:
                buffer.popleft()
            except IndexError:  # the drainer emptied it meanwhile
                break
            self.dropped_full += 1
        return True

    def _start_worker(self) -> None:
        self._worker = threading.Thread(target=self._run, name="hopline-emitter", daemon=True)
        try:
            self._worker.start()
        except RuntimeError as exc:  # interpreter shutting down: events wait for close()
            self._worker = None
            self.errors += 1
            logger.error("emitter_worker_not_started", error=str(exc))
        self._limit = self.capacity

    # -- background -----------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(self.flush_interval)
            self._wake.clear()
            try:
                with self._lock:
                    self._drain(self._close_deadline)
            except Exception as exc:  # noqa: BLE001 - a bug must not kill the worker
                self.errors += 1
                warn_throttled("emitter_drain_failed", "emitter_drain_failed", error=repr(exc))

    def _drain(self, deadline: float | None = None) -> None:
        """Hand everything buffered to the sink, batch by batch (caller holds ``_lock``), with an
        ``emitter.stats`` report in the first batch when one is due.

        Past ``deadline`` (monotonic; shutdown), what is left is dropped and counted instead.
        """
        buffer = self._buffer
        report = self._due_report()
        if report is not None and not buffer:
            self._write([], report)
        while buffer:
            if deadline is not None and time.monotonic() >= deadline:
                lost = 0
                while buffer:
                    buffer.popleft()
                    lost += 1
                self.dropped_sink += lost
                logger.warning("emitter_close_timeout", sink=repr(self.sink), dropped=lost)
                return
            batch = []
            # the batch's eids cut from one random number (new_eid's 16 hex characters each): one
            # getrandbits and one format per batch instead of per event
            eids, at = _eids(min(len(buffer), self.batch_size)), 0
            while buffer and len(batch) < self.batch_size:
                event = buffer.popleft()
                if type(event) is tuple:  # emit_later: build it now
                    event = self._built(event)
                    if event is None:
                        continue
                if "eid" not in event:
                    if at == len(eids):  # more came in meanwhile than were counted: as many again
                        eids, at = _eids(min(len(buffer) + 1, self.batch_size - len(batch))), 0
                    event["eid"] = eids[at : at + 16]
                    at += 16
                batch.append(event)
            self._write(batch, report)
            report = None

    def _write(self, batch: list[dict[str, Any]], report: dict[str, Any] | None) -> None:
        """One sink call for ``batch`` (and a report after it, which is not counted as an event;
        the sink's losses are charged to the batch's events first)."""
        count = len(batch)
        if report is not None:
            batch.append(report)
        try:
            lost = self.sink.write(batch) or 0
        except Exception as exc:  # noqa: BLE001 - a sink bug costs the batch, nothing more
            lost = len(batch)
            self.errors += 1
            warn_throttled("sink_write_raised", "sink_write_failed", sink=repr(self.sink), error=repr(exc))
        lost = min(lost, count)
        self.dropped_sink += lost
        self.sent += count - lost

    def _due_report(self, final: bool = False) -> dict[str, Any] | None:
        """The ``emitter.stats`` event to send now, or None: every ``stats_interval`` seconds when
        a counter changed since the last report, every ``STATS_HEARTBEAT`` seconds regardless, and
        at close (``final``) when anything changed."""
        if not self.stats_interval:
            return None
        now = time.monotonic()
        if not final and now < self._next_report:
            return None
        self._next_report = now + self.stats_interval
        counts = self._counts()
        if final:
            if self._last_report is None and not any(counts):
                return None  # never used: nothing to say
        elif counts == self._last_report and now < self._heartbeat_at:
            return None
        self._last_report = counts
        self._heartbeat_at = now + STATS_HEARTBEAT
        sent, buffered, errors, full, sink, closed = counts
        report = {
            "v": VERSION,
            "ts": _CLOCK_OFFSET + _perf(),
            "hop": EMITTER_STATS_HOP,
            "eid": new_eid(),
            "emitter": self.instance,
            **self.static,
            "sent": sent,
            "buffered": buffered,
            "errors": errors,
            "dropped_full": full,
            "dropped_sink": sink,
            "dropped_closed": closed,
            "final": final,
        }
        if self._per_target is not None:
            report["targets"] = self._per_target()
        return report

    def _counts(self) -> tuple[int, ...]:
        """(sent, buffered, errors, dropped_full, dropped_sink, dropped_closed): a report's counts,
        with what a sink that delivers on its own threads still holds or lost."""
        sent, buffered, full, sink = self.sent, len(self._buffer), self.dropped_full, self.dropped_sink
        if self._delivery is not None:
            try:
                held = self._delivery()
                sent = held["sent"]
                buffered += held["buffered"]
                full += held["dropped_full"]
                sink += held["dropped_sink"]
            except Exception:  # noqa: BLE001 - a sink bug must not stop the reports
                self.errors += 1
        return (sent, buffered, self.errors, full, sink, self.dropped_closed)

    def flush(self) -> None:
        """Write everything buffered so far (blocking; never call it on a request path)."""
        with self._lock:
            self._drain()
            self._sink_call("flush")

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Flush and stop the worker, giving up after ``timeout`` seconds (what is still buffered
        then is dropped and counted); a last ``emitter.stats`` report goes with the flush. Later
        ``emit`` calls are dropped and counted."""
        deadline = time.monotonic() + timeout
        if self._begin_close(deadline):
            self._finish_close(deadline)

    def _begin_close(self, deadline: float) -> bool:
        """Stop accepting events and tell the worker and the sink to finish by ``deadline``
        (monotonic). False when already closed."""
        with self._start_lock:
            if self._closed:
                return False
            self._closed = True
            self._limit = 0
        self._close_deadline = deadline
        set_deadline = getattr(self.sink, "set_deadline", None)
        if set_deadline is not None:
            set_deadline(deadline)
        self._wake.set()
        return True

    def _finish_close(self, deadline: float, grace: float = CLOSE_GRACE) -> None:
        # Grace past the deadline: a drainer notices it between batches, after the sink call.
        grace = deadline + grace
        worker = self._worker
        if worker is not None and worker.is_alive() and worker is not threading.current_thread():
            worker.join(max(grace - time.monotonic(), 0))
        if not self._lock.acquire(timeout=max(grace - time.monotonic(), 0)):
            logger.warning("emitter_close_timeout", sink=repr(self.sink), buffered=len(self._buffer))
            return
        try:
            self._drain(deadline)
            report = self._due_report(final=True)
            if report is not None and time.monotonic() < deadline:
                self._write([], report)
            self._sink_call("flush")
            self._sink_call("close")
        finally:
            self._lock.release()

    def _sink_call(self, name: str) -> None:
        try:
            getattr(self.sink, name)()
        except Exception as exc:  # noqa: BLE001
            self.errors += 1
            warn_throttled(f"sink_{name}_failed", f"sink_{name}_failed", sink=repr(self.sink), error=repr(exc))

    def stats(self) -> dict[str, Any]:
        """Counters since start (per process: a forked child starts from zero); with a sink that
        delivers on its own threads, also ``targets``: its counts per collector."""
        sent, buffered, errors, full, sink, closed = self._counts()
        stats: dict[str, Any] = {
            "buffered": buffered,
            "sent": sent,
            "dropped": full + sink + closed,
            "dropped_full": full,
            "dropped_sink": sink,
            "dropped_closed": closed,
            "errors": errors,
        }
        if self._per_target is not None:
            stats["targets"] = self._per_target()
        return stats

    def _after_fork_in_child(self) -> None:
        """The parent's worker does not exist here and its locks may be held mid-drain: start
        afresh. Buffered events are the parent's to send (it still will), so they go."""
        self._buffer = deque()
        self._lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._wake = threading.Event()
        self._worker = None
        self._limit = 0
        self.sent = self.dropped_full = self.dropped_sink = self.dropped_closed = self.errors = 0
        self._new_reporter()
        reset = getattr(self.sink, "after_fork_in_child", None)
        if reset is not None:
            reset()

    def __repr__(self) -> str:
        return f"Emitter({self.sink!r}, {self.static})"


# Every emitter alive in this process: closed at exit, reset in a forked child.
_live: weakref.WeakSet[Emitter] = weakref.WeakSet()


def _close_all() -> None:
    """At exit: all emitters flush side by side, so the whole exit waits ``EXIT_TIMEOUT`` (plus
    ``EXIT_GRACE`` for a drainer stuck in a sink call) at most; what is left is dropped, counted
    and logged in one line per emitter."""
    deadline = time.monotonic() + EXIT_TIMEOUT
    closing = [emitter for emitter in list(_live) if emitter._begin_close(deadline)]
    for emitter in closing:
        emitter._finish_close(deadline, EXIT_GRACE)


def _after_fork_in_child() -> None:
    global _default_lock
    _default_lock = threading.Lock()
    for emitter in list(_live):
        emitter._after_fork_in_child()


atexit.register(_close_all)
os.register_at_fork(after_in_child=_after_fork_in_child)


_default: Emitter | None = None
_default_lock = threading.Lock()

NOT_CONFIGURED = (
    "HOPLINE_SINK is not set: hopline emits no events (set HOPLINE_SINK=stdout, file:PATH or "
    "http://HOST:PORT, or call hopline.middleware.emit.configure())"
)


def configure(
    sink: Sink | str | None = None,
    *,
    service: str | None = None,
    replica: str | None = None,
    model: str | None = None,
    token: str | None = None,
    **options: Any,
) -> Emitter:
    """Set the process-wide emitter that ``get_emitter()`` (and so every middleware and client
    built without an ``emitter=``) uses; call it at start-up, before building them.

    Each argument not given falls back to its environment variable (``HOPLINE_SINK``,
    ``HOPLINE_SERVICE``, ``HOPLINE_REPLICA``, ``HOPLINE_MODEL``, ``HOPLINE_TOKEN``); ``options``
    go to ``Emitter`` (``capacity``, ``flush_interval``, ``batch_size``, ``stats_interval``).
    Unlike the environment path, a bad value raises ``ValueError`` naming it: this is the
    host's own start-up code asking. An emitter configured before is closed (flushed).
    """
    global _default
    spec = sink if sink is not None else os.environ.get("HOPLINE_SINK")
    if spec is None or spec == "":
        raise ValueError("configure() needs a sink (or HOPLINE_SINK): stdout, file:PATH or http://HOST:PORT")
    built = make_sink(spec, token=token) if isinstance(spec, str) else spec
    emitter = Emitter(
        built,
        service=service or os.environ.get("HOPLINE_SERVICE"),
        replica=replica or os.environ.get("HOPLINE_REPLICA"),
        model=model or os.environ.get("HOPLINE_MODEL"),
        **options,
    )
    with _default_lock:
        previous, _default = _default, emitter
    if previous is not None:
        previous.close()
    return emitter


def get_emitter() -> Emitter:
    """The process-wide emitter: the one ``configure`` set, else one from ``HOPLINE_*``.

    Without ``HOPLINE_SINK`` it is a disabled emitter, said once on stderr. A ``HOPLINE_SINK``
    that cannot be understood is logged once, naming the value, and the emitter discards
    events (counted as dropped) rather than raising into the host.
    """
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = _from_environment()
    return _default


def configured_emitter() -> Emitter | None:
    """The process-wide emitter if hopline is configured (``configure()`` or ``HOPLINE_SINK``),
    else None, without building a disabled one or saying anything: for code that must stay inert
    until it is configured (vLLM's stat logger), checking again whenever it is called."""
    current = _default
    if current is None:
        if not os.environ.get("HOPLINE_SINK", "").strip():
            return None
        current = get_emitter()
    return None if current._disabled else current


def _from_environment() -> Emitter:
    spec = os.environ.get("HOPLINE_SINK", "").strip()
    if not spec:
        logger.warning("hopline_not_configured", message=NOT_CONFIGURED)
        return Emitter.disabled()
    try:
        sink = make_sink(spec, token=os.environ.get("HOPLINE_TOKEN"))
    except ValueError as exc:
        logger.error("hopline_sink_invalid", HOPLINE_SINK=spec, error=str(exc))
        sink = NullSink()
    return Emitter(
        sink,
        service=os.environ.get("HOPLINE_SERVICE"),
        replica=os.environ.get("HOPLINE_REPLICA"),
        model=os.environ.get("HOPLINE_MODEL"),
    )
