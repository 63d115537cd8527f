"""What hopline's dashboards share: variables, the firing-alerts annotation, links, JSON output.

Variables chain service -> model -> replica, each multi-select with "All" (``.*``), read from
``hopline_requests_total`` (every request the collector joined carries all three labels).
"""

from __future__ import annotations

import json
from typing import Any

from grafana_foundation_sdk.builders.dashboard import (
    AnnotationQuery,
    Dashboard,
    DashboardLink,
    DatasourceVariable,
    QueryVariable,
)
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DashboardLinkType,
    VariableRefresh,
    VariableSort,
)

from hopline.collector import metric_names as m

from .panels import DATASOURCE
from .rules import ALERT_PREFIX, LIVE_FINDING, LIVE_FINDING_EXPR

TAG = "hopline"
# hopline's rules' alerts, without the mirror of hopline watch's findings (annotated below)
ALERTS_EXPR = f'ALERTS{{alertname=~"{ALERT_PREFIX}.*", alertname!="{LIVE_FINDING}", alertstate="firing"}}'
# The alert annotation's query in the form Grafana 11.6's dashboard schema accepts: ``expr`` at the
# top of the annotation. The schema's ``target`` is the Grafana datasource's (required limit,
# matchAny, tags, type; nothing else), so a Prometheus query there fails it ("'type' is a required
# property"). On load, Grafana's Prometheus annotation support (prepareAnnotation) moves ``expr``
# into its own target itself, with refId "Anno"; the step is then its default, 60 s. The schema has
# no top-level step, titleFormat, textFormat, tagKeys or useValueForTime: hopline writes none.
ALERT_ANNOTATION_NAME = "hopline alerts"
# hopline watch's findings on every time series (the latency panels among them): one region per
# firing incident, from the first scrape that saw it (its onset plus the detection delay; the
# sentence's "at 10:05" is the onset) to its resolve; the labels say stage, scope and direction.
FINDINGS_EXPR = LIVE_FINDING_EXPR
FINDINGS_ANNOTATION_NAME = "hopline findings"


def _label_values(label: str, filters: tuple[str, ...]) -> str:
    matchers = ", ".join(f'{name}=~"${name}"' for name in filters)
    series = m.REQUESTS.series + (f"{{{matchers}}}" if matchers else "")
    return f"label_values({series}, {label})"


def _variable(name: str, label: str, filters: tuple[str, ...]) -> QueryVariable:
    if name not in m.REQUESTS.labels:
        raise ValueError(f"{m.REQUESTS.series} has no label {name}")
    return (
        QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query(_label_values(name, filters))
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_CASE_INSENSITIVE_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*")
    )


def dashboard(title: str, uid: str, description: str) -> Dashboard:
    """An empty hopline dashboard: variables, alert annotations, links to its sibling dashboards."""
    return (
        Dashboard(title)
        .uid(uid)
        .description(description)
        .tags([TAG, "llm", "generated"])
        .refresh("30s")
        .time("now-1h", "now")
        .timezone("browser")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .editable()
        .with_variable(DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
        .with_variable(_variable("service", "Service", ()))
        .with_variable(_variable("model", "Model", ("service",)))
        .with_variable(_variable("replica", "Replica", ("service", "model")))
        .annotation(
            AnnotationQuery()
            .name(ALERT_ANNOTATION_NAME)
            .datasource(DATASOURCE)
            .enable(True)
            .icon_color("red")
            .expr(ALERTS_EXPR)
        )
        .annotation(
            AnnotationQuery()
            .name(FINDINGS_ANNOTATION_NAME)
            .datasource(DATASOURCE)
            .enable(True)
            .icon_color("orange")
            .expr(FINDINGS_EXPR)
        )
        .link(
            DashboardLink("hopline")
            .type(DashboardLinkType.DASHBOARDS)
            .tags([TAG])
            .as_dropdown(True)
            .include_vars(True)
            .keep_time(True)
        )
    )


def to_json(d: Dashboard) -> dict[str, Any]:
    """The dashboard as Grafana stores it (file provisioning or the ``dashboard`` of an API POST)."""
    return json.loads(JSONEncoder(sort_keys=True).encode(d.build()))
