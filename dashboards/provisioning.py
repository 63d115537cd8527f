"""Grafana provisioning, the Prometheus and Alertmanager configs and a docker-compose stack, as plain data.

``prometheus_config`` is the one Prometheus configuration: ``hopline dashboards build`` writes
it for the docker-compose stack and the tests run Debian's ``promtool``/``prometheus`` on it.
The stack is whole: the collector stores events, ``hopline watch`` follows its store (read-only)
and serves ``hopline_live_finding`` on ``/metrics`` and sends its alerts to Alertmanager,
Prometheus scrapes both and sends the rules' alerts to the same Alertmanager
(tests/dashboards/test_generated_stack.py runs these parts from the written files).

Grafana expands ``$VAR`` / ``${VAR}`` from its environment in provisioning files, so a literal
``$`` is written ``$$`` there (the exemplar link's ``${__value.raw}``); docker-compose does the
same with ``$$``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

COLLECTOR_PORT = 9400
COLLECTOR_URL = f"http://collector:{COLLECTOR_PORT}"
COLLECTOR_DATA = "/data"  # the collector container's event store (a named volume)
COLLECTOR_JOB = "hopline-collector"
# hopline watch: the collector's store mounted read-only, its own volume for --state (what it sent
# Alertmanager, so that a restarted watcher never pages again for what it already resolved)
WATCH_PORT = 9800
WATCH_JOB = "hopline-watch"
WATCH_STATE_DIR = "/var/lib/hopline-watch"
ALERTMANAGER_PORT = 9093
ALERTMANAGER_URL = f"http://alertmanager:{ALERTMANAGER_PORT}"
# the receiver every notification goes to until the user replaces it (.invalid never resolves)
RECEIVER = "hopline-webhook"
RECEIVER_URL = "http://replace-me.invalid:5001/hopline"
SILENT_RECEIVER = "null"  # no configs: notifies nobody (kube-prometheus' name for it)
# one notification per stage (or pitfall) and place: hopline watch's labels and the rules' scopes
GROUP_BY = ("alertname", "stage", "pitfall", "replica", "service", "model")
PROMETHEUS_URL = "http://prometheus:9090"
DATASOURCE_UID = "hopline-prometheus"
EXEMPLAR_LABEL = "request_id"
RULE_FILE = "hopline-rules.yml"
GRAFANA_DASHBOARD_DIR = "/var/lib/grafana/dashboards/hopline"

# where `hopline dashboards build --out DIR` puts each file, relative to DIR
COMPOSE_FILE = "docker-compose.yml"
PROMETHEUS_DIR = "prometheus"
PROMETHEUS_FILE = f"{PROMETHEUS_DIR}/prometheus.yml"
RULES_FILE = f"{PROMETHEUS_DIR}/{RULE_FILE}"
GRAFANA_PROVISIONING_DIR = "grafana/provisioning"
DATASOURCE_FILE = f"{GRAFANA_PROVISIONING_DIR}/datasources/hopline.yml"
PROVIDER_FILE = f"{GRAFANA_PROVISIONING_DIR}/dashboards/hopline.yml"
DASHBOARD_DIR = "grafana/dashboards"
ALERTMANAGER_DIR = "alertmanager"
ALERTMANAGER_FILE = f"{ALERTMANAGER_DIR}/alertmanager.yml"
# said at the top of alertmanager.yml (YAML keeps no comments: the writer puts it there)
ALERTMANAGER_NOTE = f"""\
# REPLACE THE RECEIVER: {RECEIVER!r} posts every notification to {RECEIVER_URL},
# a placeholder that never resolves. Put your webhook's URL there, or replace the receiver with
# slack_configs, pagerduty_configs, email_configs... (hopline's README, "Alerts and annotations",
# has a route by severity and by the side that owns an alert).
"""


def escape_dollars(text: str) -> str:
    """``$`` -> ``$$`` for files that Grafana or docker-compose expand variables in."""
    return text.replace("$", "$$")


def request_link(collector_url: str = COLLECTOR_URL) -> str:
    """Where an exemplar's request_id leads: the collector's per-request view (as Grafana sees it)."""
    return f"{collector_url.rstrip('/')}/v1/requests/${{__value.raw}}"


def datasource(prometheus_url: str = PROMETHEUS_URL, collector_url: str = COLLECTOR_URL) -> dict[str, Any]:
    """Grafana datasource provisioning: Prometheus, exemplars' request_id linked to the collector."""
    return {
        "apiVersion": 1,
        "datasources": [
            {
                "name": "Prometheus (hopline)",
                "uid": DATASOURCE_UID,
                "type": "prometheus",
                "access": "proxy",
                "url": prometheus_url,
                "isDefault": True,
                "editable": True,
                "jsonData": {
                    "httpMethod": "POST",
                    "timeInterval": "15s",
                    "exemplarTraceIdDestinations": [
                        {
                            "name": EXEMPLAR_LABEL,
                            "url": escape_dollars(request_link(collector_url)),
                            "urlDisplayLabel": "Open request in hopline",
                        }
                    ],
                },
            }
        ],
    }


def dashboard_provider(path: str = GRAFANA_DASHBOARD_DIR) -> dict[str, Any]:
    """Grafana dashboard provisioning: load every JSON file in ``path`` into folder "hopline"."""
    return {
        "apiVersion": 1,
        "providers": [
            {
                "name": "hopline",
                "folder": "hopline",
                "type": "file",
                "disableDeletion": False,
                "allowUiUpdates": False,
                "updateIntervalSeconds": 30,
                "options": {"path": path, "foldersFromFilesStructure": False},
            }
        ],
    }


def prometheus_config(
    collector: str = f"collector:{COLLECTOR_PORT}",
    vllm: Mapping[str, str] | None = None,
    *,
    watch: str | None = f"watch:{WATCH_PORT}",
    alertmanager: str | None = f"alertmanager:{ALERTMANAGER_PORT}",
    scrape_interval: str = "15s",
    rule_files: tuple[str, ...] = (RULE_FILE,),
) -> dict[str, Any]:
    """Prometheus scraping the collector, ``hopline watch --listen`` (its ``hopline_live_finding``,
    the "Findings now" panel and the findings annotations) and, optionally, vLLM servers
    (``{replica: "host:port"}``), sending the rules' alerts to ``alertmanager`` (``None``: none).

    Each vLLM target gets a ``replica`` label, the name its hopline middleware reports
    (``HOPLINE_REPLICA``), so the engine dashboard can put vLLM's and hopline's numbers for one
    replica side by side. Exemplars need ``--enable-feature=exemplar-storage`` on the command line.
    """
    scrape_configs: list[dict[str, Any]] = [
        {"job_name": COLLECTOR_JOB, "static_configs": [{"targets": [collector]}]},
    ]
    if watch:
        scrape_configs.append({"job_name": WATCH_JOB, "static_configs": [{"targets": [watch]}]})
    if vllm:
        scrape_configs.append(
            {
                "job_name": "vllm",
                "static_configs": [
                    {"targets": [address], "labels": {"replica": replica}}
                    for replica, address in sorted(vllm.items())
                ],
            }
        )
    config: dict[str, Any] = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "rule_files": list(rule_files),
    }
    if alertmanager:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    return config | {
        "storage": {"exemplars": {"max_exemplars": 100000}},
        "scrape_configs": scrape_configs,
    }


def alertmanager_config(
    receiver_url: str = RECEIVER_URL, silent: tuple[str, ...] = (), group_by: tuple[str, ...] = GROUP_BY
) -> dict[str, Any]:
    """Alertmanager: every alert to one webhook (``receiver_url``, a placeholder the user
    replaces), grouped by ``group_by``; alerts named in ``silent`` (mirrors of what another
    alert already pages with) to a receiver that notifies nobody."""
    route: dict[str, Any] = {
        "receiver": RECEIVER,
        "group_by": list(group_by),
        "group_wait": "30s",
        "group_interval": "5m",
        "repeat_interval": "4h",
    }
    receivers: list[dict[str, Any]] = [
        {"name": RECEIVER, "webhook_configs": [{"url": receiver_url, "send_resolved": True}]}
    ]
    if silent:
        route["routes"] = [
            {"matchers": [f'alertname=~"{"|".join(silent)}"'], "receiver": SILENT_RECEIVER}
        ]
        receivers.append({"name": SILENT_RECEIVER})
    return {"route": route, "receivers": receivers}


def watch_command(store: str = COLLECTOR_DATA) -> list[str]:
    """``hopline watch``'s arguments in the stack: follow the collector's store, serve ``/metrics``
    and ``/v1/findings`` on every interface of its container (``--listen`` with a bare port binds
    loopback, where Prometheus in another container cannot reach it), send to Alertmanager, keep
    what it sent in its own volume (the store is mounted read-only)."""
    return [
        "--follow", store,
        "--listen", f"0.0.0.0:{WATCH_PORT}",
        "--alertmanager", ALERTMANAGER_URL,
        "--state", f"{WATCH_STATE_DIR}/state.json",
    ]  # fmt: skip


def compose(source: str, home_dashboard: str) -> dict[str, Any]:
    """A docker-compose stack: collector, ``hopline watch``, Prometheus (with exemplar storage),
    Alertmanager and Grafana 11.6.

    The collector and the watcher are built from ``source``, a hopline checkout with its
    ``Dockerfile`` (hopline is not on a package index; the watcher's image with the ``analyzer``
    extra). Other paths are relative to the compose file, as ``hopline dashboards build`` lays
    them out; ``home_dashboard`` is the file name of the dashboard Grafana opens first. The
    watcher's port is published on the host's loopback only: its findings name requests and
    scopes, and it has no ``--read-token`` here (Prometheus reaches it inside the compose network).
    """
    return {
        "services": {
            "collector": {
                "build": {"context": source},
                "command": ["--host", "0.0.0.0", "--port", str(COLLECTOR_PORT), "--data-dir", COLLECTOR_DATA],
                "volumes": [f"hopline-events:{COLLECTOR_DATA}"],
                "ports": [f"{COLLECTOR_PORT}:{COLLECTOR_PORT}"],
            },
            "watch": {
                "build": {"context": source, "args": {"EXTRAS": "analyzer"}},
                "entrypoint": ["hopline", "watch"],
                "command": watch_command(),
                "volumes": [f"hopline-events:{COLLECTOR_DATA}:ro", f"hopline-watch:{WATCH_STATE_DIR}"],
                "ports": [f"127.0.0.1:{WATCH_PORT}:{WATCH_PORT}"],
                "depends_on": ["collector", "alertmanager"],
            },
            "alertmanager": {
                "image": "prom/alertmanager:v0.27.0",
                "command": [
                    "--config.file=/etc/alertmanager/alertmanager.yml",
                    "--storage.path=/alertmanager",
                ],
                "volumes": [f"./{ALERTMANAGER_DIR}:/etc/alertmanager:ro"],
                "ports": [f"{ALERTMANAGER_PORT}:{ALERTMANAGER_PORT}"],
            },
            "prometheus": {
                "image": "prom/prometheus:v2.53.4",
                "command": [
                    "--config.file=/etc/prometheus/prometheus.yml",
                    "--enable-feature=exemplar-storage",
                    "--storage.tsdb.path=/prometheus",
                    "--web.enable-lifecycle",
                ],
                "volumes": [f"./{PROMETHEUS_DIR}:/etc/prometheus:ro"],
                "ports": ["9090:9090"],
                "depends_on": ["collector", "watch", "alertmanager"],
            },
            "grafana": {
                "image": "grafana/grafana:11.6.0",
                "environment": {
                    "GF_AUTH_ANONYMOUS_ENABLED": "true",
                    "GF_AUTH_ANONYMOUS_ORG_ROLE": "Viewer",
                    "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH": f"{GRAFANA_DASHBOARD_DIR}/{home_dashboard}",
                },
                "volumes": [
                    f"./{GRAFANA_PROVISIONING_DIR}:/etc/grafana/provisioning:ro",
                    f"./{DASHBOARD_DIR}:{GRAFANA_DASHBOARD_DIR}:ro",
                ],
                "ports": ["3000:3000"],
                "depends_on": ["prometheus"],
            },
        },
        "volumes": {"hopline-events": {}, "hopline-watch": {}},
    }
