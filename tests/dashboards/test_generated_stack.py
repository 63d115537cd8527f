"""The stack ``hopline dashboards build`` writes is whole (issue 35): its parts, started from the
generated files without docker, carry a demo incident from hop events to the panels' series, to
Prometheus' ``ALERTS`` and to Alertmanager's receiver.

Each part runs as the compose file says, with only what a host without docker must change:
- the collector with the compose command's arguments, its host, port and data dir local;
- ``hopline watch`` with the compose command's arguments (following the collector's store, as
  the compose file mounts it), its store, listen address, Alertmanager URL and state file local;
- Debian's Prometheus 2.42 on the generated ``prometheus.yml`` loaded and written back with each
  target's host:port replaced by the local one (``rule_files`` and ``alerting`` as generated) and
  the compose command's flags;
- Debian's Alertmanager 0.25 on the generated ``alertmanager.yml`` with the receiver's URL
  replaced by a local webhook recorder (``support.alertmanager.Webhook``).

The incident: two replicas at 20 requests/s for 150 s, up to a moment ago, queue time x3 on r2
for the last 60 s, POSTed to the collector's ingest endpoint as hop events (what the sinks do).
Grafana itself cannot run here (no Debian or PyPI package): its provisioning files are checked
against the structure Grafana reads, and every series a panel names against the two /metrics.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import polars as pl
import pytest
import yaml
from hopline.dashboards import provisioning
from hopline.dashboards.build import write
from hopline.dashboards.promql import substitute_variables
from hopline.dashboards.rules import LIVE_FINDING
from prometheus_client.parser import text_string_to_metric_families
from support.alertmanager import ALERTMANAGER, Alertmanager, Webhook
from support.servers import env_without_hopline, free_port, wait_until
from support.synth import StageShift, generate

DURATION_S, ONSET_S = 150, 90
RISE = StageShift("queue", 3.0, at_s=ONSET_S, scope={"replica": "r2"})  # no end: still on when it ends
# generous: a loaded 2-core machine; each wait returns as soon as its condition holds
PATIENCE = {"timeout": 90.0, "interval": 0.5, "ignore": (httpx.HTTPError, KeyError, IndexError)}

SAMPLE_SUFFIXES = {"counter": ("", "_total"), "histogram": ("_bucket", "_sum", "_count")}

pytestmark = pytest.mark.skipif(
    not (Path(ALERTMANAGER).exists() and Path("/usr/bin/prometheus").exists()),
    reason="needs Debian's prometheus and prometheus-alertmanager",
)


def replaced(args: list[str], values: dict[str, str]) -> list[str]:
    """``args`` (a compose command) with the value after each option in ``values`` (``--opt v``
    or ``--opt=v``) replaced; every option must be there once."""
    out, seen = list(args), []
    for i, arg in enumerate(args):
        name = arg.split("=", 1)[0]
        if name in values:
            seen.append(name)
            if "=" in arg:
                out[i] = f"{name}={values[name]}"
            else:
                out[i + 1] = values[name]
    assert sorted(seen) == sorted(values), (args, values)
    return out


def local_prometheus_config(generated: dict[str, Any], addresses: dict[str, str]) -> dict[str, Any]:
    """The generated config with each target's host:port replaced (``addresses``: generated ->
    local) and nothing else changed but the intervals (below)."""
    config = json.loads(json.dumps(generated))
    targets = [
        *(sc for job in config["scrape_configs"] for sc in job["static_configs"]),
        *(sc for am in config["alerting"]["alertmanagers"] for sc in am["static_configs"]),
    ]
    for static in targets:
        static["targets"] = [addresses[t] for t in static["targets"]]
    # test copy only: the generated 15 s scrape and evaluation would spend the test's budget on waiting
    config["global"] |= {"scrape_interval": "1s", "evaluation_interval": "1s"}
    return config


def local_alertmanager_config(generated: dict[str, Any], url: str) -> dict[str, Any]:
    config = json.loads(json.dumps(generated))
    (receiver,) = [r for r in config["receivers"] if r["name"] == config["route"]["receiver"]]
    (hook,) = receiver["webhook_configs"]
    assert hook["url"] == provisioning.RECEIVER_URL  # the placeholder the user replaces
    hook["url"] = url
    # test copy only: the generated group_wait (30 s) is right for a pager, long for a test
    config["route"]["group_wait"] = "1s"
    return config


def incident_events() -> list[dict[str, Any]]:
    events = generate(duration_s=DURATION_S, rate=20, seed=7, replicas=("r1", "r2"), incidents=[RISE])
    events = events.with_columns(pl.col("ts") + (time.time() - 1 - events["ts"].max())).sort("ts")
    rows = events.drop("attrs").iter_rows(named=True)
    return [{k: v for k, v in row.items() if v is not None} for row in rows]


@contextlib.contextmanager
def process(argv: list[str], log: Path) -> Iterator[subprocess.Popen]:
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env_without_hopline())
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def query(http: httpx.Client, url: str, expr: str) -> list[dict[str, Any]]:
    answer = http.get(f"{url}/api/v1/query", params={"query": expr}).json()
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What ``hopline dashboards build --out DIR`` writes by default."""
    out = tmp_path_factory.mktemp("generated")
    write(out)
    return out


@pytest.fixture(scope="module")
def stack(generated: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("stack")
    compose = yaml.safe_load((generated / provisioning.COMPOSE_FILE).read_text())["services"]
    cport, wport, pport = free_port(), free_port(), free_port()
    store = tmp / "store"
    webhook = Webhook()
    am = Alertmanager(tmp, webhook.url)
    alertmanager_config = yaml.safe_load((generated / provisioning.ALERTMANAGER_FILE).read_text())
    am.config.write_text(yaml.safe_dump(local_alertmanager_config(alertmanager_config, webhook.url)))
    collector_args = replaced(
        compose["collector"]["command"],
        {"--host": "127.0.0.1", "--port": str(cport), "--data-dir": str(store)},
    )
    prometheus_dir = generated / provisioning.PROMETHEUS_DIR
    local_config = prometheus_dir / "prometheus-test.yml"  # beside the generated rule file it names
    local_config.write_text(
        yaml.safe_dump(
            local_prometheus_config(
                yaml.safe_load((prometheus_dir / "prometheus.yml").read_text()),
                {
                    f"collector:{provisioning.COLLECTOR_PORT}": f"127.0.0.1:{cport}",
                    f"watch:{provisioning.WATCH_PORT}": f"127.0.0.1:{wport}",
                    f"alertmanager:{provisioning.ALERTMANAGER_PORT}": am.url.removeprefix("http://"),
                },
            )
        )
    )
    prometheus_args = replaced(
        compose["prometheus"]["command"],
        {"--config.file": str(local_config), "--storage.tsdb.path": str(tmp / "tsdb")},
    )
    assert compose["watch"]["entrypoint"] == ["hopline", "watch"]
    watch_args = replaced(
        compose["watch"]["command"],
        {
            "--follow": str(store),
            "--listen": f"127.0.0.1:{wport}",
            "--alertmanager": am.url,
            "--state": str(tmp / "watch-state.json"),
        },
    )
    collector_url, watch_url = f"http://127.0.0.1:{cport}", f"http://127.0.0.1:{wport}"
    prometheus_url = f"http://127.0.0.1:{pport}"
    with contextlib.ExitStack() as stack, httpx.Client(timeout=10) as http:
        stack.callback(webhook.close)
        am.start()
        stack.callback(am.stop)
        stack.enter_context(
            process([sys.executable, "-m", "hopline.collector", *collector_args], tmp / "collector.log")
        )
        wait_until(
            "the collector", lambda: http.get(f"{collector_url}/healthz").status_code == 200, **PATIENCE
        )
        store.mkdir(exist_ok=True)
        stack.enter_context(
            process([sys.executable, "-m", "hopline.middleware.cli", "watch", *watch_args], tmp / "watch.log")
        )
        stack.enter_context(
            process(
                ["prometheus", *prometheus_args, f"--web.listen-address=127.0.0.1:{pport}"],
                tmp / "prometheus.log",
            )
        )
        wait_until("the watcher", lambda: http.get(f"{watch_url}/metrics").status_code == 200, **PATIENCE)
        wait_until("Prometheus", lambda: http.get(f"{prometheus_url}/-/ready").status_code == 200, **PATIENCE)
        events = incident_events()
        for i in range(0, len(events), 5000):  # the sinks' batches: NDJSON to the ingest endpoint
            body = b"".join(json.dumps(e).encode() + b"\n" for e in events[i : i + 5000])
            answer = http.post(
                f"{collector_url}/v1/events", content=body, headers={"content-type": "application/x-ndjson"}
            )
            assert answer.status_code == 200, answer.text
        posted = time.monotonic()
        yield {
            "posted": posted,
            "http": http,
            "collector": collector_url,
            "watch": watch_url,
            "prometheus": prometheus_url,
            "alertmanager": am,
            "webhook": webhook,
            "logs": tmp,
        }


def logs(tmp: Path) -> str:
    return "\n".join(
        f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(tmp.glob("*.log"))
    )


def test_the_incident_reaches_the_watchers_series_prometheus_alerts_and_the_receiver(stack):
    http = stack["http"]
    queue_r2 = {
        "kind": "shift", "stage": "queue", "scope_key": "replica", "scope_value": "r2", "direction": "up"
    }  # fmt: skip

    mirrored = 'stage="queue", scope_value="r2"'

    def finding() -> list[dict[str, Any]]:
        return [
            s for s in query(http, stack["prometheus"], 'hopline_live_finding{job="hopline-watch"}')
            if queue_r2.items() <= s["metric"].items()
        ]

    try:
        # the watcher serves it, Prometheus scrapes it from there (the "Findings now" panel's series)
        (series,) = wait_until("hopline_live_finding in Prometheus", finding, **PATIENCE)
        assert float(series["value"][1]) > 1.5  # queue x3 (p50; the factor the analysis measured)
        served = text_string_to_metric_families(http.get(f"{stack['watch']}/metrics").text)
        (family,) = [f for f in served if f.name == "hopline_live_finding"]
        assert queue_r2 in [s.labels for s in family.samples]
        # the generated rules put it in ALERTS (firing: the mirror has no for:) ...
        (alert,) = wait_until(
            "ALERTS",
            lambda: query(http, stack["prometheus"], f'ALERTS{{alertname="{LIVE_FINDING}", {mirrored}}}'),
            **PATIENCE,
        )
        assert alert["metric"]["alertstate"] == "firing" and alert["metric"]["direction"] == "up"
        # ... and Prometheus sends it to the generated Alertmanager, which holds it and notifies nobody
        held = wait_until(
            "the mirror at Alertmanager",
            lambda: [
                a for a in stack["alertmanager"].alerts()
                if a["labels"]["alertname"] == LIVE_FINDING and a["labels"]["scope_value"] == "r2"
            ],
            **PATIENCE,
        )
        assert held[0]["receivers"] == [{"name": provisioning.SILENT_RECEIVER}]
        # the watcher's own alert is what pages: at the receiver, with the sentence
        (paged, *_) = wait_until(
            "the watcher's alert at the receiver",
            lambda: [a for a in stack["webhook"].alerts("firing") if a["labels"].get("stage") == "queue"],
            **PATIENCE,
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{logs(stack['logs'])}") from None
    assert paged["labels"]["alertname"] == "HoplineShift" and paged["labels"]["replica"] == "r2"
    assert paged["labels"]["side"] == "engine" and "on replica r2" in paged["annotations"]["summary"]
    # one incident, one page: the mirror never reached the receiver
    assert not [a for a in stack["webhook"].alerts() if a["labels"]["alertname"] == LIVE_FINDING]
    print(f"incident seen end to end {time.monotonic() - stack['posted']:.1f} s after the events were posted")


def test_every_scrape_target_is_up_and_every_panel_series_is_on_a_metrics_page(stack, generated, expressions):
    http = stack["http"]
    up = wait_until(
        "both targets up",
        lambda: {s["metric"]["job"]: s["value"][1] for s in query(http, stack["prometheus"], "up")}
        if len(query(http, stack["prometheus"], "up == 1")) == 2 else None,
        **PATIENCE,
    )
    assert up == {provisioning.COLLECTOR_JOB: "1", provisioning.WATCH_JOB: "1"}
    # every series a panel, annotation or variable names: on the collector's or the watcher's
    # /metrics (hopline_*), a recording rule's (hopline:*), Prometheus' own (ALERTS), or vLLM's
    exposed = set()
    for url in (stack["collector"], stack["watch"]):
        for line in http.get(f"{url}/metrics").text.splitlines():
            if line.startswith("# TYPE "):  # a family declared: its samples' names (none yet, maybe)
                _, _, name, kind = line.split()
                exposed |= {name + s for s in SAMPLE_SUFFIXES.get(kind, ("",))}
            elif line and not line.startswith("#"):
                exposed.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    rules = yaml.safe_load((generated / provisioning.RULES_FILE).read_text())
    recorded = {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    missing = []
    for where, expr in expressions:  # every panel, annotation and variable of both dashboards, every rule
        names = set(re.findall(r"\b(hopline[_:][A-Za-z0-9_:]*)", substitute_variables(expr)))
        missing += [(where, n) for n in names if n not in exposed and n not in recorded]
    assert len(expressions) > 80 and not missing, missing


def test_the_grafana_provisioning_is_what_grafana_reads(generated):
    # datasources: apiVersion 1, a list of datasources each with name, type, access, url (Grafana's
    # provisioning/datasources reader; a uid the dashboards' $datasource variable can pick)
    datasources = yaml.safe_load((generated / provisioning.DATASOURCE_FILE).read_text())
    assert datasources["apiVersion"] == 1
    (source,) = datasources["datasources"]
    assert {"name", "type", "access", "url", "uid"} <= set(source)
    assert (source["type"], source["access"]) == ("prometheus", "proxy")
    assert source["url"] == provisioning.PROMETHEUS_URL  # the compose service Prometheus runs as
    # dashboards: apiVersion 1, providers of type file with options.path where compose mounts the JSON
    providers = yaml.safe_load((generated / provisioning.PROVIDER_FILE).read_text())
    assert providers["apiVersion"] == 1
    (provider,) = providers["providers"]
    assert provider["type"] == "file" and provider["name"] and isinstance(provider["options"]["path"], str)
    grafana = yaml.safe_load((generated / provisioning.COMPOSE_FILE).read_text())["services"]["grafana"]
    assert f"./{provisioning.DASHBOARD_DIR}:{provider['options']['path']}:ro" in grafana["volumes"]
    assert f"./{provisioning.GRAFANA_PROVISIONING_DIR}:/etc/grafana/provisioning:ro" in grafana["volumes"]
    for path in (generated / provisioning.DASHBOARD_DIR).glob("*.json"):
        model = json.loads(path.read_text())
        assert model["uid"] and model["title"] and model["panels"] and model["schemaVersion"] >= 39, path


def test_the_compose_file_runs_the_watcher_and_alertmanager_on_the_generated_files(generated):
    compose = yaml.safe_load((generated / provisioning.COMPOSE_FILE).read_text())
    services = compose["services"]
    assert set(services) == {"collector", "watch", "prometheus", "alertmanager", "grafana"}
    watch = services["watch"]
    # it follows the collector's store through the same volume, read-only
    (store,) = [v for v in services["collector"]["volumes"] if v.endswith(f":{provisioning.COLLECTOR_DATA}")]
    assert f"{store}:ro" in watch["volumes"]
    follow = watch["command"][watch["command"].index("--follow") + 1]
    assert follow == provisioning.COLLECTOR_DATA
    # --listen with a bare port binds loopback: in a container it must name every interface
    assert f"0.0.0.0:{provisioning.WATCH_PORT}" in watch["command"]
    assert watch["command"][watch["command"].index("--alertmanager") + 1] == provisioning.ALERTMANAGER_URL
    # the watcher's image has the analyzer extra; the Dockerfile installs what EXTRAS names
    context = services["collector"]["build"]["context"]
    assert watch["build"] == {"context": context, "args": {"EXTRAS": "analyzer"}}
    dockerfile = (Path(watch["build"]["context"]) / "Dockerfile").read_text()
    assert "ARG EXTRAS=collector" in dockerfile and '"/src[${EXTRAS}]"' in dockerfile
    # Alertmanager reads the written config; it passes amtool's check
    mount = next(v for v in services["alertmanager"]["volumes"] if v.startswith("./"))
    assert mount == f"./{provisioning.ALERTMANAGER_DIR}:/etc/alertmanager:ro"
    assert "--config.file=/etc/alertmanager/alertmanager.yml" in services["alertmanager"]["command"]
    check = subprocess.run(
        ["amtool", "check-config", str(generated / provisioning.ALERTMANAGER_FILE)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    assert "REPLACE THE RECEIVER" in (generated / provisioning.ALERTMANAGER_FILE).read_text()
    assert set(compose["volumes"]) == {"hopline-events", "hopline-watch"}
