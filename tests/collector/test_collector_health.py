"""``/healthz`` is 503 while events cannot be stored, 200 again once they can (issue 11): a data
directory replaced under a running collector, and a real full disk (a small tmpfs; the tests run as root).

Before: ``/healthz`` answered 200 whatever the store did, and a data directory replaced under a
running collector took acknowledged events into the file the collector still had open (moved
away with the old directory), answering 200 to the sender.
"""

from __future__ import annotations

import contextlib
import errno
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from hopline.collector.app import STORE_PROBE_INTERVAL_S
from hopline.collector.config import CollectorConfig
from support.collector import serve, stored_lines
from support.events import event, ndjson
from support.servers import wait_until

NDJSON = {"Content-Type": "application/x-ndjson"}
T0 = 1767225600.0


def post(running, request_id: str) -> int:
    body = ndjson([event("client.sent", request_id, T0, stream=True)])
    return running.client.post("/v1/events", content=body, headers=NDJSON).status_code


def test_healthz_is_503_with_the_reason_while_the_data_dir_is_replaced_and_200_once_it_works(tmp_path):
    data = tmp_path / "data"
    with serve(CollectorConfig(data_dir=data)) as c:
        assert post(c, "before") == 200
        assert c.client.get("/healthz").json()["status"] == "ok"
        old = tmp_path / "old"
        old.mkdir()
        (data / "events").rename(old / "events")
        (data / "events").write_text("a file where the event folder was")

        # no event needed: the probe sees it (within its 1 s interval)
        health = wait_until("/healthz 503", lambda: (r := c.client.get("/healthz")).status_code == 503 and r)
        answer = health.json()
        assert answer["status"] == "unavailable"
        assert (
            answer["store"].startswith("events cannot be stored: ")
            and str(data / "events") in answer["store"]
        )
        assert health.headers["retry-after"] == "1"
        assert post(c, "during") == 503  # not acknowledged into the moved-away file

        (data / "events").unlink()
        wait_until("/healthz 200", lambda: c.client.get("/healthz").status_code == 200, timeout=10)
        assert c.client.get("/healthz").json()["store"] == "ok"
        assert post(c, "after") == 200
    assert [e["request_id"] for e in stored_lines(data)] == ["after"]
    assert [e["request_id"] for e in stored_lines(old)] == ["before"]


@contextlib.contextmanager
def small_disk(path: Path, size: str = "512k") -> Iterator[Path]:
    """A real file system that fills up: tmpfs of ``size`` mounted at ``path`` (the tests run as root)."""
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(directory: Path) -> Path:
    """Write a file until the disk is full; returns it."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"x" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    return filler


def test_healthz_is_503_while_the_disk_is_full_and_200_once_there_is_room(tmp_path):
    # healthz_min_free=0: only failed writes count (the free-space check has its own tests below)
    config = CollectorConfig(data_dir=tmp_path / "disk" / "data", healthz_min_free=0)
    with small_disk(tmp_path / "disk") as disk, serve(config) as c:
        assert post(c, "before") == 200
        filler = fill(disk)
        batch = ndjson([event("client.sent", f"full-{i}", T0, stream=True) for i in range(100)])  # > a page
        assert c.client.post("/v1/events", content=batch, headers=NDJSON).status_code == 503
        health = c.client.get("/healthz")
        assert health.status_code == 503
        store = health.json()["store"]  # the failed write's reason, or the probe's since (every second)
        assert store.startswith("events cannot be stored: cannot write"), store
        assert store.endswith(": No space left on device"), store
        # still 503 on the next probes: nothing was written since
        time.sleep(1.5)
        health = c.client.get("/healthz")
        assert health.status_code == 503 and "No space left on device" in health.json()["store"], (
            health.json()
        )

        filler.unlink()
        wait_until("/healthz 200", lambda: c.client.get("/healthz").status_code == 200, timeout=10)
        assert c.client.post("/v1/events", content=batch, headers=NDJSON).status_code == 200
        stored = [e["request_id"] for e in stored_lines(disk / "data")]
    assert stored == ["before"] + [f"full-{i}" for i in range(100)]  # the failed write was rolled back


MIB = 1024 * 1024


def test_healthz_stays_503_for_as_long_as_the_disk_is_full_and_comes_back_by_itself(tmp_path):
    """Issue 24 item 8, on a real 20 MiB tmpfs. Before: the first probe after a refused batch said
    503, the next store probe (a 6-byte file, which fits in the pages the refused batch's rollback
    freed) cleared it, and /healthz said 200 while every batch was still refused."""
    config = CollectorConfig(data_dir=tmp_path / "disk" / "data", healthz_min_free=MIB)
    with small_disk(tmp_path / "disk", "20m") as disk, serve(config) as c:
        assert post(c, "before") == 200
        assert c.client.get("/healthz").status_code == 200
        slack = disk / "slack"
        slack.write_bytes(b"x" * 65536)
        filler = fill(disk)
        slack.unlink()  # 64 KiB free: a small write fits, a sink's batch (1,000 events, ~150 KB) does not
        batch = ndjson([event("client.sent", f"full-{i}", T0, stream=True) for i in range(1000)])
        assert len(batch) > 100_000
        assert c.client.post("/v1/events", content=batch, headers=NDJSON).status_code == 503
        # probe for several store-probe intervals (each re-examines the store): every answer is 503
        answers = []
        until = time.monotonic() + 4 * STORE_PROBE_INTERVAL_S
        while time.monotonic() < until:
            answers.append(c.client.get("/healthz"))
            time.sleep(0.1)
        assert len(answers) >= 10
        assert [r.status_code for r in answers] == [503] * len(answers), [r.json()["store"] for r in answers]
        assert all(r.json()["store"].startswith("events cannot be stored: ") for r in answers)
        assert c.client.post("/v1/events", content=batch, headers=NDJSON).status_code == 503  # still full

        filler.unlink()  # space returns: health comes back without a sender
        wait_until("/healthz 200", lambda: c.client.get("/healthz").status_code == 200, timeout=10)
        assert c.client.post("/v1/events", content=batch, headers=NDJSON).status_code == 200
        stored = [e["request_id"] for e in stored_lines(disk / "data")]
    assert stored == ["before"] + [f"full-{i}" for i in range(1000)]  # the refused writes were rolled back


def test_healthz_is_503_while_free_space_is_below_healthz_min_free(tmp_path):
    """``--healthz-min-free``: unhealthy before a batch is refused, while the file system has less
    room than the setting (a load balancer drains the collector before events are lost)."""
    config = CollectorConfig(data_dir=tmp_path / "disk" / "data", healthz_min_free=8 * MIB)
    with small_disk(tmp_path / "disk", "20m") as disk, serve(config) as c:
        assert c.client.get("/healthz").status_code == 200
        ballast = disk / "ballast"
        ballast.write_bytes(b"x" * (15 * MIB))  # ~5 MiB left: storing works, but below 8 MiB
        health = wait_until("/healthz 503", lambda: (r := c.client.get("/healthz")).status_code == 503 and r)
        assert "--healthz-min-free" in health.json()["store"], health.json()
        assert post(c, "still-stored") == 200  # refusing events is not health's business
        assert c.client.get("/healthz").status_code == 503  # a successful write does not clear it
        ballast.unlink()
        wait_until("/healthz 200", lambda: c.client.get("/healthz").status_code == 200, timeout=10)
