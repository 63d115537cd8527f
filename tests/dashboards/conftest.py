"""Fixtures for the dashboards tests: one build of every generated file, and every PromQL in it."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hopline.dashboards import provisioning
from hopline.dashboards.build import write
from support.golden import GOLDEN

PROMTOOL = "/usr/bin/promtool"
_LABEL_VALUES = re.compile(r"label_values\((.*),\s*\w+\)")


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("built")
    write(out, vllm_targets={"r1": "127.0.0.1:8001", "r2": "127.0.0.1:8002"})
    return out


@pytest.fixture(scope="session")
def dashboard_models(built: Path) -> dict[str, dict[str, Any]]:
    files = sorted((built / provisioning.DASHBOARD_DIR).glob("*.json"))
    return {f.name: json.loads(f.read_text()) for f in files}


@pytest.fixture(scope="session")
def rule_file(built: Path) -> dict[str, Any]:
    return yaml.safe_load((built / provisioning.RULES_FILE).read_text())


def _all_panels(model: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, including those nested in collapsed rows."""
    for panel in model["panels"]:
        yield panel
        yield from panel.get("panels", [])


@pytest.fixture(scope="session")
def all_panels() -> Callable[[dict[str, Any]], Iterator[dict[str, Any]]]:
    return _all_panels


def dashboard_queries(model: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every target, annotation and query variable of a dashboard."""
    for panel in _all_panels(model):
        for target in panel.get("targets", []):
            yield f"{model['uid']} panel {panel['id']} {panel['title']!r} {target['refId']}", target["expr"]
    for annotation in model["annotations"]["list"]:
        if "expr" in annotation:
            yield f"{model['uid']} annotation {annotation['name']!r}", annotation["expr"]
    for variable in model["templating"]["list"]:
        if variable["type"] == "query":
            match = _LABEL_VALUES.fullmatch(variable["query"])
            assert match, (
                f"{model['uid']} variable {variable['name']}: not label_values(...): {variable['query']}"
            )
            yield f"{model['uid']} variable {variable['name']}", match.group(1)


@pytest.fixture(scope="session")
def expressions(
    dashboard_models: dict[str, dict[str, Any]], rule_file: dict[str, Any]
) -> list[tuple[str, str]]:
    """(where, PromQL) for everything generated: dashboards and rules (Grafana variables still in)."""
    found = [q for model in dashboard_models.values() for q in dashboard_queries(model)]
    for group in rule_file["groups"]:
        for rule in group["rules"]:
            found.append((f"rule {rule.get('record') or rule.get('alert')}", rule["expr"]))
    return found


def _promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL, *map(str, args)], capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="session")
def promtool() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run /usr/bin/promtool with arguments; the completed process (stdout, stderr, returncode)."""
    return _promtool


@pytest.fixture
def parse_with_promtool(tmp_path: Path) -> Callable[[list[str]], subprocess.CompletedProcess[str]]:
    """Parse PromQL with promtool: each expression wrapped as a recording rule, `promtool check rules`.

    promtool 2.42 has no offline "parse this expression" command (`promtool query` needs a
    server); `check rules` parses every rule's expression with Prometheus' own parser.
    """

    def parse(exprs: list[str]) -> subprocess.CompletedProcess[str]:
        rules = [{"record": f"hopline_check:expr_{i}", "expr": expr} for i, expr in enumerate(exprs)]
        path = tmp_path / f"parse-{len(list(tmp_path.iterdir()))}.yml"
        path.write_text(yaml.safe_dump({"groups": [{"name": "parse", "rules": rules}]}))
        return _promtool("check", "rules", path)

    return parse


def _traffic(suffix: str) -> list[dict[str, Any]]:
    """Hop events for the golden fixture's requests plus two, request IDs ending in ``suffix``.

    The extra two: the complete request again from a client that set no max_tokens (a pitfall
    hopline counts), and a request the engine is still working on (in flight, holding KV cache:
    finishes never). Every stage, view, outcome and pitfall counter gets a value.
    """
    # the cases that never end stay open in the collector, like the in-flight one ("running...")
    events = [
        {**e, "request_id": ("running-" if case.get("outcome") == "incomplete" else "") + e["request_id"]}
        for case in GOLDEN["cases"]
        for e in case["events"]
    ]
    complete = next(c for c in GOLDEN["cases"] if c["name"] == "complete_streaming")["events"]
    events += [
        {**e, "request_id": "no-max-tokens", "max_tokens_set": False}
        for e in complete
        if "max_tokens" not in e
    ]
    events.append(
        {
            "ts": 2.0,
            "request_id": "running",
            "hop": "engine.received",
            "model": "m",
            "replica": "r1",
            "stream": True,
            "prompt_tokens": 100,
        }
    )
    return [{**e, "request_id": e["request_id"] + suffix} for e in events]


@pytest.fixture(scope="session")
def traffic() -> Callable[[str], list[dict[str, Any]]]:
    return _traffic
