"""``hopline dashboards build`` writes a complete, self-consistent stack; provisioning is as Grafana needs."""

from __future__ import annotations

import json
from pathlib import Path

import typer
import yaml
from typer.testing import CliRunner

from hopline.dashboards import provisioning
from hopline.dashboards.build import write
from hopline.dashboards.cli import register

EXPECTED_FILES = {
    "docker-compose.yml",
    "prometheus/prometheus.yml",
    "prometheus/hopline-rules.yml",
    "alertmanager/alertmanager.yml",
    "grafana/provisioning/datasources/hopline.yml",
    "grafana/provisioning/dashboards/hopline.yml",
    "grafana/dashboards/hopline-lifecycle.json",
    "grafana/dashboards/hopline-engine.json",
}


def _run(*args: str):
    app = typer.Typer()
    register(app)  # as the `hopline` command does for every installed part
    return CliRunner().invoke(app, ["dashboards", *args])


def test_build_writes_every_file_and_takes_the_options(tmp_path: Path):
    out = tmp_path / "stack"
    result = _run(
        "build",
        "--out",
        str(out),
        "--vllm",
        "r1=10.0.0.5:8000",
        "--vllm",
        "r2=10.0.0.6:8000",
        "--ttft-gap",
        "0.3",
        "--queue-factor",
        "4",
        "--collector-url",
        "http://localhost:9400",
    )
    assert result.exit_code == 0, result.output
    written = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert written == EXPECTED_FILES
    assert set(result.output.split()) == {str(out / f) for f in EXPECTED_FILES}

    prometheus = yaml.safe_load((out / "prometheus/prometheus.yml").read_text())
    vllm_job = next(j for j in prometheus["scrape_configs"] if j["job_name"] == "vllm")
    assert vllm_job["static_configs"] == [
        {"targets": ["10.0.0.5:8000"], "labels": {"replica": "r1"}},
        {"targets": ["10.0.0.6:8000"], "labels": {"replica": "r2"}},
    ]
    rules = yaml.safe_load((out / "prometheus/hopline-rules.yml").read_text())
    exprs = {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    assert exprs["HoplineClientEngineTtftGap"].endswith("> 0.3")
    assert '> 4 * (hopline:stage_seconds:p50_5m{stage="queue"} offset 1h)' in exprs["HoplineQueueTimeShift"]
    datasource = yaml.safe_load((out / provisioning.DATASOURCE_FILE).read_text())
    link = datasource["datasources"][0]["jsonData"]["exemplarTraceIdDestinations"][0]["url"]
    assert link.replace("$$", "$") == "http://localhost:9400/v1/requests/${__value.raw}"


def test_exemplars_link_request_ids_to_the_collector(built: Path):
    (source,) = yaml.safe_load((built / provisioning.DATASOURCE_FILE).read_text())["datasources"]
    assert (
        source["type"] == "prometheus" and source["url"] == "http://prometheus:9090" and source["isDefault"]
    )
    (destination,) = source["jsonData"]["exemplarTraceIdDestinations"]
    assert destination["name"] == "request_id"
    # Grafana expands $VAR in provisioning files; $$ is its escape for a literal $
    assert destination["url"] == "http://collector:9400/v1/requests/$${__value.raw}"
    assert destination["url"].replace("$$", "$") == "http://collector:9400/v1/requests/${__value.raw}"


def test_the_dashboard_provider_and_compose_mounts_point_at_the_written_files(built: Path):
    compose = yaml.safe_load((built / provisioning.COMPOSE_FILE).read_text())
    services = compose["services"]
    assert set(services) == {"collector", "watch", "prometheus", "alertmanager", "grafana"}
    assert "--enable-feature=exemplar-storage" in services["prometheus"]["command"]
    assert services["grafana"]["image"] == "grafana/grafana:11.6.0"
    # the collector is built from this checkout's Dockerfile (hopline is on no package index), and
    # the compose command is the Dockerfile's `hopline collector` with compose's port and data dir
    context = Path(services["collector"]["build"]["context"])
    dockerfile = (context / "Dockerfile").read_text()
    assert context == Path(__file__).resolve().parents[2]
    assert 'ARG EXTRAS=collector\nRUN pip install --no-cache-dir "/src[${EXTRAS}]"' in dockerfile
    assert "args" not in services["collector"]["build"]  # the Dockerfile's default: the collector extra
    assert 'ENTRYPOINT ["hopline", "collector"]' in dockerfile
    assert services["collector"]["command"] == ["--host", "0.0.0.0", "--port", "9400", "--data-dir",
                                                provisioning.COLLECTOR_DATA]  # fmt: skip
    assert f"{provisioning.COLLECTOR_PORT}:{provisioning.COLLECTOR_PORT}" in services["collector"]["ports"]
    mounts = {}
    for service in services.values():
        for volume in service.get("volumes", []):
            source, target = volume.split(":")[:2]
            if source.startswith("./"):
                assert (built / source).is_dir(), f"compose mounts {source}, which build did not write"
                mounts[target] = built / source
    # Prometheus reads the very config the tests check, and finds the rule file it names beside it
    config = yaml.safe_load((mounts["/etc/prometheus"] / "prometheus.yml").read_text())
    assert config == provisioning.prometheus_config(vllm={"r1": "127.0.0.1:8001", "r2": "127.0.0.1:8002"})
    assert all((mounts["/etc/prometheus"] / f).is_file() for f in config["rule_files"])
    assert config["scrape_configs"][0]["static_configs"][0]["targets"] == ["collector:9400"]
    assert config["scrape_configs"][1]["static_configs"][0]["targets"] == ["watch:9800"]
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["alertmanager:9093"]
    # Alertmanager reads the written alertmanager.yml
    assert (mounts["/etc/alertmanager"] / "alertmanager.yml").is_file()
    # Grafana's provider path holds both dashboards; the home dashboard is one of them
    (provider,) = yaml.safe_load((built / provisioning.PROVIDER_FILE).read_text())["providers"]
    dashboards = mounts[provider["options"]["path"]]
    uids = {json.loads(f.read_text())["uid"] for f in dashboards.glob("*.json")}
    assert uids == {"hopline-lifecycle", "hopline-engine"}
    home = services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (dashboards / Path(home).relative_to(provider["options"]["path"])).is_file()


def test_help_has_an_example_and_bad_input_is_named():
    result = _run("build", "--help")
    assert (
        result.exit_code == 0
        and "Example" in result.output
        and "hopline dashboards build --out" in result.output
    )
    bad = _run("build", "--out", "/tmp/unused", "--vllm", "r1")
    assert bad.exit_code == 2 and "REPLICA=HOST:PORT" in bad.output


def test_the_output_is_deterministic(tmp_path: Path, built: Path):
    # byte for byte the same on every build, so generated files can be committed and diffed
    write(tmp_path, vllm_targets={"r1": "127.0.0.1:8001", "r2": "127.0.0.1:8002"})
    for path in built.rglob("*"):
        if path.is_file():
            assert (tmp_path / path.relative_to(built)).read_bytes() == path.read_bytes(), path
