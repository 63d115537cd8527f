"""Joins hop events into requests, decides when a request is finished, and records its metrics.

Per-request state is keyed by request ID (events with a trace stand-in first go through the
trace rule, ``trace_join.TraceRouter``). A request is *complete* when, for every component
that reported on it (client, gateway, engine), the component's final hop
(``contract.FINAL_HOPS``) arrived for the highest attempt that component reported; it is then
finished after ``grace_s`` more seconds, so late hops (``engine.stats`` comes after
``engine.last_token``) still count. Events may arrive in any order: a new, higher attempt
re-opens a request that looked complete. A request that stays incomplete expires ``ttl_s``
after its last event (sliding; long generations keep it alive) and is counted by its first
missing hop. Outcome, scope and missing hops come from the rule book (``middleware/rules.py``). At most ``max_open`` requests are open: beyond that the least recently active one
is evicted and counted the same way, so memory is bounded whatever arrives.

A request's events are kept as the validated dicts (no second decode when it finishes; a
dict costs ~750 bytes against ~300 for its NDJSON line, bounded by ``max_open``). Finished
requests stay in a bounded LRU for ``GET /v1/requests/{id}``. Stages are computed with the
compiled stage table (``stages.py``: the contract's table, same results, a fifth of the cost).

Engine load (requests in flight, KV-cache bytes held per replica) follows
``engine.received`` -> ``engine.last_token`` / ``engine.error`` per attempt, as the events arrive.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from typing import Any

from hopline.collector.metrics import Recorder
from hopline.collector.stages import compute_stages
from hopline.collector.trace_join import TraceRouter
from hopline.middleware.contract import (
    ATTRIBUTE_SOURCES,
    FINAL_HOPS,
    HOPS,
    RATIOS,
    STAGE_NAMES,
    component,
    negative_stages,
)
from hopline.middleware.rules import describe_request

FINAL_HOP_SET = frozenset(h for hops in FINAL_HOPS.values() for h in hops)
# hop -> (component, is a final hop): one dict lookup per event on the hot path
HOP_INFO = {hop: (component(hop), hop in FINAL_HOP_SET) for hop in HOPS}
ENGINE_DONE = frozenset(FINAL_HOPS["engine"])
MAX_EVENTS_PER_REQUEST = 512  # events beyond this are stored but not joined (bounded memory)


class OpenRequest:
    """A request still being joined: its events and per-component progress."""

    __slots__ = ("due", "engine", "events", "last_seen", "progress")

    def __init__(self, now: float) -> None:
        self.events: list[dict[str, Any]] = []
        # component -> [highest attempt seen, final hop seen for that attempt]
        self.progress: dict[str, list] = {}
        self.last_seen = now
        self.due: float | None = None  # when complete: the time it will be finished
        # engine attempt -> (model, replica, kv_bytes) while held; None once released
        self.engine: dict[int, tuple[str | None, str | None, int] | None] | None = None

    def complete(self) -> bool:
        return bool(self.progress) and all(final for _, final in self.progress.values())


class FinishedRequest:
    """A finished request in the LRU: its events and why it was finished (complete, expired, evicted)."""

    __slots__ = ("events", "state")

    def __init__(self, events: list[dict[str, Any]], state: str) -> None:
        self.events = events
        self.state = state


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
        grace_s: float = 2.0,
        ttl_s: float = 900.0,
        max_open: int = 100_000,
        finished_cache: int = 10_000,
        kv_bytes_per_token: Mapping[str, int] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.recorder = recorder
        self.grace_s = grace_s
        self.ttl_s = ttl_s
        self.max_open = max_open
        self.finished_cache = finished_cache
        self.kv_bytes_per_token = dict(kv_bytes_per_token or {})
        self.clock = clock
        self.open: OrderedDict[str, OpenRequest] = OrderedDict()  # least recently active first
        self.finished: OrderedDict[str, FinishedRequest] = OrderedDict()
        self._due: deque[tuple[float, str]] = deque()  # (due time, request id), in time order
        self.counts = {"complete": 0, "expired": 0, "evicted": 0, "late_events": 0, "overflow_events": 0}
        self.traces = TraceRouter(max_traces=max_open)
        # called with (request ID, events, stage values, rule-book description) per complete request
        self.on_finish: Callable[[str, list, dict, dict], None] | None = None

    # -- ingest ---------------------------------------------------------------------------------

    def add(self, events: list[dict[str, Any]]) -> None:
        """Join validated events; then finish whatever is due."""
        now = self.clock()
        open_, finished = self.open, self.finished
        pending = deque(events)
        while pending:
            ev = pending.popleft()
            if ev.get("trace_id") is not None:  # the trace rule places stand-ins (trace_join.py)
                rid, moved = self.traces.route(ev)
                if rid != ev["request_id"]:
                    ev = {**ev, "request_id": rid}
                for stand_in in moved:  # waiting stand-in requests join their trace's owner now
                    waited = open_.pop(stand_in, None)
                    if waited is not None:
                        self._release_all(waited)
                        pending.extend(waited.events)
            rid = ev["request_id"]
            req = open_.get(rid)
            if req is None:
                done = finished.get(rid)
                if done is not None:  # a late hop of a finished request: keep it for the timeline
                    if len(done.events) < MAX_EVENTS_PER_REQUEST:
                        done.events.append(ev)
                    self.counts["late_events"] += 1
                    continue
                req = open_[rid] = OpenRequest(now)
            else:
                open_.move_to_end(rid)
                req.last_seen = now
            if len(req.events) >= MAX_EVENTS_PER_REQUEST:
                self.counts["overflow_events"] += 1
                continue
            req.events.append(ev)
            hop = ev["hop"]
            comp, final = HOP_INFO[hop]
            attempt = ev["attempt"]
            progress = req.progress.get(comp)
            if progress is None:
                req.progress[comp] = [attempt, final]
            elif attempt > progress[0]:
                progress[0], progress[1] = attempt, final
            elif final and attempt == progress[0]:
                progress[1] = True
            if comp == "engine":
                self._engine_load(req, ev, hop, attempt)
            # only a final hop can complete a request (anything else keeps it or makes it open)
            if final and req.due is None and req.complete():
                if self.grace_s <= 0:
                    self._finish(rid, req)
                else:
                    req.due = now + self.grace_s
                    self._due.append((req.due, rid))
        if len(open_) > self.max_open:
            self._evict(len(open_) - self.max_open)
        self.sweep(now)

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

    def sweep(self, now: float | None = None) -> None:
        """Finish requests whose grace ended; expire those idle for longer than the TTL."""
        now = self.clock() if now is None else now
        due, open_ = self._due, self.open
        while due and due[0][0] <= now:
            when, rid = due.popleft()
            req = open_.get(rid)
            if req is None or req.due != when:
                continue
            if req.complete():
                self._finish(rid, req)
            else:  # a new attempt arrived during the grace period
                req.due = None
        cutoff = now - self.ttl_s
        while open_:
            rid, req = next(iter(open_.items()))
            if req.last_seen > cutoff:
                break
            self._give_up(rid, "expired")

    def _evict(self, count: int) -> None:
        for _ in range(count):
            rid = next(iter(self.open))
            self._give_up(rid, "evicted")

    def _finish(self, rid: str, req: OpenRequest) -> None:
        del self.open[rid]
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
            negative_stages(values),
        )
        self._release_all(req)
        self.counts["complete"] += 1
        self._remember(rid, FinishedRequest(events, "complete"))
        if self.on_finish is not None:
            self.on_finish(rid, events, values, described)

    def _give_up(self, rid: str, why: str) -> None:
        """An expired or evicted request: counted by its first missing hop and by its outcome
        (the rule book's: ``incomplete`` unless the component nearest the user saw it end)."""
        req = self.open.pop(rid)
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
        self._remember(rid, FinishedRequest(events, why))

    def _release_all(self, req: OpenRequest) -> None:
        if req.engine:
            for attempt in list(req.engine):
                self._release(req, attempt)

    def _remember(self, rid: str, done: FinishedRequest) -> None:
        finished = self.finished
        finished[rid] = done
        finished.move_to_end(rid)
        while len(finished) > self.finished_cache:
            finished.popitem(last=False)

    def finish_all(self) -> None:
        """Finish every complete request now (shutdown); incomplete ones stay unreported."""
        for rid, req in list(self.open.items()):
            if req.complete():
                self._finish(rid, req)

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
