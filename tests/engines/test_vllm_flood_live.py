"""A real vLLM flood followed live, with the real confounders, into a real Alertmanager.

What users run (/work/shared/repro/README.md, ``vllm-flood-live-2026-12-04``): the stock tiny
model as ``.ci`` builds it (no dummy weights, vLLM's default stream interval: the API server, not
the engine, may saturate first), ``--max-num-seqs 4``, hopline's engine middleware on it
(``HOPLINE_REPLICA=r1``) and hopline's instrumented client, on a loaded host (two ``nice -n 5``
CPU burners for the whole traffic). Two chat users (service ``chat``) stream ``max_tokens=48``
answers with a random pause (mean 0.2 s); after ``STEADY_S`` (and ``MIN_SIDE`` answers) a batch
job (service ``batch``) adds 12 back-to-back streams of ``max_tokens=160`` for ``FLOOD_S``, then
the chat goes on alone for ``AFTER_S``. ``hopline watch --follow EVENTS --alertmanager URL --json``
runs from the start of the traffic until it has seen the end of it, pushing to a real
Alertmanager whose webhook receiver records what would page someone.

The targets (wall clock, generous):
1. nothing reaches the webhook before the flood, and no alert is about a change that began
   before it: its onset no more than ``ONSET_SLACK_S`` early (an onset is a window boundary
   placed live from the few requests finished so far; three windows early was seen in CI, with
   ~25 chat requests in between; a change of the host before the flood shows 20-30 s early);
2. the first alert after the flood is the queue, or the busy API server (a shift of ``frontend``
   or of the engine's event loop), on replica r1, at the webhook within ``FIRST_ALERT_S``;
3. at most ``MAX_ALERTS`` distinct firing alerts (label sets) for the incident;
4. ``hopline analyze EVENTS --json`` of the same events exits 0 with JSON.

With ``HOPLINE_LIVE_RECORDINGS=DIR``, every run is kept, pass or fail, under ``DIR/RUN_N`` (events, the watch's output, the
webhook's notifications, ``run.json`` with the flood's times) for replaying in the analyzer.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hopline.middleware.emit import Emitter
from support.alertmanager import Webhook, alertmanager_with_webhook
from test_vllm import UNPINNED, free_port, start_server, stop_server, tail, vllm_dir, wait_ready
from test_vllm_flood import FLOOD_USERS, MAX_PHASE_S, STEADY_USERS, Answers, chat_and_batch, user, wait_for

# On this 2-core host a CPU-only engine's own decode speed moves with the host (p50 143 -> 236 ms
# on the chat 20 s before a flood in one run, other suites taking the CPUs): the engine
# middleware's CPU wait (engine.last_token cpu_wait, middleware/cpu_wait.py) tells that rise as
# the host's, noted and not paged, where before it paged.
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1200)]

RECORDINGS_ENV = "HOPLINE_LIVE_RECORDINGS"  # a folder to keep every run in (else pytest's tmp_path keeps it)
MAX_NUM_SEQS = 4

STEADY_S, FLOOD_S, AFTER_S = 40.0, 40.0, 30.0  # at least; and MIN_SIDE answers before and after
MIN_SIDE = 60
ONSET_SLACK_S = 10.0  # see target 1
CHAT_TOKENS, BATCH_TOKENS = 48, 160  # the batch asks for longer answers: a mix change, not a slowdown
THINK_S = 0.2  # a chat user's mean pause between answers; the batch job has none
BURNERS, BURNER_NICE = 2, 5
# The watch: sized like the demo's (demo/live.py) for a run of two to four minutes on one host.
# A 2 s window (what `hopline analyze` picks for a few minutes); settle and lateness 2 s, not the
# demo's 1 s: every component shares this host's clock, but on the loaded host vLLM's stat logger
# writes `engine.stats` after the stream's last chunk, and the file sinks drain every 0.2 s. A
# finding must hold 5 s before it fires (the demo's: a busy host's passing hiccups of a few
# seconds are no page). --until-quiet: once the events stop (the server is stopped and flushed),
# the watch lets event time run on, sends its resolves and exits, as the demo's does. Not reniced
# (the demo renices its watch to keep its load generator on time): its ~0.1 s of CPU per step
# (measured on the repro's events) is small, and behind the burners a niced watch would fall
# behind, so its alerts' delay would measure the scheduler, not the detector.
WINDOW_S = 2.0
FLOOD_TIMES = ("flood_start", "flood_stop", "flood_end")
WATCH_FLAGS = (
    "--window", f"{WINDOW_S:g}s", "--settle", "2s", "--lateness", "2s", "--hold", "5s",
    "--poll", "0.25s", "--until-quiet", "5s", "--resend", "10s",
)  # fmt: skip
WATCH_FINISH_S = 180.0  # for the watch to see the end and exit by itself (else SIGINT)
FIRST_ALERT_S = 60.0  # flood start → the first alert at the webhook (wall clock)
MAX_ALERTS = 2  # distinct firing label sets: the incident's alert and at most one more
# A busy engine: its queue, or its API server (frontend: HTTP, template, tokenization; or the
# time before its middleware sees a request, its event loop's lateness, under whichever name).
ENGINE_SIDE = ("queue", "frontend")


def engine_side(stage: str) -> bool:
    return stage in ENGINE_SIDE or "loop" in stage or "lateness" in stage


def epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def scenario(port: int, emitter: Emitter, times: dict[str, Any]) -> None:
    """Steady chat, flood, chat alone; fills ``times`` (wall clock) as it goes, so that a run
    that fails half-way still says when it got where: ``traffic_start``, ``flood_start``,
    ``flood_stop`` (no batch call starts after it), ``flood_end`` (the batch's last call ended),
    ``traffic_end``, and the answers per service.

    Each user is a thread with a blocking client, as in test_vllm_flood (streams sharing one
    asyncio loop were seen to starve each other)."""
    with chat_and_batch(emitter) as (chat_c, batch_c, pool):
        chat, steady_over, flood_over = Answers(), threading.Event(), threading.Event()
        times["traffic_start"] = time.time()
        steady = [
            pool.submit(user, chat_c, port, steady_over, CHAT_TOKENS, THINK_S, 100 + i, chat)
            for i in range(STEADY_USERS)
        ]
        try:
            wait_for(chat, MIN_SIDE, STEADY_S)
            times["chat_before_flood"] = chat.count
            batch, times["flood_asked"] = Answers(), time.time()
            flood = [
                pool.submit(user, batch_c, port, flood_over, BATCH_TOKENS, 0.0, 200 + i, batch)
                for i in range(FLOOD_USERS)
            ]
            # when its first call is sent, not when it was asked for (see test_vllm_flood.scenario)
            assert batch.sent.wait(MAX_PHASE_S), "no batch call was sent"
            times["flood_start"] = batch.first_sent
            time.sleep(FLOOD_S)
            flood_over.set()
            times["flood_stop"] = time.time()
            times["batch_answers"] = sum(f.result() for f in flood)
            times["flood_end"] = time.time()
            wait_for(chat, chat.count + MIN_SIDE, AFTER_S)
        finally:
            flood_over.set()
            steady_over.set()
        times["chat_answers"] = sum(f.result() for f in steady)
        times["traffic_end"] = time.time()


def start_burners() -> list[subprocess.Popen]:
    """``BURNERS`` busy loops at ``nice -n BURNER_NICE``, each in a session of its own."""
    return [
        subprocess.Popen(
            ["nice", "-n", str(BURNER_NICE), sys.executable, "-c", "while True: pass"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for _ in range(BURNERS)
    ]


def kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def watch_argv(events: Path, alertmanager_url: str) -> list[str]:
    hopline = str(Path(sys.executable).parent / "hopline")
    return [
        hopline,
        "watch",
        "--follow",
        str(events),
        "--alertmanager",
        alertmanager_url,
        "--json",
        *WATCH_FLAGS,
    ]


def finish_watch(watch: subprocess.Popen) -> str:
    """Let the watch exit by itself (``--until-quiet``), else SIGINT (it sends what it holds),
    else SIGKILL; says which."""
    try:
        watch.wait(timeout=WATCH_FINISH_S)
        return f"exited by itself ({watch.returncode})"
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):
        os.killpg(watch.pid, signal.SIGINT)
    try:
        watch.wait(timeout=20)
        return f"stopped by SIGINT after {WATCH_FINISH_S:g} s ({watch.returncode})"
    except subprocess.TimeoutExpired:
        kill_group(watch)
        return f"killed after {WATCH_FINISH_S:g} s and SIGINT ({watch.returncode})"


def wait_webhook_quiet(webhook: Webhook, quiet_s: float = 4.0, at_most_s: float = 30.0) -> None:
    """Until no notification came for ``quiet_s`` (the resolves after the watch's last post)."""
    deadline = time.monotonic() + at_most_s
    seen, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        count = len(webhook.records())
        if count != seen:
            seen, since = count, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.2)


def new_run_dir(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    number = 1 + max((int(p.name[4:]) for p in root.glob("RUN_*") if p.name[4:].isdigit()), default=0)
    while True:
        path = root / f"RUN_{number}"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            number += 1


def queue_truth(engine_events: Path, run: dict[str, Any]) -> dict[str, Any]:
    """What vLLM itself measured (``engine.stats``: its queue_s) before, during and after the
    flood, by when each request ended: the scenario's ground truth, printed and recorded."""
    phases: dict[str, list[float]] = {"before": [], "flood": [], "after": []}
    if "flood_start" not in run or not engine_events.exists():
        return {}
    start, stop, end = (
        run["flood_start"],
        run.get("flood_stop", float("inf")),
        run.get("flood_end", float("inf")),
    )
    for line in engine_events.read_bytes().splitlines():
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if event.get("hop") != "engine.stats" or event.get("queue_s") is None:
                continue
            ts = event["ts"]
            phase = (
                "before"
                if ts < start
                else "flood"
                if start + 5 <= ts <= stop
                else "after"
                if ts > end + 5
                else None
            )
            if phase:
                phases[phase].append(event["queue_s"])
    return {
        phase: {"requests": len(v), "queue_p50_ms": round(1000 * sorted(v)[len(v) // 2], 1) if v else None}
        for phase, v in phases.items()
    }


def record(tmp_path: Path, events: Path, webhook_records: list[dict], run: dict[str, Any]) -> Path:
    """Copy the run's events, the watch's output, the webhook's notifications, the server's log
    and ``run.json`` to a new ``RECORDINGS/RUN_N``; never raises (the test's own failure comes first)."""
    if not os.environ.get(RECORDINGS_ENV):
        return tmp_path  # pytest keeps the last runs' folders
    try:
        out = new_run_dir(Path(os.environ[RECORDINGS_ENV]))
    except OSError as exc:
        print(f"\nno recording: {exc!r}")
        return tmp_path
    try:
        if events.exists():
            shutil.copytree(events, out / "events")
        for name in ("watch.out", "watch.err", "serve.log", "analyze.json", "analyze.err"):
            if (tmp_path / name).exists():
                shutil.copy2(tmp_path / name, out / name)
        with open(out / "alertmanager-webhook.ndjson", "w") as f:
            f.writelines(json.dumps(line) + "\n" for line in webhook_records)
        (out / "run.json").write_text(json.dumps(run, indent=2) + "\n")
    except OSError as exc:
        print(f"\nrecording {out} incomplete: {exc!r}")
    return out


def firing_alerts(webhook_records: list[dict]) -> list[dict[str, Any]]:
    """Every firing alert the webhook got, in arrival order, with ``received`` (epoch seconds)."""
    return [
        {**alert, "received": rec["received"]}
        for rec in webhook_records
        for alert in rec["body"]["alerts"]
        if alert["status"] == "firing"
    ]


def describe(alert: dict[str, Any], flood_start: float | None) -> str:
    """One line: state, alertname, stage/pitfall, scope labels, onset and arrival relative to
    the flood's start, summary."""
    labels = alert["labels"]
    what = labels.get("stage") or labels.get("pitfall") or "?"
    kept = ("alertname", "severity", "direction", "stage", "pitfall")
    scope = ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k not in kept) or "(all)"

    def rel(t: float) -> str:
        return f"{t - flood_start:+.1f}s" if flood_start is not None else f"@{t:.1f}"

    onset = rel(epoch(alert["startsAt"]))
    received = rel(alert["received"]) if "received" in alert else "-"
    return (
        f"{alert.get('status', '?'):8} {labels.get('alertname')} {what} [{scope}] onset {onset} "
        f"at webhook {received} (vs flood start): {alert['annotations'].get('summary')}"
    )


def check(
    run: dict[str, Any], webhook_records: list[dict], analysed: subprocess.CompletedProcess | None
) -> list[str]:
    """What misses the issue's targets (an empty list: all met)."""
    problems = []
    flood_start = run.get("flood_start")
    if flood_start is None:
        return ["the flood never started (see the run's times and the server log)"]
    firing = firing_alerts(webhook_records)
    # 1. nothing pages before the flood, nor for a change that began before it
    early = [a for a in firing if a["received"] < flood_start or epoch(a["startsAt"]) < flood_start - ONSET_SLACK_S]
    if early:
        problems.append(
            f"1. alerts sent before the flood or with an onset more than {ONSET_SLACK_S:g} s before it:\n   "
            + "\n   ".join(describe(a, flood_start) for a in early)
        )
    # 2. the first alert to arrive after the flood began (one not already firing before it;
    # its onset is 1.'s business): the queue or the busy API server, on r1, soon
    arrived: dict[tuple, dict[str, Any]] = {}
    for alert in firing:
        arrived.setdefault(tuple(sorted(alert["labels"].items())), alert)
    after = [a for a in arrived.values() if a["received"] >= flood_start]
    if not after:
        problems.append("2. no alert reached the webhook after the flood began")
    else:
        first = min(after, key=lambda a: a["received"])
        labels = first["labels"]
        if not (
            labels.get("alertname") == "HoplineShift"
            and engine_side(labels.get("stage", ""))
            and labels.get("direction") == "up"
            and labels.get("replica", "r1") == "r1"
        ):
            problems.append(
                "2. the first alert after the flood is not a rise of the queue or the engine's API "
                f"server on r1: {describe(first, flood_start)}"
            )
        late_s = first["received"] - flood_start
        if late_s > FIRST_ALERT_S:
            problems.append(
                f"2. the first alert reached the webhook {late_s:.1f} s after the flood began "
                f"(> {FIRST_ALERT_S:g} s): {describe(first, flood_start)}"
            )
    # 3. one incident, at most MAX_ALERTS pages
    distinct = {tuple(sorted(a["labels"].items())) for a in firing}
    if len(distinct) > MAX_ALERTS:
        shown = [
            ",".join(f"{k}={v}" for k, v in labels if k not in ("severity", "direction"))
            for labels in distinct
        ]
        problems.append(
            f"3. {len(distinct)} distinct firing alerts (at most {MAX_ALERTS}): " + "; ".join(sorted(shown))
        )
    # 4. the offline analysis of the same events
    if analysed is None:
        problems.append("4. hopline analyze did not run")
    elif analysed.returncode != 0:
        problems.append(f"4. hopline analyze exited {analysed.returncode}: {analysed.stderr[-1500:]}")
    else:
        try:
            json.loads(analysed.stdout)
        except ValueError as exc:
            problems.append(f"4. hopline analyze --json printed no JSON ({exc}): {analysed.stdout[:500]!r}")
    return problems


def report(
    tmp_path: Path,
    run: dict[str, Any],
    webhook_records: list[dict],
    analysed: subprocess.CompletedProcess | None,
) -> None:
    """Print what the run did and what the watch, the webhook and ``hopline analyze`` said."""
    flood_start = run.get("flood_start")
    times = {
        k: round(run[k] - flood_start, 1)
        for k in ("flood_stop", "flood_end", "traffic_end")
        if flood_start and k in run
    }
    print(
        f"vLLM ready after {run.get('vllm_ready_s')} s; flood start {flood_start}, relative: {times}; "
        f"answers chat {run.get('chat_answers')} (before the flood {run.get('chat_before_flood')}), "
        f"batch {run.get('batch_answers')}; load {run.get('load_before')} -> {run.get('load_after')}; "
        f"watch {run.get('watch_end')}; vLLM's own queue_s by phase: {run.get('queue_truth')}"
    )
    watch_out = tmp_path / "watch.out"
    print(
        "the watch printed:\n"
        + (watch_out.read_text(errors="replace") if watch_out.exists() else "(nothing)")
    )
    print("its stderr (tail):\n" + tail(tmp_path / "watch.err", 20))
    print(f"the webhook got {len(webhook_records)} notifications:")
    for rec in webhook_records:
        for alert in rec["body"]["alerts"]:
            print("  " + describe({**alert, "received": rec["received"]}, flood_start))
    if analysed is not None and analysed.returncode == 0:
        with contextlib.suppress(ValueError):
            result = json.loads(analysed.stdout)
            print(f"hopline analyze: {result['requests']} requests, window {result['window_s']} s; first:")
            for finding in result["findings"][:4]:
                print(f"  - {finding['summary']}")


def test_a_live_flood_pages_once_for_the_queue(tmp_path: Path) -> None:
    root = vllm_dir()
    events = tmp_path / "events"
    events.mkdir()
    port, log_path = free_port(), tmp_path / "serve.log"
    run: dict[str, Any] = {
        "scenario": "vllm-flood-live",
        "max_num_seqs": MAX_NUM_SEQS,
        "users": {"chat": STEADY_USERS, "batch": FLOOD_USERS},
        "max_tokens": {"chat": CHAT_TOKENS, "batch": BATCH_TOKENS},
        "think_s": THINK_S,
        "burners": f"{BURNERS} x nice -n {BURNER_NICE}",
        "vllm_env": UNPINNED,
    }
    webhook_records: list[dict] = []
    analysed: subprocess.CompletedProcess | None = None
    try:
        with alertmanager_with_webhook(tmp_path) as (am, webhook):
            run["watch_argv"] = watch_argv(events, am.url)[1:]
            run["test_start"] = time.time()
            # vLLM's CPU default pins its model worker to core 0 and leaves the API server, the engine
            # core and this client to core 1; unpinned, one OpenMP thread, as test_vllm runs it
            # (pinned, a loaded API server and client were seen stalled for a whole decode).
            proc = start_server(
                root, port, events / "engine.ndjson", log_path, max_num_seqs=MAX_NUM_SEQS, env_extra=UNPINNED
            )
            burners: list[subprocess.Popen] = []
            watch: subprocess.Popen | None = None
            emitter = Emitter(f"file:{events / 'client.ndjson'}")
            try:
                run["vllm_ready_s"] = round(wait_ready(proc, port, log_path), 1)
                burners = start_burners()
                time.sleep(2.0)  # the burners running before the first request
                run["load_before"] = os.getloadavg()
                with open(tmp_path / "watch.out", "wb") as out, open(tmp_path / "watch.err", "wb") as err:
                    watch = subprocess.Popen(
                        watch_argv(events, am.url), stdout=out, stderr=err, start_new_session=True
                    )
                run["watch_start"] = time.time()
                try:
                    scenario(port, emitter, run)
                finally:
                    run["load_after"] = os.getloadavg()
                    emitter.close()
                    stop_server(proc)
                    run["server_stopped"] = time.time()
                    if watch is not None:
                        run["watch_end"] = finish_watch(watch)
                        run["watch_exit"] = time.time()
                    wait_webhook_quiet(webhook)
            finally:
                for burner in burners:
                    kill_group(burner)
                if watch is not None and watch.poll() is None:
                    kill_group(watch)
                emitter.close()
                stop_server(proc)
                webhook_records = webhook.records()
        analysed = subprocess.run(
            [str(Path(sys.executable).parent / "hopline"), "analyze", str(events), "--json"],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        (tmp_path / "analyze.json").write_text(analysed.stdout)
        (tmp_path / "analyze.err").write_text(analysed.stderr)
    finally:
        run["webhook_notifications"] = len(webhook_records)
        run["queue_truth"] = queue_truth(events / "engine.ndjson", run)
        run.update(
            {f"{k}_utc": datetime.fromtimestamp(run[k], UTC).isoformat() for k in FLOOD_TIMES if k in run}
        )
        recorded = record(tmp_path, events, webhook_records, run)
        print(f"\nrecorded in {recorded}")
        report(tmp_path, run, webhook_records, analysed)

    problems = check(run, webhook_records, analysed)
    assert not problems, (
        "\n".join(problems) + f"\n(recorded in {recorded}; server log:\n{tail(log_path, 15)})"
    )
