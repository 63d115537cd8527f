"""--tail follows the file sink's files across rotation, only complete lines, resuming after restart."""

from __future__ import annotations

import time

from hopline.collector.config import CollectorConfig
from hopline.middleware.sinks import FileSink
from support.collector import serve, stored_lines
from support.events import event
from support.servers import wait_until


def test_tail_follows_rotation_and_resumes_without_duplicates(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    live = logs / "events.ndjson"
    config = CollectorConfig(data_dir=tmp_path / "data", tail=(f"{live}*",), tail_interval=0.05, grace=0)
    sink = FileSink(live, max_bytes=1000)  # ~8 events per file: rotates every other batch
    written: list[str] = []

    def write(n: int, prefix: str) -> None:
        batch = [event("gateway.received", f"{prefix}-{i}", 1767225600.0 + i, service="gw") for i in range(n)]
        assert sink.write(batch) == 0
        written.extend(e["eid"] for e in batch)

    with serve(config) as c:
        for round_ in range(12):
            write(4, f"a{round_}")
            if round_ % 3 == 0:
                time.sleep(0.1)  # let some polls land mid-way, between rotations
        wait_until("the collector", lambda: len(stored_lines(config.data_dir)) == len(written))
        assert len(list(logs.glob("events.ndjson.*"))) >= 3  # it did rotate
        # a line still being written is not consumed until its newline arrives
        with open(live, "ab") as f:
            f.write(b'{"v":1,"ts":1767225600.0,"request_id":"half","hop":"gateway.rec')
            f.flush()
            time.sleep(0.3)
            assert c.client.get("/v1/requests/half").status_code == 404
            f.write(b'eived"}\n')
        wait_until("the collector", lambda: c.client.get("/v1/requests/half").status_code == 200)
    # restarted: positions come from DIR/tail-state.json, nothing is stored twice
    write(3, "b")
    with serve(config):
        wait_until("the collector", lambda: len(stored_lines(config.data_dir)) == len(written) + 1)
        time.sleep(0.3)  # a few more polls: still nothing read twice
    stored = stored_lines(config.data_dir)
    assert sorted(e["eid"] for e in stored if "eid" in e) == sorted(written)  # each exactly once
    assert [e["request_id"] for e in stored if "eid" not in e] == ["half"]
