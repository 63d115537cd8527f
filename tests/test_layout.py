"""The folders are the dependency graph: each part imports only the parts below it.

    middleware  <-  collector  <-  dashboards (the collector's metric names only)
        ^
        +---------  analyzer
    demo: on top, may import every part; nothing imports it.

Every module's imports are read with ``ast`` (at any depth: a lazy import inside a function is
still a dependency), and so is every string that names a hopline module
(``[sys.executable, "-m", "hopline.collector", ...]`` runs the collector: that counts too).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PARTS = ("middleware", "collector", "analyzer", "dashboards", "demo")
# part -> the parts it may import (itself included)
ALLOWED: dict[str, set[str]] = {
    "middleware": {"middleware"},
    "collector": {"middleware", "collector"},
    "analyzer": {"middleware", "analyzer"},
    "dashboards": {"middleware", "dashboards"},
    "demo": {"middleware", "collector", "analyzer", "dashboards", "demo"},
}
# single modules a part may import beyond ALLOWED
ALLOWED_MODULES = {"dashboards": {"hopline.collector.metric_names"}}
# What emitting needs is the core install: middleware never imports an extra's package at import time.
EXTRAS_PACKAGES = {
    "polars", "numpy", "plotly", "fastapi", "starlette", "uvicorn", "prometheus_client", "yaml",
    "grafana_foundation_sdk", "openai", "trustme", "pyarrow", "pandas",
}  # fmt: skip
MODULE_NAME = re.compile(r"hopline(?:\.\w+)+")


def module_name(path: Path, root: Path = REPO) -> str:
    """``middleware/engine.py`` -> ``hopline.middleware.engine`` (``__init__`` is its package)."""
    parts = ["hopline", *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> Iterator[Path]:
    for part in PARTS:
        yield from sorted((REPO / part).rglob("*.py"))


def imported(path: Path, root: Path = REPO) -> Iterator[tuple[int, str]]:
    """(line, module) for every import in ``path``, relative ones resolved, and every string constant
    that is exactly a hopline module name (a ``-m`` argument, an ``importlib`` target)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module_name(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            yield node.lineno, target
            # ``from hopline.collector import metric_names``: the submodule is what is imported
            for alias in node.names:
                yield node.lineno, f"{target}.{alias.name}"
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if MODULE_NAME.fullmatch(node.value):
                yield node.lineno, node.value


def part_of(module: str) -> str | None:
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 and pieces[0] == "hopline" and pieces[1] in PARTS else None


def violations(path: Path, root: Path = REPO) -> list[str]:
    me = part_of(module_name(path, root))
    assert me is not None
    found = []
    for line, target in imported(path, root):
        other = part_of(target)
        if other is None or other in ALLOWED[me]:
            continue
        if any(target == m or target.startswith(m + ".") for m in ALLOWED_MODULES.get(me, ())):
            continue
        # ``from hopline.collector import metric_names`` yields both the package and the submodule
        if any(m.startswith(target + ".") for m in ALLOWED_MODULES.get(me, ())):
            continue
        found.append(f"{path.relative_to(root)}:{line}: {me} imports {target}")
    return found


@pytest.mark.parametrize("part", PARTS)
def test_each_part_imports_only_the_parts_below_it(part: str) -> None:
    found = [v for path in sorted((REPO / part).rglob("*.py")) for v in violations(path)]
    assert found == []


def test_nothing_imports_the_demo() -> None:
    found = [
        f"{path.relative_to(REPO)}:{line}: {target}"
        for path in modules()
        if part_of(module_name(path)) != "demo"
        for line, target in imported(path)
        if part_of(target) == "demo"
    ]
    assert found == []


def test_middleware_imports_no_extras_package_at_import_time() -> None:
    found = []
    for path in sorted((REPO / "middleware").rglob("*.py")):
        for node in ast.parse(path.read_text()).body:  # module level only: lazy imports are fine
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            found += [f"{path.name}:{node.lineno}: {n}" for n in names if n.split(".")[0] in EXTRAS_PACKAGES]
    assert found == []


# --- the shared vocabulary in its own room ------------------------------------------------------
# middleware/ holds two kinds of code: what runs inside the user's process (client, gateway,
# engine, emit, sinks, ...) and the vocabulary every part shares (middleware/contract/). The
# collector, the analyzer and the dashboards use the vocabulary, never the host-side code; the
# vocabulary imports nothing of the host side; and no part goes through the command assembler.
VOCABULARY = "hopline.middleware.contract"
# hopline's own logger, used by the collector too; the bounded uvicorn protocol of hopline's own
# servers (the collector's, ``hopline watch --listen``'s), which a gateway could run as well; the
# command errors every part's commands raise (beside the command assembler)
SHARED_WITH_THE_HOST = {"hopline.middleware.log", "hopline.middleware.http_limits", "hopline.middleware.exits"}
ASSEMBLER = "hopline.middleware.cli"


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def host_side_imports(path: Path, root: Path = REPO) -> list[str]:
    """What ``path`` (outside middleware/) imports of middleware/ beyond the vocabulary."""
    return [
        f"{path.relative_to(root)}:{line}: {target}"
        for line, target in imported(path, root)
        if _under(target, "hopline.middleware")
        and target != "hopline.middleware"
        and not any(_under(target, m) for m in (VOCABULARY, *SHARED_WITH_THE_HOST))
    ]


@pytest.mark.parametrize("part", ("collector", "analyzer", "dashboards"))
def test_other_parts_use_only_the_shared_vocabulary_of_middleware(part: str) -> None:
    found = [v for path in sorted((REPO / part).rglob("*.py")) for v in host_side_imports(path)]
    assert found == []


def test_the_vocabulary_imports_no_host_side_code() -> None:
    found = [
        f"{path.relative_to(REPO)}:{line}: {target}"
        for path in sorted((REPO / "middleware" / "contract").rglob("*.py"))
        for line, target in imported(path)
        if _under(target, "hopline.middleware") and target != "hopline.middleware" and not _under(target, VOCABULARY)
    ]
    assert found == []


def test_no_part_imports_the_command_assembler() -> None:
    """Parts raise typer/click exceptions themselves (``middleware/exits.py``); only the ``hopline``
    console script (pyproject) names the assembler."""
    found = [
        f"{path.relative_to(REPO)}:{line}: {target}"
        for path in modules()
        if module_name(path) != ASSEMBLER
        for line, target in imported(path)
        if _under(target, ASSEMBLER)
    ]
    assert found == []


def probe_file(root: Path, part: str, source: str, name: str = "probe.py") -> Path:
    """``source`` written as ``root/part/name`` (``part`` a folder path): a module for a check to read."""
    path = root / part / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    return path


def test_the_vocabulary_checks_see_what_they_must(tmp_path: Path) -> None:
    source = "from hopline.middleware.client import instrument\nfrom hopline.middleware.contract import rules\n"
    path = probe_file(tmp_path, "analyzer", source)
    flagged = {v.split(": ")[1] for v in host_side_imports(path, root=tmp_path)}
    assert flagged == {"hopline.middleware.client", "hopline.middleware.client.instrument"}


# --- what an emitter loads of the contract -------------------------------------------------------
# The code that runs inside a user's process (client, gateway, engine, emit, sinks, ...) needs the
# hops, the fields and validation (``contract.events``) and a few small modules, never the stage
# table (``contract.stages``) nor the rule book, which only the readers need; nor the package face
# ``hopline.middleware.contract``, which hands out the stage table's names too.
EMITTER_CONTRACT = tuple(
    f"{VOCABULARY}.{name}" for name in ("events", "errors", "units", "install")
)


def emitter_contract_imports(path: Path, root: Path = REPO) -> list[str]:
    """What a host-side module of middleware/ imports of the contract beyond ``EMITTER_CONTRACT``."""
    return [
        f"{path.relative_to(root)}:{line}: {target}"
        for line, target in imported(path, root)
        if _under(target, VOCABULARY) and not any(_under(target, m) for m in EMITTER_CONTRACT)
    ]


def host_side_modules() -> list[Path]:
    return [path for path in sorted((REPO / "middleware").glob("*.py")) if module_name(path) != ASSEMBLER]


def test_emitters_import_only_the_events_of_the_contract() -> None:
    found = [v for path in host_side_modules() for v in emitter_contract_imports(path)]
    assert found == []


def test_an_emitter_does_not_load_the_stage_table() -> None:
    """The same, as a process sees it: importing every host-side module loads ``contract.events``
    and not ``contract.stages`` nor ``contract.rules``."""
    names = [module_name(path) for path in host_side_modules()]
    probe = (
        "import importlib, json, sys\n"
        "loaded = []\n"
        f"for name in {names!r}:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ModuleNotFoundError as exc:\n"  # an extra's package (litellm, vllm) not installed
        "        assert not exc.name.startswith('hopline'), exc\n"
        "        continue\n"
        "    loaded.append(name)\n"
        "print(json.dumps([loaded, sorted(m for m in sys.modules if m.startswith('hopline.middleware.contract'))]))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    loaded, contract = json.loads(out)
    assert {"hopline.middleware.client", "hopline.middleware.gateway", "hopline.middleware.engine"} <= set(loaded)
    assert f"{VOCABULARY}.events" in contract
    assert f"{VOCABULARY}.stages" not in contract and f"{VOCABULARY}.rules" not in contract, contract


def test_the_emitter_check_sees_what_it_must(tmp_path: Path) -> None:
    path = probe_file(
        tmp_path,
        "middleware",
        "from hopline.middleware.contract import HOPS\n"
        "from hopline.middleware.contract.stages import STAGES\n"
        "from hopline.middleware.contract.events import validate_event\n"
        "from hopline.middleware.contract.errors import HoplineError\n"
    )
    flagged = {v.split(": ")[1] for v in emitter_contract_imports(path, root=tmp_path)}
    assert flagged == {
        "hopline.middleware.contract", "hopline.middleware.contract.HOPS",
        "hopline.middleware.contract.stages", "hopline.middleware.contract.stages.STAGES",
    }  # fmt: skip


# --- one reading of sizes, durations and instants -----------------------------------------------
# ``512MB`` was 512,000,000 bytes to the collector and 536,870,912 to the analyzer, because each had
# its parser. The parsers live in ``contract.units`` only: no other module defines one (by its name:
# ``parse_size``, ``to_epoch``, ``parse_time``, ``read_duration``, ...), and a command takes them
# from ``units``, not through another module that re-exports them.
UNITS = f"{VOCABULARY}.units"
UNIT_PARSERS = ("parse_size", "parse_duration", "to_epoch")
UNIT_PARSER_NAME = re.compile(
    r"_?(?:parse|read|to)_?(?:size|bytes|memory|duration|seconds|interval|time|instant|epoch|timestamp|datetime)s?"
)


def unit_parsers_elsewhere(path: Path, root: Path = REPO) -> list[str]:
    """Where ``path`` (not ``contract/units.py``) defines a size, duration or time parser, or imports
    one of ``UNIT_PARSERS`` from another module than ``units``."""
    if module_name(path, root) == UNITS:
        return []
    where = path.relative_to(root)
    package = module_name(path, root).split(".")[: None if path.name == "__init__.py" else -1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and UNIT_PARSER_NAME.fullmatch(node.name):
            found.append(f"{where}:{node.lineno}: defines {node.name}")
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Lambda):
            found += [
                f"{where}:{node.lineno}: defines {t.id}"
                for t in node.targets
                if isinstance(t, ast.Name) and UNIT_PARSER_NAME.fullmatch(t.id)
            ]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
            source = ".".join(p for p in (base, node.module) if p)
            found += [
                f"{where}:{node.lineno}: imports {a.name} from {source}"
                for a in node.names
                if a.name in UNIT_PARSERS and source != UNITS
            ]
    return found


def test_sizes_durations_and_times_are_read_by_contract_units_only() -> None:
    found = [v for path in modules() for v in unit_parsers_elsewhere(path)]
    assert found == []


def test_the_unit_parsers_are_what_units_exports() -> None:
    from hopline.middleware.contract import units

    assert all(name in units.__all__ and callable(getattr(units, name)) for name in UNIT_PARSERS)
    assert all(UNIT_PARSER_NAME.fullmatch(name) for name in UNIT_PARSERS)


@pytest.mark.parametrize(
    "source",
    [
        pytest.param("def parse_size(text):\n    return int(text)\n", id="own-size-parser"),
        pytest.param("def f():\n    def _to_seconds(t):\n        return float(t)\n", id="nested-duration"),
        pytest.param("async def parse_time(text):\n    return 0.0\n", id="async-time-parser"),
        pytest.param("read_bytes = lambda text: int(text)\n", id="lambda"),
        pytest.param("from hopline.analyzer.bounded import parse_size\n", id="re-exported"),
        pytest.param("from .units import to_epoch\n", id="relative"),
    ],
)
def test_the_units_check_sees_what_it_must(tmp_path: Path, source: str) -> None:
    path = probe_file(tmp_path, "analyzer", source)
    assert len(unit_parsers_elsewhere(path, root=tmp_path)) == 1


def test_the_units_check_lets_units_be_used(tmp_path: Path) -> None:
    path = probe_file(
        tmp_path,
        "collector",
        "from hopline.middleware.contract.units import parse_duration, parse_size, to_epoch\n"
        "from hopline.middleware.contract import units\n"
        "def max_memory(text):\n    return units.parse_size(text)\n"
        "def parse_listen(text):\n    return text\n"
    )
    assert unit_parsers_elsewhere(path, root=tmp_path) == []
    units_py = probe_file(tmp_path, "middleware/contract", "def parse_size(text):\n    return int(text)\n", "units.py")
    assert unit_parsers_elsewhere(units_py, root=tmp_path) == []
    beside = units_py.parent / "probe.py"
    beside.write_text("from .units import to_epoch\n")
    assert unit_parsers_elsewhere(beside, root=tmp_path) == []


def test_the_contract_face_is_its_all() -> None:
    """``hopline.middleware.contract``'s public names are its ``__all__`` (the names of ``events``
    and ``stages``) and its submodules: no ``os`` or ``orjson`` of a star import. ``events`` holds
    no name of the stage table."""
    import types

    from hopline.middleware import contract
    from hopline.middleware.contract import events, stages

    public = {n for n in dir(contract) if not n.startswith("_")}
    stray = {n for n in public - set(contract.__all__) if not isinstance(getattr(contract, n), types.ModuleType)}
    assert stray == set()
    assert all(getattr(contract, name) is not None for name in contract.__all__)
    for name in ("STAGES", "INPUTS", "Formula", "compute_stages", "VIEWS"):
        assert not hasattr(events, name) and getattr(contract, name) is getattr(stages, name)


# --- the checker itself: it sees what it must ---------------------------------------------------


def _checked(tmp_path: Path, part: str, source: str) -> list[str]:
    return violations(probe_file(tmp_path, part, source), root=tmp_path)


@pytest.mark.parametrize(
    ("part", "source"),
    [
        pytest.param("collector", "from hopline.analyzer.kv import KVSpec\n", id="collector-from-analyzer"),
        pytest.param("collector", "def f():\n    import hopline.analyzer.io\n", id="lazy-import"),
        pytest.param("middleware", "from hopline.collector import metric_names\n", id="middleware-upwards"),
        pytest.param(
            "analyzer",
            'ARGV = [sys.executable, "-m", "hopline.collector", "--port", "1"]\n',
            id="runs-the-collector",
        ),
        pytest.param(
            "dashboards", "from hopline.collector.app import create_app\n", id="dashboards-collector-app"
        ),
        pytest.param("dashboards", "from ..collector import store\n", id="relative-upwards"),
        pytest.param("analyzer", "from hopline.demo import scenarios\n", id="imports-the-demo"),
    ],
)
def test_the_checker_catches_a_wrong_import(tmp_path: Path, part: str, source: str) -> None:
    assert len(_checked(tmp_path, part, source)) >= 1


@pytest.mark.parametrize(
    ("part", "source"),
    [
        pytest.param("dashboards", "from hopline.collector import metric_names as m\n", id="metric-names"),
        pytest.param("dashboards", "from hopline.collector.metric_names import Metric\n", id="metric-name"),
        pytest.param("dashboards", "from . import panels\n", id="own-part"),
        pytest.param(
            "demo",
            'ARGV = ["-m", "hopline.collector"]\nfrom hopline.analyzer.io import scan_events\n',
            id="demo-on-top",
        ),
        pytest.param(
            "analyzer", '"""Run ``python -m hopline.collector`` first."""\n', id="prose-is-not-a-module"
        ),
    ],
)
def test_the_checker_allows_what_the_graph_allows(tmp_path: Path, part: str, source: str) -> None:
    assert _checked(tmp_path, part, source) == []


def test_the_readme_layout_section_lists_the_tree():
    """README.md's Layout section names every top-level folder (and the Dockerfile) of the
    checkout, and nothing that is not there."""
    import re
    import subprocess

    root = Path(__file__).resolve().parents[1]
    text = (root / "README.md").read_text()
    section = text[text.index("## Layout") :]
    section = section[: section.index("\n## ", 4)] if "\n## " in section[4:] else section
    listed = set(re.findall(r"^    ([A-Za-z][\w.-]*/?)\s", section, re.M))
    tracked = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True).stdout
    tops = {line.split("/")[0] + "/" for line in tracked.splitlines() if "/" in line and not line.startswith(".")}
    assert {name for name in listed if name.endswith("/")} == tops
    assert all((root / name.rstrip("/")).exists() for name in listed)


def test_every_package_is_in_the_distribution() -> None:
    """pyproject lists packages by hand (the package-dir mapping): a subpackage missing there works
    in an editable install and is absent from a wheel. Every folder with an ``__init__.py`` is listed."""
    import tomllib

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {module_name(init) for part in PARTS for init in (REPO / part).rglob("__init__.py")}
    assert found - listed == set()


def test_no_symlink_is_tracked() -> None:
    """A tracked symlink (a worktree's `.vllm -> /work/...`) breaks setup on every other checkout."""
    git = REPO / ".git"
    if not git.exists():
        pytest.fail("the layout checks run on a git checkout; .git is missing")
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-s"], capture_output=True, text=True, check=True
    ).stdout
    links = [line.split("\t", 1)[1] for line in listed.splitlines() if line.startswith("120000 ")]
    assert links == [], f"tracked symlinks: {links}"


def test_the_shift_detector_is_imported_only_by_the_registry() -> None:
    """What other detectors and the live side borrow (rank test, scopes, words) lives in
    ``analyzer/findings/``; ``findings/shifts/`` is one detector, reached through the registry."""
    shifts = REPO / "analyzer" / "findings" / "shifts"
    wrong = [
        f"{path.relative_to(REPO)}:{line} imports {name}"
        for path in modules()
        if shifts not in path.parents and path.name != "registry.py"
        for line, name in imported(path)
        if name.startswith("hopline.analyzer.findings.shifts")
    ]
    assert not wrong, wrong


def test_the_live_side_reads_findings_as_types_not_as_json() -> None:
    """Typed to the page: the live modules never import the report (its JSON) nor read a finding
    back from a dict (``finding["stage"]``, ``incident.get("scope")``)."""
    live = REPO / "analyzer" / "live"
    dict_reads = re.compile(r"\b(finding|incident|found)(\[\"|\.get\()")
    wrong = []
    for path in sorted(live.rglob("*.py")):
        wrong += [f"{path.name}:{line} imports {name}" for line, name in imported(path) if name == "hopline.analyzer.report"]
        wrong += [
            f"{path.name}:{number}: {text.strip()}"
            for number, text in enumerate(path.read_text().splitlines(), start=1)
            if dict_reads.search(text)
        ]
    assert not wrong, wrong


def test_every_error_hopline_raises_on_purpose_is_a_hopline_error() -> None:
    """One ``except HoplineError`` catches what hopline raises for a caller (``contract.errors``):
    every exception class defined in a part derives from it (read with ``ast``: a class whose base
    is an exception type and not ``HoplineError`` is listed)."""
    exception = re.compile(r"(Error|Exception|Exit|Warning)$")
    wrong = []
    for path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = [ast.unparse(base).split(".")[-1] for base in node.bases]
            if any(exception.search(b) for b in bases) and "HoplineError" not in bases and node.name != "HoplineError":
                wrong.append(f"{path.relative_to(REPO)}: class {node.name}({', '.join(bases)})")
    assert not wrong, wrong


def test_every_part_ships_its_type_hints() -> None:
    """PEP 561: each part carries ``py.typed`` and the distribution includes it."""
    import tomllib

    data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "py.typed" in data["*"]
    assert [part for part in PARTS if not (REPO / part / "py.typed").is_file()] == []


PIPELINE = REPO / "analyzer" / "pipeline.py"
# what the command, the demo and bench run as the analysis: each reaches it through the pipeline
PIPELINE_CALLERS = ("analyzer/cli.py", "demo/analysis.py", "bench/bench_bounded.py")


def analysis_builders(path: Path) -> list[str]:
    """Where ``path`` builds an analysis itself: ``Analysis(...)`` or ``Facts.of(...)`` (line: call)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.Call):
            continue
        func = ast.unparse(node.func)
        if func.split(".")[-1] == "Analysis" or func.endswith("Facts.of"):
            found.append(f"{node.lineno}: {func}(...)")
    return found


def test_only_the_pipeline_composes_the_analysis() -> None:
    """One composition of the offline analysis (events -> timelines -> facts + findings): no other
    module of a part or of bench/ builds an ``Analysis`` or its ``Facts``, and the command, the demo
    and bench import the pipeline."""
    paths = [*modules(), *sorted((REPO / "bench").glob("*.py"))]
    wrong = [f"{p.relative_to(REPO)}:{c}" for p in paths if p != PIPELINE for c in analysis_builders(p)]
    assert not wrong, wrong
    assert analysis_builders(PIPELINE)  # the checker sees the one place that does
    callers = {name: {n for _, n in imported(REPO / name)} for name in PIPELINE_CALLERS}
    assert [name for name, names in callers.items() if "hopline.analyzer.pipeline" not in names] == []


def test_the_composition_check_sees_what_it_must(tmp_path: Path) -> None:
    source = tmp_path / "elsewhere.py"
    source.write_text("from hopline.analyzer import report\n\ndef f(a, b):\n    return report.Analysis(a, b)")
    assert analysis_builders(source) == ["4: report.Analysis(...)"]
    source.write_text("from hopline.analyzer.report import Facts\n\nfacts = Facts.of(frame, window_s=1, by=())")
    assert analysis_builders(source) == ["3: Facts.of(...)"]


def readme_layout_blocks(text: str) -> dict[str, str]:
    """README.md's Layout section as {folder: its text}: a block starts at a line with a path
    ending in ``/`` after four spaces and holds the indented lines below it."""
    section = text[text.index("\n## Layout\n") :]
    section = section[: section.index("\n## ", 4)] if "\n## " in section[4:] else section
    blocks: dict[str, str] = {}
    current = None
    for line in section.splitlines():
        head = re.match(r"^    ([\w./-]+/)(?:\s|$)", line)
        if head:
            current = head.group(1)
            blocks[current] = line[4 + len(current) :]
        elif current is not None and line.startswith("      "):
            blocks[current] += " " + line.strip()
        else:
            current = None
    return blocks


def test_the_readme_layout_names_every_module_of_every_package() -> None:
    """Each package of every part (a folder with ``__init__.py``) has its block in the README's
    Layout section, and the block names exactly the modules the folder holds (``__init__`` and
    ``__main__`` aside): a module added, moved or removed without the README fails here."""
    blocks = readme_layout_blocks((REPO / "README.md").read_text())
    packages = sorted(init.parent for part in PARTS for init in (REPO / part).rglob("__init__.py"))
    wrong = []
    for folder in packages:
        name = f"{folder.relative_to(REPO)}/"
        if name not in blocks:
            wrong.append(f"{name}: no block")
            continue
        present = {p.name for p in folder.glob("*.py") if p.name not in ("__init__.py", "__main__.py")}
        said = set(re.findall(r"(?<![\w/.-])(\w+\.py)\b", blocks[name]))
        if said != present:
            wrong.append(f"{name}: not listed {sorted(present - said)}, no such module {sorted(said - present)}")
    assert not wrong, wrong


def test_the_readme_layout_check_sees_what_it_must() -> None:
    text = "\n## Layout\n\n    pkg/          a.py, b.py\n                  c.py\n    pkg/sub/\n                  d.py\n\nEnd\n"
    assert readme_layout_blocks(text) == {"pkg/": "          a.py, b.py c.py", "pkg/sub/": " d.py"}
