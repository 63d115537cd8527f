"""End to end: a real collector, scraped by a real Prometheus (Debian's 2.42) running the generated
config and rules, answers the dashboards' queries with data and exemplars.

The collector ingests the golden fixture's requests in rounds (fresh request IDs each round) so
that rates are non-zero; Prometheus scrapes it every second with exemplar storage on, exactly as
the docker-compose stack does, from the same ``prometheus_config`` function.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
import yaml
from hopline.dashboards import provisioning
from hopline.dashboards.build import write
from hopline.dashboards.promql import substitute_variables
from hopline.middleware.contract import EMITTER_STATS_HOP, dumps, new_eid
from support.servers import free_port, wait_until

ROUNDS = 3
DEADLINE_S = 30.0
# how the helpers wait for a server or a scrape (httpx errors: not up yet)
PATIENCE = {"timeout": DEADLINE_S, "interval": 0.2, "ignore": (httpx.HTTPError,)}
# Queries that legitimately return nothing on the test's traffic, and why.
EMPTY_BY_DESIGN = {
    "Incomplete requests": "no request expires within the test (TTL 15 min)",
    "Findings now": "no hopline watch runs in this stack (tests/analyzer/live scrape one)",
}
KV_SPEC = "m=2,2,64,fp16"  # model m: 2 layers x 2 KV heads x 64 dims x 2 bytes x (K, V) = 1 KiB a token


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, traffic) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("stack")
    cport, pport = free_port(), free_port()
    collector = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hopline.collector",
            "--data-dir",
            str(tmp / "events"),
            "--port",
            str(cport),
            "--grace",
            "0s",
            "--fsync",
            "none",
            "--model-config",
            KV_SPEC,
        ],
        stdout=(tmp / "collector.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    write(tmp / "out")
    config_dir = tmp / "out" / provisioning.PROMETHEUS_DIR
    (config_dir / "prometheus.yml").write_text(
        yaml.safe_dump(provisioning.prometheus_config(collector=f"127.0.0.1:{cport}", scrape_interval="1s"))
    )
    prometheus = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config_dir / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{pport}",
            "--enable-feature=exemplar-storage",
        ],
        stdout=(tmp / "prometheus.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    collector_url, prom_url = f"http://127.0.0.1:{cport}", f"http://127.0.0.1:{pport}"
    try:
        with httpx.Client(timeout=10) as http:
            wait_until("the collector", lambda: http.get(f"{collector_url}/healthz").status_code == 200, **PATIENCE)
            wait_until("Prometheus", lambda: http.get(f"{prom_url}/-/ready").status_code == 200, **PATIENCE)

            def requests_seen() -> float:
                result = http.get(
                    f"{prom_url}/api/v1/query", params={"query": "sum(hopline_requests_total)"}
                ).json()
                return float(result["data"]["result"][0]["value"][1]) if result["data"]["result"] else 0.0

            ids: list[str] = []
            finished = 0
            for n in range(ROUNDS):
                events = traffic(f"-{n}")
                ids += sorted({e["request_id"] for e in events})
                # and one invalid event a round: the collector rejects it, keeps the rest; and a
                # gateway emitter's health report (delivering, nothing dropped)
                health = {
                    "ts": time.time(), "eid": new_eid(), "hop": EMITTER_STATS_HOP, "emitter": "e1",
                    "service": "kite-chat", "replica": "gw-1", "sent": 100 * (n + 1), "buffered": n,
                }
                body = b"".join(dumps(e) for e in [*events, health]) + b'{"ts": 1, "hop": "client.sent"}\n'
                answer = http.post(
                    f"{collector_url}/v1/events",
                    content=body,
                    headers={"content-type": "application/x-ndjson"},
                )
                assert answer.status_code == 200, answer.text
                # wait until a scrape saw this round (the joiner finished every request: grace 0)
                finished += len(
                    {e["request_id"] for e in events if not e["request_id"].startswith("running")}
                )
                wait_until(f"round {n} scraped", lambda f=finished: requests_seen() >= f, **PATIENCE)
            # let the rules evaluate on the last scrape (evaluation interval 1 s)
            wait_until(
                "recording rules",
                lambda: http.get(
                    f"{prom_url}/api/v1/query", params={"query": "hopline:stage_seconds:p50_5m"}
                ).json()["data"]["result"], **PATIENCE)
            yield {"prometheus": prom_url, "request_ids": ids, "built": tmp / "out", "http": http}
    finally:
        for proc in (prometheus, collector):
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()


def _query(stack: dict, expr: str, at: str | None = None) -> dict:
    params = {"query": expr} | ({"time": at} if at else {})
    answer = stack["http"].get(f"{stack['prometheus']}/api/v1/query", params=params).json()
    assert answer["status"] == "success", (expr, answer)
    return answer["data"]


def _last_good_scrape(stack: dict) -> str:
    """When the collector's last successful scrape started. On a loaded machine a 1 s scrape can
    time out, and Prometheus then marks every series stale: queries pinned to a good scrape see
    what the dashboards would, not the accident of the moment."""

    def healthy() -> str | None:
        targets = stack["http"].get(f"{stack['prometheus']}/api/v1/targets").json()["data"]["activeTargets"]
        return targets[0]["lastScrape"] if targets and targets[0]["health"] == "up" else None

    return wait_until("a successful scrape", healthy, **PATIENCE)


def test_every_dashboard_query_runs_and_hoplines_return_data(stack, dashboard_models, all_panels):
    at = _last_good_scrape(stack)
    empty = []
    for model in dashboard_models.values():
        for panel in all_panels(model):
            for target in panel.get("targets", []):
                data = _query(stack, substitute_variables(target["expr"]), at)
                if "vllm:" not in target["expr"] and not data["result"]:
                    empty.append((panel["title"], target["expr"]))
    assert sorted({title for title, _ in empty}) == sorted(EMPTY_BY_DESIGN), empty


def test_exemplars_on_latency_queries_carry_request_ids(stack, dashboard_models, all_panels):
    model = dashboard_models["hopline-lifecycle.json"]
    panel = next(p for p in all_panels(model) if p["title"] == "TTFT p90: client, gateway, engine")
    now = time.time()
    answer = (
        stack["http"]
        .get(
            f"{stack['prometheus']}/api/v1/query_exemplars",
            params={
                "query": substitute_variables(panel["targets"][0]["expr"]),
                "start": now - 300,
                "end": now,
            },
        )
        .json()
    )
    assert answer["status"] == "success"
    exemplars = [e for series in answer["data"] for e in series["exemplars"]]
    assert exemplars
    assert {e["labels"]["request_id"] for e in exemplars} <= set(stack["request_ids"])
    views = {series["seriesLabels"]["view"] for series in answer["data"]}
    assert views == {"client", "gateway", "engine"}


def test_rules_evaluate_and_the_alert_annotation_finds_a_firing_alert(stack, dashboard_models):
    groups = stack["http"].get(f"{stack['prometheus']}/api/v1/rules").json()["data"]["groups"]
    assert {g["name"] for g in groups} == {"hopline-recordings", "hopline-alerts"}
    for group in groups:
        for rule in group["rules"]:
            assert rule["health"] == "ok", rule
    # the fixture has a negative stage: HoplineNegativeStages fires at once (no `for`)
    annotation = dashboard_models["hopline-lifecycle.json"]["annotations"]["list"][0]
    firing = wait_until("a firing alert", lambda: _query(stack, annotation["expr"])["result"], **PATIENCE)
    assert {r["metric"]["alertname"] for r in firing} == {"HoplineNegativeStages"}


def test_variables_list_the_labels_the_collector_exposes(stack):
    values = (
        stack["http"]
        .get(
            f"{stack['prometheus']}/api/v1/label/replica/values", params={"match[]": "hopline_requests_total"}
        )
        .json()["data"]
    )
    assert {"r1", "r2"} <= set(values)
