"""``hopline watch`` tried as a new user would (issue 35, the first hour, round three).

Before: a replay sent to an Alertmanager that was down printed ``FIRING`` and ``RESOLVED`` as if
paged and exited 0 (the sender's failures were counted on /metrics, said nowhere); ``--listen`` on
a port in use logged uvicorn's error from its thread and went on without a server; ``hopline demo
--alertmanager not-a-url`` started the whole stack (its watch child then refused the URL); the
README's Alertmanager route grouped a queue rise and fall on one replica into one notification
whose common summary (its Slack title) was empty; ``--until-quiet`` dated its RESOLVED line at the
event time it ran on to, past every event.
"""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path

import httpx
import pytest
from hopline.analyzer.findings.model import iso_utc
from support.alertmanager import ALERTMANAGER, Alertmanager, Webhook, alertmanager_with_webhook
from support.cli import hopline
from support.servers import closed_port_url, wait_until
from support.synth import StageShift, generate, write_ndjson

# two replicas at 20 requests/s for 7 minutes; queue x3 on r2 from 3:00 to 5:00: one alert
RISE = StageShift("queue", 3.0, at_s=180, until_s=300, scope={"replica": "r2"})
SHORT = ("--horizon", "4m", "--recent", "2m")


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    events = generate(duration_s=420, rate=20, seed=7, replicas=("r1", "r2"), incidents=[RISE]).sort("ts")
    return write_ndjson(events, tmp_path_factory.mktemp("rise") / "events.ndjson")


def test_a_replay_to_an_alertmanager_that_is_down_prints_no_firing_says_why_and_fails(log):
    dead = closed_port_url()
    run = hopline("watch", "--replay", str(log), *SHORT, "--alertmanager", dead, timeout=300)
    assert run.returncode == 1, run.stderr  # before: 0
    assert "FIRING" not in run.stdout and "RESOLVED" not in run.stdout, run.stdout  # before: both
    # each alert said as not delivered, with the reason, once while retrying and once at the end
    assert f"not delivered yet, Alertmanager {dead} did not take it (ConnectError" in run.stderr
    undelivered = [line for line in run.stderr.splitlines() if "NOT DELIVERED to any Alertmanager" in line]
    assert len(undelivered) == 2, run.stderr  # the firing version and the resolve
    assert "Connection refused" in undelivered[0] and "firing HoplineShift{" in undelivered[0]
    assert "resolved HoplineShift{" in undelivered[1]
    last = run.stderr.splitlines()[-1]
    assert last == f"hopline watch: 2 alerts reached no Alertmanager ({dead}): see above"


def test_a_replay_json_to_an_alertmanager_that_is_down_prints_no_alert(log):
    dead = closed_port_url()
    run = hopline("watch", "--replay", str(log), *SHORT, "--json", "--alertmanager", dead, timeout=300)
    assert run.returncode == 1 and run.stdout == "", run.stdout  # before: two alerts, exit 0


@pytest.mark.skipif(not Path(ALERTMANAGER).exists(), reason=f"no {ALERTMANAGER}")
def test_with_one_alertmanager_of_two_up_each_alert_is_printed_once_and_the_replay_succeeds(log, tmp_path):
    dead = closed_port_url()
    with alertmanager_with_webhook(tmp_path) as (am, webhook):
        run = hopline("watch", "--replay", str(log), *SHORT, "--alertmanager", dead, "--alertmanager", am.url,
                      timeout=300)  # fmt: skip
        wait_until("the resolved notification", lambda: webhook.alerts("resolved"), timeout=60, interval=0.2)
    assert run.returncode == 0, run.stderr
    states = [line.split("] ")[1].split(" ")[0] for line in run.stdout.splitlines()]
    assert states == ["FIRING", "RESOLVED"], run.stdout  # printed as the live one took them
    assert f"Alertmanager {dead} did not take it" in run.stderr  # the other is said, not fatal
    assert "NOT DELIVERED" not in run.stderr


def test_listen_on_a_port_in_use_is_one_line_and_exit_1(log):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = hopline("watch", "--replay", str(log), "--listen", f"127.0.0.1:{port}", timeout=120)
    assert run.returncode == 1, run.stderr  # before: 0, after the whole replay, with uvicorn's log lines
    assert run.stderr == f"hopline watch: cannot listen on 127.0.0.1:{port}: it is in use\n"
    assert run.stdout == ""


def test_the_demo_refuses_an_alertmanager_that_is_not_a_url_as_watch_does(log):
    watch = hopline("watch", "--replay", str(log), "--alertmanager", "not-a-url")
    demo = hopline("demo", "--alertmanager", "not-a-url", timeout=60)
    assert watch.returncode == demo.returncode == 2, demo.stdout + demo.stderr
    assert watch.stderr.replace("hopline watch:", "hopline demo:") == demo.stderr
    said = "hopline demo: Alertmanager URL must start with http:// or https://, got 'not-a-url'\n"
    assert demo.stderr == said


def readme_route() -> str:
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    blocks = re.findall(r"^```yaml\n(.*?)^```", readme, re.MULTILINE | re.DOTALL)
    (route,) = [b for b in blocks if "route:" in b]
    return route


@pytest.mark.skipif(not Path(ALERTMANAGER).exists(), reason=f"no {ALERTMANAGER}")
def test_the_readmes_route_never_mixes_two_summaries_in_one_notification(tmp_path):
    """The README's route as written, its receivers made one local webhook each (and group_wait /
    group_interval 1 s, the test's only other change); two alerts that differ in one label its
    grouping may leave out (a queue rise and a queue fall on r2, as hopline sends them): each
    notification holds one summary, and ``commonAnnotations.summary`` is never empty (Slack's title)."""
    route = readme_route()
    head = route[: route.index("receivers:")]
    head = head.replace("route:\n", "route:\n  group_wait: 1s\n  group_interval: 1s\n", 1)
    hook = Webhook()
    names = re.findall(r"^  - name: (\S+)", route[route.index("receivers:") :], re.MULTILINE)
    to_hook = f"    webhook_configs: [{{url: '{hook.url}'}}]\n"
    receivers = "receivers:\n" + "".join(
        f"  - name: {name}\n" + ("" if name == '"null"' else to_hook) for name in names
    )
    am = Alertmanager(tmp_path, hook.url)
    am.config.write_text(head + receivers)
    labels = {"alertname": "HoplineShift", "severity": "warning", "side": "engine", "stage": "queue",
              "replica": "r2", "model": "llama-3.1-8b"}  # fmt: skip
    alerts = [
        {"labels": labels | {"direction": "up"},
         "annotations": {"summary": "queue time tripled at 10:06 on replica r2"}},
        {"labels": labels | {"direction": "down"},
         "annotations": {"summary": "queue time fell by half at 10:09 on replica r2"}},
    ]  # fmt: skip
    try:
        am.start()
        assert httpx.post(am.url + "/api/v2/alerts", json=alerts, timeout=5).is_success
        wait_until("both alerts notified", lambda: len(hook.alerts()) >= 2, timeout=30, interval=0.2)
        time.sleep(1.5)  # a group_interval more: anything grouped late would show
    finally:
        am.stop()
        hook.close()
    for note in hook.notifications:
        summaries = {a["annotations"]["summary"] for a in note["alerts"]}
        assert len(summaries) == 1, summaries  # before: both in one (group_by left direction out)
        assert note["commonAnnotations"].get("summary") in summaries  # before: {} (a blank title)


def test_until_quiet_says_the_resolve_at_an_event_time_the_log_has(tmp_path):
    """The log stops at 4:10 while the queue rise (from 3:00) is still on: ``--until-quiet`` runs
    event time on without events until the incident resolves. Its RESOLVED line said the time it
    ran on to (10:06:30, +210 s: no event is that late); now the newest event's, 10:04:10."""
    events = generate(duration_s=420, rate=20, seed=7, replicas=("r1", "r2"), incidents=[RISE]).sort("ts")
    cut = events.filter(events["ts"] < events["ts"].min() + 250)
    write_ndjson(cut, tmp_path / "store" / "events.ndjson")
    run = hopline("watch", "--follow", str(tmp_path / "store"), *SHORT, "--state", "", "--until-quiet", "2s",
                  "--poll", "0.2s", timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr
    firing, resolved = run.stdout.splitlines()
    assert firing.startswith("[2026-01-05T10:03:40Z +40s since onset] FIRING HoplineShift{")
    newest = iso_utc(cut["ts"].max())
    assert newest == "2026-01-05T10:04:10Z"
    # before: [2026-01-05T10:06:30Z +210s since onset]
    assert resolved.startswith(f"[{newest} +70s since onset] RESOLVED HoplineShift{{"), resolved
