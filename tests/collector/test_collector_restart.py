"""A collector killed (SIGKILL) and restarted on its store: the windows not served yet are rebuilt
from the stored events, requests in flight are joined again, nothing is counted twice, and what
could not be given back is said in /metrics (collector/restart.py). A real collector process, its
store on disk, real HTTP."""

from __future__ import annotations

import collections
import os
import signal
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families
from support.collector import collector_process
from support.events import ndjson
from support.servers import wait_until
from support.synth import generate

NDJSON = {"Content-Type": "application/x-ndjson"}
FIRST_HOPS = frozenset(
    {"client.sent", "gateway.received", "gateway.admitted", "gateway.forwarded", "engine.received"}
)
# 2 s windows served 8 s after their end: the windows of requests sent "now" are not served when the
# collector is killed right after they are stored (a stall of 8 s between the two would be needed)
ARGS = ("--window", "2s", "--window-settle", "8s", "--grace", "200ms")


def requests(n: int, seed: int, start: float) -> dict[str, list[dict]]:
    frame = generate(n, seed=seed, rate=20.0, start=start, clock_skew_s=0.0, error_rate=0.0).drop("attrs")
    by_id: dict[str, list[dict]] = collections.defaultdict(list)
    for row in frame.to_dicts():
        by_id[f"s{seed}-{row['request_id']}"].append(
            {**{k: v for k, v in row.items() if v is not None}, "request_id": f"s{seed}-{row['request_id']}"}
        )
    return by_id


def post(url: str, events: list[dict]) -> None:
    r = httpx.post(url + "/v1/events", content=ndjson(events), headers=NDJSON, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["accepted"] == len(events)


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(url + "/metrics", timeout=30).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(samples: dict[tuple[str, tuple], float], name: str) -> float:
    return sum(v for (n, _), v in samples.items() if n == name)


def windows(url: str, since: float, until: float) -> list[dict]:
    answer = httpx.get(url + "/v1/windows", params={"since": since, "until": until}, timeout=30).json()
    return answer["windows"]


def test_a_killed_collector_rebuilds_its_windows_from_its_store_and_says_what_was_lost(tmp_path):
    data_dir = tmp_path / "c"
    with collector_process(data_dir, *ARGS) as (proc, url):
        now = time.time()
        served = requests(20, seed=1, start=now - 120)  # served before the kill
        post(url, [e for evs in served.values() for e in evs])
        wait_until(
            "the first requests' windows served",
            lambda: sum(w["requests"] for w in windows(url, now - 200, now - 60)) == len(served),
            timeout=30,
        )
        now = time.time()
        unserved = requests(30, seed=2, start=now)  # finished, stored, in windows not served at the kill
        in_flight = requests(12, seed=3, start=now + 0.2)  # first hops before the kill, the rest after
        too_old = requests(5, seed=4, start=now - 600)  # the same, but begun before what is read back
        both = {**in_flight, **too_old}
        first = {rid: [e for e in evs if e["hop"] in FIRST_HOPS] for rid, evs in both.items()}
        rest = {rid: [e for e in evs if e["hop"] not in FIRST_HOPS] for rid, evs in both.items()}
        post(url, [e for evs in unserved.values() for e in evs] + [e for evs in first.values() for e in evs])
        os.kill(proc.pid, signal.SIGKILL)  # at once: their windows end 2-4 s from now, served 8 s later
        proc.wait(timeout=10)

    with collector_process(data_dir, *ARGS) as (proc, url):
        m = scrape(url)
        restart = "hopline_collector_restart_requests"
        state = {dict(labels)["state"]: v for (n, labels), v in m.items() if n == restart}
        assert state == {"rebuilt": len(unserved), "served_before": len(served), "rejoined": len(in_flight)}
        stored_back = sum(map(len, served.values())) + sum(map(len, unserved.values()))
        stored_back += sum(len(first[rid]) for rid in in_flight)
        assert m[("hopline_collector_restart_events", ())] == stored_back
        assert m[("hopline_collector_restart_seconds", ())] > 0
        assert total(m, "hopline_requests_total") == 0  # nothing read back is counted a second time
        assert m[("hopline_open_requests", ())] == len(in_flight)

        retried = next(iter(unserved.values()))[0]  # a sender's retry of an event stored before the kill
        r = httpx.post(url + "/v1/events", content=ndjson([retried]), headers=NDJSON, timeout=30)
        assert r.status_code == 200 and r.json()["accepted"] == 0, r.text
        post(url, [e for evs in rest.values() for e in evs])
        wait_until(
            "the requests in flight finished",
            lambda: total(scrape(url), "hopline_requests_total") == len(in_flight) + len(too_old),
            timeout=30,
        )
        m = scrape(url)
        assert m[("hopline_collector_requests_partial_total", ())] == len(too_old)
        assert m[("hopline_events_duplicate_total", ())] == 1

        def rebuilt_windows() -> list[dict]:
            return windows(url, now - 10, now + 60)

        wait_until(
            "the rebuilt windows served",
            lambda: sum(w["requests"] for w in rebuilt_windows()) == len(unserved) + len(in_flight),
            timeout=60,
        )
        assert sum(w["rebuilt"] for w in rebuilt_windows()) == len(unserved)
        # the windows served before the kill are not served again (the watcher would add them twice)
        assert windows(url, now - 200, now - 60) == []
        old = windows(url, now - 700, now - 500)  # the requests begun before: counted, from what came
        assert sum(w["requests"] for w in old) == len(too_old) and sum(w["rebuilt"] for w in old) == 0
