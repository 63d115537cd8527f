"""A forged clock at the door (issue 34, item 1): the collector refuses an event dated ahead of its
own clock by more than ``--max-future`` (5 min by default), says why for that line, and stores the
batch's other events.

The contract takes any ``ts`` before 2100, and one event dated a year ahead moved every live
detector's event time a year forward. A sender's clock a little ahead (skew) is still accepted.
The collector runs as ``hopline collector`` does (``python -m hopline.collector``): the command
sets the bound (``create_app`` does not pass it yet, see ``collector.ingest.Ingestor``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hopline.collector.config import CollectorConfig
from support.collector import collector_process, stored_lines
from support.events import event, ndjson

NDJSON = {"Content-Type": "application/x-ndjson"}
YEAR_S = 365 * 86400.0


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """``hopline collector`` with its defaults: (base URL, data directory)."""
    data = tmp_path_factory.mktemp("clock") / "data"
    with collector_process(data) as (_, url):
        yield url, data


def test_an_event_a_year_ahead_is_refused_and_the_rest_of_the_batch_stored(running):
    url, data = running
    now = time.time()
    good = [
        event("client.sent", "clock-a", now - 5, stream=True),
        event("client.sent", "clock-b", now + 60, stream=True),  # a clock a minute ahead: skew, kept
        event("client.sent", "clock-c", now, stream=True),
    ]
    forged = event("client.sent", "clock-forged", now + YEAR_S, stream=True)
    body = ndjson([good[0], forged, *good[1:]])
    answer = httpx.post(url + "/v1/events", content=body, headers=NDJSON, timeout=10)
    assert answer.status_code == 200, answer.text
    result = answer.json()
    assert (result["accepted"], result["duplicates"]) == (3, 0)
    [rejected] = result["rejected"]
    assert rejected["line"] == 2
    error = rejected["error"]
    assert error.startswith(f"ts {forged['ts']!r} (")
    assert "s ahead of the collector's clock" in error and "more than --max-future (300 s)" in error
    assert "the sender's clock is wrong" in error
    ahead = float(error.split(" is ", 1)[1].split(" s ahead", 1)[0].replace(",", ""))
    assert abs(ahead - YEAR_S) < 60  # the line says by how much: a year, less the time the post took
    stored = stored_lines(data)
    assert sorted(e["request_id"] for e in stored if e["request_id"].startswith("clock-")) == [
        "clock-a",
        "clock-b",
        "clock-c",
    ]
    metrics = httpx.get(url + "/metrics", timeout=10).text
    assert 'hopline_events_rejected_total{reason="ts_in_future"} 1.0' in metrics.splitlines()


def test_a_batch_of_only_future_events_is_refused_whole_with_the_reason_per_line(running):
    """As any batch without a valid line: 400, each line's reason listed (a JSON array body too)."""
    url, data = running
    ahead = time.time() + 3600
    events = [event("client.sent", f"late-{i}", ahead, stream=True) for i in range(2)]
    answer = httpx.post(url + "/v1/events", json=events, timeout=10)
    assert answer.status_code == 400
    result = answer.json()
    assert result["error"] == "no valid event in the batch" and result["accepted"] == 0
    assert [r["line"] for r in result["rejected"]] == [1, 2]
    assert all("ahead of the collector's clock" in r["error"] for r in result["rejected"])
    assert not [e for e in stored_lines(data) if e["request_id"].startswith("late-")]


def test_the_bound_is_a_setting(tmp_path):
    """``--max-future`` (``HOPLINE_MAX_FUTURE``): 30 s refuses what is 2 min ahead."""
    assert CollectorConfig(data_dir=tmp_path).max_future == 300.0
    assert CollectorConfig.from_options({"data_dir": tmp_path, "max_future": "30s"}).max_future == 30.0
    with collector_process(tmp_path / "data", "--max-future", "30s") as (_, url):
        now = time.time()
        batch = [
            event("client.sent", "in-time", now + 10, stream=True),
            event("client.sent", "early", now + 120, stream=True),
        ]
        result = httpx.post(url + "/v1/events", content=ndjson(batch), headers=NDJSON, timeout=10).json()
    assert result["accepted"] == 1
    [rejected] = result["rejected"]
    assert rejected["line"] == 2 and "more than --max-future (30 s)" in rejected["error"]
