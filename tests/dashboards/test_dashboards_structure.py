"""The generated dashboards round-trip through the SDK's parser and hold together as Grafana needs.

The SDK's ``from_json`` validates nothing (a typo'd panel type or a string gridPos parse fine),
so the structure is checked here: ids, the 24-column grid, datasources and refIds, units and
exemplars, stacking, variables; and the content the issue asks for.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models.dashboard import Dashboard as DashboardModel

from hopline.dashboards import vllm_metrics
from hopline.dashboards.base import ALERTS_EXPR, FINDINGS_EXPR
from hopline.dashboards.promql import GRAFANA_SAMPLE_VALUES, VARIABLES
from hopline.middleware.contract import VIEWS

LIFECYCLE = "hopline-lifecycle.json"
ENGINE = "hopline-engine.json"


def _sdk_round_trip(model: dict[str, Any]) -> dict[str, Any]:
    register_default_plugins()  # without it, panel options and targets decode as plain dicts
    return json.loads(JSONEncoder(sort_keys=True).encode(DashboardModel.from_json(model)))


@pytest.fixture(scope="module")
def targets(all_panels):
    def of(model: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        return [(panel, target) for panel in all_panels(model) for target in panel.get("targets", [])]

    return of


@pytest.mark.parametrize("name", [LIFECYCLE, ENGINE])
def test_round_trips_through_the_sdk_parser_keeping_every_panel_and_query(dashboard_models, name, all_panels):
    model = dashboard_models[name]
    once = _sdk_round_trip(model)
    # the first trip adds plugin defaults; the second must change nothing
    assert _sdk_round_trip(once) == once

    def essentials(m: dict[str, Any]) -> list[tuple]:
        return [
            (
                p["id"],
                p["type"],
                p["title"],
                json.dumps(p["gridPos"], sort_keys=True),
                tuple(
                    (t["refId"], t["expr"], t.get("exemplar"), t.get("format")) for t in p.get("targets", [])
                ),
            )
            for p in all_panels(m)
        ]

    assert essentials(once) == essentials(model)
    assert [v["name"] for v in once["templating"]["list"]] == [v["name"] for v in model["templating"]["list"]]
    assert once["uid"] == model["uid"] and once["title"] == model["title"]
    # the alert and findings annotations are the SDK's own (the query in ``expr``): a round trip
    # keeps all of them
    alerts, findings = once["annotations"]["list"]
    assert [alerts, findings] == model["annotations"]["list"]
    assert (alerts["expr"], findings["expr"]) == (ALERTS_EXPR, FINDINGS_EXPR)


@pytest.mark.parametrize("name", [LIFECYCLE, ENGINE])
def test_panels_have_unique_ids_and_tile_the_24_column_grid(dashboard_models, name, all_panels):
    panels = list(all_panels(dashboard_models[name]))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) and i > 0 for i in ids)
    occupied: dict[tuple[int, int], int] = {}
    for p in panels:
        g = p["gridPos"]
        assert all(isinstance(g[k], int) for k in "hwxy"), p["title"]
        assert g["w"] > 0 and g["h"] > 0 and g["x"] >= 0 and g["x"] + g["w"] <= 24, (p["title"], g)
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in occupied, f"panel {p['id']} overlaps panel {occupied[(x, y)]}"
                occupied[(x, y)] = p["id"]
        if p["type"] == "row":
            assert (g["w"], g["h"], g["x"]) == (24, 1, 0)


@pytest.mark.parametrize("name", [LIFECYCLE, ENGINE])
def test_every_target_has_a_datasource_and_a_unique_ref_id(dashboard_models, name, all_panels):
    model = dashboard_models[name]
    for panel in all_panels(model):
        refs = [t["refId"] for t in panel.get("targets", [])]
        assert len(refs) == len(set(refs)) and all(refs), panel["title"]
        assert panel["type"] == "row" or refs, f"{panel['title']} queries nothing"
        for target in panel.get("targets", []):
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
            assert target["expr"].strip()


@pytest.mark.parametrize("name", [LIFECYCLE, ENGINE])
def test_latency_panels_are_in_seconds_with_exemplars_and_quantiles_are_never_stacked(
    dashboard_models, name, all_panels, targets
):
    latency = 0
    for panel, target in targets(dashboard_models[name]):
        defaults = panel.get("fieldConfig", {}).get("defaults", {})
        seconds = defaults.get("unit") == "s" or panel["type"] == "heatmap"
        if "_seconds" in target["expr"] and seconds:
            latency += 1
            assert target["exemplar"] is True, f"{panel['title']} {target['refId']}: no exemplars"
            assert not re.search(r"\b1000\s*\*", target["expr"]), "scaled queries misplace exemplar markers"
        stacking = defaults.get("custom", {}).get("stacking", {}).get("mode", "none")
        if "histogram_quantile" in target["expr"]:
            assert stacking == "none", f"{panel['title']} stacks quantiles"
    assert latency >= 10
    for panel in all_panels(dashboard_models[name]):
        if panel["type"] == "heatmap":
            assert panel["options"]["yAxis"]["unit"] == "s" and panel["options"]["calculate"] is False
            assert panel["targets"][0]["format"] == "heatmap"


@pytest.mark.parametrize("name", [LIFECYCLE, ENGINE])
def test_variables_and_alert_annotations(dashboard_models, name):
    model = dashboard_models[name]
    variables = {v["name"]: v for v in model["templating"]["list"]}
    assert list(variables) == ["datasource", *VARIABLES]
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    for var in VARIABLES:
        assert variables[var]["multi"] and variables[var]["includeAll"] and variables[var]["allValue"] == ".*"
    used = set(re.findall(r"\$\{?(\w+)", json.dumps(model["panels"])))
    assert used <= set(variables) | set(GRAFANA_SAMPLE_VALUES) | {"__value", "__field", "__url_time_range"}, (
        used
    )
    annotations = [a for a in model["annotations"]["list"] if "expr" in a]
    assert [a["expr"] for a in annotations] == [ALERTS_EXPR, FINDINGS_EXPR]
    assert 'alertname=~"Hopline.*"' in ALERTS_EXPR
    # hopline watch's firing incidents, on every time series panel (the latency panels among them)
    assert FINDINGS_EXPR == "hopline_live_finding > 0"
    assert all(a["enable"] is True and "filter" not in a for a in annotations)


# Grafana 11.6's dashboard JSON schema (grafana-foundation-sdk's jsonschema/dashboard, branch
# v11.6.x) for an annotation, written out here as data (the schema files are not ours to commit):
# AnnotationQuery's properties with their JSON types (additionalProperties false) and required keys,
# and AnnotationTarget's, the Grafana datasource's fields, all four required and nothing else, so
# that a Prometheus query under ``target`` fails it ("'type' is a required property"). The legacy
# Prometheus keys Grafana still migrates but the schema does not allow: step, titleFormat, ….
ANNOTATION_QUERY = {
    "name": str, "datasource": dict, "enable": bool, "hide": bool, "iconColor": str, "filter": dict,
    "target": dict, "type": str, "builtIn": (int, float), "expr": str,
}  # fmt: skip
ANNOTATION_QUERY_REQUIRED = {"name", "datasource", "enable", "iconColor"}
ANNOTATION_TARGET = {"limit": int, "matchAny": bool, "tags": list, "type": str}  # every one required
DATASOURCE_REF = {"type": str, "uid": str}
LEGACY_ANNOTATION_KEYS = {"step", "titleFormat", "textFormat", "tagKeys", "useValueForTime"}


def _object_errors(where: str, value: dict, allowed: dict, required: set[str]) -> list[str]:
    errors = [f"{where}{k!r} is a required property" for k in sorted(required - value.keys())]
    errors += [f"{where}{k}: additional property" for k in sorted(value.keys() - allowed.keys())]
    wrong = [k for k in allowed if k in value and not isinstance(value[k], allowed[k])]
    return errors + [f"{where}{k}: not {allowed[k]}" for k in wrong]


def schema_errors(annotation: dict) -> list[str]:
    """What Grafana 11.6's dashboard schema says of one ``annotations.list[]`` entry (empty: valid)."""
    errors = _object_errors("", annotation, ANNOTATION_QUERY, ANNOTATION_QUERY_REQUIRED)
    if isinstance(annotation.get("target"), dict):
        errors += _object_errors("target: ", annotation["target"], ANNOTATION_TARGET, set(ANNOTATION_TARGET))
    if isinstance(annotation.get("datasource"), dict):
        errors += _object_errors("datasource: ", annotation["datasource"], DATASOURCE_REF, set())
    return errors


def test_the_schema_check_rejects_a_prometheus_query_under_target():
    """Issue 24: the form hopline wrote before, which Grafana 11.6's schema rejects."""
    before = {
        "name": "hopline alerts", "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "enable": True, "iconColor": "red", "target": {"expr": ALERTS_EXPR, "interval": "60s", "refId": "Anno"},
    }  # fmt: skip
    errors = schema_errors(before)
    assert "target: 'type' is a required property" in errors  # what Grafana's validator said
    assert "target: expr: additional property" in errors


@pytest.mark.parametrize("name", [LIFECYCLE, ENGINE])
def test_annotations_pass_grafanas_schema_and_carry_their_query(dashboard_models, name):
    for annotation in dashboard_models[name]["annotations"]["list"]:
        assert schema_errors(annotation) == [], annotation
        legacy = sorted(LEGACY_ANNOTATION_KEYS & annotation.keys())
        assert legacy == [], f"{annotation['name']}: legacy top-level keys {legacy}"
        # the query where Grafana's Prometheus annotation support reads it (prepareAnnotation moves
        # a top-level expr into its target)
        assert annotation["datasource"]["type"] == "prometheus"
        assert annotation["expr"] in (ALERTS_EXPR, FINDINGS_EXPR)


def test_the_findings_now_table_lists_hopline_watchs_firing_incidents(dashboard_models, all_panels):
    model = dashboard_models[LIFECYCLE]
    panels = {p["title"]: p for p in all_panels(model)}
    table = panels["Findings now"]
    assert table["type"] == "table" and table["gridPos"] == {"h": 6, "w": 24, "x": 0, "y": 1}  # first
    (target,) = table["targets"]
    assert target["expr"] == "hopline_live_finding > 0"
    assert target["instant"] is True and target["format"] == "table"
    (organize,) = table["transformations"]
    assert organize["id"] == "organize" and organize["options"]["renameByName"] == {"Value": "factor"}
    assert {"Time", "__name__"} <= set(organize["options"]["excludeByName"])
    assert table["fieldConfig"]["defaults"]["noValue"] == "no finding firing"


def test_lifecycle_dashboard_has_what_the_issue_asks_for(dashboard_models, all_panels):
    model = dashboard_models[LIFECYCLE]
    assert model["title"] == "hopline — request lifecycle"
    panels = {p["title"]: p for p in all_panels(model)}
    stacked = panels["TTFT by stage (means, stacked)"]
    legends = [t["legendFormat"] for t in stacked["targets"]]
    # the TTFT sum's terms and the fallbacks standing in where hops are missing, in the rule book's
    # order and words, then the total (drawn unstacked)
    assert legends == [
        "client delay", "connect", "network", "gateway", "upstream network", "upstream", "engine frontend", "queue",
        "prefill", "engine", "KV transfer", "client TTFT (mean)",
    ]
    assert stacked["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"
    total_ref = stacked["targets"][-1]["refId"]
    override = next(o for o in stacked["fieldConfig"]["overrides"] if o["matcher"]["options"] == total_ref)
    assert {"id": "custom.stacking", "value": {"group": "A", "mode": "none"}} in override["properties"]
    for t in stacked["targets"]:
        assert " / (" in t["expr"] and "_sum{" in t["expr"] and "_count{" in t["expr"], "stacked means only"
    for pct in ("p50", "p90", "p99"):
        panel = panels[f"TTFT {pct}: client, gateway, engine"]
        (target,) = panel["targets"]
        assert f'view=~"{"|".join(VIEWS)}"' in target["expr"] and "by (le, view)" in target["expr"]
    # side by side (below the "Findings now" row: 7 rows, and the overview)
    assert {p["gridPos"]["y"] for t, p in panels.items() if t.startswith("TTFT p")} == {23}
    for title in (
        "Client TTFT distribution",
        "Queue time distribution",
        "Client TTFT distribution on $replica",
    ):
        assert panels[title]["type"] == "heatmap"
    repeated = [p for p in model["panels"] if p.get("repeat")]
    assert [(p["type"], p["repeat"]) for p in repeated] == [("row", "replica")]
    for title, metric in (
        ("Requests in flight by replica", "hopline_requests_in_flight"),
        ("KV-cache bytes held by replica", "hopline_kv_cache_bytes"),
        ("Request outcomes", "hopline_requests_total"),
        ("New connections per request", "hopline_connections_total"),
        ("Requests without max_tokens", "hopline_requests_without_max_tokens_total"),
        ("Negative stages", "hopline_negative_stages_total"),
        ("End-to-end latency", "hopline_e2e_seconds_bucket"),
        ("Inter-token latency per user", "hopline_itl_seconds_bucket"),
        ("Tokens/s per user", "hopline_itl_seconds_count"),
    ):
        assert metric in json.dumps(panels[title]["targets"]), title
    assert panels["KV-cache bytes held by replica"]["fieldConfig"]["defaults"]["unit"] == "bytes"


def test_engine_dashboard_puts_vllm_beside_hopline(dashboard_models, all_panels, targets):
    model = dashboard_models[ENGINE]
    assert model["title"] == "hopline — engine"
    text = json.dumps([t["expr"] for _, t in targets(model)])
    for metric in vllm_metrics.ALL:
        assert metric.name in text, metric.name
    panels = list(all_panels(model))
    for panel in panels:
        exprs = [t["expr"] for t in panel.get("targets", [])]
        if any("vllm:request_" in e or "vllm:time_to_first_token" in e for e in exprs):
            # on the same panel, or (a heatmap) beside hopline's on the same line
            same_line = (
                [p for p in panels if p["gridPos"]["y"] == panel["gridPos"]["y"]]
                if panel["type"] == "heatmap"
                else [panel]
            )
            assert "hopline_" in json.dumps([p.get("targets") for p in same_line]), (
                f"{panel['title']}: vLLM alone"
            )
        for expr in exprs:
            if "vllm:" in expr:
                assert 'model_name=~"$model"' in expr and 'replica=~"$replica"' in expr
