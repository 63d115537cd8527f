"""The demo's live answer: ``hopline watch --follow`` on the collector's store while the traffic
runs, each alert printed in the terminal in two lines (what moved and where, with the seconds since
its onset; then its sentence), and kept whole, as Alertmanager receives it, in ``RUN_DIR/alerts.log``.

The watch is a child process like the rest of the stack (``process.Child``), reniced so that its
analysis (every window of event time) never takes the CPU the load generator needs to keep time:
the demo's final report stays the one of a run without it. Its alerts arrive on its stdout as
``hopline watch --json`` lines; a thread prints them above the live panel and keeps them in
``RUN_DIR/alerts.log`` (JSON lines, but not ``.ndjson``: ``hopline analyze RUN`` reads only event files). When the run ends and the collector has stored the last events, the
watch sees nothing new for ``QUIET_S``, lets event time run on without traffic (what fired
resolves once its scope stays quiet, its ``endsAt`` no later than the run's last event: the
watch's event time runs minutes past the wall clock then, and Alertmanager, on the wall clock,
would hold an alert ending in its future as firing until then), sends the resolves and exits.

``--alertmanager URL`` (repeatable; else ``HOPLINE_ALERTMANAGER_URL``) goes to the watch, which
sends the live findings there as ``hopline watch`` does.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from hopline.analyzer.attribution import auto_window
from hopline.demo.process import Child, python_module
from rich.console import Console
from rich.markup import escape

QUIET_S = 3.0  # wall-clock seconds without a new event after which the watch finishes
NICE = 10  # the watch's niceness: the demo's timings come first
# The demo's components share one host and clock: stragglers (engine.stats) come within a second.
SETTLE = LATENESS = "1s"
# A finding must hold 5 windows before it fires: on a busy machine the first seconds of a run show
# passing network and pool-wait hiccups of a few seconds (the load generator running late).
HOLD = "5s"


def watch_argv(run_dir: Path, seconds: float, alertmanager: list[str]) -> list[str]:
    """``hopline watch --follow RUN_DIR/events --json …`` (as ``python -m hopline.analyzer.live``) sized for a run of ``seconds``: the
    window ``hopline analyze`` chooses for the run, a horizon holding the whole run."""
    span = seconds + 10.0
    horizon = max(120.0, 2 * span)
    args = [
        "--follow", str(run_dir / "events"), "--json",
        "--window", f"{auto_window(span):g}s", "--horizon", f"{horizon:g}s", "--recent", f"{horizon / 2:g}s",
        "--settle", SETTLE, "--lateness", LATENESS, "--hold", HOLD, "--poll", "0.25s", "--until-quiet", f"{QUIET_S:g}s",
        "--resend", "10s",
    ]  # fmt: skip
    for url in alertmanager:
        args += ["--alertmanager", url]
    return python_module("hopline.analyzer.live", *args)


# labels that say what and how bad, not where (the rest of an alert's labels are its scope)
NOT_SCOPE = ("alertname", "severity", "direction", "side", "stage", "pitfall", "standing")


def alert_text(line: dict[str, Any]) -> str:
    """One alert for the terminal, in two lines: state, seconds since onset, what moved (the stage
    or the pitfall) and where (its scope labels), then its sentence. The whole alert, as
    Alertmanager receives it, is in RUN_DIR/alerts.log."""
    alert = line["alert"]
    labels = alert["labels"]
    state = "RESOLVED" if alert.get("endsAt") else "FIRING"
    what = labels.get("stage") or labels.get("pitfall") or labels["alertname"]
    where = ", ".join(f"{k}={v}" for k, v in labels.items() if k not in NOT_SCOPE) or "all traffic"
    head = (
        f"[bold]{'[green]' if state == 'RESOLVED' else '[red]'}live alert {state}[/] "
        f"+{line['seconds_since_onset']:.0f} s since onset[/bold]: {escape(what)} on {escape(where)}"
    )
    return f"{head}\n  {escape(alert['annotations']['summary'])}"


@dataclass
class LiveWatch:
    """The watch child, and the alerts it printed (in order)."""

    child: Child
    console: Console
    path: Path
    alerts: list[dict[str, Any]] = field(default_factory=list)
    thread: threading.Thread | None = None

    @classmethod
    def start(cls, run_dir: Path, seconds: float, alertmanager: list[str], console: Console) -> LiveWatch:
        logs = run_dir / "logs"
        argv = ["nice", "-n", str(NICE), *watch_argv(run_dir, seconds, alertmanager)]
        child = Child("watch", argv, logs, stdout=subprocess.PIPE)
        live = cls(child, console, run_dir / "alerts.log")
        live.path.write_bytes(b"")
        live.thread = threading.Thread(target=live._read, name="demo-live-alerts", daemon=True)
        live.thread.start()
        return live

    def _read(self) -> None:
        stream = self.child.popen.stdout
        assert stream is not None
        with self.path.open("ab") as kept:
            for raw in stream:
                with contextlib.suppress(orjson.JSONDecodeError, KeyError, TypeError):
                    line = orjson.loads(raw)
                    self.console.print(alert_text(line), highlight=False)
                    self.alerts.append(line)
                    kept.write(orjson.dumps(line) + b"\n")
                    kept.flush()

    def finish(self, timeout: float) -> None:
        """Wait for the watch to see the last events and finish (else stop it)."""
        deadline = time.monotonic() + timeout
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.child.popen.wait(max(0.0, deadline - time.monotonic()))
        if self.child.popen.poll() is None:
            self.console.print("[yellow]the live watch did not finish in time: stopped[/yellow]")
            self.child.terminate()
        self.child.wait_or_kill(time.monotonic() + 5.0)
        if self.thread is not None:
            self.thread.join(timeout=5.0)

    def stop(self) -> None:
        self.child.terminate()
        self.child.wait_or_kill(time.monotonic() + 5.0)

