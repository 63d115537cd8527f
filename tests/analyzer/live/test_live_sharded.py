"""Beyond one collector: three real collector processes behind one sharded http sink (as in
tests/collector/test_sharding.py), one ``hopline watch --follow`` over their three stores, and a
real Alertmanager. Each request's events meet in one collector, so each store holds a third of
the requests; the watch joins the three stores into one stream, so one incident is one alert,
not three (nor one per store with a third of the evidence).

The log: two replicas at 20 requests/s for 7 minutes; queue x3 on r2 from 3:00 to 5:00.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time

import orjson
import polars as pl
from hopline.middleware.sharded_sink import ShardedHttpSink
from support.alertmanager import alertmanager_with_webhook
from support.collector import collector_process, stored_lines
from support.servers import wait_until
from support.synth import StageShift, generate

RISE = StageShift("queue", 3.0, at_s=180, until_s=300, scope={"replica": "r2"})
SHORT = ("--horizon", "4m", "--recent", "2m")


def send_sharded(events: pl.DataFrame, urls: list[str]) -> None:
    """Every event through one ``ShardedHttpSink`` over the three collectors, in event-time order."""
    sink = ShardedHttpSink(urls, capacity=200_000, batch_size=2000, flush_interval=0.05, retry_budget=120.0)
    rows = [{k: v for k, v in row.items() if v is not None} for row in events.drop("attrs").iter_rows(named=True)]
    for i in range(0, len(rows), 5000):
        sink.write(rows[i : i + 5000])
    sink.set_deadline(time.monotonic() + 180)
    sink.close()
    counts = sink.delivery_counts()
    assert counts["sent"] == len(rows) and counts["dropped_full"] == counts["dropped_sink"] == 0, counts


def test_three_sharded_collectors_and_one_watch_give_one_alert_for_one_incident(tmp_path):
    events = generate(duration_s=420, rate=20, seed=7, replicas=("r1", "r2"), incidents=[RISE]).sort("ts")
    stores = [tmp_path / f"collector-{i}" for i in range(3)]
    with contextlib.ExitStack() as stack:
        urls = [stack.enter_context(collector_process(d))[1] for d in stores]
        send_sharded(events, urls)
        wait_until(
            "every event stored",
            lambda: sum(len(stored_lines(d)) for d in stores) >= events.height,
            timeout=120,
            interval=0.5,
        )
        shares = [len({e["request_id"] for e in stored_lines(d)}) for d in stores]
        total = events["request_id"].n_unique()
        # every request in exactly one store, and each store a real share of them
        assert sum(shares) == total and min(shares) > total / 6, shares
        am, webhook = stack.enter_context(alertmanager_with_webhook(tmp_path))
        watch = subprocess.run(
            [sys.executable, "-m", "hopline.analyzer.live", *(a for d in stores for a in ("--follow", str(d))),
             *SHORT, "--json",
             "--poll", "0.2s", "--until-quiet", "3s", "--alertmanager", am.url],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert watch.returncode == 0, watch.stderr[-3000:]
        lines = [orjson.loads(x) for x in watch.stdout.splitlines()]
        firing = [x["alert"] for x in lines if not x["alert"].get("endsAt")]
        resolved = [x["alert"] for x in lines if x["alert"].get("endsAt")]
        # one incident: one alert fires (queue on r2, its onset 3:00) and the same alert resolves
        assert [a["labels"] for a in firing] == [
            {"alertname": "HoplineShift", "severity": "critical", "direction": "up", "side": "engine", "stage": "queue", "replica": "r2",
             "model": "llama-3.1-8b"}  # every request on r2 was for it (the log has one model)
        ]  # fmt: skip
        assert firing[0]["startsAt"] == "2026-01-05T10:03:00Z"
        assert [a["labels"] for a in resolved] == [firing[0]["labels"]]
        assert firing[0]["annotations"]["summary"].startswith("queue time tripled at 10:03 on replica r2")
        hooked = wait_until("the resolved notification", lambda: webhook.alerts("resolved"), timeout=90)
        assert {tuple(sorted(a["labels"].items())) for a in webhook.alerts()} == {
            tuple(sorted(firing[0]["labels"].items()))
        }
        assert hooked[0]["labels"]["replica"] == "r2"
