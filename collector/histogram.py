"""A histogram with ``request_id`` exemplars that costs a fraction of prometheus_client's.

prometheus_client's ``Histogram.observe`` with an exemplar is slow even on a pre-bound child (it
validates the exemplar and takes locks on every call), and a finished request makes 17
observations (bench/README.md, "collector", compares the two side by side). This one
keeps, per label tuple, plain per-bucket counts, a sum and each bucket's latest exemplar, and
turns them into a ``HistogramMetricFamily`` only at scrape time (a custom collector: the
registry's pull model). The exposition is the same: cumulative ``_bucket`` series with ``le``,
``_sum``, ``_count``, and in OpenMetrics one exemplar per bucket.

A finished request's ~20 observations are not counted one by one: ``Rows`` holds the request's
values as one row and counts many rows at once with a few NumPy calls (``Rows.fold``), before any
scrape reads the buckets and whenever ``Deferred.limit`` rows wait. The exposition is the same as
counting each at once: the same counts, sums added in the same order, each bucket's latest exemplar.

Not thread-safe by design: the collector observes and scrapes on one event loop thread.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Callable, Container, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
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


class Deferred:
    """The ``Rows`` with rows not counted yet, shared by the histograms they count on: a scrape
    (``ExemplarHistogram.collect``) folds them all first; ``limit`` rows in all fold them too,
    which bounds the memory held (a row is ~0.7 KB with the values it keeps: ~6 MB at most)."""

    def __init__(self, limit: int = 8192) -> None:
        self.limit = limit
        self.waiting: list[Rows] = []
        self.rows = 0

    def fold(self) -> None:
        waiting, self.waiting, self.rows = self.waiting, [], 0
        for rows in waiting:
            rows.fold()


class Rows:
    """A finished request's observations on a fixed set of children, as one row of values per
    request, counted in bulk (``fold``). ``keys[j]``'s value is observed on ``children[j]``, unless
    it is None (NaN), or, for the keys in ``nonnegative``, it is not >= 0; every observation of
    a row carries the row's exemplar (``{"request_id": ...}``) and time."""

    def __init__(
        self,
        pairs: Sequence[tuple[str, HistogramChild]],
        nonnegative: Container[str],
        deferred: Deferred,
    ) -> None:
        self.keys = tuple(key for key, _ in pairs)
        self.children = tuple(child for _, child in pairs)
        self.deferred = deferred
        # the rows waiting: request IDs, times, and their values one after the other (a row is
        # ``len(keys)`` of them: one list extended by a C loop, no tuple a row)
        self.ids: list[str] = []
        self.times: list[float] = []
        self.values: list[Any] = []
        # the columns by bucket bounds: one searchsorted and one bincount per set of bounds
        groups: dict[tuple[float, ...], list[int]] = {}
        for j, child in enumerate(self.children):
            groups.setdefault(child.upper, []).append(j)
        self.groups = [
            (np.array(upper), np.array(cols), np.array([self.keys[j] in nonnegative for j in cols]))
            for upper, cols in groups.items()
        ]

    def add(self, request_id: str, timestamp: float, get: Callable[[str], Any]) -> None:
        """One request's values, ``get(key)`` for each key, counted at the next fold."""
        ids = self.ids
        deferred = self.deferred
        if not ids:
            deferred.waiting.append(self)
        ids.append(request_id)
        self.times.append(timestamp)
        self.values.extend(map(get, self.keys))
        deferred.rows += 1
        if deferred.rows >= deferred.limit:
            deferred.fold()

    def fold(self) -> None:
        """Count the rows waiting: per set of bucket bounds, the bucket of every value at once, the
        counts by (column, bucket), the sums added row by row from the children's (so equal to the
        bit to adding each value in turn) and each bucket's last row for its exemplar."""
        ids, times, flat = self.ids, self.times, self.values
        if not ids:
            return
        self.ids, self.times, self.values = [], [], []
        width = len(self.keys)
        values = np.array(flat, dtype=float).reshape(len(ids), width)  # None -> NaN
        children = self.children
        exemplars: dict[int, dict[str, str]] = {}
        for upper, cols, nonnegative in self.groups:
            block = values[:, cols]
            valid = np.where(nonnegative, block >= 0, ~np.isnan(block))
            nb = len(upper)
            cells = (np.searchsorted(upper, block) + np.arange(len(cols)) * nb)[valid]
            counts = np.bincount(cells, minlength=len(cols) * nb).reshape(len(cols), nb).tolist()
            start = np.array([[children[j].sum for j in cols.tolist()]])
            with np.errstate(invalid="ignore", over="ignore"):  # inf - inf, as Python's += gives it: NaN
                sums = np.add.accumulate(np.concatenate((start, np.where(valid, block, 0.0))), axis=0)[-1].tolist()
            # each (column, bucket)'s last row: the first of the reversed order
            taken, first = np.unique(cells[::-1], return_index=True)
            row_of = np.nonzero(valid)[0][len(cells) - 1 - first]
            for k, j in enumerate(cols.tolist()):
                child = children[j]
                child.counts = [a + b for a, b in zip(child.counts, counts[k])]
                child.sum = sums[k]
            for cell, r in zip(taken.tolist(), row_of.tolist()):
                k, bucket = divmod(cell, nb)
                j = int(cols[k])
                exemplar = exemplars.get(r)
                if exemplar is None:
                    exemplar = exemplars[r] = {"request_id": ids[r]}
                children[j].exemplars[bucket] = (exemplar, flat[r * width + j], times[r])


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
        deferred: Deferred | None = None,
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
        self.deferred = deferred  # rows of observations to count before a scrape reads the buckets
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
        if self.deferred is not None:
            self.deferred.fold()
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
