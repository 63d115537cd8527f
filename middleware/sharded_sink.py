"""Several collectors behind one sink: each event goes to the collector a rendezvous hash picks.

``HOPLINE_SINK=http://c1:4318,http://c2:4318,http://c3:4318`` (comma-separated collector URLs,
each as a single http sink takes it) builds a ``ShardedHttpSink``. Routing is rendezvous
(highest-random-weight) hashing: every target gets a score from a hash of (routing key, target)
and the highest score wins. So every process that lists the same collectors sends a request's
events to the same one, whatever order the list is in, and removing or adding one collector
moves only the requests it loses or wins (a modulo hash would move nearly all of them).

The routing key, in order:

* ``request_id``: all hops of a request meet in one collector, whichever process emits them;
* ``trace_id`` when an event has no request ID;
* ``emitter`` for ``emitter.stats`` reports: one emitter's reports always reach the same
  collector, which turns their cumulative counts into counters (reports spread over several
  collectors would each be counted whole: the sums over collectors would double);
* anything else (no key at all) goes to the first target of the list.

Each target has its own bounded buffer and its own delivery thread with a plain ``HttpSink``
(retries, backoff, 413 splitting, as for one collector). ``write`` only routes the batch into
the buffers, so a collector that is down or slow holds up its own share only: its buffer sheds
its oldest events when full (``dropped_full``), its sink gives up a batch after the retry budget
(``dropped_sink``), each counted for that target, and the other targets deliver as usual. When
it answers again, its thread delivers what its buffer still holds. Memory is bounded by
``capacity`` events per target.

Hashes are blake2b with the target's name as salt (stable across processes and Python
versions, unlike ``hash()``), computed on the emitter's worker thread, never on a request path;
a small map of recent keys saves most of them, since a request's hops come in a few batches.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import deque
from typing import Any
from urllib.parse import urlsplit

from hopline.middleware.contract.events import EMITTER_STATS_HOP, EMITTER_TARGET_COUNTS
from hopline.middleware.log import warn_throttled
from hopline.middleware.sinks import EVENTS_PATH, Event, HttpSink

DEFAULT_TARGET_CAPACITY = 10_000  # events buffered per target (the emitter's own default)
ROUTE_CACHE_SIZE = 4096  # recent routing keys remembered (cleared whole when full: no LRU upkeep)


def target_name(url: str) -> str:
    """What a target is called in hashes, logs and metrics: ``host:port`` of its events URL (with
    the path when it is not the default), never credentials."""
    parts = urlsplit(url)
    name = parts.netloc.rpartition("@")[2]
    path = parts.path.rstrip("/")
    return name if path == EVENTS_PATH else name + path


def routing_key(event: Event) -> str | None:
    """The string an event is routed by (module docstring), or None when it has none."""
    key = event.get("request_id")
    if key is None:
        key = event.get("trace_id")
        if key is None and event.get("hop") == EMITTER_STATS_HOP:
            key = event.get("emitter")
    return key if isinstance(key, str) else None


class Rendezvous:
    """Picks one of ``names`` for a key by highest random weight (blake2b salted per name)."""

    def __init__(self, names: list[str]) -> None:
        if not names:
            raise ValueError("rendezvous hashing needs at least one target")
        self.salts = [hashlib.blake2b(name.encode(), digest_size=16).digest() for name in names]
        self.recent: dict[str, int] = {}  # key -> index, for the keys picked lately

    def pick(self, key: str) -> int:
        """The index of the target ``key`` belongs to."""
        try:
            return self.recent[key]
        except KeyError:
            pass
        data = key.encode()
        best, chosen = b"", 0
        for index, salt in enumerate(self.salts):
            score = hashlib.blake2b(data, digest_size=8, salt=salt).digest()
            if score > best:
                best, chosen = score, index
        cache = self.recent
        if len(cache) >= ROUTE_CACHE_SIZE:
            cache.clear()
        cache[key] = chosen
        return chosen


class _Target:
    """One collector: a bounded buffer, an ``HttpSink`` and the thread that drains one into the other.

    Each counter has one writer: ``routed`` and ``dropped_full`` the emitter's worker (``put``),
    ``sent`` and ``dropped_sink`` this target's thread; ``buffered`` is what was routed here and
    is not settled yet (the batch being delivered included).

    ``emitter.stats`` reports are no events: they are not counted and take no room in the buffer
    (each is cumulative, so only the latest waiting one is kept, and it goes with the next batch).
    Were they queued like events, every report would push an event out of a dead collector's
    full buffer, and so change the counts, and so call for another report.
    """

    def __init__(self, sink: HttpSink, *, capacity: int, batch_size: int, flush_interval: float) -> None:
        self.sink = sink
        self.name = target_name(sink.url)
        self.capacity = capacity
        self.batch_size = batch_size
        self.flush_interval = flush_interval
        self._reset()

    def _reset(self) -> None:
        self.queue: deque[Event] = deque()
        self.report: deque[Event] = deque(maxlen=1)  # the latest emitter.stats waiting
        self.routed = self.dropped_full = self.sent = self.dropped_sink = 0
        self.busy = False  # a batch is out of the queue and not settled yet
        self.closed = False
        self.deadline: float | None = None
        self.wake = threading.Event()
        self.idle = threading.Condition()
        self.thread: threading.Thread | None = None

    # -- the emitter's worker thread ----------------------------------------------------------

    def put(self, events: list[Event]) -> None:
        """Append ``events``, shedding the oldest when the buffer is full, and wake the thread."""
        queue = self.queue
        for event in events:
            if event.get("hop") == EMITTER_STATS_HOP:
                self.report.append(event)  # replaces an older one still waiting
                continue
            if len(queue) >= self.capacity:
                try:
                    queue.popleft()
                except IndexError:  # the delivery thread emptied it meanwhile
                    pass
                else:
                    self.dropped_full += 1
            queue.append(event)
            self.routed += 1
        if self.thread is None:
            self._start()
        self.wake.set()

    def _start(self) -> None:
        thread = threading.Thread(target=self._run, name=f"hopline-sink-{self.name}", daemon=True)
        try:
            thread.start()
        except RuntimeError as exc:  # interpreter shutting down: the events stay counted as buffered
            warn_throttled(
                "sharded_thread_not_started", "sink_thread_not_started", sink=self.name, error=str(exc)
            )
            return
        self.thread = thread

    # -- its own thread --------------------------------------------------------------------------

    def _run(self) -> None:
        while not self.closed or self.queue or self.report:
            self.wake.wait(self.flush_interval)
            self.wake.clear()
            try:
                self._drain()
            except Exception as exc:  # noqa: BLE001 - a bug must not kill delivery
                warn_throttled("sharded_drain_failed", "sink_write_failed", sink=self.name, error=repr(exc))
            finally:
                self.busy = False
            with self.idle:
                self.idle.notify_all()
            if self.closed and self._past_deadline():
                return

    def _past_deadline(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def _drain(self) -> None:
        queue = self.queue
        while queue or self.report:
            self.busy = True
            if self._past_deadline():  # shutting down: what is left is lost, and counted
                self._drop_rest()
                return
            batch: list[Event] = []
            while queue and len(batch) < self.batch_size:
                batch.append(queue.popleft())
            events = len(batch)
            try:
                batch.append(self.report.popleft())
            except IndexError:
                pass
            try:
                lost = self.sink.write(batch) or 0
            except Exception as exc:  # noqa: BLE001 - a sink bug costs the batch, nothing more
                lost = events
                warn_throttled("sharded_write_raised", "sink_write_failed", sink=self.name, error=repr(exc))
            lost = min(lost, events)
            self.dropped_sink += lost
            self.sent += events - lost
            self.busy = False

    def _drop_rest(self) -> None:
        lost = 0
        self.report.clear()
        while self.queue:
            self.queue.popleft()
            lost += 1
        self.dropped_sink += lost
        warn_throttled("sharded_close_timeout", "emitter_close_timeout", sink=self.name, dropped=lost)

    # -- flush, close, fork ------------------------------------------------------------------------

    def wait_idle(self, deadline: float | None) -> None:
        """Block until the buffer is delivered (or given up), or until ``deadline`` (monotonic)."""
        thread = self.thread
        if thread is None:
            return
        self.wake.set()
        with self.idle:
            while (self.queue or self.report or self.busy) and thread.is_alive():
                left = 0.05 if deadline is None else min(deadline - time.monotonic(), 0.05)
                if left <= 0:
                    return
                self.idle.wait(left)

    def set_deadline(self, deadline: float) -> None:
        self.deadline = deadline
        self.sink.set_deadline(deadline)
        self.wake.set()

    def close(self, deadline: float) -> None:
        self.closed = True
        self.wake.set()
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(max(deadline - time.monotonic(), 0))
        self.sink.close()

    def after_fork_in_child(self) -> None:
        """The parent's thread does not exist here; the buffered events are the parent's to send."""
        self._reset()
        self.sink.after_fork_in_child()

    def counts(self) -> dict[str, Any]:
        settled = self.dropped_full + self.sent + self.dropped_sink
        return {
            "target": self.name,
            "sent": self.sent,
            "buffered": max(self.routed - settled, 0),
            "dropped_full": self.dropped_full,
            "dropped_sink": self.dropped_sink,
        }


class ShardedHttpSink:
    """Routes each event to one of several collectors (module docstring) and delivers each share
    on its own thread.

    Args:
        urls: the collectors, each ``http(s)://HOST[:PORT][/v1/events]``; at least two, no repeats.
        capacity: events buffered per target; beyond it the oldest are dropped and counted.
        batch_size, flush_interval: per-target batching (as the emitter's).
        Other keyword arguments go to each target's ``HttpSink`` (``token``, ``timeout``,
        ``retry_budget``, ``backoff``, ``verify``).

    The emitter sees a sink that never blocks in ``write``: it asks ``delivery_counts()`` and
    ``target_counts()`` for what was delivered, lost and still buffered here.
    """

    def __init__(
        self,
        urls: list[str],
        *,
        capacity: int = DEFAULT_TARGET_CAPACITY,
        batch_size: int = 1000,
        flush_interval: float = 0.2,
        **http: Any,
    ) -> None:
        sizes = (("capacity", capacity), ("batch_size", batch_size), ("flush_interval", flush_interval))
        for name, value in sizes:
            if not value > 0:
                raise ValueError(f"{name} must be positive, got {value!r}")
        sinks = [HttpSink(url, **http) for url in urls]
        names = [target_name(sink.url) for sink in sinks]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"collector URLs must differ; listed more than once: {', '.join(repeated)}")
        if len(sinks) < 2:
            raise ValueError(f"a sharded sink needs at least two collector URLs, got {len(sinks)}")
        self.targets = [
            _Target(sink, capacity=capacity, batch_size=batch_size, flush_interval=flush_interval)
            for sink in sinks
        ]
        self.router = Rendezvous(names)
        self._deadline: float | None = None

    def write(self, batch: list[Event]) -> int:
        """Route ``batch`` into the targets' buffers (no I/O here); nothing is dropped at this point."""
        for target, share in zip(self.targets, self.shares(batch)):
            if share:
                target.put(share)
        return 0

    def shares(self, batch: list[Event]) -> list[list[Event]]:
        """``batch`` split by target, in order (what bench/bench_emit.py times as routing)."""
        shares: list[list[Event]] = [[] for _ in self.targets]
        pick, recent = self.router.pick, self.router.recent
        for event in batch:
            key = event.get("request_id")
            if key.__class__ is not str:  # no request ID (or not a string): the other rules
                key = routing_key(event)
            index = recent.get(key)  # inlined pick() for the common case: a key seen lately
            if index is None:
                index = 0 if key is None else pick(key)
            shares[index].append(event)
        return shares

    def delivery_counts(self) -> dict[str, int]:
        """Totals over the targets: ``sent``, ``buffered``, ``dropped_full``, ``dropped_sink``."""
        per_target = self.target_counts()
        return {name: sum(counts[name] for counts in per_target) for name in EMITTER_TARGET_COUNTS}

    def target_counts(self) -> list[dict[str, Any]]:
        """Per target: its name (``host:port``) and its ``EMITTER_TARGET_COUNTS``."""
        return [target.counts() for target in self.targets]

    def set_deadline(self, deadline: float) -> None:
        """The emitter is closing: no delivery may last past ``deadline`` (monotonic)."""
        self._deadline = deadline
        for target in self.targets:
            target.set_deadline(deadline)

    def flush(self) -> None:
        """Wait until every target delivered (or gave up) what it holds; by the close deadline at most."""
        for target in self.targets:
            target.wait_idle(self._deadline)

    def close(self) -> None:
        deadline = self._deadline if self._deadline is not None else time.monotonic() + 5.0
        for target in self.targets:
            target.set_deadline(deadline)
        for target in self.targets:
            target.close(deadline + 0.5)

    def after_fork_in_child(self) -> None:
        for target in self.targets:
            target.after_fork_in_child()
        self._deadline = None

    def __repr__(self) -> str:
        return f"ShardedHttpSink({[target.name for target in self.targets]!r})"


__all__ = ["Rendezvous", "ShardedHttpSink", "routing_key", "target_name"]
