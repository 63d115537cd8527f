"""``hopline watch`` as a user runs it: --replay prints the alerts; --follow tails a growing
NDJSON folder and serves GET /v1/findings and /metrics while it runs."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import orjson
import polars as pl
from hopline.analyzer.live.metrics import FINDING
from hopline.middleware.contract.units import to_epoch
from support.cli import hopline
from support.servers import closed_port_url, free_port, wait_until
from support.synth import StageShift, generate, write_ndjson

# two replicas at 20 requests/s for 7 minutes; queue x3 on r2 from 3:00 to 5:00
RISE = StageShift("queue", 3.0, at_s=180, until_s=300, scope={"replica": "r2"})
SHORT = ("--horizon", "4m", "--recent", "2m")
# the demo's watch for a 60 s run (demo/live.py): 1 s windows, a horizon of twice the run
DEMO = ("--window", "1s", "--horizon", "140s", "--recent", "70s", "--settle", "1s", "--lateness", "1s",
        "--hold", "5s")  # fmt: skip


def log(seed: int = 7) -> pl.DataFrame:
    return generate(duration_s=420, rate=20, seed=seed, replicas=("r1", "r2"), incidents=[RISE]).sort("ts")


def test_replay_prints_the_alert_with_the_seconds_since_onset_and_its_end(tmp_path):
    path = write_ndjson(log(), tmp_path / "events.ndjson")
    run = hopline("watch", "--replay", str(path), *SHORT, timeout=300)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith(
        "[2026-01-05T10:03:40Z +40s since onset] FIRING HoplineShift{severity=critical, direction=up, side=engine, "
        "stage=queue, replica=r2, model=llama-3.1-8b}: queue time tripled at 10:03 on replica r2 (p50 "
    )
    assert lines[1].startswith("[2026-01-05T10:05:20Z +140s since onset] RESOLVED HoplineShift{")
    # the resolved notification says what the firing one said (onset, statistic, factor), and how it ended
    assert lines[1].split("}: ", 1)[1].startswith(lines[0].split("}: ", 1)[1] + "; resolved at 10:05:00: came back")
    assert len(lines) == 2
    assert "8,400 requests" in run.stderr and "1 incident" in run.stderr


def test_replay_json_is_the_alert_alertmanager_receives(tmp_path):
    path = write_ndjson(log(), tmp_path / "events.ndjson")
    run = hopline("watch", "--replay", str(path), *SHORT, "--json", timeout=300)
    assert run.returncode == 0, run.stderr
    first, last = (orjson.loads(line) for line in run.stdout.splitlines())
    assert first["seconds_since_onset"] == 40.0  # found at +20 s, held 2 windows
    assert (
        first["alert"]["labels"]["replica"] == "r2" and first["alert"]["startsAt"] == "2026-01-05T10:03:00Z"
    )
    assert first["alert"]["annotations"]["timeline"].endswith(str(path))
    assert last["alert"]["endsAt"] == "2026-01-05T10:05:00Z"


def test_bad_input_is_one_line():
    run = hopline("watch")
    assert run.returncode == 2 and "give --replay PATH or --follow PATH" in run.stderr
    run = hopline("watch", "--replay", "/nonexistent/x.ndjson")
    assert run.returncode == 2 and "no such file or folder" in run.stderr
    run = hopline("watch", "--replay", "/tmp", "--listen", "nope")
    assert run.returncode == 2 and "--listen wants HOST:PORT" in run.stderr


def test_follow_serves_findings_and_metrics_while_the_incident_runs(tmp_path):
    events = log()
    folder = tmp_path / "store"
    folder.mkdir()
    sink = folder / "events.ndjson"
    first = events.filter(pl.col("ts") < events["ts"].min() + 250)
    write_ndjson(first, sink)
    port = free_port()
    dead = closed_port_url()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hopline.middleware.cli", "watch", "--follow", str(folder), *SHORT,
         "--listen", f"127.0.0.1:{port}", "--poll", "0.2s", "--alertmanager", dead],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:

        def firing() -> list[dict]:
            found = httpx.get(url + "/v1/findings", timeout=5).json()["findings"]
            return [f for f in found if f["state"] == "firing"]

        (finding,) = wait_until(
            "a firing finding", firing, timeout=240, interval=0.5, ignore=(httpx.HTTPError,)
        )
        assert (finding["stage"], finding["scope"], finding["onset"]) == (
            "queue",
            {"replica": "r2"},
            "2026-01-05T10:03:00Z",
        )
        assert finding["first_seen"] == "2026-01-05T10:03:40Z" and finding["summary"].startswith(
            "queue time tripled"
        )
        metrics = httpx.get(url + "/metrics", timeout=5).text
        line = next(x for x in metrics.splitlines() if x.startswith(FINDING + "{"))
        assert 'kind="shift"' in line and 'stage="queue"' in line and 'scope_key="replica"' in line
        assert 'scope_value="r2"' in line and 'direction="up"' in line
        assert 2.5 <= float(line.split()[-1]) <= 3.5  # the factor
        # the Alertmanager given is down: the sender retries, and says so
        wait_until(
            "send failures counted",
            lambda: (
                f'hopline_live_alert_send_failures_total{{alertmanager="{dead}"}} '
                in httpx.get(url + "/metrics").text
            ),
        )
        with open(sink, "ab") as f:  # the rest of the log arrives
            events.filter(pl.col("ts") >= events["ts"].min() + 250).drop("attrs").write_ndjson(f)

        def resolved() -> list[dict]:
            found = httpx.get(url + "/v1/findings", params={"since": "2026-01-05T10:04:00Z"}).json()[
                "findings"
            ]
            return [f for f in found if f["state"] == "resolved"]

        (done,) = wait_until("the resolve", resolved, timeout=240, interval=0.5)
        assert done["ends_at"] == "2026-01-05T10:05:00Z"
        later = httpx.get(url + "/v1/findings", params={"since": "2026-01-05T11:00:00Z"}).json()
        assert later["findings"] == []  # resolved before that
        bad = httpx.get(url + "/v1/findings", params={"since": "yesterday"})
        assert bad.status_code == 400 and "not a time" in bad.json()["error"]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    # nothing reached an Alertmanager: no FIRING on stdout, the alert said on stderr as undelivered
    out, err = proc.stdout.read(), proc.stderr.read()
    assert "FIRING" not in out, out
    assert f"not delivered yet, Alertmanager {dead} did not take it (ConnectError" in err, err[-2000:]
    assert "retrying: firing HoplineShift{" in err, err[-2000:]


def test_follow_until_quiet_on_traffic_that_just_ended_resolves_at_alertmanager_at_once(tmp_path):
    """What the demo's watch does (its settings): 70 s of traffic up to a moment ago (event time =
    the wall clock), queue x3 on r2 from 40 s, still on when it stops; the watch sees nothing new, lets event time run on and
    resolves. Its ``endsAt`` is no later than the last event, so a real Alertmanager (whose clock
    is the wall clock) notifies the resolve at once, not once event time's end is reached there
    (minutes of drained event time later)."""
    from support.alertmanager import alertmanager_with_webhook

    rise = StageShift("queue", 3.0, at_s=40, scope={"replica": "r2"})  # no end
    events = generate(duration_s=70, rate=30, seed=7, replicas=("r1", "r2"), incidents=[rise])
    events = events.with_columns(pl.col("ts") + (time.time() - 2 - events["ts"].max()))  # ends now
    folder = tmp_path / "store"
    folder.mkdir()
    write_ndjson(events.sort("ts"), folder / "events.ndjson")
    with alertmanager_with_webhook(tmp_path) as (am, webhook):
        watch = subprocess.run(
            [sys.executable, "-m", "hopline.analyzer.live", "--follow", str(folder), *DEMO, "--json",
             "--poll", "0.2s", "--until-quiet", "2s", "--alertmanager", am.url],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert watch.returncode == 0, watch.stderr[-3000:]
        lines = [orjson.loads(x)["alert"] for x in watch.stdout.splitlines()]
        queue = [a for a in lines if a["labels"].get("stage") == "queue"]
        assert [bool(a.get("endsAt")) for a in queue] == [False, True], lines
        assert queue[1]["labels"] == queue[0]["labels"] and queue[0]["labels"]["replica"] == "r2"
        assert to_epoch(queue[1]["endsAt"]) <= events["ts"].max()  # not in Alertmanager's future
        hooked = wait_until(
            "the resolved notification",
            lambda: [a for a in webhook.alerts("resolved") if a["labels"].get("stage") == "queue"],
            timeout=60,
        )
    assert hooked[0]["labels"] == queue[0]["labels"]
    assert hooked[0]["annotations"]["summary"] == queue[1]["annotations"]["summary"]  # as it resolved
    assert "on replica r2" in hooked[0]["annotations"]["summary"]
