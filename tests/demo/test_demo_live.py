"""``hopline demo`` answers live: as the queue burst starts, the demo's watch (``hopline watch
--follow`` on the collector's store) prints the alert as Alertmanager receives it, sends it to a
real Alertmanager (Debian's prometheus-alertmanager) whose webhook gets the sentence, and resolves
it once the run is over (its ``endsAt`` no later than the run's last event, so Alertmanager
notifies the resolve at once). Content is asserted; wall-clock waits only have generous bounds.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import orjson
from hopline.demo.live import watch_argv
from support.alertmanager import alertmanager_with_webhook
from support.demo import SHIFT_SECONDS, demo_argv
from support.servers import wait_until

UNTRUSTED_RERUNS = 2  # as test_demo_scenarios: a run the demo itself distrusts is run again


def run_once(tmp_path: Path, am_url: str) -> tuple[dict, str, list[dict]]:
    out = tmp_path / "run"
    argv = demo_argv(out, SHIFT_SECONDS, "--scenario", "queue-burst", "--seed", "7", "--alertmanager", am_url)
    proc = subprocess.run(argv, capture_output=True, timeout=SHIFT_SECONDS + 240, check=False)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-4000:]
    report = orjson.loads(proc.stdout)  # stdout is still exactly the findings JSON
    lines = [orjson.loads(x) for x in (out / "alerts.log").read_bytes().splitlines()]
    return report, proc.stderr.decode(errors="replace"), lines


def label_set(alert: dict) -> tuple:
    return tuple(sorted(alert["labels"].items()))


def test_the_queue_burst_is_a_live_alert_naming_r2_that_reaches_alertmanager_and_resolves(tmp_path):
    for attempt in range(UNTRUSTED_RERUNS + 1):
        folder = tmp_path / f"attempt-{attempt}"
        folder.mkdir()
        with alertmanager_with_webhook(folder) as (am, webhook):
            report, stderr, lines = run_once(folder, am.url)
            if report["demo"]["trusted"] or attempt == UNTRUSTED_RERUNS:
                check_the_live_alert(report, stderr, lines, webhook)
                return


def check_the_live_alert(report: dict, stderr: str, lines: list[dict], webhook) -> None:
    # whatever fired (on a machine too busy for the demo's timings, the busy machine's own
    # slowness fires too) reached Alertmanager, and its resolve did, with the end the watch printed
    last = {label_set(x["alert"]): x["alert"] for x in lines}  # each alert's last version printed
    assert last and all(a.get("endsAt") for a in last.values()), f"an alert never resolved: {lines}"
    ends = {(k, a["endsAt"][:19]) for k, a in last.items()}
    wait_until(
        "every resolved notification, with the end the watch printed",
        lambda: ends <= {(label_set(a), a["endsAt"][:19]) for a in webhook.alerts("resolved")},
        timeout=90,
    )
    # the queue burst: 20 more workers of the batch job pinned to r2 -> queue time up on r2
    offline = report["findings"][0]["summary"] if report["findings"] else None
    queue = [x for x in lines if x["alert"]["labels"].get("stage") == "queue"]
    assert queue, f"no live queue alert; printed: {[x['alert']['labels'] for x in lines]}; offline: {offline}"
    firing, resolved = queue[0], queue[-1]
    labels = firing["alert"]["labels"]
    named = (labels["alertname"], labels.get("replica"), labels["direction"])
    assert named == ("HoplineShift", "r2", "up"), f"{labels}; offline first finding: {offline}"
    summary = firing["alert"]["annotations"]["summary"]
    # the sentence names the place the labels name, as the whole run's analysis does: the batch
    # job's requests are all on r2, but r2's other requests waited too (incidents._broadest_named)
    assert summary.startswith("queue time ") and "on replica r2" in summary, summary
    assert not firing["alert"].get("endsAt")
    assert firing["seconds_since_onset"] >= 0
    assert resolved["alert"].get("endsAt"), "the queue alert never resolved in the demo's printout"
    assert resolved["alert"]["labels"] == labels
    # the terminal printed it, with the seconds since onset
    assert "live alert FIRING" in stderr and "s since onset" in stderr
    # the same alert reached Alertmanager's webhook with its sentence, then its resolution did
    hooked = wait_until(
        "the firing notification",
        lambda: [a for a in webhook.alerts("firing") if a["labels"].get("stage") == "queue"],
        timeout=90,
    )
    assert hooked[0]["labels"]["replica"] == "r2"
    assert hooked[0]["annotations"]["summary"].startswith("queue time ")
    assert hooked[0]["annotations"]["timeline"].startswith("hopline timeline ")
    ended = wait_until(
        "the resolved notification",
        lambda: [a for a in webhook.alerts("resolved") if a["labels"].get("stage") == "queue"],
        timeout=90,
    )
    assert ended[0]["labels"] == hooked[0]["labels"]
    assert ended[0]["endsAt"][:19] == resolved["alert"]["endsAt"][:19]  # the end the watch printed


def test_the_demos_watch_uses_the_window_hopline_analyze_chooses_and_holds_the_whole_run(tmp_path):
    argv = watch_argv(tmp_path, 60, ["http://am1:9093", "http://am2:9093"])
    assert argv[argv.index("-m") + 2] == "hopline.analyzer.live"  # hopline watch, via the demo's launcher
    args = dict(zip(argv, argv[1:], strict=False))
    assert args["--window"] == "1s"  # hopline analyze's auto window for a 70 s log (≤ 200 windows)
    assert float(args["--horizon"].rstrip("s")) >= 2 * 70  # the whole run, before and after
    assert argv.count("--alertmanager") == 2 and argv[-1] == "http://am2:9093"
    assert args["--follow"] == str(tmp_path / "events")  # the collector's store, not the demo's own files


def test_the_closing_lines_say_what_fired_live_after_any_busy_machine_warning():
    from hopline.demo.cli import closing_lines
    from hopline.demo.orchestrate import TRUSTED_LAG_MS, DemoRun

    alert = {"labels": {"alertname": "HoplineShift", "stage": "queue", "replica": "r2"},
             "annotations": {"summary": "queue time tripled at 10:06 on replica r2"}}  # fmt: skip
    fired = ({"seconds_since_onset": 12.0, "alert": alert},
             {"seconds_since_onset": 30.0, "alert": alert | {"endsAt": "2026-01-05T10:07:00Z"}})  # fmt: skip
    lines = closing_lines(DemoRun({}, None, TRUSTED_LAG_MS * 4, None, live_alerts=fired), html=None)
    assert "too busy to trust the timings" in lines[0]
    assert lines[1] == "live: 1 alert fired while it ran, the first 12 s after its onset: queue time tripled at 10:06 on replica r2"
    # a warning that came first is not the page the closing line quotes
    standing = {"labels": {"alertname": "HoplinePitfall", "severity": "warning", "standing": "true"},
                "annotations": {"summary": "service kite-cli opens a new connection for 100% of requests"}}  # fmt: skip
    critical = {"labels": alert["labels"] | {"severity": "critical"}, "annotations": alert["annotations"]}
    both = ({"seconds_since_onset": 0.0, "alert": standing}, {"seconds_since_onset": 9.0, "alert": critical})
    lines = closing_lines(DemoRun({}, None, 3.0, None, live_alerts=both), html=None)
    assert lines[0] == (
        "live: 2 alerts fired while it ran, the first critical one 9 s after its onset: "
        "queue time tripled at 10:06 on replica r2"
    )
    quiet = closing_lines(DemoRun({}, None, 3.0, None), html=None)
    assert quiet[0] == "live: no alert fired while it ran"
