"""Emitters' health, from their ``emitter.stats`` reports, as ``hopline_emitter_*`` metrics.

Every hopline emitter sends its cumulative counts (sent, dropped by reason, buffered, errors)
now and then down its sink (``contract.EMITTER_STATS_HOP``). They are counts of one emitter
instance (a process; a forked child is another), so the collector remembers each instance's
last report and adds what grew since to counters per ``service`` and ``replica``: the sums stay
monotonic when processes come and go, a report that arrives twice or late adds nothing, and
``buffered`` (a gauge) is the sum over the instances heard from recently.

What bounds the memory: at most ``max_instances`` instances (the least recently heard is
forgotten first), each forgotten after ``expiry_s`` without a report (emitters report at least
every five minutes) or at its final report; at most ``max_series`` (service, replica) pairs, the
rest counted under ``other``.

An emitter whose sink shards over several collectors (middleware/sharded_sink.py) adds
``targets`` to its reports: the same kind of cumulative counts per collector. They become
``hopline_emitter_target_*`` with a ``target`` label (the collector's ``host:port``), so a dead
collector's share (buffered, then dropped) shows by name in the collectors that are up; at most
``max_series`` (service, replica, target) triples, the rest under ``other``.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from hopline.collector import metric_names as names
from hopline.middleware.contract import EMITTER_DROP_REASONS, EMITTER_STATS_HOP, EMITTER_TARGET_COUNTS
from prometheus_client import CollectorRegistry, Counter, Gauge

OTHER = "other"
UNKNOWN = "unknown"
_COUNTERS = ("sent", "errors") + tuple(f"dropped_{reason}" for reason in EMITTER_DROP_REASONS)


def split_reports(events: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(request hop events, emitter.stats reports) of a validated batch, each in order."""
    reports = [event for event in events if event["hop"] == EMITTER_STATS_HOP]
    if not reports:
        return events, reports
    return [event for event in events if event["hop"] != EMITTER_STATS_HOP], reports


@dataclass
class _Instance:
    series: tuple[str, str]
    counts: dict[str, int]
    buffered: int
    heard: float  # monotonic
    ts: float = 0.0  # of the latest report applied
    # per target name: (its series, its last counts); only for sharding emitters
    targets: dict[str, tuple[tuple[str, str, str], dict[str, int]]] = field(default_factory=dict)


class EmitterStats:
    """Turns reports into ``metric_names.EMITTER_METRICS`` on ``registry``."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        max_series: int = 256,
        max_instances: int = 10_000,
        expiry_s: float = 900.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        def make(metric: names.Metric) -> Any:
            kind = Counter if metric.kind == "counter" else Gauge
            return kind(metric.name, metric.help, metric.labels, registry=registry)

        self.sent = make(names.EMITTER_SENT)
        self.dropped = make(names.EMITTER_DROPPED)
        self.buffered = make(names.EMITTER_BUFFERED)
        self.errors = make(names.EMITTER_ERRORS)
        self.target_sent = make(names.EMITTER_TARGET_SENT)
        self.target_dropped = make(names.EMITTER_TARGET_DROPPED)
        self.target_buffered = make(names.EMITTER_TARGET_BUFFERED)
        self._target_series: set[tuple[str, str, str]] = set()
        self.max_series = max_series
        self.max_instances = max_instances
        self.expiry_s = expiry_s
        self._clock = clock
        self._series: set[tuple[str, str]] = set()
        self._instances: OrderedDict[tuple[str, str, str], _Instance] = OrderedDict()

    def _capped(self, service: Any, replica: Any) -> tuple[str, str]:
        series = (service or UNKNOWN, replica or UNKNOWN)
        if series in self._series:
            return series
        if len(self._series) < self.max_series:
            self._series.add(series)
            return series
        return (OTHER, OTHER)

    def observe(self, reports: Iterable[dict[str, Any]]) -> None:
        """Apply validated ``emitter.stats`` events (in the order they were sent)."""
        now = self._clock()
        for report in reports:
            key = (report.get("service") or "", report.get("replica") or "", report["emitter"])
            instance = self._instances.pop(key, None)
            if instance is None:
                instance = self._new_instance(key)
            if report["ts"] > instance.ts:  # an older report (resent late) says nothing new
                self._apply(instance, report)
                instance.ts = report["ts"]
            instance.heard = now
            if report.get("final") is True:
                self._forget(instance)
            else:
                self._instances[key] = instance  # most recently heard last
        self._expire(now)

    def _new_instance(self, key: tuple[str, str, str]) -> _Instance:
        """State for an emitter heard for the first time; its series exist from now on, at 0 where
        nothing was counted yet (so a first drop is an increase that ``increase()`` can see)."""
        series = self._capped(key[0], key[1])
        self.sent.labels(*series)
        self.errors.labels(*series)
        self.buffered.labels(*series)
        for reason in EMITTER_DROP_REASONS:
            self.dropped.labels(*series, reason)
        return _Instance(series, dict.fromkeys(_COUNTERS, 0), 0, self._clock())

    def _apply(self, instance: _Instance, report: dict[str, Any]) -> None:
        service, replica = instance.series
        for name in _COUNTERS:
            value = report.get(name, 0)
            grown = value - instance.counts[name]
            if grown <= 0:
                continue
            instance.counts[name] = value
            if name == "sent":
                self.sent.labels(service, replica).inc(grown)
            elif name == "errors":
                self.errors.labels(service, replica).inc(grown)
            else:
                self.dropped.labels(service, replica, name.removeprefix("dropped_")).inc(grown)
        buffered = report.get("buffered", 0)
        self.buffered.labels(service, replica).inc(buffered - instance.buffered)
        instance.buffered = buffered
        for target in report.get("targets") or ():
            self._apply_target(instance, target)

    def _apply_target(self, instance: _Instance, target: dict[str, Any]) -> None:
        """Add what grew in one collector's counts since this instance's last report."""
        known = instance.targets.get(target["target"])
        if known is None:
            series = self._capped_target(*instance.series, target["target"])
            self.target_sent.labels(*series)
            self.target_buffered.labels(*series)
            for reason in ("full", "sink"):
                self.target_dropped.labels(*series, reason)
            known = instance.targets[target["target"]] = (series, dict.fromkeys(EMITTER_TARGET_COUNTS, 0))
        series, counts = known
        for name in EMITTER_TARGET_COUNTS:
            value = target.get(name, 0)
            grown = value - counts[name]
            if name == "buffered":
                self.target_buffered.labels(*series).inc(grown)
            elif grown <= 0:
                continue
            elif name == "sent":
                self.target_sent.labels(*series).inc(grown)
            else:
                self.target_dropped.labels(*series, name.removeprefix("dropped_")).inc(grown)
            counts[name] = value

    def _capped_target(self, service: str, replica: str, target: str) -> tuple[str, str, str]:
        series = (service, replica, target)
        if series in self._target_series:
            return series
        if len(self._target_series) < self.max_series:
            self._target_series.add(series)
            return series
        return (OTHER, OTHER, OTHER)

    def _forget(self, instance: _Instance) -> None:
        if instance.buffered:
            self.buffered.labels(*instance.series).dec(instance.buffered)
            instance.buffered = 0
        for series, counts in instance.targets.values():
            if counts["buffered"]:
                self.target_buffered.labels(*series).dec(counts["buffered"])
                counts["buffered"] = 0

    def _expire(self, now: float) -> None:
        instances = self._instances
        while instances:
            key, oldest = next(iter(instances.items()))
            if len(instances) <= self.max_instances and now - oldest.heard < self.expiry_s:
                break
            del instances[key]
            self._forget(oldest)

    def __len__(self) -> int:
        """Emitter instances remembered."""
        return len(self._instances)
