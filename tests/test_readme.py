"""The README says what the tool does (issue 11): its commands run as written, its Prometheus
scrape job passes ``promtool check config``, its stage table is the contract's, and every section
of the terminal report is explained.

Before: ``pip install 'hopline[dashboards]'`` (hopline is on no package index), a
``[--token T]`` placeholder in a command, no example without vLLM, no scrape job, no word on the
report's sections or on p90, and no stage table to compare.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import orjson
from hopline.middleware import contract
from hopline.middleware.contract import docs, rules
from support.cli import hopline
from support.servers import env_without_hopline
from support.synth import StageShift, generate, write_ndjson

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
PYTHON_FILE = re.compile(r"# (\w+\.py): ")  # a Python block that starts so is a file to save
# The README's commands that cannot run in a test, each with the reason. Every other command of a
# ```bash block runs, in README order, in one shell (test_every_readme_command_runs_...).
NOT_HERE = {
    "python3.11 -m venv .venv && .venv/bin/pip install -e '.[all]' && .venv/bin/hopline demo": "creates a virtualenv and installs into it with pip (the test runs in the installed .venv); "
    "the demo itself runs below, shorter",
    "bash .ci/setup && .venv/bin/python -m pytest -q tests": "installs system packages and runs the whole suite, this test included",
    "git clone <this repository> hopline && cd hopline": "a placeholder for the repository's address",
    "pip install '.[collector,analyzer]'": "pip install into the user's environment",
    "pip wheel --no-deps . -w dist": "builds a wheel of the clone (pip); the test runs from the installed .venv",
    "/path/to/vllm-venv/bin/pip install dist/hopline-0.1.0-py3-none-any.whl": "a placeholder for vLLM's virtualenv",
    "pip install dist/hopline-*.whl": "pip install into vLLM's environment",
    "HOPLINE_SINK=http://collector:9400 HOPLINE_REPLICA=r1 vllm serve MODEL "
    "--middleware hopline.middleware.engine.EngineMiddleware": "vllm serve with a model from a hub",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf OTEL_SERVICE_NAME=vllm "
    "OTEL_RESOURCE_ATTRIBUTES=service.instance.id=r1 "
    "vllm serve MODEL --otlp-traces-endpoint http://collector:9400/v1/traces": "vllm serve with a model from a hub",
    "pip install '.[dashboards]'": "pip install into the user's environment",
    "cd hopline-grafana && docker compose up": "docker (tests/dashboards/ checks the compose file and provisioning)",
    "kubectl apply -k deploy/kubernetes/overlays/kube-prometheus-stack": "a Kubernetes cluster "
    "(tests/deploy/ renders and validates it offline)",
    "kubectl apply -k deploy/kubernetes/examples/vllm": "a Kubernetes cluster with GPUs (tests/deploy/ renders "
    "and validates it offline)",
    "duckdb -c \"COPY ($(cat timelines.sql)) TO 'timelines.parquet' (FORMAT parquet)\"": "the duckdb CLI over a "
    "compacted Parquet store (tests/analyzer/test_sql.py runs this view on DuckDB, and the next command on its output)",
    "hopline analyze --timelines timelines.parquet": "needs the table the duckdb command above writes "
    "(tests/analyzer/test_sql.py: analyze --timelines gives analyze's findings)",
}
PORTS = (9400, 8000, 8001)  # what the walkthrough without vLLM listens on, as written
# The terminal report's section titles (analyzer/report.py): each must be printed and explained.
REPORT_SECTIONS = (
    "Findings (largest effect on users' time first)",
    "As each component sees it (ms)",
    "Where the time goes",
    "Largest part of TTFT",
    "By replica",
    "Outcomes",
)


def blocks(language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(README) if lang == language]


def commands(block: str) -> list[str]:
    """The block's commands: continuation lines joined, comment lines and trailing comments dropped."""
    joined = re.sub(r"\\\n\s*", "", block)
    out = []
    for line in joined.splitlines():
        line = re.sub(r"\s+#\s.*$", "", line).strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def readme_commands() -> list[str]:
    return [c for block in blocks("bash") for c in commands(block)]


def section(title: str) -> str:
    """The README's text under ``## title`` up to the next ``## ``."""
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end != -1 else None]


def test_the_list_of_commands_that_cannot_run_here_is_current():
    listed = set(NOT_HERE)
    found = set(readme_commands())
    assert listed <= found, f"NOT_HERE names commands the README no longer has: {sorted(listed - found)}"


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_every_readme_command_runs_as_written(tmp_path):
    """Every command of the README's ```bash blocks that is not in NOT_HERE, in README order, in one
    bash (``set -euo pipefail``) in an empty folder beside the installed .venv; the walkthrough's
    Python files saved first, as written."""
    busy = [p for p in PORTS if port_in_use(p)]
    assert not busy, f"ports {busy} are taken on this machine: the README's walkthrough needs them"
    work = tmp_path / "work"
    work.mkdir()
    (work / ".venv").symlink_to(Path(sys.prefix))  # the README's commands use .venv/bin/hopline too
    for block in blocks("python"):
        named = PYTHON_FILE.match(block)
        if named:
            (work / named.group(1)).write_text(block)
    assert {p.name for p in work.glob("*.py")} == {"engine_app.py", "gateway_app.py", "client.py"}
    runnable = [c for c in readme_commands() if c not in NOT_HERE]
    script = ["set -euo pipefail"]
    for i, command in enumerate(runnable):
        script += [f"echo '>>> {i}' >&2", command]
    (work / "readme.sh").write_text("\n".join(script) + "\n")
    env = env_without_hopline()
    env["PATH"] = f"{Path(sys.prefix) / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.update(COLUMNS="100", NO_COLOR="1")
    proc = subprocess.Popen(
        ["bash", "readme.sh"], cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=540)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever a failed run left in the background
        except ProcessLookupError:
            pass
    ran = [line for line in err.splitlines() if line.startswith(">>> ")]
    last = runnable[int(ran[-1].split()[1])] if ran else None
    assert proc.returncode == 0, (
        f"failed at: {last}\n--- stderr ---\n{err[-4000:]}\n--- stdout ---\n{out[-3000:]}"
    )
    assert len(ran) == len(runnable)
    # what the commands made is what the README says they make
    report = orjson.loads((work / "demo-run" / "report.json").read_bytes())
    assert report["requests"] > 0, "the demo's report.json holds no request"
    assert (work / "demo-run" / "report.html").stat().st_size > 0, "no demo-run/report.html"
    assert (work / "hopline-grafana" / "prometheus" / "hopline-rules.yml").exists(), "no dashboards build"
    calls = re.findall(r"^([0-9a-f]{32}) Hello from a tiny engine$", out, re.MULTILINE)  # python client.py
    assert len(set(calls)) == 20, out[-3000:]  # each call's own request ID (request_id_of)
    listed = [line for line in out.splitlines() if line.startswith('{"capacity"')]  # curl: no newline after
    assert len(listed) == 1, out[-3000:]
    slowest = json.JSONDecoder().raw_decode(listed[0])[0]["requests"]
    assert len(slowest) == 3 and {r["request_id"] for r in slowest} <= set(calls), slowest
    assert "engine view: TTFT" in out, out[-3000:]  # hopline timeline "$ID"
    assert "20 requests" in out, out[-3000:]  # hopline analyze hopline-data: the client's 20 calls
    # the README's own client keeps its connection (AsyncOpenAI reads each stream to its end)
    assert "a new connection for" not in out, out[-3000:]


def test_the_prometheus_scrape_job_passes_promtool(tmp_path):
    """The README's YAML with ``scrape_configs`` as an existing Prometheus' prometheus.yml, beside
    what ``hopline dashboards build`` writes (its rule file) and a read token file."""
    (snippet,) = [b for b in blocks("yaml") if "scrape_configs:" in b]
    build = hopline("dashboards", "build", "--out", str(tmp_path / "hopline-grafana"))
    assert build.returncode == 0, build.stderr
    (tmp_path / "hopline-read-token").write_text("a-read-token\n")
    config = tmp_path / "prometheus.yml"
    config.write_text(snippet)
    check = subprocess.run(
        ["promtool", "check", "config", str(config)], capture_output=True, text=True, timeout=60, check=False
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 1 rule files found" in check.stdout + check.stderr


def markdown_table(text: str, header_start: str) -> list[list[str]]:
    lines = text[text.index(header_start) :].splitlines()
    rows = []
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


def test_the_stage_table_is_the_contracts():
    """Names, order, labels, measuring component, stand-ins (rules.STAGE_LOOKS) and the first
    formula (contract.STAGES, written as docs/contract.md writes it) of every stage."""
    rows = markdown_table(section("Reading the report"), "| stage | in reports | measured by |")
    formulas = {s.name: s.formulas[0] for s in contract.STAGES}
    expected = [
        [
            f"`{look.name}`",
            look.label,
            look.view,
            docs._formula(formulas[look.name]),
            ", ".join(look.stands_for),
        ]
        for look in rules.STAGE_LOOKS
    ]
    assert [[r[0], r[1], r[2], r[4], r[5]] for r in rows] == expected


def test_every_section_of_the_terminal_report_is_explained(tmp_path):
    """The report of a log with an incident (a queue shift on r2) prints each of REPORT_SECTIONS,
    and the README's "Reading the report" explains each, in the order the report prints them; its
    findings come in the order the README says, and its pitfall list is the analyzer's."""
    log = write_ndjson(
        generate(
            duration_s=600, seed=3, incidents=[StageShift("queue", 3.0, at_s=300, scope={"replica": "r2"})]
        ),
        tmp_path / "events.ndjson",
    )
    report = hopline("analyze", str(log))
    assert report.returncode == 0, report.stderr
    findings = orjson.loads(hopline("analyze", str(log), "--json").stdout)["findings"]
    impacts = [abs(f["impact_s"]) for f in findings]
    assert findings and impacts == sorted(impacts, reverse=True)  # "ordered by impact_s", largest first
    printed = [report.stdout.find(title) for title in REPORT_SECTIONS]
    assert -1 not in printed and printed == sorted(printed), dict(zip(REPORT_SECTIONS, printed))
    explained = section("Reading the report")
    where = [explained.find(f"**{title.split(' (')[0]}") for title in REPORT_SECTIONS]
    assert -1 not in where and where == sorted(where), dict(zip(REPORT_SECTIONS, where))
    said = re.search(r"A \*\*pitfall\*\* is one of (.*?)\.\n", explained, re.DOTALL).group(1)
    from hopline.analyzer.findings import REGISTRY

    found = [d.name for d in REGISTRY if d.kind == "pitfall"]
    assert re.findall(r"`(\w+)`", said) == found  # every pitfall the analyzer can report, in its order


def test_why_a_shift_is_sometimes_p90_gives_the_analyzers_own_thresholds():
    """The README's reason is findings.shifts.stats._effect's: p50 first, else p90, each held to ShiftConfig's
    min_factor and min_abs_ms."""
    from hopline.analyzer.findings.shifts.stats import ShiftConfig

    cfg = ShiftConfig()
    why = (
        section("Reading the report").split("**Why a shift is sometimes given as p90.**")[1].split("\n\n")[0]
    )
    why = " ".join(why.split())
    assert f"by {cfg.min_factor:g}× or more" in why and f"by {cfg.min_abs_ms:g} ms or more" in why
    assert "the p90 is held to the same two thresholds" in why


def section_blocks(title: str, language: str) -> list[str]:
    """The ```language blocks of the README's section ``## title``."""
    return [body for lang, body in FENCE.findall(section(title)) if lang == language]


def test_the_whole_path_runs_pasted_into_a_clean_shell(tmp_path):
    """Issue 24: "The whole path on one machine" could not be pasted into a new shell (hopline,
    uvicorn and python were not found without the venv) and polled /healthz on an engine and a
    gateway that answered it with 404. Its files saved as written and its ```bash block as one
    paste, in a bash started by ``env -i`` (a minimal PATH, no venv, no HOPLINE_*), in a folder
    that holds the clone's ``.venv``: every command runs, the servers never answer 404 (the
    readiness loop polls routes that exist), and everything it started is stopped afterwards."""
    title = "The whole path on one machine, without vLLM"
    busy = [p for p in PORTS if port_in_use(p)]
    assert not busy, f"ports {busy} are taken on this machine: the README's walkthrough needs them"
    for block in section_blocks(title, "python"):
        (tmp_path / PYTHON_FILE.match(block).group(1)).write_text(block)
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))  # the clone's .venv
    (paste,) = section_blocks(title, "bash")
    (tmp_path / "paste.sh").write_text("set -euo pipefail\n" + paste)
    clean = ["env", "-i", "PATH=/usr/bin:/bin", f"HOME={tmp_path}", "bash", "paste.sh"]
    proc = subprocess.Popen(
        clean,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=240)  # returns once the servers, which hold its stdout, exited
        left = [p for p in PORTS if port_in_use(p)]
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever a failed run left in the background
        except ProcessLookupError:
            pass
    assert proc.returncode == 0, out[-4000:]
    assert "command not found" not in out, out[-4000:]
    assert not re.search(r'" 404\b', out), out[-4000:]  # uvicorn's access log: no route was missing
    calls = set(re.findall(r"^([0-9a-f]{32}) Hello from a tiny engine$", out, re.MULTILINE))
    assert len(calls) == 20, out[-3000:]
    assert "engine view: TTFT" in out and "20 requests" in out, out[-3000:]  # timeline "$ID"; analyze
    assert not left, f"the paste's `kill $(jobs -p)` left ports {left} served"
