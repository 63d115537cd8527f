"""A record format is one row (issue 37, item 5): its marker bytes and its file names live in its
``RecordFormat`` row in contract/records.py and nowhere else, and the vocabulary holds no poller
(the TensorRT-LLM poller is the host-side ``hopline poll-trtllm``, middleware/trtllm_poll.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

from hopline.middleware.contract.records import FORMATS, MARKERS, is_record_file

REPO = Path(__file__).resolve().parents[2]
RECORDS = REPO / "middleware" / "contract" / "records.py"
PARTS = ("middleware", "collector", "analyzer", "dashboards", "demo")


def test_markers_and_file_names_come_from_the_rows():
    assert MARKERS == tuple(f.marker for f in FORMATS) and len(set(MARKERS)) == len(FORMATS)
    assert is_record_file("sglang-request-metrics-20260101_00.log")
    assert not is_record_file("sglang-request-metrics-20260101_00.log.bak")
    assert not is_record_file("request-trace.000000.jsonl.gz")  # Dynamo's: NDJSON by its own name


def test_no_other_module_names_a_formats_marker_or_file_pattern():
    spelled = {f.marker.decode(): f.name for f in FORMATS} | {f.files: f.name for f in FORMATS if f.files}
    found = [
        f"{path.relative_to(REPO)}: {text!r} ({name})"
        for part in PARTS
        for path in sorted((REPO / part).rglob("*.py"))
        if path != RECORDS
        for text, name in spelled.items()
        if text in path.read_text()
    ]
    assert found == []


def test_the_vocabulary_holds_no_poller_and_no_argument_parser():
    tree = ast.parse(RECORDS.read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])
    }
    assert not imported & {"argparse", "httpx", "typer", "time"}
    functions = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    assert not {"poll_trtllm", "main"} & functions
