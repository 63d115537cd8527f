"""``hopline poll-trtllm`` (middleware/trtllm_poll.py): the TensorRT-LLM poller as a ``hopline``
command on the engine's host, run as a user runs it (the installed console script, a real
uvicorn serving a drained ``/perf_metrics`` on 127.0.0.1), and its old spelling
``python -m hopline.middleware.contract.records poll-trtllm`` handed over to it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from fastapi import FastAPI
from hopline.middleware.contract.records import translate_lines
from support.servers import closed_port_url, running_server, wait_until

RECORD = orjson.loads((Path(__file__).parent / "fixtures" / "tensorrt-llm-perf-metrics.ndjson").read_bytes())
HOPLINE = str(Path(sys.executable).with_name("hopline"))
OLD_SPELLING = [sys.executable, "-m", "hopline.middleware.contract.records"]


def drained_perf_metrics() -> FastAPI:
    """trtllm-serve's /perf_metrics: the records finished since the last call, then nothing."""
    app = FastAPI()
    bare = {k: v for k, v in RECORD.items() if k != "hopline_clock_offset_s"}  # as the engine answers
    pending = [[bare | {"request_id": i}] for i in (1, 2)]

    @app.get("/perf_metrics")
    async def perf_metrics() -> list:
        return pending.pop(0) if pending else []

    return app


@pytest.mark.parametrize("command", [[HOPLINE], OLD_SPELLING], ids=["hopline", "old-spelling"])
def test_the_command_saves_drained_records_until_interrupted(tmp_path: Path, command: list[str]):
    out = tmp_path / "trt.ndjson"
    with running_server(drained_perf_metrics()) as url:
        proc = subprocess.Popen(
            [*command, "poll-trtllm", url, "--out", str(out), "--interval", "0.05"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            wait_until("two records saved", lambda: out.exists() and len(out.read_bytes().splitlines()) == 2)
        finally:
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    saved = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert [r["request_id"] for r in saved] == [1, 2] and all("hopline_clock_offset_s" in r for r in saved)
    translated, errors = translate_lines(out.read_bytes())
    assert errors == [] and translated.count(b'"engine.stats"') == 2


def test_an_engine_that_is_not_there_is_one_line_and_status_1(tmp_path: Path):
    url = closed_port_url()
    done = subprocess.run(
        [HOPLINE, "poll-trtllm", url, "--out", str(tmp_path / "trt.ndjson")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1
    assert done.stderr.startswith(f"hopline poll-trtllm: {url}/perf_metrics: ")
    assert done.stderr.count("\n") == 1  # one line


def test_a_bad_interval_is_bad_usage(tmp_path: Path):
    done = subprocess.run(
        [HOPLINE, "poll-trtllm", "http://127.0.0.1:1", "--out", str(tmp_path / "t"), "--interval", "0"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "--interval must be a positive number of seconds, got 0.0" in done.stderr
