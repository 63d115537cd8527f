"""``histogram.Rows``: finished requests' observations counted in bulk give the buckets, sums and
exemplars of counting each value at once (``HistogramChild.observe``), to the bit; a scrape
counts the rows waiting first, and ``Deferred.limit`` rows waiting are counted without one."""

from __future__ import annotations

import math

import hypothesis.strategies as st
from hopline.collector import metric_names as names
from hopline.collector.histogram import Deferred, ExemplarHistogram, HistogramChild, Rows
from hypothesis import given, settings
from prometheus_client import CollectorRegistry

LATENCY = (*map(float, names.LATENCY_BUCKETS), math.inf)
TOKENS = (*map(float, names.TOKEN_BUCKETS), math.inf)
# (key, bounds, nonnegative): two sets of bounds, as a scope's stages, views and tokens
KEYS = (
    ("queue", LATENCY, False),
    ("prefill", LATENCY, False),
    ("client_ttft", LATENCY, True),
    ("client_e2e", LATENCY, True),
    ("prompt_tokens", TOKENS, False),
    ("output_tokens", TOKENS, False),
)

value = st.one_of(
    st.none(),
    st.floats(min_value=-5.0, max_value=4000.0, allow_nan=False),
    st.sampled_from([0.0, -0.0, -1e-10, 1e-3, 0.001, 30.0, math.inf, -math.inf]),
    st.sampled_from([bound for bound in LATENCY[:-1]]),  # on a bucket's edge
    st.integers(min_value=0, max_value=200_000),
)
row = st.fixed_dictionaries({}, optional={key: value for key, _, _ in KEYS})
# each request: its values and whether the rows waiting are counted after it (a scrape)
requests = st.lists(st.tuples(row, st.booleans()), min_size=1, max_size=60)


def children() -> list[tuple[str, HistogramChild]]:
    return [(key, HistogramChild(upper)) for key, upper, _ in KEYS]


def state(pairs: list[tuple[str, HistogramChild]]) -> list:
    """Counts, the sum's exact bits, and exemplars (request ID, value, time) of each child."""
    out = []
    for _, child in pairs:
        exemplars = [None if e is None else (dict(e[0]), e[1], e[2]) for e in child.exemplars]
        out.append((child.counts, child.sum.hex(), exemplars))
    return out


@settings(max_examples=300, deadline=None)
@given(requests, st.integers(min_value=1, max_value=50))
def test_rows_count_as_each_value_at_once(reqs: list, limit: int) -> None:
    at_once, bulk = children(), children()
    deferred = Deferred(limit)
    rows = Rows(bulk, {key for key, _, nonneg in KEYS if nonneg}, deferred)
    for i, (values, scrape) in enumerate(reqs):
        exemplar, now = {"request_id": f"req-{i}"}, 1_764_700_000.0 + i
        for (key, child), (_, _, nonneg) in zip(at_once, KEYS):
            value = values.get(key)
            if value is not None and (not nonneg or value >= 0):
                child.observe(value, exemplar, now)
        rows.add(f"req-{i}", now, values.get)
        assert deferred.rows < limit  # the limit folds what waits
        if scrape:
            deferred.fold()
            assert state(bulk) == state(at_once)
    deferred.fold()
    assert state(bulk) == state(at_once)


def test_a_scrape_counts_the_rows_waiting() -> None:
    registry = CollectorRegistry()
    deferred = Deferred()
    hist = ExemplarHistogram("h_seconds", "doc", ["stage"], buckets=[0.1, 1.0], registry=registry, deferred=deferred)
    rows = Rows([("queue", hist.labels("queue"))], (), deferred)
    for i, v in enumerate([0.05, 0.5, 0.7, 5.0, None]):
        rows.add(f"req-{i}", 100.0 + i, {"queue": v}.get)
    assert hist.labels("queue").counts == [0, 0, 0]  # waiting
    samples = {(s.name, s.labels.get("le")): s for family in registry.collect() for s in family.samples}
    assert samples[("h_seconds_bucket", "0.1")].value == 1
    assert samples[("h_seconds_bucket", "1.0")].value == 3
    assert samples[("h_seconds_bucket", "+Inf")].value == 4
    assert samples[("h_seconds_count", None)].value == 4
    assert samples[("h_seconds_sum", None)].value == 0.05 + 0.5 + 0.7 + 5.0
    exemplar = samples[("h_seconds_bucket", "1.0")].exemplar
    assert (exemplar.labels, exemplar.value, exemplar.timestamp) == ({"request_id": "req-2"}, 0.7, 102.0)
    assert deferred.rows == 0 and rows.ids == []


def test_the_limit_counts_rows_without_a_scrape() -> None:
    deferred = Deferred(limit=3)
    child = HistogramChild(LATENCY)
    rows = Rows([("queue", child)], (), deferred)
    rows.add("a", 1.0, {"queue": 0.2}.get)
    rows.add("b", 2.0, {"queue": 0.2}.get)
    assert sum(child.counts) == 0 and deferred.rows == 2
    rows.add("c", 3.0, {"queue": 0.2}.get)
    assert sum(child.counts) == 3 and deferred.rows == 0 and rows.ids == []
