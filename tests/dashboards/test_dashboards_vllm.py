"""The engine dashboard on a real stack: vLLM (CPU, tiny model) with hopline's engine middleware and
stat logger, clients through hopline's httpx transport, the collector tailing both event files, and
Prometheus scraping vLLM and the collector with the generated config and rules.

Every query of the engine dashboard must return data: vLLM's series (named in ``vllm_metrics``,
labelled ``replica`` by the scrape job) and hopline's, for the same replica.

Needs the vLLM venv of ``.ci/vllm-setup.sh`` (``$HOPLINE_VLLM_DIR``); the server is started the
way tests/engines/test_vllm.py starts it (its helpers are reused, not copied).
"""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml
from hopline.dashboards import provisioning
from hopline.dashboards.build import write
from hopline.dashboards.promql import substitute_variables
from hopline.middleware.client import instrument
from hopline.middleware.emit import Emitter
from support.servers import wait_until

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

_spec = importlib.util.spec_from_file_location(
    "hopline_tests_engines_vllm", Path(__file__).parents[1] / "engines" / "test_vllm.py"
)
engine_test = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(engine_test)

REPLICA = "r1"  # what tests/engines/test_vllm.py's server reports as HOPLINE_REPLICA
DEADLINE_S = 60.0
# how the helpers wait for a server or a scrape (httpx errors: not up yet)
PATIENCE = {"timeout": DEADLINE_S, "interval": 0.3, "ignore": (httpx.HTTPError,)}


async def _chats(port: int, emitter: Emitter, ids: list[str]) -> None:
    async with instrument(httpx.AsyncClient(timeout=120), emitter=emitter) as client:
        await asyncio.gather(*(engine_test.chat(client, port, rid, 48) for rid in ids))


def test_engine_dashboard_queries_return_vllm_and_hopline_data(tmp_path: Path, dashboard_models, all_panels):
    root = engine_test.vllm_dir()
    vport, cport, pport = engine_test.free_port(), engine_test.free_port(), engine_test.free_port()
    events = tmp_path / "events"
    events.mkdir()
    vllm = engine_test.start_server(root, vport, events / "engine.ndjson", tmp_path / "serve.log")
    collector = subprocess.Popen(
        [sys.executable, "-m", "hopline.collector", "--data-dir", str(tmp_path / "store"),
         "--port", str(cport), "--fsync", "none", "--tail", f"{events}/*.ndjson*",
         "--model-config", f"{engine_test.MODEL}={root / 'tiny'}"],
        stdout=(tmp_path / "collector.log").open("wb"), stderr=subprocess.STDOUT)  # fmt: skip
    write(tmp_path / "out")
    config = tmp_path / "out" / provisioning.PROMETHEUS_FILE
    config.write_text(
        yaml.safe_dump(
            provisioning.prometheus_config(
                collector=f"127.0.0.1:{cport}", vllm={REPLICA: f"127.0.0.1:{vport}"}, scrape_interval="1s"
            )
        )
    )
    prometheus = subprocess.Popen(
        ["/usr/bin/prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{pport}", "--enable-feature=exemplar-storage"],
        stdout=(tmp_path / "prometheus.log").open("wb"), stderr=subprocess.STDOUT)  # fmt: skip
    emitter = Emitter(f"file:{events / 'client.ndjson'}", service="dash-client")
    prom = f"http://127.0.0.1:{pport}"
    try:
        engine_test.wait_ready(vllm, vport, tmp_path / "serve.log")
        with httpx.Client(timeout=10) as http:

            def value(expr: str) -> float:
                result = http.get(f"{prom}/api/v1/query", params={"query": expr}).json()["data"]["result"]
                return float(result[0]["value"][1]) if result else 0.0

            done = 0
            for n in range(2):  # two rounds, each scraped, so that rates are above zero
                ids = [f"dash-{n}-{i}" for i in range(4)]
                asyncio.run(_chats(vport, emitter, ids))
                emitter.flush()
                done += len(ids)
                # the default grace (2 s, four tail polls): the client's and the engine's files are
                # read apart by up to a poll, and a request's engine hops must join it (its stages)
                wait_until(f"round {n} in Prometheus", lambda d=done: value("sum(hopline_requests_total)") >= d
                      and value('sum(hopline_stage_seconds_count{stage="decode"})') >= d
                      and value("sum(vllm:time_to_first_token_seconds_count)") >= d, **PATIENCE)  # fmt: skip
            joined = http.get(f"http://127.0.0.1:{cport}/healthz").json()
            empty = []
            for panel in all_panels(dashboard_models["hopline-engine.json"]):
                for target in panel.get("targets", []):
                    answer = http.get(
                        f"{prom}/api/v1/query", params={"query": substitute_variables(target["expr"])}
                    )
                    data = answer.json()
                    assert data["status"] == "success", (panel["title"], data)
                    if not data["data"]["result"]:
                        empty.append(f"{panel['title']} {target['refId']}")
                    elif "by (replica)" in target["expr"]:
                        assert {r["metric"]["replica"] for r in data["data"]["result"]} == {REPLICA}
    finally:
        emitter.close()
        for proc in (prometheus, collector):
            proc.terminate()
        engine_test.stop_server(vllm)
        for proc in (prometheus, collector):
            proc.wait(timeout=15)
    assert empty == [], f"{empty}\njoin counts: {joined}\ncollector log:\n{engine_test.tail(tmp_path / 'collector.log')}"
