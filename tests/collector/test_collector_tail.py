"""--tail follows the file sink's files across rotation, only complete lines, resuming after restart."""

from __future__ import annotations

import time

import orjson
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


def test_a_grace_shorter_than_two_tail_polls_is_warned_about(tmp_path, capfd):
    """Two files written together can be read a poll apart: with --grace below two polls, a
    request's hops from the second file come after it finished (stored, but missing from its
    stages). The collector says so when it starts; at two polls or more it says nothing."""
    for grace, warned in ((0.5, True), (1.0, False), (0, False)):
        config = CollectorConfig(data_dir=tmp_path / f"data-{grace}", tail=(f"{tmp_path}/*.ndjson",), grace=grace)
        with serve(config):
            pass
        out, err = capfd.readouterr()
        logs = [orjson.loads(line) for line in (out + err).splitlines() if line.startswith("{")]
        assert any(e["event"] == "collector_started" for e in logs)
        found = [e for e in logs if e["event"] == "grace_shorter_than_tail"]
        assert bool(found) == warned, (grace, logs)
        if warned:
            assert found[0]["level"] == "warning" and "--grace 0.5s" in found[0]["message"]
