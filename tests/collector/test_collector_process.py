"""The collector as a real process: acknowledged events survive SIGKILL; SIGTERM exits cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from support.collector import collector_process, stored_lines
from support.events import event, ndjson
from support.servers import env_without_hopline

NDJSON = {"Content-Type": "application/x-ndjson"}


SIGKILL_ROUNDS = 3


def ingest_until_killed(data_dir: Path, round_no: int, at_least: int) -> list[str]:
    """Start a collector, post batches from a thread, SIGKILL it mid-stream; the acknowledged eids."""
    acked: list[str] = []
    with collector_process(data_dir) as (proc, url):
        stop = threading.Event()

        def post() -> None:
            with httpx.Client(base_url=url, timeout=5) as client:
                i = 0
                while not stop.is_set():
                    batch = [
                        event("engine.received", f"k{round_no}-{i}-{j}", 1767225600.0 + j, stream=True)
                        for j in range(200)
                    ]
                    i += 1
                    try:
                        r = client.post("/v1/events", content=ndjson(batch), headers=NDJSON)
                    except httpx.TransportError:
                        return  # killed mid-request: not acknowledged
                    if r.status_code == 200:
                        assert r.json()["accepted"] == len(batch)
                        acked.extend(e["eid"] for e in batch)

        poster = threading.Thread(target=post)
        poster.start()
        while len(acked) < at_least:  # acknowledged batches, then kill mid-stream
            assert poster.is_alive()
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        stop.set()
        poster.join(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    return acked


def test_acknowledged_events_survive_sigkill_rounds_and_read_back_with_the_analyzer(tmp_path):
    """Rounds of: sustained ingest, SIGKILL, restart. Every acknowledged eid is on disk after each
    round, and ``hopline analyze`` reads them all (a torn tail, if any, is cut on restart)."""
    from hopline.analyzer.io import scan_events

    data_dir = tmp_path / "data"
    acked: set[str] = set()
    for round_no in range(SIGKILL_ROUNDS):
        acked |= set(ingest_until_killed(data_dir, round_no, at_least=2000 + 600 * round_no))
        missing = acked - {e["eid"] for e in stored_lines(data_dir)}
        assert not missing, f"round {round_no}: {len(missing)} acknowledged events lost"
    # a restarted collector appends after the last complete line
    with collector_process(data_dir) as (_, url):
        late = event("engine.received", "after-restart", 1767225601.0, stream=True)
        assert httpx.post(url + "/v1/events", content=ndjson([late]), headers=NDJSON).json()["accepted"] == 1
    for path in (data_dir / "events").glob("date=*/hour=*/*.ndjson"):
        for raw in path.read_bytes().splitlines():
            assert raw.startswith(b"{") and raw.endswith(b"}")
    frame, _ = scan_events([data_dir])
    read = set(frame.select("eid").collect()["eid"].to_list())
    assert not acked - read, f"{len(acked - read)} acknowledged events not readable by the analyzer"
    assert "after-restart" in set(frame.select("request_id").collect()["request_id"].to_list())
    cli = subprocess.run(
        [sys.executable, "-m", "hopline.middleware.cli", "analyze", str(data_dir), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert cli.returncode == 0, cli.stderr
    assert "Traceback" not in cli.stderr


def test_sigterm_flushes_and_exits_cleanly(tmp_path):
    data_dir = tmp_path / "data"
    with collector_process(data_dir, "--fsync", "interval", "--fsync-interval", "60s") as (proc, url):
        batch = [event("client.sent", f"t{i}", 1767225600.0, stream=True) for i in range(50)]
        assert httpx.post(url + "/v1/events", content=ndjson(batch), headers=NDJSON).json()["accepted"] == 50
        proc.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully (lifespan shutdown: queued writes, fsync, close), then
        # ends the process with the signal it received, as a service manager expects
        assert proc.wait(timeout=15) == -signal.SIGTERM
        stderr = proc.stderr.read().decode()
    assert '"event":"collector_stopped"' in stderr
    assert "Traceback" not in stderr
    assert {e["eid"] for e in stored_lines(data_dir)} == {e["eid"] for e in batch}


def _start(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hopline.collector", "--data-dir", str(data_dir), *args],
        env=env_without_hopline(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_a_collector_that_cannot_start_says_why_in_one_line(tmp_path):
    """A port in use or an unusable data dir: exit 1 and one line before anything says "started"
    (before: it logged collector_started and answered 503 forever); a port out of range: exit 2."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        busy = taken.getsockname()[1]
        proc = _start(tmp_path / "data", "--port", str(busy))
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.strip() == f"hopline collector: cannot listen on 127.0.0.1:{busy}: it is in use"
    (tmp_path / "a-file").write_text("a file, not a folder")
    proc = _start(tmp_path / "a-file", "--port", "0")
    assert proc.returncode == 1 and proc.stderr.startswith("hopline collector: cannot use --data-dir"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "collector_started" not in proc.stderr
    proc = _start(tmp_path / "data", "--port", "99999")
    assert proc.returncode == 2 and "--port" in proc.stderr, proc.stderr
