"""A histogram with ``request_id`` exemplars that costs a fraction of prometheus_client's.

prometheus_client's ``Histogram.observe`` with an exemplar is slow even on a pre-bound child (it
validates the exemplar and takes locks on every call), and a finished request makes 17
observations (bench/README.md, "collector", compares the two side by side). This one
keeps, per label tuple, plain per-bucket counts, a sum and each bucket's latest exemplar, and
turns them into a ``HistogramMetricFamily`` only at scrape time (a custom collector: the
registry's pull model). The exposition is the same: cumulative ``_bucket`` series with ``le``,
``_sum``, ``_count``, and in OpenMetrics one exemplar per bucket.

Not thread-safe by design: the collector observes and scrapes on one event loop thread.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Callable, Container, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import HistogramMetricFamily
from prometheus_client.samples import Exemplar
from prometheus_client.utils import floatToGoString


class HistogramChild:
    """One label tuple's buckets; ``observe`` is a bisect and three stores."""

    __slots__ = ("counts", "exemplars", "sum", "upper")

    def __init__(self, upper: tuple[float, ...]) -> None:
        self.upper = upper
        self.counts = [0] * len(upper)
        self.exemplars: list[tuple[Mapping[str, str], float, float] | None] = [None] * len(upper)
        self.sum = 0.0

    def observe(
        self, value: float, exemplar: Mapping[str, str] | None = None, timestamp: float | None = None
    ) -> None:
        """Count ``value``; with ``exemplar``, keep it as its bucket's latest, stamped ``timestamp``
        (default now: a caller observing many values at once passes one time for all)."""
        i = bisect_left(self.upper, value)
        self.counts[i] += 1
        self.sum += value
        if exemplar is not None:
            self.exemplars[i] = (exemplar, value, time.time() if timestamp is None else timestamp)

    @staticmethod
    def observe_found(
        pairs: Sequence[tuple[str, HistogramChild]],
        get: Callable[[str], Any],
        exemplar: Mapping[str, str],
        timestamp: float,
        skip: Container[str] = (),
        nonnegative: bool = False,
    ) -> None:
        """``observe`` on each (key, child) of ``pairs`` of ``get(key)``, with one exemplar and
        time, unless it is None, ``key`` is in ``skip`` or, with ``nonnegative``, it is not >= 0:
        a finished request's ~17 observations in three loops (the per-call cost is most of an
        observation; no list of pairs found is built first)."""
        for key, child in pairs:
            value = get(key)
            if value is None or key in skip or (nonnegative and not value >= 0):
                continue
            i = bisect_left(child.upper, value)
            child.counts[i] += 1
            child.sum += value
            child.exemplars[i] = (exemplar, value, timestamp)


class ExemplarHistogram:
    """A labelled histogram registered on ``registry`` as a custom collector.

    Buckets must be sorted and finite (``+Inf`` is added), as prometheus_client requires.
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        *,
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        upper = tuple(float(b) for b in buckets)
        if list(upper) != sorted(upper) or len(set(upper)) != len(upper):
            raise ValueError(f"{name}: buckets must be strictly increasing, got {buckets}")
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.upper = upper + (math.inf,)
        self._le = tuple(floatToGoString(b) for b in self.upper)
        self._children: dict[tuple[str, ...], HistogramChild] = {}
        registry.register(self)

    def labels(self, *values: str) -> HistogramChild:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {values}")
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = HistogramChild(self.upper)
        return child

    def describe(self) -> list[HistogramMetricFamily]:
        return [HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in list(self._children.items()):
            cumulative = 0
            buckets: list = []
            for le, count, ex in zip(self._le, child.counts, child.exemplars):
                cumulative += count
                if ex is None:
                    buckets.append((le, cumulative))
                else:
                    buckets.append((le, cumulative, Exemplar(dict(ex[0]), ex[1], ex[2])))
            family.add_metric(list(values), buckets, child.sum)
        yield family
