"""The Alertmanager v2 client against a real Alertmanager (Debian's prometheus-alertmanager),
whose webhook receiver is a local HTTP server: delivery, resolve, retries while it is down."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import httpx
from dataclasses import replace

from hopline.analyzer.findings.model import Shift
from hopline.analyzer.live.alertmanager import AlertSender, payload, scope_label
from hopline.analyzer.live.incidents import Incident
from hopline.middleware.contract.rules import side_of
from hopline.middleware.contract.units import to_epoch
from support.alertmanager import Alertmanager, Webhook, alertmanager_with_webhook
from support.servers import closed_port_url, wait_until

SUMMARY = "queue time tripled at 10:25 on replica r2 (p50 40.1 → 121 ms); prefill and decode unchanged"


ONSET = to_epoch("2026-01-05T10:25:00Z")


def incident(state: str = "firing", **kw: object) -> Incident:
    """An incident of a queue rise on r2 (resolved: at 10:28, back near its level)."""
    finding = Shift(
        summary=SUMMARY, stage="queue", scope={"replica": "r2"}, statistic="p50", at=ONSET,
        before_ms=40.1, after_ms=121.0, factor=3.017, z=9.0, affected_requests=310, impact_s=25.1,
    )  # fmt: skip
    key = ("HoplineShift", "queue", (("replica", "r2"),), "up")
    made = Incident(key, finding, ONSET, ONSET + 20, ONSET + 20, "critical", 0.21, ["s1-30011", "s1-30017", "s1-30002"])
    if state == "resolved":
        made.state, made.ends_at, made.ended = "resolved", ONSET + 180, "queue back near its level before (40.1 ms)"
    for name, value in kw.items():
        setattr(made, name, value)
    return made


def test_an_incident_as_an_alert():
    alert = payload(incident(), store="/var/lib/hopline")
    assert alert["labels"] == {
        "alertname": "HoplineShift",
        "severity": "critical",
        "direction": "up",
        "side": "engine",
        "stage": "queue",
        "replica": "r2",
    }
    assert alert["annotations"]["summary"] == SUMMARY
    assert alert["annotations"]["examples"] == "s1-30011 s1-30017 s1-30002"
    assert alert["annotations"]["timeline"] == "hopline timeline s1-30011 /var/lib/hopline"
    assert "factor=3.017" in alert["annotations"]["evidence"]
    assert "share_of_users_time_since_onset=21.0%" in alert["annotations"]["evidence"]
    assert alert["startsAt"] == "2026-01-05T10:25:00Z" and "endsAt" not in alert
    resolved = payload(incident("resolved"))
    assert resolved["endsAt"] == "2026-01-05T10:28:00Z"
    assert resolved["labels"] == alert["labels"]  # the same alert for Alertmanager
    # the resolved notification says what the firing one said, and how it ended
    assert resolved["annotations"]["summary"] == (
        SUMMARY + "; resolved at 10:28:00: queue back near its level before (40.1 ms)"
    )


def test_the_resolved_alert_keeps_the_sentence_it_paged_with():
    fired = incident()
    newer = replace(fired.finding, summary="queue time rose 2.6× at 10:24 on replica r2 (p90 ...)", at=ONSET - 60)
    fired.finding, fired.onset = newer, ONSET - 60
    fired.state, fired.ends_at, fired.ended = "resolved", ONSET + 180, "came back"
    alert = payload(fired)
    assert alert["annotations"]["summary"].startswith(SUMMARY + "; resolved at 10:28:00")
    assert alert["startsAt"] == "2026-01-05T10:25:00Z"  # the onset it paged with
    assert "factor=3.017" in alert["annotations"]["evidence"]


def test_a_side_owns_each_stage_and_pitfall():
    assert [side_of(s) for s in ("client_delay", "connect", "network", "gateway", "queue", "decode")] == [
        "client", "client", "network", "gateway", "engine", "engine",
    ]  # fmt: skip
    assert side_of("retry") == "client" and side_of("upstream_network") == "network"
    assert payload(incident(late="client"))["labels"]["side"] == "client"


def test_scope_keys_become_label_names_that_never_clash_with_hoplines_own():
    assert scope_label("gateway_replica") == "gateway_replica"
    assert scope_label("k8s.pod-name") == "k8s_pod_name"
    assert scope_label("stage") == "scope_stage"
    assert scope_label("1st") == "_1st"


def test_the_alert_reaches_the_webhook_with_its_sentence_then_resolves(tmp_path):
    with alertmanager_with_webhook(tmp_path) as (am, webhook):
        sender = AlertSender([am.url]).start()
        try:
            sender.update([payload(incident())])
            firing = wait_until("the firing notification", lambda: webhook.alerts("firing"), timeout=60)
            assert firing[0]["labels"]["replica"] == "r2" and firing[0]["labels"]["stage"] == "queue"
            assert firing[0]["annotations"]["summary"] == SUMMARY
            assert firing[0]["startsAt"].startswith("2026-01-05T10:25:00")
            sender.update([payload(incident("resolved"))])
            resolved = wait_until("the resolved notification", lambda: webhook.alerts("resolved"), timeout=60)
            assert resolved[0]["labels"] == firing[0]["labels"]
            assert resolved[0]["endsAt"].startswith("2026-01-05T10:28:00")
        finally:
            sender.close()
        assert sender.stats.sent[am.url] == 2 and not sender.stats.failures


def test_alertmanager_down_for_a_while_the_alert_still_arrives_and_the_retries_are_counted(tmp_path):
    webhook = Webhook()
    am = Alertmanager(tmp_path, webhook.url)
    am.start()
    am.stop()  # it ran, and is down now
    sender = AlertSender([am.url], backoff_s=0.2, max_backoff_s=1.0).start()
    try:
        sender.update([payload(incident())])
        wait_until("three failed posts", lambda: sender.stats.failures.get(am.url, 0) >= 3, timeout=60)
        assert sender.queue_length() == 1  # still waiting, not dropped
        am.start()
        firing = wait_until("the firing notification", lambda: webhook.alerts("firing"), timeout=60)
        assert firing[0]["annotations"]["summary"] == SUMMARY
        assert sender.stats.retries[am.url] >= 3  # every post after the first failure was a retry
        assert sender.stats.sent[am.url] == 1
        wait_until("an empty queue", lambda: sender.queue_length() == 0, timeout=10)
        assert sender.stats.last_error[am.url].startswith("ConnectError")
    finally:
        sender.close()
        am.stop()
        webhook.close()


def test_several_alertmanagers_each_get_the_alert_and_a_dead_one_blocks_nothing(tmp_path):
    dead = closed_port_url()
    with alertmanager_with_webhook(tmp_path) as (am, webhook):
        sender = AlertSender([dead, am.url], backoff_s=0.2, max_backoff_s=1.0).start()
        try:
            sender.update([payload(incident())])
            wait_until("the firing notification", lambda: webhook.alerts("firing"), timeout=60)
            wait_until("failed posts to the dead one", lambda: sender.stats.failures.get(dead, 0) >= 2)
            held = httpx.get(am.url + "/api/v2/alerts", timeout=5).json()
            assert [a["labels"]["replica"] for a in held] == ["r2"]
            assert sender.stats.sent[am.url] == 1 and am.url not in sender.stats.failures
        finally:
            sender.close(flush_s=0)


def test_a_firing_alert_is_resent_on_schedule(tmp_path):
    with alertmanager_with_webhook(tmp_path) as (am, webhook):
        sender = AlertSender([am.url], resend_s=0.5).start()
        try:
            sender.update([payload(incident())])
            wait_until(
                "three posts of one firing alert", lambda: sender.stats.sent.get(am.url, 0) >= 3, timeout=30
            )
            sender.update([payload(incident("resolved"))])
            wait_until(
                "the resolve", lambda: not am.alerts() or am.alerts()[0]["status"]["state"] != "active"
            )
            wait_until("the resolve sent", lambda: sender.queue_length() == 0)
            sent = sender.stats.sent[am.url]
            time.sleep(2.0)  # four resend periods
            assert sender.stats.sent[am.url] == sent  # resolved: no longer re-sent
        finally:
            sender.close()
        assert len(webhook.alerts("firing")) >= 1


def test_the_readmes_alertmanager_route_passes_amtool(tmp_path):
    """README "Alerts and annotations": its route example is a valid Alertmanager configuration."""
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    (route,) = [
        b for b in re.findall(r"^```yaml\n(.*?)^```", readme, re.MULTILINE | re.DOTALL) if "route:" in b
    ]
    config = tmp_path / "alertmanager.yml"
    config.write_text(route)
    check = subprocess.run(
        ["/usr/bin/amtool", "check-config", str(config)], check=False, capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert " - 3 receivers" in check.stdout  # team-chat, on-call, and "null" for the rules' mirror
