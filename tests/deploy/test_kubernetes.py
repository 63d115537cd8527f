"""deploy/kubernetes/ renders with kustomize, validates offline, and says what the rest of hopline says.

Rendered with ``kubectl kustomize`` (Debian's kubernetes-client; .ci/setup installs it when no
kubectl is on the PATH); the core kinds validated with kubernetes-validate's bundled schemas
(strict: an unknown field fails), the prometheus-operator kinds with check-jsonschema against
their CRDs' schemas vendored in tests/deploy/schemas/ (README.md there). The generated files
(PrometheusRule, dashboard ConfigMaps) must equal what ``hopline dashboards kubernetes`` writes
now, and the watcher's arguments what the compose stack runs.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import typer
import yaml
from typer.testing import CliRunner

from hopline.collector import otlp, routes
from hopline.dashboards import kubernetes, provisioning
from hopline.dashboards.build import write
from hopline.dashboards.cli import register
from hopline.middleware.contract.rules import SIDES

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "kubernetes"
OVERLAY = DEPLOY / "overlays" / "kube-prometheus-stack"
SCHEMAS = Path(__file__).parent / "schemas"
# the oldest release the clouds still run (extended support) and the newest kubernetes-validate has
KUBERNETES_VERSIONS = ("1.30.0", "1.37.0")
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor-v1.json",
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitor-v1.json",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule-v1.json",
    ("monitoring.coreos.com/v1alpha1", "AlertmanagerConfig"): "alertmanagerconfig-v1alpha1.json",
}
STORE = "/var/lib/hopline"
COLLECTOR_ROUTES = {r.path for r in [*routes.router.routes, *otlp.router.routes]}


class Loader(yaml.SafeLoader):
    """YAML 1.1 reads a bare ``=`` (kustomize writes matchType: = unquoted) as the ``value`` tag."""


Loader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node))


def render(directory: Path) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "no kubectl on the PATH: run .ci/setup (Debian's kubernetes-client)"
    done = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.load_all(done.stdout, Loader=Loader) if d]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {
        "base": render(DEPLOY / "base"),
        "kube-prometheus-stack": render(OVERLAY),
        "vllm": render(DEPLOY / "examples" / "vllm"),
    }


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def container(statefulset: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in statefulset["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return found


def core_errors(doc: dict[str, Any]) -> list[str]:
    errors = []
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            errors.append(f"{version}: {e.message} at {list(e.path)}")
    return errors


def crd_check(docs: list[dict[str, Any]], tmp: Path) -> subprocess.CompletedProcess[str]:
    """check-jsonschema on each document against its kind's CRD schema (all of one kind at once)."""
    tmp.mkdir(parents=True, exist_ok=True)
    by_schema: dict[str, list[str]] = {}
    for i, doc in enumerate(docs):
        path = tmp / f"{i}-{doc['kind']}.yaml"
        path.write_text(yaml.safe_dump(doc))
        by_schema.setdefault(CRD_SCHEMAS[doc["apiVersion"], doc["kind"]], []).append(str(path))
    out, code = "", 0
    for schema, paths in by_schema.items():
        done = subprocess.run(
            [sys.executable, "-m", "check_jsonschema", "--schemafile", str(SCHEMAS / schema), *paths],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        out += done.stdout + done.stderr
        code = code or done.returncode
    return subprocess.CompletedProcess([], code, out, "")


def test_the_generated_manifests_are_what_hopline_dashboards_kubernetes_writes():
    # the same rule groups as prometheus/hopline-rules.yml and the same dashboards as grafana/:
    # a change to dashboards/ without `hopline dashboards kubernetes --out <the overlay>` fails here
    for name, text in kubernetes.files().items():
        assert (OVERLAY / name).read_text(encoding="utf-8") == text, f"regenerate {name}"


def test_the_command_writes_them_and_the_rules_are_the_compose_stacks(tmp_path):
    app = typer.Typer()
    register(app)
    result = CliRunner().invoke(app, ["dashboards", "kubernetes", "--out", str(tmp_path / "k")])
    assert result.exit_code == 0, result.output
    for name in (kubernetes.RULE_FILE, kubernetes.DASHBOARDS_FILE):
        assert (tmp_path / "k" / name).read_bytes() == (OVERLAY / name).read_bytes()
    # the PrometheusRule's groups are prometheus/hopline-rules.yml's, the ConfigMaps' JSON grafana/'s
    write(tmp_path / "compose")
    rules = yaml.safe_load((tmp_path / "compose" / provisioning.RULES_FILE).read_text())
    (rule,) = yaml.safe_load_all((OVERLAY / kubernetes.RULE_FILE).read_text())
    assert rule["spec"] == rules
    for configmap in yaml.safe_load_all((OVERLAY / kubernetes.DASHBOARDS_FILE).read_text()):
        ((name, text),) = configmap["data"].items()
        assert text == (tmp_path / "compose" / provisioning.DASHBOARD_DIR / name).read_text()


def test_each_kustomization_renders_its_objects(rendered):
    kinds = {
        where: sorted(f"{d['kind']}/{d['metadata']['name']}" for d in docs)
        for where, docs in rendered.items()
    }
    base = [
        "Namespace/hopline", "Service/hopline-collector", "Service/hopline-watch",
        "StatefulSet/hopline-collector",
    ]  # fmt: skip
    assert kinds["base"] == base
    assert kinds["kube-prometheus-stack"] == sorted([
        *base, "AlertmanagerConfig/hopline-routes", "ConfigMap/hopline-dashboard-engine",
        "ConfigMap/hopline-dashboard-lifecycle", "PrometheusRule/hopline-rules",
        "ServiceMonitor/hopline-collector", "ServiceMonitor/hopline-watch",
    ])  # fmt: skip
    assert kinds["vllm"] == [
        "Deployment/vllm-hopline", "Deployment/vllm-otlp", "PodMonitor/vllm", "Service/vllm-hopline",
    ]  # fmt: skip
    for docs in (rendered["base"], rendered["kube-prometheus-stack"]):
        assert all(d["metadata"].get("namespace") == "hopline" for d in docs if d["kind"] != "Namespace")
    # the overlay's patch points the watcher at kube-prometheus-stack's Alertmanager
    statefulset = one(rendered["kube-prometheus-stack"], "StatefulSet", "hopline-collector")
    url = "http://kube-prometheus-stack-alertmanager.monitoring.svc:9093"
    assert container(statefulset, "watch")["env"] == [{"name": "ALERTMANAGER_URL", "value": url}]


def test_the_core_kinds_validate_against_kubernetes_schemas(rendered):
    docs = [d for all_docs in rendered.values() for d in all_docs if d["apiVersion"] in ("v1", "apps/v1")]
    assert len(docs) == 4 + 6 + 3  # base, the overlay (base + dashboards), the vLLM examples
    assert {f"{d['kind']}/{d['metadata']['name']}": core_errors(d) for d in docs if core_errors(d)} == {}


def test_the_prometheus_operator_kinds_validate_against_their_crds(rendered, tmp_path):
    docs = [
        d for where in ("kube-prometheus-stack", "vllm") for d in rendered[where]
        if d["apiVersion"].startswith("monitoring.")
    ]  # fmt: skip
    assert len(docs) == 5
    done = crd_check(docs, tmp_path)
    assert done.returncode == 0, done.stdout


@pytest.mark.parametrize(
    "kind, mutate",
    [
        ("ServiceMonitor", lambda d: d["spec"]["endpoints"][0].update(honorLabel=True)),  # misspelt
        ("PrometheusRule", lambda d: d["spec"]["groups"][1]["rules"][0].pop("expr")),
        ("AlertmanagerConfig", lambda d: d["spec"]["route"]["matchers"][0].update(matchType="==")),
        ("AlertmanagerConfig", lambda d: d["spec"]["receivers"][1]["webhookConfigs"][0].update(url=5001)),
    ],
    ids=["servicemonitor-unknown-field", "rule-without-expr", "matcher-type", "url-as-number"],
)
def test_a_broken_operator_manifest_fails_the_check(rendered, tmp_path, kind, mutate):
    (doc,) = [copy.deepcopy(d) for d in rendered["kube-prometheus-stack"] if d["kind"] == kind][:1]
    assert crd_check([doc], tmp_path / "before").returncode == 0
    mutate(doc)
    assert crd_check([doc], tmp_path / "after").returncode != 0


@pytest.mark.parametrize(
    "mutate",
    [
        lambda s: container(s, "collector").update(readinesProbe=container(s, "collector")["readinessProbe"]),
        lambda s: container(s, "watch")["ports"][0].update(containerPort="watch"),
        lambda s: s["spec"].update(replicas="1"),
    ],
    ids=["misspelt-field", "port-as-name", "replicas-as-string"],
)
def test_a_broken_core_manifest_fails_the_check(rendered, mutate):
    statefulset = copy.deepcopy(one(rendered["base"], "StatefulSet", "hopline-collector"))
    assert core_errors(statefulset) == []
    mutate(statefulset)
    assert len(core_errors(statefulset)) == len(KUBERNETES_VERSIONS)


def test_the_watcher_runs_as_in_the_compose_stack_on_the_collectors_volume(rendered):
    statefulset = one(rendered["base"], "StatefulSet", "hopline-collector")
    collector, watch = container(statefulset, "collector"), container(statefulset, "watch")
    args = collector["args"]
    assert args[args.index("--data-dir") + 1] == STORE
    expected = provisioning.watch_command(STORE)
    expected[expected.index("--alertmanager") + 1] = "$(ALERTMANAGER_URL)"  # set per overlay
    assert (watch["command"], watch["args"]) == (["hopline", "watch"], expected)
    mounts = {m["mountPath"]: m for m in watch["volumeMounts"]}
    assert mounts[STORE] == {"name": "events", "mountPath": STORE, "readOnly": True}
    assert {"name": "events", "mountPath": STORE} in collector["volumeMounts"]
    assert mounts[provisioning.WATCH_STATE_DIR]["name"] == "watch-state"  # --state: writable, its own
    claims = {c["metadata"]["name"] for c in statefulset["spec"]["volumeClaimTemplates"]}
    assert claims == {"events", "watch-state"}
    # probes on routes that exist: the collector's /healthz (503 while it cannot store: not ready)
    assert collector["readinessProbe"]["httpGet"]["path"] == "/healthz" in COLLECTOR_ROUTES
    assert all(c["resources"]["requests"] and c["resources"]["limits"]["memory"] for c in (collector, watch))


def test_prometheus_finds_both_jobs_as_the_rules_name_them(rendered):
    docs = rendered["kube-prometheus-stack"]
    pod_labels = one(docs, "StatefulSet", "hopline-collector")["spec"]["template"]["metadata"]["labels"]
    ports = {p["name"]: p["containerPort"] for c in one(docs, "StatefulSet", "hopline-collector")["spec"][
        "template"]["spec"]["containers"] for p in c["ports"]}  # fmt: skip
    for job, port in ((provisioning.COLLECTOR_JOB, provisioning.COLLECTOR_PORT),
                      (provisioning.WATCH_JOB, provisioning.WATCH_PORT)):
        # the operator names the job after the Service
        service, monitor = one(docs, "Service", job), one(docs, "ServiceMonitor", job)
        assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        assert service["spec"]["selector"].items() <= pod_labels.items()
        (endpoint,) = monitor["spec"]["endpoints"]
        (service_port,) = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
        assert ports[service_port["targetPort"]] == port
        # else the operator's `service` target label renames hopline's own `service` label
        assert endpoint["honorLabels"] is True
        assert monitor["metadata"]["labels"] == kubernetes.RELEASE_LABEL
    assert one(docs, "PrometheusRule", "hopline-rules")["metadata"]["labels"] == kubernetes.RELEASE_LABEL
    for name in ("hopline-dashboard-lifecycle", "hopline-dashboard-engine"):
        assert one(docs, "ConfigMap", name)["metadata"]["labels"] == {"grafana_dashboard": "1"}


def test_the_alertmanager_example_routes_by_severity_and_side(rendered):
    spec = one(rendered["kube-prometheus-stack"], "AlertmanagerConfig", "hopline-routes")["spec"]
    routes = spec["route"]["routes"]
    sides = {
        side
        for route in routes
        for matcher in route["matchers"]
        if matcher["name"] == "side"
        for side in matcher["value"].split("|")
    }
    assert sides == set(SIDES)  # client to the calling team, the serving sides to the on-call
    critical = {"name": "severity", "matchType": "=", "value": "critical"}
    assert any(critical in route["matchers"] for route in routes)
    assert routes[0] == {
        "receiver": "null",
        "matchers": [{"name": "alertname", "matchType": "=", "value": "HoplineLiveFinding"}],
    }
    assert {"name": "null"} in spec["receivers"]
    assert spec["route"]["groupBy"] == list(provisioning.GROUP_BY)


def test_the_vllm_examples_report_to_the_collector(rendered):
    docs = rendered["vllm"]
    collector = f"http://{provisioning.COLLECTOR_JOB}.hopline.svc:{provisioning.COLLECTOR_PORT}"
    (vllm,) = one(docs, "Deployment", "vllm-hopline")["spec"]["template"]["spec"]["containers"]
    args = vllm["args"]
    middleware = args[args.index("--middleware") + 1]
    module, _, attribute = middleware.rpartition(".")
    assert hasattr(__import__(module, fromlist=[attribute]), attribute)
    env = {e["name"]: e for e in vllm["env"]}
    assert env["HOPLINE_SINK"]["value"] == collector
    assert env["HOPLINE_REPLICA"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    (otlp,) = one(docs, "Deployment", "vllm-otlp")["spec"]["template"]["spec"]["containers"]
    endpoint = otlp["args"][otlp["args"].index("--otlp-traces-endpoint") + 1]
    assert endpoint == f"{collector}/v1/traces"
    assert "/v1/traces" in COLLECTOR_ROUTES
    # vLLM's own metrics carry the replica its events name, which the engine dashboard matches on
    monitor = one(docs, "PodMonitor", "vllm")["spec"]
    (endpoint,) = monitor["podMetricsEndpoints"]
    pod_name = {"sourceLabels": ["__meta_kubernetes_pod_name"], "targetLabel": "replica"}
    assert endpoint["relabelings"] == [pod_name]
    for name in ("vllm-hopline", "vllm-otlp"):
        assert name in monitor["selector"]["matchExpressions"][0]["values"]
        (vllm,) = one(docs, "Deployment", name)["spec"]["template"]["spec"]["containers"]
        assert endpoint["port"] in {p["name"] for p in vllm["ports"]}
