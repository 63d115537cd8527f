"""``hopline watch --collector URL…`` (issue 36, route b): three real collector processes fed by
the sharded sink, one watcher that reaches them over HTTP only (their window summaries, GET
/v1/windows, with the collectors' read token) and a real Alertmanager with a webhook receiver.

The log: two replicas at 20 requests/s for 10 minutes; queue x3 on r2 from 3:00 to 6:00. The
events are sent while the watcher runs, a minute of event time at a time. One incident is one
alert: fired once (queue on r2, onset 3:00, the shift detector's sentence), resolved once; the
same stage, scope and onset as the request-level detector on the whole log (``find_shifts``).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time

import httpx
import orjson
import polars as pl
import pytest
from hopline.analyzer.findings.shifts.detector import find_shifts
from hopline.analyzer.live.windowed import STALL_S, CollectorFeed
from hopline.analyzer.timelines import timelines
from hopline.collector.windows import WindowSummaries
from hopline.middleware.sharded_sink import ShardedHttpSink
from support.alertmanager import alertmanager_with_webhook
from support.cli import hopline
from support.collector import collector_process
from support.servers import wait_until
from support.synth import StageShift, generate

RISE = StageShift("queue", 3.0, at_s=180, until_s=360, scope={"replica": "r2"})
SHORT = ("--horizon", "4m", "--recent", "2m")
TOKENS = ("--token", "write-secret", "--read-token", "read-secret")
# model: every request on r2 was for it (the log has one model), so the alert carries it as the
# --follow watcher's does (test_live_sharded.py)
LABELS = {
    "alertname": "HoplineShift", "severity": "critical", "direction": "up", "side": "engine",
    "stage": "queue", "replica": "r2", "model": "llama-3.1-8b",
}  # fmt: skip


@pytest.fixture(scope="module")
def events() -> pl.DataFrame:
    return generate(duration_s=600, rate=20, seed=7, replicas=("r1", "r2"), incidents=[RISE]).sort("ts")


def rows_of(events: pl.DataFrame) -> list[list[dict]]:
    """The events as the sink takes them, a minute of event time a batch."""
    minute = (pl.col("ts") // 60).alias("_minute")
    parts = events.drop("attrs").with_columns(minute).partition_by("_minute", maintain_order=True)
    return [
        [{k: v for k, v in r.items() if v is not None and k != "_minute"} for r in p.to_dicts()]
        for p in parts
    ]


def watcher(urls: list[str], alertmanager: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "hopline.analyzer.live", *(a for u in urls for a in ("--collector", u)),
         "--collector-token", "read-secret", *SHORT, "--json", "--poll", "0.2s", "--until-quiet", "20s",
         "--alertmanager", alertmanager],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def check_one_alert(out: str, webhook) -> None:
    lines = [orjson.loads(x) for x in out.splitlines()]
    firing = [x["alert"] for x in lines if not x["alert"].get("endsAt")]
    resolved = [x["alert"] for x in lines if x["alert"].get("endsAt")]
    assert [a["labels"] for a in firing] == [LABELS], out[-3000:]
    assert firing[0]["startsAt"] == "2026-01-05T10:03:00Z"
    assert firing[0]["annotations"]["summary"].startswith("queue time tripled at 10:03 on replica r2 (p50 ")
    assert "prefill and decode unchanged" in firing[0]["annotations"]["summary"]
    assert [a["labels"] for a in resolved] == [LABELS]
    assert resolved[0]["endsAt"] == "2026-01-05T10:06:00Z"  # the burst's end, as the windows saw it
    wait_until("the resolved notification", lambda: webhook.alerts("resolved"), timeout=90)
    assert {tuple(sorted(a["labels"].items())) for a in webhook.alerts()} == {tuple(sorted(LABELS.items()))}
    assert [a["status"] for a in webhook.alerts()].count("firing") >= 1


def finish(sink: ShardedHttpSink, watch: subprocess.Popen, webhook) -> str:
    """Every event delivered, the watcher done by itself with one alert (``check_one_alert``):
    its stderr."""
    sink.set_deadline(time.monotonic() + 120)
    sink.close()
    assert sink.delivery_counts()["dropped_sink"] == 0
    out, err = watch.communicate(timeout=600)
    assert watch.returncode == 0, err[-3000:]
    check_one_alert(out, webhook)
    return err


def test_one_watch_over_three_collectors_gives_one_alert_fired_and_resolved_once(tmp_path, events):
    offline = find_shifts(timelines(events.lazy()).collect(), 10.0, ("replica", "model", "service"))
    assert (offline[0].stage, offline[0].scope, offline[0].at) == ("queue", {"replica": "r2"}, 1767607380.0)
    with contextlib.ExitStack() as stack:
        urls = [stack.enter_context(collector_process(tmp_path / f"c{i}", *TOKENS))[1] for i in range(3)]
        am, webhook = stack.enter_context(alertmanager_with_webhook(tmp_path))
        watch = watcher(urls, am.url)
        stack.callback(lambda: watch.poll() is None and watch.kill())
        sink = ShardedHttpSink(
            urls, capacity=200_000, batch_size=2000, flush_interval=0.05, token="write-secret"
        )
        for batch in rows_of(events):
            sink.write(batch)
            time.sleep(0.5)
        err = finish(sink, watch, webhook)
        assert "not read" not in err, err[-2000:]  # every collector answered every poll


def test_a_collector_killed_and_restarted_mid_run_the_alert_still_fires(tmp_path, events):
    """Collector 1 is killed before the rise's minutes are sent and restarted on its port (its
    windows not yet served are lost, said by the watcher on stderr; the sink retries what it
    could not deliver): the rise is still one alert, fired and resolved once."""
    with contextlib.ExitStack() as stack:
        dirs = [tmp_path / f"c{i}" for i in range(3)]
        procs, urls = [], []
        for d in dirs:
            proc, url = stack.enter_context(collector_process(d, *TOKENS))
            procs.append(proc)
            urls.append(url)
        am, webhook = stack.enter_context(alertmanager_with_webhook(tmp_path))
        watch = watcher(urls, am.url)
        stack.callback(lambda: watch.poll() is None and watch.kill())
        sink = ShardedHttpSink(
            urls,
            capacity=200_000,
            batch_size=2000,
            flush_interval=0.05,
            token="write-secret",
            retry_budget=120.0,
        )
        batches = rows_of(events)
        for n, batch in enumerate(batches):
            if n == 2:  # 2:00 of event time: collector 1 goes down, and comes back on its port
                time.sleep(3)
                procs[1].kill()
                procs[1].wait(timeout=10)
                port = int(urls[1].rsplit(":", 1)[1])
                stack.enter_context(collector_process(dirs[1], *TOKENS, port=port))
            sink.write(batch)
            time.sleep(0.5)
        sink.set_deadline(time.monotonic() + 120)
        sink.close()
        out, err = watch.communicate(timeout=600)
        assert watch.returncode == 0, err[-3000:]
        assert f"collector {urls[1]} not read" in err  # said once it was down
        check_one_alert(out, webhook)


def test_a_collector_paused_while_the_rise_is_sent_is_waited_for(tmp_path, events):
    """Collector 1 is stopped (SIGSTOP: a stalled process, a starved host) while the rise's first
    minutes are sent, and goes on 6 s later: the others serve those windows first, and the watcher
    waits for collector 1's part of each before it steps on them. Stepping on two thirds of the
    requests said "arrivals on r2 9.2/s → 3.8/s" and a prefill rise in the alert (CI, stop 48)."""
    with contextlib.ExitStack() as stack:
        procs, urls = [], []
        for i in range(3):
            proc, url = stack.enter_context(collector_process(tmp_path / f"c{i}", *TOKENS))
            procs.append(proc)
            urls.append(url)
        stack.callback(lambda: procs[1].poll() is None and procs[1].send_signal(signal.SIGCONT))
        am, webhook = stack.enter_context(alertmanager_with_webhook(tmp_path))
        watch = watcher(urls, am.url)
        stack.callback(lambda: watch.poll() is None and watch.kill())
        sink = ShardedHttpSink(
            urls, capacity=200_000, batch_size=2000, flush_interval=0.05, token="write-secret",
            retry_budget=120.0,
        )  # fmt: skip
        for n, batch in enumerate(rows_of(events)):
            if n == 3:  # 3:00 of event time, the rise's start
                time.sleep(2)  # what was sent is in
                procs[1].send_signal(signal.SIGSTOP)
                paused = time.monotonic()
            if n == 5:
                time.sleep(max(0.0, paused + 6 - time.monotonic()))
                procs[1].send_signal(signal.SIGCONT)
            sink.write(batch)
            time.sleep(0.5)
        finish(sink, watch, webhook)


def test_the_watcher_steps_on_windows_every_collector_served_and_waits_for_no_idle_one():
    """``CollectorFeed.ready_start``: the newest window the collector furthest behind served; a
    collector that has served nothing yet holds the steps back, for ``STALL_S`` at most; one down,
    or whose newest window has not moved for ``STALL_S`` while another's did, is not waited for."""
    collectors = [
        WindowSummaries(window=10.0, window_keep=3600.0, window_by=("replica",), window_scope_cap=8, window_settle=0.0)
        for _ in range(3)
    ]  # fmt: skip
    feed = CollectorFeed(urls=["c0", "c1", "c2"])

    def serve(i: int, *starts: float) -> None:
        for start in starts:
            collectors[i].add(start, {"replica": "r1"}, {"queue": 0.01}, "ok")
        feed._merge(feed.urls[i], collectors[i].answer(now=1e9))

    assert feed.ready_start() is None  # nothing served
    serve(0, 1000.0, 1010.0, 1020.0)
    serve(1, 1000.0, 1010.0)
    assert feed.ready_start() is None  # c2 has served nothing yet: waited for
    feed._first_window -= STALL_S + 1  # c2 has served nothing for STALL_S: idle, not waited for
    assert feed.ready_start() == 1010.0  # c1's newest
    serve(2, 1000.0)  # c2 serves: waited for again
    assert feed.ready_start() == 1000.0
    feed.down.add("c2")  # down (said on stderr): not waited for
    assert feed.ready_start() == 1010.0
    feed.down.clear()
    feed.moved["c2"] -= STALL_S + 1  # its newest has not moved since, while c0's is newer: idle
    feed.moved["c1"] -= STALL_S - 5  # behind and moving: waited for
    assert feed.ready_start() == 1010.0
    serve(1, 1020.0)
    serve(2, 1020.0)
    assert feed.ready_start() == 1020.0  # all at the newest
    feed.moved = dict.fromkeys(feed.moved, -1e9)  # none moved for long, but none is behind
    assert feed.ready_start() == 1020.0


def test_bad_collector_input_is_one_line(tmp_path):
    run = hopline("watch", "--collector", "c1:9400")
    assert run.returncode == 2 and "--collector wants a collector's base URL" in run.stderr
    run = hopline("watch", "--collector", "http://127.0.0.1:9", "--follow", str(tmp_path))
    assert run.returncode == 2 and "(one of them)" in run.stderr
    run = hopline("watch", "--collector", "http://127.0.0.1:9", "--sample", "0.5")
    assert run.returncode == 2 and "--sample is for --replay and --follow" in run.stderr


def test_collectors_with_another_window_stop_with_one_line(tmp_path):
    """The watcher's steps are the collectors' windows: a --window that differs is said, exit 1."""
    events = generate(duration_s=30, rate=5, seed=1).drop("attrs")
    body = b"".join(
        orjson.dumps({k: v for k, v in r.items() if v is not None}) + b"\n" for r in events.to_dicts()
    )
    with collector_process(tmp_path / "c", "--window", "5s") as (_, url):
        r = httpx.post(
            url + "/v1/events", content=body, headers={"Content-Type": "application/x-ndjson"}, timeout=30
        )
        assert r.status_code == 200, r.text
        wait_until(
            "windows served", lambda: httpx.get(url + "/v1/windows", timeout=5).json()["windows"], timeout=60
        )
        run = hopline("watch", "--collector", url, "--poll", "0.2s", timeout=60)
    assert run.returncode == 1
    assert "the collectors keep 5 s windows: run hopline watch with --window 5s" in run.stderr
