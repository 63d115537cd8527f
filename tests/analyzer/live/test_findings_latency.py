"""``GET /v1/findings`` does little Python work on the server's thread (issue 34, item 7).

The server thread shares the GIL with the detection step; whatever Python a request runs waits for
the step's hand-overs. Before, every request serialized each incident (``Incident.to_json``) on
that thread: with a horizon's worth of incidents, tens of milliseconds of Python per request, each
slice of it behind the step. Now each step serializes its incidents once (``Watch.published``) and
a request joins bytes. Measured as a ratio on one machine, side by side (medians of alternated
requests), never as a time: 1,000 incidents against none.
"""

from __future__ import annotations

import statistics
import time

import httpx
from hopline.analyzer.findings.model import Shift
from hopline.analyzer.live.detector import LiveConfig, LiveDetector
from hopline.analyzer.live.incidents import Incident
from hopline.analyzer.live.server import FindingsApp, findings_answer
from hopline.analyzer.live.watch import Watch
from hopline.middleware.contract.units import to_epoch
from support.servers import running_server

ONSET = to_epoch("2026-01-05T10:25:00Z")
INCIDENTS = 1_000
ROUNDS = 150


def incident(n: int) -> Incident:
    replica = f"r{n}"
    finding = Shift(
        summary=f"queue time tripled at 10:25 on replica {replica}", stage="queue",
        scope={"replica": replica},
        statistic="p50", at=ONSET, before_ms=40.1, after_ms=121.0, factor=3.017, z=9.0,
        affected_requests=310, impact_s=25.1,
    )  # fmt: skip
    key = ("HoplineShift", "queue", (("replica", replica),), "up")
    return Incident(key, finding, ONSET, ONSET + 20, ONSET + 20 + n, "critical", 0.21, [f"s1-{n}"])


def watch_with(count: int) -> Watch:
    watch = Watch(LiveDetector(LiveConfig()))
    watch.detector.book.incidents = [incident(n) for n in range(count)]
    watch.on_step(ONSET + 60, [])  # what a step hands the server
    return watch


def test_findings_cost_the_server_little_python_whatever_the_incidents():
    busy, empty = watch_with(INCIDENTS), watch_with(0)
    answer = findings_answer(busy, ONSET + 20 + INCIDENTS - 10)
    assert len(answer["findings"]) == INCIDENTS  # all firing: kept whatever ?since says
    assert answer["findings"][7] == incident(7).to_json()
    with running_server(FindingsApp(busy)) as many, running_server(FindingsApp(empty)) as none:
        client = httpx.Client(timeout=30)
        times: dict[str, list[float]] = {many: [], none: []}
        for _ in range(ROUNDS):
            for url in (many, none):
                started = time.perf_counter()
                assert client.get(url + "/v1/findings").status_code == 200
                times[url].append(time.perf_counter() - started)
    ratio = statistics.median(times[many]) / statistics.median(times[none])
    # before: every request serialized the 1,000 incidents (x40-x48 here); now x2.0-x2.6 (the bytes sent)
    assert ratio < 10, f"1,000 incidents cost x{ratio:.1f} an empty answer"
