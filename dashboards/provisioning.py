"""Grafana provisioning, the Prometheus config and a docker-compose stack, as plain data.

``prometheus_config`` is the one Prometheus configuration: ``hopline dashboards build`` writes
it for the docker-compose stack and the tests run Debian's ``promtool``/``prometheus`` on it.

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
    scrape_interval: str = "15s",
    rule_files: tuple[str, ...] = (RULE_FILE,),
) -> dict[str, Any]:
    """Prometheus scraping the collector and, optionally, vLLM servers (``{replica: "host:port"}``).

    Each vLLM target gets a ``replica`` label, the name its hopline middleware reports
    (``HOPLINE_REPLICA``), so the engine dashboard can put vLLM's and hopline's numbers for one
    replica side by side. Exemplars need ``--enable-feature=exemplar-storage`` on the command line.
    """
    scrape_configs: list[dict[str, Any]] = [
        {"job_name": "hopline-collector", "static_configs": [{"targets": [collector]}]},
    ]
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
    return {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "rule_files": list(rule_files),
        "storage": {"exemplars": {"max_exemplars": 100000}},
        "scrape_configs": scrape_configs,
    }


def compose(source: str, home_dashboard: str) -> dict[str, Any]:
    """A docker-compose stack: collector, Prometheus (with exemplar storage) and Grafana 11.6.

    The collector is built from ``source``, a hopline checkout with its ``Dockerfile`` (hopline is
    not on a package index). Other paths are relative to the compose file, as ``hopline
    dashboards build`` lays them out; ``home_dashboard`` is the file name of the dashboard
    Grafana opens first.
    """
    return {
        "services": {
            "collector": {
                "build": {"context": source},
                "command": ["--host", "0.0.0.0", "--port", str(COLLECTOR_PORT), "--data-dir", COLLECTOR_DATA],
                "volumes": [f"hopline-events:{COLLECTOR_DATA}"],
                "ports": [f"{COLLECTOR_PORT}:{COLLECTOR_PORT}"],
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
                "depends_on": ["collector"],
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
        "volumes": {"hopline-events": {}},
    }
