"""The ``hopline`` command: the real extra named for a command whose packages are missing, a bug's
ImportError shown as a bug, and one error style (one line on stderr; 2 for bad usage, 1 for a failure).

A core-only install is simulated in a child process: a ``sitecustomize`` on ``PYTHONPATH``
puts an import blocker first on ``sys.meta_path`` for the packages an extra brings.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
import typer
from hopline.middleware.cli import build, commands
from hopline.middleware.contract.install import install_hint
from hopline.middleware.exits import ClickException, UsageError, run
from support.cli import hopline
from support.servers import env_without_hopline

REPO = Path(__file__).resolve().parents[2]
BLOCKER = '''
import sys

BLOCKED = {blocked!r}


class Blocker:
    """As if these packages were not installed."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, Blocker())
'''


def hopline_without(tmp_path: Path, blocked: set[str], *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "sitecustomize.py").write_text(BLOCKER.format(blocked=sorted(blocked)))
    return hopline(*args, env={**env_without_hopline(), "PYTHONPATH": str(tmp_path)})


# what each extra brings that its commands import (pyproject.toml's optional dependencies)
ANALYZER = {"polars", "numpy", "plotly"}
COLLECTOR = {"fastapi", "uvicorn", "prometheus_client"}
DASHBOARDS = {"grafana_foundation_sdk", "yaml"}


@pytest.mark.parametrize(
    ("command", "blocked", "extra"),
    [
        ("analyze", ANALYZER, "analyzer"),
        ("timeline", ANALYZER, "analyzer"),
        ("collector", COLLECTOR, "collector"),
        ("dashboards", DASHBOARDS, "dashboards"),
        ("demo", {"openai"}, "demo"),
    ],
)
def test_a_missing_extra_is_named_for_its_command(tmp_path: Path, command: str, blocked: set, extra: str):
    proc = hopline_without(tmp_path, blocked, command, "some-argument")
    assert proc.returncode == 1, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"hopline {command}: needs ")
    assert line.endswith(f"which is not installed: {install_hint(extra)}")
    assert_installs_from_here(install_hint(extra), extra)


def assert_installs_from_here(hint: str, extra: str) -> None:
    """Issue 24: the hint said ``pip install 'hopline[analyzer]'``, and hopline is on no package
    index. It names this interpreter's pip and where this hopline came from: here, this clone
    (installed with -e by .ci/setup and the README), or a wheel."""
    python, *pip, target = shlex.split(hint)
    assert python == sys.executable and pip[:3] == ["-m", "pip", "install"], hint
    where = Path(target.removesuffix(f"[{extra}]"))
    assert target.endswith(f"[{extra}]") and where.is_absolute() and where.exists(), hint
    assert where.suffix == ".whl" or 'name = "hopline"' in (where / "pyproject.toml").read_text(), hint


@pytest.mark.parametrize(
    ("direct_url", "hint"),
    [
        ({"url": "file:///src/hopline", "dir_info": {"editable": True}}, "PY -m pip install -e '/src/hopline[analyzer]'"),
        ({"url": "file:///src/my%20clone", "dir_info": {}}, "PY -m pip install '/src/my clone[analyzer]'"),
        ({"url": "file:///w/dist/hopline-0.1.0-py3-none-any.whl", "archive_info": {}},
         "PY -m pip install '/w/dist/hopline-0.1.0-py3-none-any.whl[analyzer]'"),
        ({"url": "https://example.com/hopline.git", "vcs_info": {"vcs": "git", "commit_id": "ab12"}},
         "PY -m pip install 'hopline[analyzer] @ git+https://example.com/hopline.git'"),
        ({}, "PY -m pip install '/path/to/hopline[analyzer]' (the clone, or a wheel built from it: see its README, Install)"),
    ],
)  # fmt: skip
def test_the_install_hint_follows_where_hopline_came_from(direct_url: dict, hint: str) -> None:
    """pip's record of the install (PEP 610 direct_url.json) -> a command that works without an index."""
    assert install_hint("analyzer", direct_url, python="PY") == hint


def test_core_only_install_lists_every_command_and_budget_still_works(tmp_path: Path):
    core_only = ANALYZER | COLLECTOR | DASHBOARDS | {"openai", "trustme", "pyarrow"}
    listing = hopline_without(tmp_path, core_only, "--help")
    assert listing.returncode == 0, listing.stderr
    for command, extra in [("analyze", "analyzer"), ("collector", "collector"), ("demo", "demo")]:
        assert any(
            line.split()[1:2] == [command] and f"pip install -e {shlex.quote(f'{REPO}[{extra}]')}" in line
            for line in listing.stdout.splitlines()
            if len(line.split()) > 1
        ), listing.stdout
    # the KV arithmetic is plain Python in middleware/: `hopline budget` needs no extra
    budget = hopline_without(
        tmp_path, core_only, "budget", "--network", "40ms", "--queue", "60ms", "--prefill", "300ms",
        "--prompt-tokens", "6000", "--output-tokens", "400", "--itl", "20ms", "--layers", "48",
        "--kv-heads", "4", "--head-dim", "128", "--dtype", "bf16", "--json",
    )  # fmt: skip
    assert budget.returncode == 0, budget.stderr
    assert '"kv_bytes_per_token": 98304' in budget.stdout


def test_an_import_error_inside_hopline_is_shown_as_a_bug(capsys: pytest.CaptureFixture[str]):
    broken = EntryPoint("broken", "hopline.middleware.no_such_module:register [analyzer]", "hopline.cli")
    assert run(build([broken]), ["broken"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("hopline broken: cannot be loaded (a bug in hopline): ModuleNotFoundError")
    assert "pip install" not in line


def test_a_missing_package_of_a_command_without_extra_is_named(capsys: pytest.CaptureFixture[str]):
    ep = EntryPoint("probe", "hopline_test_absent_package.cli:register", "hopline.cli")
    assert run(build([ep]), ["probe"]) == 1
    assert capsys.readouterr().err == (
        "hopline probe: needs hopline_test_absent_package, which is not installed: "
        "pip install hopline_test_absent_package\n"
    )


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.command()
    def usage(count: int = 1) -> None:
        raise UsageError(f"--count must be even,\nnot {count}")

    @app.command()
    def param() -> None:
        raise typer.BadParameter("no such scope", param_hint="--by")

    @app.command()
    def failure() -> None:
        raise ClickException("the store at /data is locked")

    @app.command()
    def fine() -> None:
        typer.echo("ok")

    return app


@pytest.mark.parametrize(
    ("argv", "code", "line"),
    [
        (["usage", "--count", "3"], 2, "hopline usage: --count must be even, not 3"),
        (["param"], 2, "hopline param: Invalid value for --by: no such scope"),
        (["usage", "--count", "x"], 2, "hopline usage: Invalid value for '--count': "),
        (["usage", "--bogus"], 2, "hopline usage: No such option: --bogus"),
        (["nothing"], 2, "hopline: No such command 'nothing'."),
        (["failure"], 1, "hopline failure: the store at /data is locked"),
    ],
)
def test_one_error_style(argv: list[str], code: int, line: str, capsys: pytest.CaptureFixture[str]):
    assert run(_app(), argv) == code
    out = capsys.readouterr()
    assert out.err.startswith(line) and out.err.count("\n") == 1 and out.out == ""
    if not line.endswith(": "):  # typer words its own type errors
        assert out.err == line + "\n"


def test_success_and_help_exit_0(capsys: pytest.CaptureFixture[str]):
    assert run(_app(), ["fine"]) == 0
    assert capsys.readouterr().out == "ok\n"
    assert run(_app(), ["--help"]) == 0


@pytest.mark.parametrize("command", [[], ["analyze"], ["demo"], ["collector"], ["timeline"], ["dashboards", "build"]])
def test_help_shows_flags_as_flags_and_h_works(command: list[str]):
    """``-h`` is ``--help``; flags (``--json``) have no ``<bool>`` placeholder."""
    proc = hopline(*command, "-h")
    assert proc.returncode == 0, proc.stderr
    assert "Show this message and exit." in proc.stdout
    assert "<bool>" not in proc.stdout


def test_version_and_an_example_in_the_top_level_help():
    from importlib.metadata import version

    proc = hopline("--version")
    assert (proc.returncode, proc.stdout.strip()) == (0, f"hopline {version('hopline')}")
    assert "Example: hopline demo" in hopline("--help").stdout


def test_a_command_loads_its_own_entry_point_only():
    """``hopline analyze …`` imports the analyzer alone (not the demo's OpenAI client: ~2 CPU-s of
    start-up); the top-level help, ``--version`` and an unknown name load every command."""
    every = {ep.name for ep in commands([])}
    assert {"analyze", "demo", "collector"} <= every
    assert [ep.name for ep in commands(["analyze", "/var/lib/hopline", "--json"])] == ["analyze"]
    for argv in (["--help"], ["--version"], ["nosuch"], ["-h", "analyze"]):
        assert {ep.name for ep in commands(argv)} == every
