"""Joins hop events into requests, decides when a request is finished, and records its metrics.

Per-request state is keyed by request ID (events with a trace stand-in first go through the
trace rule, ``trace_join.TraceRouter``). A request is *complete* when, for every component
that reported on it (client, gateway, engine), the component's final hop
(``contract.FINAL_HOPS``) arrived for the highest attempt that component reported; it is then
finished after ``grace`` more seconds, so late hops (``engine.stats`` comes after
``engine.last_token``) still count. Events may arrive in any order: a new, higher attempt
re-opens a request that looked complete. A request that stays incomplete expires ``ttl`` seconds
after its last event (sliding; long generations keep it alive) and is counted by its first
missing hop. Outcome, scope and missing hops come from the rule book (``middleware/contract/rules.py``).
At most ``max_open`` requests are open, holding at most ``max_open_bytes`` of
events (estimated per event from its NDJSON size, ``event_bytes``): beyond either, the least
recently active one is evicted and counted the same way. A request that reaches
``max_events_per_request`` events is closed as incomplete (``overflow``) at once; its later events
are stored but kept only up to the same cap in the finished LRU. So memory is bounded whatever
arrives: by ``max_open_bytes`` for open requests and ``finished_cache`` x ``max_events_per_request``
events (and ``max_finished_bytes``) for finished ones. Each bound is a setting or limit of
``CollectorConfig`` (``Joiner.from_config``), under the same name.

A request's events are kept as the validated dicts (no second decode when it finishes; a
dict costs ~750 bytes against ~300 for its NDJSON line, bounded by ``max_open``). Finished
requests stay in a bounded LRU for ``GET /v1/requests/{id}``, and in brief (``recent.py``: ID,
TTFT, e2e, outcome, scope) in a longer bounded list for ``GET /v1/requests?since=…&slowest=N``. Stages are computed with the
compiled stage table (``stages.py``: the contract's table, same results, a fifth of the cost).

Engine load (requests in flight, KV-cache bytes held per replica) follows
``engine.received`` -> ``engine.last_token`` / ``engine.error`` per attempt, as the events arrive.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import chain, repeat
from typing import TYPE_CHECKING, Any

from hopline.collector.config import CollectorConfig, settings_of
from hopline.collector.metrics import Recorder
from hopline.collector.recent import RecentRequests, summarize
from hopline.collector.stages import compute_stages
from hopline.collector.stages import negative_stages as negative_computed
from hopline.collector.trace_join import TraceRouter
from hopline.middleware.contract import (
    ATTRIBUTE_SOURCES,
    FINAL_HOPS,
    HOPS,
    PREFILL_LEG,
    RATIOS,
    STAGE_NAMES,
    component,
    negative_stages,
)
from hopline.middleware.contract.rules import describe_request

if TYPE_CHECKING:
    from hopline.collector.windows import WindowSummaries

FINAL_HOP_SET = frozenset(h for hops in FINAL_HOPS.values() for h in hops)
# hop -> (component, is a final hop): one dict lookup per event on the hot path
HOP_INFO = {hop: (component(hop), hop in FINAL_HOP_SET) for hop in HOPS}
ENGINE_DONE = frozenset(FINAL_HOPS["engine"])
ENGINE_LOAD_HOPS = ENGINE_DONE | {"engine.received"}  # the hops ``Joiner._engine_load`` acts on


def event_bytes(line_bytes: int) -> int:
    """Estimated memory of one validated event dict from its NDJSON size (a 181-byte line: ~750 B)."""
    return 400 + 2 * line_bytes


DEFAULT_EVENT_BYTES = event_bytes(200)  # for callers that pass no sizes


def _drain(queue: deque) -> Iterator:
    """``queue``'s items from the left until it is empty, taking what is appended meanwhile."""
    while queue:
        yield queue.popleft()


class OpenRequest:
    """A request still being joined: its events and per-component progress."""

    __slots__ = ("bytes", "due", "engine", "events", "last_seen", "progress")

    def __init__(self, now: float) -> None:
        self.events: list[dict[str, Any]] = []
        self.bytes = 0  # estimated memory of the events (event_bytes)
        # component -> (highest attempt seen, final hop seen for that attempt)
        # tuples, not lists: the garbage collector untracks tuples and dicts of plain values, so a
        # full collection scans ~3 objects per open request instead of ~6 (100k open: half the pause)
        self.progress: dict[str, tuple[int, bool]] = {}
        self.last_seen = now
        self.due: float | None = None  # when complete: the time it will be finished
        # engine attempt (a P/D prefill instance's: -1 - attempt) -> (model, replica, kv_bytes)
        # while held; None once released
        self.engine: dict[int, tuple[str | None, str | None, int] | None] | None = None

    def complete(self) -> bool:
        progress = self.progress
        if not progress:
            return False
        for _, final in progress.values():  # a loop, not all() over a generator: called per final hop
            if not final:
                return False
        return True


class FinishedRequest:
    """A finished request in the LRU: its events, why it was finished (complete, expired,
    evicted, overflow) and their estimated bytes."""

    __slots__ = ("bytes", "events", "state")

    def __init__(self, events: list[dict[str, Any]], state: str, size: int = 0) -> None:
        self.events = events
        self.state = state
        self.bytes = size


def timeline(request_id: str, events: list[dict[str, Any]], state: str) -> dict:
    """The JSON answer of ``GET /v1/requests/{id}``: hops in time order, stages, attributes, and
    the rule book's outcome, scope and missing hops (``missing``: a list, in request order)."""
    events = sorted(events, key=lambda e: (e["ts"], e["attempt"]))
    values = compute_stages(events)
    described = describe_request(events)
    return {
        "request_id": request_id,
        "state": state,
        "outcome": described["outcome"],
        "missing": described["missing"],
        **described["scope"],
        "stages": {name: values[name] for name in STAGE_NAMES},
        "ratios": {r.name: values[r.name] for r in RATIOS},
        "attributes": {name: values[name] for name in ATTRIBUTE_SOURCES if name != "upstream"},
        "negative": negative_stages(values),
        "hops": events,
    }


class Joiner:
    """Open requests, their completion and expiry, and the LRU of finished ones."""

    def __init__(
        self,
        recorder: Recorder,
        *,
        grace: float,
        ttl: float,
        max_open: int,
        max_open_bytes: int,
        finished_cache: int,
        max_finished_bytes: int,
        max_events_per_request: int,
        recent_requests: int,
        model_config: Mapping[str, int],  # model name -> KV-cache bytes per token
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.recorder = recorder
        self.grace = grace
        self.ttl = ttl
        self.max_open = max_open
        self.finished_cache = finished_cache
        self.max_open_bytes = max_open_bytes
        self.max_finished_bytes = max_finished_bytes
        self.max_events_per_request = max_events_per_request
        self.open_bytes = 0  # estimated memory of the open requests' events
        self.finished_bytes = 0
        self.kv_bytes_per_token = dict(model_config)
        self.clock = clock
        self.open: OrderedDict[str, OpenRequest] = OrderedDict()  # least recently active first
        self.finished: OrderedDict[str, FinishedRequest] = OrderedDict()
        self._due: deque[tuple[float, str]] = deque()  # (due time, request id), in time order
        self.counts = {
            "complete": 0, "expired": 0, "evicted": 0, "overflow": 0, "late_events": 0, "overflow_events": 0
        }
        self.traces = TraceRouter(max_traces=max_open)
        self.recent = RecentRequests(recent_requests)  # every finished request in brief (GET /v1/requests)
        # per-window, per-scope summaries of every finished request (windows.py); None: not kept
        self.windows: WindowSummaries | None = None
        # called with (request ID, events, stage values, rule-book description) per complete request
        self.on_finish: Callable[[str, list, dict, dict], None] | None = None

    @classmethod
    def from_config(
        cls, config: CollectorConfig, recorder: Recorder, *, clock: Callable[[], float] = time.monotonic
    ) -> Joiner:
        return cls(recorder, **settings_of(cls, config), clock=clock)

    # -- ingest ---------------------------------------------------------------------------------

    def add(self, events: list[dict[str, Any]], sizes: list[int] | None = None) -> None:
        """Join validated events (``sizes``: their NDJSON bytes, for the memory bound); then
        finish whatever is due."""
        now = self.clock()
        open_, finished = self.open, self.finished
        max_events = self.max_events_per_request
        # (event, its NDJSON bytes or None): the batch's, then those of stand-in requests re-joined
        # under their owner (``rejoined``, in the order they were moved); zip hands out one reused
        # tuple where a queue of the batch's pairs made one per event
        rejoined: deque[tuple[dict[str, Any], int | None]] = deque()
        if sizes is not None and len(sizes) != len(events):  # before any is joined (zip's check comes late)
            raise ValueError(f"{len(events)} events with {len(sizes)} sizes")
        for ev, line_bytes in chain(
            zip(events, sizes) if sizes is not None else zip(events, repeat(None)),
            _drain(rejoined),
        ):
            size = DEFAULT_EVENT_BYTES if line_bytes is None else 400 + 2 * line_bytes  # event_bytes, inline
            if ev.get("trace_id") is not None:  # the trace rule places stand-ins (trace_join.py)
                rid, moved = self.traces.route(ev)
                if rid != ev["request_id"]:
                    ev = {**ev, "request_id": rid}
                for stand_in in moved:  # waiting stand-in requests join their trace's owner now
                    waited = open_.pop(stand_in, None)
                    if waited is not None:
                        self._release_all(waited)
                        self.open_bytes -= waited.bytes
                        rejoined.extend((e, None) for e in waited.events)
            rid = ev["request_id"]
            req = open_.get(rid)
            if req is None:
                done = finished.get(rid)
                if done is not None:  # a late hop of a finished request: keep it for the timeline
                    if len(done.events) < max_events:
                        done.events.append(ev)
                        done.bytes += size
                        self.finished_bytes += size
                    else:
                        self.counts["overflow_events"] += 1
                    self.counts["late_events"] += 1
                    continue
                req = open_[rid] = OpenRequest(now)
            else:
                open_.move_to_end(rid)
                req.last_seen = now
            req.events.append(ev)
            req.bytes += size
            self.open_bytes += size
            if len(req.events) >= max_events:
                self._give_up(rid, "overflow")
                continue
            hop = ev["hop"]
            comp, final = HOP_INFO[hop]
            attempt = ev["attempt"]
            if comp == "engine" and ev.get("leg") == PREFILL_LEG:
                # a P/D prefill instance (read as prefill.*): its load is its own (a slot of its
                # own: the decode instance has the same attempt), its end is not the engine's
                self._engine_load(req, ev, hop, -1 - attempt)
                continue
            progress = req.progress.get(comp)
            if progress is None or attempt > progress[0]:
                req.progress[comp] = (attempt, final)
            elif final and attempt == progress[0] and not progress[1]:
                req.progress[comp] = (attempt, True)
            if comp == "engine" and hop in ENGINE_LOAD_HOPS:  # the others leave the load as it is
                self._engine_load(req, ev, hop, attempt)
            # only a final hop can complete a request (anything else keeps it or makes it open)
            if final and req.due is None and req.complete():
                if self.grace <= 0:
                    self._finish(rid, req)
                else:
                    req.due = now + self.grace
                    self._due.append((req.due, rid))
        if len(open_) > self.max_open:
            self._evict(len(open_) - self.max_open)
        while self.open_bytes > self.max_open_bytes and open_:
            self._give_up(next(iter(open_)), "evicted")
        # finish what is due, a request per four events of this batch (at least 25): the cost of
        # an add stays bounded by its batch; the housekeeping loop finishes the rest in slices
        self.sweep(now, limit=max(len(events) // 4, 25))  # and applies the recorder's sums (flush)

    def _engine_load(self, req: OpenRequest, ev: Mapping[str, Any], hop: str, attempt: int) -> None:
        if req.engine is None:
            req.engine = {}
        if hop == "engine.received":
            if attempt in req.engine:  # released already (its final hop came first) or a repeat
                return
            model, replica = ev.get("model"), ev.get("replica")
            prompt = ev.get("prompt_tokens")
            per_token = self.kv_bytes_per_token.get(model or "", 0)
            kv = prompt * per_token if prompt else 0
            req.engine[attempt] = (model, replica, kv)
            self.recorder.engine_load(model, replica, 1, kv)
        elif hop in ENGINE_DONE:
            self._release(req, attempt)

    def _release(self, req: OpenRequest, attempt: int) -> None:
        engine = req.engine
        if engine is None:
            return
        held = engine.get(attempt)
        engine[attempt] = None
        if held is not None:
            model, replica, kv = held
            self.recorder.engine_load(model, replica, -1, -kv)

    # -- finishing ------------------------------------------------------------------------------

    def sweep(self, now: float | None = None, limit: int | None = None) -> bool:
        """Finish requests whose grace ended; expire those idle for longer than the TTL. At most
        ``limit`` of each (a burst of 100,000 requests must not be finished in one go on the event
        loop); returns True when more are due (call again, after letting others run). Then the
        recorder's pending sums go to the metrics (``Recorder.flush``: what this and the ``add``
        calling it counted)."""
        try:
            return self._sweep(now, limit)
        finally:
            self.recorder.flush()

    def _sweep(self, now: float | None, limit: int | None) -> bool:
        now = self.clock() if now is None else now
        budget = limit if limit is not None else len(self._due) + len(self.open)
        due, open_ = self._due, self.open
        finished = 0
        while due and due[0][0] <= now:
            if finished >= budget:
                return True
            when, rid = due.popleft()
            req = open_.get(rid)
            if req is None or req.due != when:
                continue
            finished += 1
            if req.complete():
                self._finish(rid, req)
            else:  # a new attempt arrived during the grace period
                req.due = None
        cutoff = now - self.ttl
        expired = 0
        while open_:
            rid, req = next(iter(open_.items()))
            if req.last_seen > cutoff:
                break
            if expired >= budget:
                return True
            self._give_up(rid, "expired")
            expired += 1
        return False

    def _evict(self, count: int) -> None:
        for _ in range(count):
            rid = next(iter(self.open))
            self._give_up(rid, "evicted")

    def _finish(self, rid: str, req: OpenRequest) -> None:
        del self.open[rid]
        self.open_bytes -= req.bytes
        events = req.events
        values = compute_stages(events)
        described = describe_request(events)
        scope = described["scope"]
        recorder = self.recorder
        recorder.request(
            rid,
            values,
            recorder.scope(scope["service"], scope["model"], scope["replica"]),
            described["outcome"],
            negative_computed(values),
        )
        if described["missing"]:  # complete without some earlier hops (hopline_collector_requests_partial)
            recorder.partial()
        self._release_all(req)
        self.counts["complete"] += 1
        self._remember(rid, FinishedRequest(events, "complete", req.bytes))
        summary = summarize(rid, events, values, described, "complete")
        self.recent.add(summary)
        if self.windows is not None:
            self.windows.add(summary.started, scope, values, summary.outcome, summary.ttft_s, summary.e2e_s)
        if self.on_finish is not None:
            self.on_finish(rid, events, values, described)

    def _give_up(self, rid: str, why: str) -> None:
        """Close an unfinished request: ``expired``, ``evicted`` or ``overflow``. It is counted by
        its first missing hop, and by its outcome (the rule book's: ``incomplete`` unless the
        component nearest the user saw it end)."""
        req = self.open.pop(rid)
        self.open_bytes -= req.bytes
        events = req.events
        described = describe_request(events)
        scope = described["scope"]
        missing = described["missing"]
        recorder = self.recorder
        recorder.incomplete(
            missing[0] if missing else "unknown",
            described["outcome"],
            recorder.scope(scope["service"], scope["model"], scope["replica"]),
        )
        self._release_all(req)
        self.counts[why] += 1
        recorder.closed_incomplete(why)
        self._remember(rid, FinishedRequest(events, why, req.bytes))
        summary = summarize(rid, events, compute_stages(events), described, why)
        self.recent.add(summary)
        if self.windows is not None:  # counted (arrivals, outcome), no stages: it did not finish
            self.windows.add(summary.started, scope, None, summary.outcome)

    def _release_all(self, req: OpenRequest) -> None:
        if req.engine:
            for attempt in list(req.engine):
                self._release(req, attempt)

    def _remember(self, rid: str, done: FinishedRequest) -> None:
        finished = self.finished
        old = finished.pop(rid, None)
        if old is not None:
            self.finished_bytes -= old.bytes
        finished[rid] = done
        self.finished_bytes += done.bytes
        while len(finished) > self.finished_cache or (
            self.finished_bytes > self.max_finished_bytes and len(finished) > 1
        ):
            self.finished_bytes -= finished.popitem(last=False)[1].bytes

    def finish_all(self) -> None:
        """Finish every complete request now (shutdown); incomplete ones stay unreported."""
        for rid, req in list(self.open.items()):
            if req.complete():
                self._finish(rid, req)
        self.recorder.flush()

    # -- reading --------------------------------------------------------------------------------

    def lookup(self, rid: str) -> dict | None:
        """The timeline of an open or recently finished request, or None."""
        req = self.open.get(rid)
        if req is not None:
            return timeline(rid, req.events, "open")
        done = self.finished.get(rid)
        if done is not None:
            return timeline(rid, done.events, done.state)
        return None
