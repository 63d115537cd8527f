"""``/healthz`` is 503 while events cannot be stored, 200 again once they can (issue 11).

Before: ``/healthz`` answered 200 whatever the store did, and a data directory replaced under a
running collector took acknowledged events into the file the collector still had open (moved
away with the old directory), answering 200 to the sender.
"""

from __future__ import annotations

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
