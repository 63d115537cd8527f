"""A real Prometheus (exemplar storage on) scraping a real collector: quantiles and exemplars."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hopline.collector.config import CollectorConfig
from support.collector import serve
from support.events import event, ndjson
from support.servers import free_port

PROMETHEUS = "/usr/bin/prometheus"


@contextlib.contextmanager
def prometheus(tmp_path: Path, target: str) -> Iterator[str]:
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: hopline\n"
        f"    static_configs: [{{targets: ['{target}']}}]\n"
    )
    port = free_port()
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--enable-feature=exemplar-storage",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, "prometheus exited"
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(url + "/-/ready", timeout=1).status_code == 200:
                    break
            assert time.monotonic() < deadline, "prometheus not ready"
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def request_events(rid: str, t: float, queue_s: float, prefill_s: float) -> list[dict]:
    """One complete streaming request: client and engine hops, queue and prefill from engine.stats."""
    engine = {"service": "engine", "model": "m", "replica": "r1"}
    return [
        event("client.sent", rid, t, service="kite-chat", stream=True, conn_reused=True),
        event("engine.received", rid, t + 0.01, stream=True, **engine),
        event("engine.stats", rid, t + 0.9, queue_s=queue_s, prefill_s=prefill_s, decode_s=0.1, **engine),
        event("engine.first_token", rid, t + 0.01 + queue_s + prefill_s, **engine),
        event("client.first_token", rid, t + 0.02 + queue_s + prefill_s),
        event("engine.last_token", rid, t + 0.9, output_tokens=10, **engine),
        event("client.last_token", rid, t + 0.91, output_tokens=10),
    ]


def query(url: str, promql: str) -> list[dict]:
    r = httpx.get(url + "/api/v1/query", params={"query": promql}, timeout=5)
    r.raise_for_status()
    return r.json()["data"]["result"]


def test_quantiles_and_exemplars_through_prometheus(tmp_path):
    """10 requests, all with queue 0.12 s, 4 with prefill 0.25 s and 6 with prefill 0.6 s.

    histogram_quantile interpolates linearly inside the bucket where the rank falls, so the
    expected values follow from the bucket bounds of metric_names.LATENCY_BUCKETS alone:
    queue: all 10 in (0.1, 0.15]; rank 0.5 x 10 = 5 -> 0.1 + 0.05 x 5/10 = 0.125,
           rank 0.9 x 10 = 9 -> 0.1 + 0.05 x 9/10 = 0.145.
    prefill: 4 in (0.2, 0.3], 6 in (0.5, 0.75]; rank 5 falls in the second
           -> 0.5 + 0.25 x (5 - 4)/6 = 0.541666...; rank 2 in the first -> 0.2 + 0.1 x 2/4 = 0.25.
    """
    t = time.time() - 5
    events = []
    for i in range(10):
        events += request_events(f"prom-{i}", t + i * 0.001, 0.12, 0.25 if i < 4 else 0.6)
    with serve(CollectorConfig(data_dir=tmp_path / "data", grace=0)) as c:
        r = c.client.post(
            "/v1/events", content=ndjson(events), headers={"Content-Type": "application/x-ndjson"}
        )
        assert r.json()["accepted"] == len(events)
        # the collector negotiates: OpenMetrics (with exemplars) only when asked for
        assert "# {request_id=" not in c.client.get("/metrics").text
        om = c.client.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        assert om.headers["content-type"].startswith("application/openmetrics-text")
        assert '# {request_id="prom-' in om.text
        with prometheus(tmp_path, c.url.removeprefix("http://")) as prom:
            promql = 'histogram_quantile({q}, sum by (le) (hopline_stage_seconds_bucket{{stage="{stage}"}}))'
            deadline = time.monotonic() + 30
            while not query(prom, 'hopline_stage_seconds_count{stage="queue"}'):
                assert time.monotonic() < deadline, "no scrape reached Prometheus"
                time.sleep(0.25)
            expected = {
                ("queue", 0.5): 0.125,
                ("queue", 0.9): 0.145,
                ("prefill", 0.5): 0.5 + 0.25 / 6,
                ("prefill", 0.2): 0.25,
            }
            for (stage, q), want in expected.items():
                got = float(query(prom, promql.format(q=q, stage=stage))[0]["value"][1])
                assert got == pytest.approx(want, rel=1e-9), (stage, q)
            deadline = time.monotonic() + 30
            while True:
                r = httpx.get(
                    prom + "/api/v1/query_exemplars",
                    params={
                        "query": 'hopline_stage_seconds_bucket{stage="queue"}',
                        "start": t - 60,
                        "end": time.time() + 60,
                    },
                    timeout=5,
                )
                series = r.json()["data"]
                if series:
                    break
                assert time.monotonic() < deadline, "no exemplars in Prometheus"
                time.sleep(0.25)
            ids = {ex["labels"]["request_id"] for s in series for ex in s["exemplars"]}
            assert ids and ids <= {f"prom-{i}" for i in range(10)}
            assert all(abs(float(ex["value"]) - 0.12) < 1e-9 for s in series for ex in s["exemplars"])


def test_metrics_have_no_created_series_and_a_host_registry_keeps_its_own(tmp_path):
    """prometheus_client adds a ``*_created`` sample to every counter and histogram child (before:
    hopline_requests_total_created, hopline_stage_seconds_created, ... on /metrics). The collector
    leaves them out of its registry only: a host application's registry in the same process keeps
    them (``disable_created_metrics()`` would have removed them process-wide)."""
    from prometheus_client import CollectorRegistry, Counter, generate_latest

    host = CollectorRegistry()
    Counter("host_jobs", "a host application's counter", registry=host).inc()
    with serve(CollectorConfig(data_dir=tmp_path / "data", grace=0)) as c:
        events = request_events("created-1", time.time() - 5, 0.12, 0.25)
        r = c.client.post("/v1/events", content=ndjson(events), headers={"Content-Type": "application/x-ndjson"})
        assert r.json()["accepted"] == len(events)
        text = c.client.get("/metrics").text
        om = c.client.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}).text
    for exposition in (text, om):
        assert 'hopline_requests_total{' in exposition and "hopline_stage_seconds_bucket{" in exposition
        created = [line for line in exposition.splitlines() if "_created" in line]
        assert created == []
    assert b"host_jobs_created " in generate_latest(host)
