"""Prometheus metrics of the collector: built by a factory on an explicit registry.

``build_metrics(registry)`` creates every metric named in ``metric_names`` on the registry it is
given (never the global one, so two collectors in one process or one test never clash).
Histograms are ``ExemplarHistogram`` (same exposition as prometheus_client's, a fifth of the
cost per observation; see ``histogram.py``), counters and gauges prometheus_client's own.
``Recorder`` is what the join calls: it caps label values (overflow -> ``other``) per label and
per combination (``scope_cap`` distinct (service, model, replica) scopes; later ones are recorded
as (other, other, other)), so every family has at most its fixed labels' values x ``scope_cap``
series, and it keeps the bound children per label tuple, because ``.labels(...)`` costs more than
the observation itself.

``ExpositionRegistry`` is the collector's registry: it leaves out prometheus_client's ``*_created``
series (one per counter and histogram child: a timestamp no hopline panel or rule reads, which
doubles the series count of every counter). prometheus_client's ``disable_created_metrics()``
would do the same for every registry of the process, including a host application's, which
expects its own to be untouched.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hopline.collector import metric_names as names
from hopline.collector.config import CollectorConfig
from hopline.collector.histogram import Deferred, ExemplarHistogram, Rows
from hopline.middleware.contract import TIME_STAGES
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.metrics_core import Metric

OTHER = "other"
ENGINE_CHILDREN_CACHE = 4096
SCOPE_CACHE = 4096  # raw scopes of finished requests whose capped labels are remembered (Recorder.scope)
UNKNOWN = "unknown"


CREATED_TYPES = frozenset({"counter", "histogram", "summary", "gaugehistogram"})


class ExpositionRegistry(CollectorRegistry):
    """A registry whose collection has no ``*_created`` samples (only this registry's)."""

    def collect(self) -> Iterable[Metric]:
        for family in super().collect():
            if family.type in CREATED_TYPES:
                created = family.name + "_created"
                family.samples = [s for s in family.samples if s.name != created]
            yield family


@dataclass(frozen=True)
class Metrics:
    stage_seconds: ExemplarHistogram
    ttft_seconds: ExemplarHistogram
    e2e_seconds: ExemplarHistogram
    itl_seconds: ExemplarHistogram
    prompt_tokens: ExemplarHistogram
    output_tokens: ExemplarHistogram
    requests: Counter
    in_flight: Gauge
    kv_cache_bytes: Gauge
    events: Counter
    events_rejected: Counter
    events_duplicate: Counter
    incomplete_requests: Counter
    connections: Counter
    without_max_tokens: Counter
    negative_stages: Counter
    open_requests: Gauge
    bodies_rejected: Counter
    store_failures: Counter
    compaction_failures: Counter
    quarantined_parts: Counter
    dedup_keys: Gauge
    open_request_bytes: Gauge
    finished_request_bytes: Gauge
    requests_closed_incomplete: Counter
    scopes_overflowed: Counter
    event_loop_lag: Gauge
    http_connections_closed: Counter
    window_scopes_overflowed: Counter
    window_summary_bytes: Gauge
    restart_requests: Gauge
    restart_events: Gauge
    restart_seconds: Gauge
    requests_partial: Counter
    deferred: Deferred  # the histograms' observations not counted yet (``Rows``)


_BUCKETS = {
    names.ITL_SECONDS.name: names.ITL_BUCKETS,
    names.PROMPT_TOKENS.name: names.TOKEN_BUCKETS,
    names.OUTPUT_TOKENS.name: names.TOKEN_BUCKETS,
}


def _make(
    metric: names.Metric, registry: CollectorRegistry, deferred: Deferred
) -> ExemplarHistogram | Counter | Gauge:
    if metric.kind == "histogram":
        buckets = _BUCKETS.get(metric.name, names.LATENCY_BUCKETS)
        return ExemplarHistogram(
            metric.name, metric.help, metric.labels, registry=registry, buckets=buckets, deferred=deferred
        )
    if metric.kind == "counter":
        return Counter(metric.name, metric.help, metric.labels, registry=registry)
    return Gauge(metric.name, metric.help, metric.labels, registry=registry)


def build_metrics(registry: CollectorRegistry) -> Metrics:
    """Every metric of ``metric_names.ALL`` registered on ``registry``."""
    deferred = Deferred()
    m = {metric.name: _make(metric, registry, deferred) for metric in names.ALL}
    return Metrics(
        stage_seconds=m[names.STAGE_SECONDS.name],
        ttft_seconds=m[names.TTFT_SECONDS.name],
        e2e_seconds=m[names.E2E_SECONDS.name],
        itl_seconds=m[names.ITL_SECONDS.name],
        prompt_tokens=m[names.PROMPT_TOKENS.name],
        output_tokens=m[names.OUTPUT_TOKENS.name],
        requests=m[names.REQUESTS.name],
        in_flight=m[names.IN_FLIGHT.name],
        kv_cache_bytes=m[names.KV_CACHE_BYTES.name],
        events=m[names.EVENTS.name],
        events_rejected=m[names.EVENTS_REJECTED.name],
        events_duplicate=m[names.EVENTS_DUPLICATE.name],
        incomplete_requests=m[names.INCOMPLETE_REQUESTS.name],
        connections=m[names.CONNECTIONS.name],
        without_max_tokens=m[names.WITHOUT_MAX_TOKENS.name],
        negative_stages=m[names.NEGATIVE_STAGES.name],
        open_requests=m[names.OPEN_REQUESTS.name],
        bodies_rejected=m[names.BODIES_REJECTED.name],
        store_failures=m[names.STORE_FAILURES.name],
        compaction_failures=m[names.COMPACTION_FAILURES.name],
        quarantined_parts=m[names.QUARANTINED_PARTS.name],
        dedup_keys=m[names.DEDUP_KEYS.name],
        open_request_bytes=m[names.OPEN_REQUEST_BYTES.name],
        finished_request_bytes=m[names.FINISHED_REQUEST_BYTES.name],
        requests_closed_incomplete=m[names.REQUESTS_CLOSED_INCOMPLETE.name],
        scopes_overflowed=m[names.SCOPES_OVERFLOWED.name],
        event_loop_lag=m[names.EVENT_LOOP_LAG.name],
        http_connections_closed=m[names.HTTP_CONNECTIONS_CLOSED.name],
        window_scopes_overflowed=m[names.WINDOW_SCOPES_OVERFLOWED.name],
        window_summary_bytes=m[names.WINDOW_SUMMARY_BYTES.name],
        restart_requests=m[names.RESTART_REQUESTS.name],
        restart_events=m[names.RESTART_EVENTS.name],
        restart_seconds=m[names.RESTART_SECONDS.name],
        requests_partial=m[names.REQUESTS_PARTIAL.name],
        deferred=deferred,
    )


class LabelCap:
    """Admits the first ``cap`` distinct values of a label; later ones become ``other``."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self._seen: set[str] = set()

    def __call__(self, value: str | None) -> str:
        if not value:
            return UNKNOWN
        seen = self._seen
        if value in seen:
            return value
        if len(seen) < self.cap:
            seen.add(value)
            return value
        return OTHER


class CombinationCap:
    """Admits the first ``cap`` distinct label tuples; later ones become all ``other``.

    Per-label caps alone allow their product (64 services x 64 models x 64 replicas = 262,144
    scopes, gigabytes of /metrics); this bounds the combinations a family can hold.
    """

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.overflowed = 0
        self._seen: set[tuple[str, ...]] = set()

    def __call__(self, values: tuple[str, ...]) -> tuple[str, ...]:
        seen = self._seen
        if values in seen:
            return values
        if len(seen) < self.cap:
            seen.add(values)
            return values
        self.overflowed += 1
        return (OTHER,) * len(values)


# (stage value name in the computed stages, label value) for the per-view histograms
_TTFT = tuple((f"{view}_ttft", view) for view in names.VIEW_LABEL_VALUES)
_E2E = tuple((f"{view}_e2e", view) for view in names.VIEW_LABEL_VALUES)
_ITL = tuple((f"{view}_itl", view) for view in names.VIEW_LABEL_VALUES)


@dataclass(frozen=True)
class ScopedChildren:
    """The children a finished request of one (service, model, replica) observes on, bound once
    per scope rather than per request: the histograms' (stages, views, tokens) as one ``Rows``,
    and the counters by their other label (outcome, connection reuse), bound on first use."""

    rows: Rows
    requests: dict[str, Any]  # outcome -> hopline_requests_total child
    connections: dict[bool, Any]  # conn_reused -> hopline_connections_total child


class Recorder:
    """Observes finished requests and hop events on ``Metrics``, with capped labels and cached children."""

    def __init__(self, metrics: Metrics, *, label_cap: int, scope_cap: int) -> None:
        self.m = metrics
        self.service = LabelCap(label_cap)
        self.model = LabelCap(label_cap)
        self.replica = LabelCap(label_cap)
        self.scopes = CombinationCap(scope_cap)  # (service, model, replica) of finished requests
        self.engines = CombinationCap(scope_cap)  # (model, replica) of the engine-load gauges
        self._children: dict[tuple, Any] = {}
        # child -> the sum of its increments not applied yet (``flush``): requests and connections
        # counters, engine-load gauges
        self._pending: dict[Any, int] = {}
        # raw (service, model, replica) of finished requests -> their capped labels (``scope``; bounded)
        self._capped_scopes: dict[tuple[str | None, str | None, str | None], tuple[str, str, str]] = {}
        self._scoped_children: dict[tuple[str, str, str], ScopedChildren] = {}
        # raw (model, replica) of engine events -> (in-flight, KV) children (bounded)
        self._engine_children: dict[tuple[str | None, str | None], tuple[Any, Any]] = {}

    @classmethod
    def from_config(cls, config: CollectorConfig, metrics: Metrics) -> Recorder:
        return cls(metrics, label_cap=config.label_cap, scope_cap=config.scope_cap)

    def _child(self, metric: Any, labels: tuple[str, ...]) -> Any:
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def scope(self, service: str | None, model: str | None, replica: str | None) -> tuple[str, str, str]:
        """The capped (service, model, replica) label values of one request.

        A raw scope the caps admitted maps to the same labels ever after (the caps only ever add
        what they have seen), so it is remembered (``SCOPE_CACHE`` of them) and the caps are asked
        once; one that overflowed is asked every time (each counts)."""
        raw = (service, model, replica)
        capped = self._capped_scopes.get(raw)
        if capped is not None:
            return capped
        before = self.scopes.overflowed
        capped = self.scopes((self.service(service), self.model(model), self.replica(replica)))
        if self.scopes.overflowed != before:
            self.m.scopes_overflowed.inc()
        elif len(self._capped_scopes) < SCOPE_CACHE:
            self._capped_scopes[raw] = capped
        return capped

    # -- per event ------------------------------------------------------------------------------

    def events(self, per_hop: Mapping[str, int]) -> None:
        """Count accepted events: ``{hop: count}`` of a batch (one increment per hop)."""
        for hop, count in per_hop.items():
            self._child(self.m.events, (hop,)).inc(count)

    def rejected(self, reason: str, count: int = 1) -> None:
        self._child(self.m.events_rejected, (reason,)).inc(count)

    def duplicates(self, count: int) -> None:
        self.m.events_duplicate.inc(count)

    def body_rejected(self, reason: str) -> None:
        self._child(self.m.bodies_rejected, (reason,)).inc()

    def store_failed(self) -> None:
        self.m.store_failures.inc()

    def partial(self) -> None:
        self.m.requests_partial.inc()

    def closed_incomplete(self, why: str) -> None:
        self._child(self.m.requests_closed_incomplete, (why,)).inc()

    def engine_load(self, model: str | None, replica: str | None, requests: int, kv_bytes: int) -> None:
        """Add (or with negative numbers remove) in-flight requests and their KV bytes on a replica."""
        children = self._engine_children.get((model, replica))
        if children is None:
            labels = self.engines((self.model(model), self.replica(replica)))
            children = (self.m.in_flight.labels(*labels), self.m.kv_cache_bytes.labels(*labels))
            if len(self._engine_children) < ENGINE_CHILDREN_CACHE:
                self._engine_children[(model, replica)] = children
        pending = self._pending  # applied by ``flush``
        gauge = children[0]
        pending[gauge] = pending.get(gauge, 0) + requests
        if kv_bytes:
            gauge = children[1]
            pending[gauge] = pending.get(gauge, 0) + kv_bytes

    def flush(self) -> None:
        """Apply the increments ``request`` (requests, connections, without max_tokens) and
        ``engine_load`` keep, a sum per child: one ``inc`` per child a batch instead of one per
        request or event (prometheus_client's ``inc`` is ~1 µs: a lock and three calls). The join
        calls it at the end of each ``add``, ``sweep`` and ``finish_all``, before it hands the loop
        back; a scrape (on its thread) in between misses the batch's counts not applied yet, as it
        could always miss the rest of a batch half joined. The sums are whole numbers (requests, bytes), so one
        ``inc`` of a sum adds exactly what the ``inc`` of each term would."""
        pending = self._pending
        if pending:
            for child, amount in pending.items():
                child.inc(amount)
            pending.clear()

    # -- per finished request -------------------------------------------------------------------

    def _scoped(self, scope: tuple[str, str, str]) -> ScopedChildren:
        plan = self._scoped_children.get(scope)
        if plan is None:
            m = self.m
            stages = tuple((stage, m.stage_seconds.labels(stage, *scope)) for stage in TIME_STAGES)
            views = tuple(
                (key, metric.labels(view, *scope))
                for metric, views in (
                    (m.ttft_seconds, _TTFT),
                    (m.e2e_seconds, _E2E),
                    (m.itl_seconds, _ITL),
                )
                for key, view in views
            )
            tokens = (
                ("prompt_tokens", m.prompt_tokens.labels(*scope)),
                ("output_tokens", m.output_tokens.labels(*scope)),
            )
            plan = self._scoped_children[scope] = ScopedChildren(
                rows=Rows((*stages, *views, *tokens), {key for key, _ in views}, m.deferred),
                requests={},
                connections={},
            )
        return plan

    def request(
        self,
        request_id: str,
        stages: Mapping[str, Any],
        scope: tuple[str, str, str],
        outcome: str,
        negative: list[str],
    ) -> None:
        """One finished request: stages, views, tokens, outcome, connection reuse, max_tokens.

        The ~20 observations are a row of the scope's ``Rows``, counted in bulk before the next
        scrape, without the negative stages (a clock or instrumentation problem); the request's
        exemplar and time are shared by all of them; the counters' increments wait for ``flush``."""
        now = time.time()
        plan = self._scoped(scope)
        get = stages.get
        m = self.m
        if negative:  # rare: counted, and left out of the histograms
            for name in negative:
                self._child(m.negative_stages, (name,)).inc()
            plan.rows.add(request_id, now, lambda key: None if key in negative else get(key))
        else:
            plan.rows.add(request_id, now, get)
        counter = plan.requests.get(outcome)
        if counter is None:
            counter = plan.requests[outcome] = self._child(m.requests, (outcome, *scope))
        pending = self._pending  # applied by ``flush``
        pending[counter] = pending.get(counter, 0) + 1
        reused = get("conn_reused")
        if reused is not None:
            counter = plan.connections.get(bool(reused))
            if counter is None:
                counter = plan.connections[bool(reused)] = self._child(
                    m.connections, ("true" if reused else "false", *scope)
                )
            pending[counter] = pending.get(counter, 0) + 1
        if get("max_tokens_set") is False:
            counter = self._child(m.without_max_tokens, scope)
            pending[counter] = pending.get(counter, 0) + 1

    def incomplete(self, missing: str, outcome: str, scope: tuple[str, str, str]) -> None:
        """A request given up before every hop arrived: by its first missing hop, and by outcome."""
        self._child(self.m.incomplete_requests, (missing,)).inc()
        self._child(self.m.requests, (outcome, *scope)).inc()
