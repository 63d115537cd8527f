"""The figures a bench/*_instructions.py script prints (one JSON object), for the instruction-count
tests: counts under callgrind, which the machine's load does not move."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def bench_figures(script: str, *args: str) -> dict:
    command = [sys.executable, str(BENCH / script), *args]
    run = subprocess.run(command, cwd=BENCH, capture_output=True, text=True, timeout=900, check=True)
    return json.loads(run.stdout)
