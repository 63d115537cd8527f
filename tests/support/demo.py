"""``hopline demo`` in a child process for tests, and the processes a run left behind."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import psutil

# Long enough for the analyzer: a shift needs 50 requests on each side of it in the scope it names
# (a replica gets ~4 requests/s); a pitfall needs 20 requests of the culprit.
SHIFT_SECONDS = 36
PITFALL_SECONDS = 25


def demo_argv(out: Path, seconds: int, *options: str) -> list[str]:
    """``hopline demo --seconds S --out OUT --json OPTIONS…`` with this interpreter."""
    return [sys.executable, "-m", "hopline.middleware.cli", "demo", "--seconds", str(seconds),
            "--out", str(out), "--json", *options]  # fmt: skip


def run_demo(out: Path, scenario: str, seconds: int, seed: int = 7) -> dict[str, Any]:
    """``hopline demo … --json`` in a child process; its stdout must be exactly the findings JSON."""
    argv = demo_argv(out, seconds, "--scenario", scenario, "--seed", str(seed))
    proc = subprocess.run(argv, capture_output=True, timeout=seconds + 90, check=False)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-4000:]
    return orjson.loads(proc.stdout)


def processes_of(out: Path) -> list[psutil.Process]:
    """Live processes started for the run in ``out`` (every child's command line names that folder),
    and any recorded child pid still running."""
    found: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter(["cmdline", "status"]):
        with contextlib.suppress(psutil.Error):
            if proc.info["status"] != psutil.STATUS_ZOMBIE and str(out) in " ".join(
                proc.info["cmdline"] or ()
            ):
                found[proc.pid] = proc
    pids_file = out / "pids.json"
    for pid in orjson.loads(pids_file.read_bytes()).values() if pids_file.exists() else ():
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE and str(out) in " ".join(proc.cmdline()):
                found[pid] = proc
    return [p for pid, p in found.items() if pid != os.getpid()]


def first_finding(report: dict[str, Any]) -> dict[str, Any]:
    assert report["findings"], f"no findings at all: {report}"
    return report["findings"][0]
