"""The collector as a real process: acknowledged events survive SIGKILL; SIGTERM exits cleanly."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from support.collector import stored_lines
from support.events import event, ndjson
from support.servers import env_without_hopline, free_port

NDJSON = {"Content-Type": "application/x-ndjson"}


@contextlib.contextmanager
def collector_process(data_dir: Path, *args: str) -> Iterator[tuple[subprocess.Popen, str]]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "hopline.collector", "--data-dir", str(data_dir), "--port", str(port), *args],
        env=env_without_hopline(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        assert proc.poll() is None, proc.stderr.read().decode()
        try:
            httpx.get(url + "/healthz", timeout=0.5)
            break
        except httpx.TransportError:
            assert time.monotonic() < deadline, "collector did not start"
            time.sleep(0.05)
    try:
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def test_acknowledged_events_survive_sigkill(tmp_path):
    """Post batches from a thread while the collector is killed; every acknowledged eid is on disk."""
    acked: list[str] = []
    data_dir = tmp_path / "data"
    with collector_process(data_dir) as (proc, url):
        stop = threading.Event()

        def post() -> None:
            with httpx.Client(base_url=url, timeout=5) as client:
                i = 0
                while not stop.is_set():
                    batch = [
                        event("engine.received", f"k{i}-{j}", 1767225600.0 + j, stream=True)
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
        while len(acked) < 2000:  # at least 10 acknowledged batches, then kill mid-stream
            assert poster.is_alive()
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        stop.set()
        poster.join(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    stored = {e["eid"] for e in stored_lines(data_dir)}
    missing = set(acked) - stored
    assert not missing, f"{len(missing)} acknowledged events lost"
    # a restarted collector appends after the last complete line (a torn tail, if any, is cut)
    with collector_process(data_dir) as (proc, url):
        late = event("engine.received", "after-restart", 1767225601.0, stream=True)
        assert httpx.post(url + "/v1/events", content=ndjson([late]), headers=NDJSON).json()["accepted"] == 1
    for path in (data_dir / "events").glob("date=*/hour=*/*.ndjson"):
        for raw in path.read_bytes().splitlines():
            assert raw.startswith(b"{") and raw.endswith(b"}")
    assert "after-restart" in {e["request_id"] for e in stored_lines(data_dir)}


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
