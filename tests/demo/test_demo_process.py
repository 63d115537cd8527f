"""No process the demo starts outlives it: not after Ctrl-C, not even after ``kill -9`` of the demo."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import orjson
from support.demo import demo_argv, processes_of

EXPECTED_CHILDREN = {"collector", "engine-r1", "engine-r2", "gateway"}


def _start(out: Path) -> subprocess.Popen[bytes]:
    argv = demo_argv(out, 60)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not ((out / "logs" / "gateway.port").exists() and (out / "pids.json").exists()):
        assert proc.poll() is None, proc.stderr.read().decode(errors="replace")[-3000:] if proc.stderr else ""
        assert time.monotonic() < deadline, "the stack did not come up"
        time.sleep(0.1)
    time.sleep(1.0)  # traffic flowing
    pids = orjson.loads((out / "pids.json").read_bytes())
    assert set(pids) == EXPECTED_CHILDREN
    assert {p.pid for p in processes_of(out)} >= set(pids.values())  # they are running now
    return proc


def _wait_gone(out: Path, within: float) -> list:
    deadline = time.monotonic() + within
    while (left := processes_of(out)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def test_ctrl_c_stops_every_child(tmp_path: Path) -> None:
    proc = _start(tmp_path)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=40)
    assert proc.returncode == 130, stderr.decode(errors="replace")[-3000:]
    assert processes_of(tmp_path) == []  # stopped before the demo returned
    assert b"interrupted" in stderr


def test_children_die_with_a_killed_demo(tmp_path: Path) -> None:
    proc = _start(tmp_path)
    proc.kill()  # no cleanup code runs in the demo: the kernel (PR_SET_PDEATHSIG) tells the children
    proc.communicate(timeout=10)
    assert _wait_gone(tmp_path, within=20) == []
