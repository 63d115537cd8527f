"""Restarts that remember (issue 34, item 3): a restarted ``hopline watch --follow`` replays the
store's open hour, so every incident on its horizon opens again; what it already sent resolved
must not page again, and no resend may put a stale firing version over a resolve.

The sender is checked against a local HTTP server recording each POST to ``/api/v2/alerts``
(``support.alertmanager.Webhook`` takes any path); the restart runs the real CLI twice against a
real Alertmanager (Debian's prometheus-alertmanager) whose webhook records what would page, and
counts the firing alerts Alertmanager received (its own ``alertmanager_alerts_received_total``).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson
import polars as pl
import pytest
from hopline.analyzer.findings.model import Shift
from hopline.analyzer.live.alertmanager import AlertSender, payload
from hopline.analyzer.live.incidents import Incident
from hopline.analyzer.live.watch import STATE_NAME, SentState
from hopline.middleware.contract.units import to_epoch
from support.alertmanager import ALERTMANAGER, Webhook, alertmanager_with_webhook
from support.cli import hopline
from support.servers import wait_until
from support.synth import StageShift, generate, write_ndjson

ONSET = to_epoch("2026-01-05T10:25:00Z")
# two replicas at 20 requests/s for 7 minutes; queue x3 on r2 from 3:00 to 5:00 (test_live_watch's)
RISE = StageShift("queue", 3.0, at_s=180, until_s=300, scope={"replica": "r2"})
SHORT = ("--horizon", "4m", "--recent", "2m", "--poll", "0.2s")


def incident(state: str = "firing") -> Incident:
    """A queue rise on r2 from 10:25 (resolved: at 10:28)."""
    finding = Shift(
        summary="queue time tripled at 10:25 on replica r2", stage="queue", scope={"replica": "r2"},
        statistic="p50", at=ONSET, before_ms=40.1, after_ms=121.0, factor=3.017, z=9.0,
        affected_requests=310, impact_s=25.1,
    )  # fmt: skip
    key = ("HoplineShift", "queue", (("replica", "r2"),), "up")
    made = Incident(key, finding, ONSET, ONSET + 20, ONSET + 20, "critical", 0.21, ["s1-30011"])
    if state == "resolved":
        made.state, made.ends_at, made.ended = "resolved", ONSET + 180, "came back"
    return made


def posted(receiver: Webhook) -> list[str]:
    """The status of each alert POSTed so far, in order (``endsAt``: resolved)."""
    return ["resolved" if a.get("endsAt") else "firing" for body in receiver.notifications for a in body]


def test_a_resend_of_the_old_firing_version_never_lands_after_the_resolve():
    receiver = Webhook()  # records the bodies of POST /api/v2/alerts
    sender = AlertSender([receiver.url.removesuffix("/hook")], resend_s=3600.0).start()
    firing, resolved = payload(incident()), payload(incident("resolved"))
    try:
        sender.update([firing])
        wait_until("the firing post", lambda: posted(receiver) == ["firing"])
        # the resender's periodic resend (AlertSender._resend): it copies the firing alerts...
        with sender.lock:
            copied = list(sender.firing.values())
        sender.update([resolved])  # ... the incident resolves meanwhile ...
        wait_until("the resolved post", lambda: posted(receiver) == ["firing", "resolved"])
        for target in sender.targets:  # ... and it puts its copy after the resolve
            target.put(copied)
        sender.update([firing])  # and the same old version handed over again (a replay)
        time.sleep(0.5)  # posts go out within milliseconds: give a wrong one time to arrive
    finally:
        sender.close()
        receiver.close()
    # before: ['firing', 'resolved', 'firing'] — Alertmanager would then hold it firing for its
    # resolve_timeout (5 min) and page again; the resolve (same startsAt) beats the old firing
    assert posted(receiver) == ["firing", "resolved"]
    assert not sender.firing  # and the resender has nothing left to resend
    # a new onset after the resolve is a new incident: it fires
    sender = AlertSender([receiver.url.removesuffix("/hook")])
    sender.update([resolved])
    later = payload(incident()) | {"startsAt": "2026-01-05T10:40:00Z"}
    sender.update([later])
    assert [a.get("endsAt") for a in sender.targets[0].pending.values()] == [None]


def test_a_corrupt_state_file_is_said_and_ignored(tmp_path):
    said: list[str] = []
    path = tmp_path / STATE_NAME
    path.write_text('{"version": 1, "alerts": [{"labels": ')
    state = SentState.load(path, warn=said.append)
    assert not state.sent and len(said) == 1 and str(path) in said[0]
    state.record([payload(incident("resolved"))])  # and it is written anew, atomically
    assert SentState.load(path).holds_back(payload(incident()))
    assert [p.name for p in tmp_path.iterdir()] == [STATE_NAME]  # no temporary file left


def received_firing(url: str) -> float:
    """Firing alerts Alertmanager received so far (its own counter, every API version)."""
    metrics = httpx.get(url + "/metrics", timeout=5).text
    return sum(
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("alertmanager_alerts_received_total{") and 'status="firing"' in line
    )


@pytest.mark.skipif(not Path(ALERTMANAGER).exists(), reason=f"no {ALERTMANAGER}")
def test_a_restarted_watch_never_pages_again_for_what_it_resolved(tmp_path):
    events = generate(duration_s=420, rate=20, seed=7, replicas=("r1", "r2"), incidents=[RISE]).sort("ts")
    store = tmp_path / "store"
    sink = write_ndjson(events.filter(pl.col("ts") < events["ts"].min() + 250), store / "events.ndjson")
    with alertmanager_with_webhook(tmp_path) as (am, webhook):
        first = subprocess.Popen(
            [sys.executable, "-m", "hopline.middleware.cli", "watch", "--follow", str(store), *SHORT,
             "--alertmanager", am.url],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            wait_until("the firing notification", lambda: webhook.alerts("firing"), timeout=60, interval=0.2)
            with open(sink, "ab") as f:  # the rest of the log: the queue comes back at 5:00
                events.filter(pl.col("ts") >= events["ts"].min() + 250).drop("attrs").write_ndjson(f)
            wait_until("the resolved notification", lambda: webhook.alerts("resolved"), timeout=60, interval=0.2)
        finally:
            first.send_signal(signal.SIGTERM)  # stopped as systemd stops it
            first.wait(timeout=30)
        remembered = orjson.loads((store / STATE_NAME).read_bytes())["alerts"]
        assert [(a["labels"]["replica"], a["status"], a["startsAt"]) for a in remembered] == [
            ("r2", "resolved", "2026-01-05T10:03:00Z")
        ]
        notified, received = len(webhook.notifications), received_firing(am.url)
        assert received >= 1

        # the same store, the same (default) state file: the replay finds the incident again
        second = hopline("watch", "--follow", str(store), *SHORT, "--alertmanager", am.url, "--until-quiet", "2s")
        assert second.returncode == 0, second.stderr
        printed = second.stdout.splitlines()
        # the firing version is held back (never said FIRING: it is not sent), the resolve is sent again
        assert [line.split("] ")[1].split(" HoplineShift")[0] for line in printed] == [
            "NOT SENT AGAIN (sent resolved before this restart)",
            "RESOLVED",
        ]
        time.sleep(3.0)  # Alertmanager's group_wait and group_interval are 1 s: what pages has paged
        # before: 8 more firing versions received (the replay's steps while it fired: 8 in the
        # first run too) and 2 more notifications, a page again then its resolve; now none:
        # only the resolve is sent again (harmless: it already ended, nothing new is notified)
        assert received_firing(am.url) == received
        assert len(webhook.notifications) == notified
        assert [a["status"]["state"] for a in am.alerts()] in ([], ["resolved"])
