"""The detector's way out: each changed incident printed (as the alert Alertmanager receives,
with the event-time seconds since its onset), sent to Alertmanager, and kept for the HTTP API.

A restarted watcher reads its store's open hour again, so every incident on the horizon opens
again as the replay goes by. ``SentState`` is what it sent, kept in a small JSON file
(``hopline watch --state``): per alert (its label set, Alertmanager's fingerprint) the last status
sent, ``startsAt`` and ``endsAt``, rewritten atomically (a temporary file, fsync, ``os.replace``)
whenever one of the three changes. Loaded at start, it keeps the replay from paging again: a
firing alert whose label set was sent resolved, with a ``startsAt`` at or before that resolve's
``endsAt`` (the same onset: the incident that ended), is not sent; a new onset after the
resolve is a new incident and is. An alert sent firing and found firing again is sent as it
is (the same alert again, harmless); nothing is ever sent resolved because the state says so.
"What sent" is what the watcher handed to ``AlertSender``: a resolve handed over and then lost
with the process is sent again by the replay (a resolved version is never held back). A state
file that cannot be read or parsed is reported on stderr and the watch starts without it; one
that cannot be written is reported once and the watch goes on.
"""

from __future__ import annotations

import contextlib
import copy
import os
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from hopline.analyzer.live.alertmanager import AlertSender, payload
from hopline.analyzer.live.detector import LiveDetector
from hopline.analyzer.live.incidents import FELT_MS, Incident
from hopline.analyzer.findings.model import iso_utc
from hopline.middleware.contract.times import to_epoch

STATE_NAME = ".hopline-watch-state.json"  # --follow DIR's default state file, in DIR
STATE_KEEP = 1000  # alerts a state file remembers (the latest by startsAt)


def alert_line(now: float, incident: Incident, alert: dict) -> str:
    """``[+20s] FIRING HoplineShift{stage=queue, replica=r2, ...} queue time tripled ...``"""
    labels = alert["labels"]
    shown = ", ".join(f"{k}={v}" for k, v in labels.items() if k != "alertname")
    state = "FIRING" if incident.state == "firing" else "RESOLVED"
    if incident.standing:
        state = "NOTED (not paged: standing, a condition with no onset)"
    elif incident.mix:
        state = "NOTED (not paged: a change in the traffic, not a slowdown)"
    elif not incident.pages and incident.unfelt:
        state = f"NOTED (not paged: under {FELT_MS:g} ms a request)"
    elif not incident.pages:
        state = f"NOTED (not paged: the {incident.late} side's own lateness{'' if incident.late == 'client' else ', not critical'})"
    return (
        f"[{iso_utc(now)} +{now - incident.onset:.0f}s since onset] {state} {labels['alertname']}{{{shown}}}: "
        f"{alert['annotations']['summary']}"
    )


def news(now: float, incident: Incident) -> bool:
    """Whether ``incident`` is news at ``now``: it began to page (or opened, not paging), or
    resolved. What does not page is said once, when it opens."""
    return incident.first_seen == now or (incident.state == "resolved" and incident.pages)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def fingerprint(alert: dict) -> str:
    """An alert's identity as Alertmanager sees it (its label set), as one string."""
    return orjson.dumps(alert["labels"], option=orjson.OPT_SORT_KEYS).decode()


@dataclass
class SentState:
    """What this watcher sent per alert (see the module doc); ``path`` None: kept in memory only."""

    path: Path | None = None
    sent: dict[str, dict] = field(default_factory=dict)  # fingerprint -> labels, status, startsAt, endsAt
    warn: Callable[[str], None] = _stderr
    broken: bool = False  # a write failed (said once)

    @classmethod
    def load(cls, path: Path | None, warn: Callable[[str], None] = _stderr) -> SentState:
        """The state in ``path`` (missing: empty; unreadable or corrupt: said, and empty)."""
        state = cls(path, warn=warn)
        if path is None:
            return state
        try:
            data = orjson.loads(Path(path).read_bytes())
            for entry in data["alerts"]:
                labels, status = entry["labels"], entry["status"]
                if not isinstance(labels, dict) or status not in ("firing", "resolved"):
                    raise ValueError(f"not an alert: {entry!r:.80}")
                to_epoch(entry["startsAt"]), to_epoch(entry.get("endsAt"))
                state.sent[fingerprint(entry)] = {
                    "labels": labels, "status": status, "startsAt": entry["startsAt"], "endsAt": entry.get("endsAt"),
                }  # fmt: skip
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError) as exc:  # orjson.JSONDecodeError is a ValueError
            warn(f"hopline watch: ignoring the state file {path} ({type(exc).__name__}: {exc})")
            state.sent.clear()
        return state

    def holds_back(self, alert: dict) -> bool:
        """Whether ``alert`` is a firing version of an incident this watcher already sent resolved."""
        if alert.get("endsAt"):
            return False
        last = self.sent.get(fingerprint(alert))
        if last is None or last["status"] != "resolved" or not last.get("endsAt"):
            return False
        return to_epoch(alert["startsAt"]) <= to_epoch(last["endsAt"])

    def record(self, alerts: list[dict]) -> None:
        """Remember these alerts as sent; write the file when what it holds changed."""
        changed = False
        for alert in alerts:
            entry = {
                "labels": alert["labels"],
                "status": "resolved" if alert.get("endsAt") else "firing",
                "startsAt": alert["startsAt"],
                "endsAt": alert.get("endsAt"),
            }
            key = fingerprint(alert)
            if self.sent.get(key) != entry:
                self.sent.pop(key, None)
                self.sent[key] = entry
                changed = True
        if changed:
            self.save()

    def save(self) -> None:
        if self.path is None:
            return
        if len(self.sent) > STATE_KEEP:
            newest = sorted(self.sent.items(), key=lambda kv: to_epoch(kv[1]["startsAt"]))[-STATE_KEEP:]
            self.sent = dict(newest)
        path = Path(self.path)
        body = orjson.dumps({"version": 1, "alerts": list(self.sent.values())}, option=orjson.OPT_INDENT_2)
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(body)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            self.broken = False
        except OSError as exc:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            if not self.broken:
                self.warn(f"hopline watch: cannot write the state file {path} ({type(exc).__name__}: {exc})")
            self.broken = True


@dataclass(frozen=True)
class Published:
    """One incident as ``GET /v1/findings`` shows it: its JSON, serialized once per step, and what
    ``?since=`` keeps it by."""

    firing: bool
    last_seen: float
    body: bytes


@dataclass
class Watch:
    """Glue: ``detector.on_step`` -> alerts (printed with ``out``; those that page sent with
    ``sender``, unless ``state`` says it was sent resolved), and a snapshot of the incidents for
    ``GET /v1/findings`` (``published``: serialized on the step's thread) and ``/metrics`` (read
    under ``lock``)."""

    detector: LiveDetector
    sender: AlertSender | None = None
    out: Callable[[str], None] | None = None
    store: str | None = None
    generator_url: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    snapshot: list[Incident] = field(default_factory=list)  # copies of the incidents, newest step
    published: list[Published] = field(default_factory=list)  # the same, serialized
    alerts_printed: int = 0
    state: SentState = field(default_factory=SentState)
    held_back: int = 0  # firing versions not sent: the state says they were resolved
    follow_failures: int = 0  # --follow polls that could not list or open the files (``Tail.failures``)

    def __post_init__(self) -> None:
        self.detector.on_step = self.on_step

    def on_step(self, now: float, changed: list[Incident]) -> None:
        alerts = []
        for incident in changed:
            alert = payload(incident, store=self.store, generator_url=self.generator_url)
            if incident.pages:
                if self.state.holds_back(alert):
                    self.held_back += 1
                else:
                    alerts.append(alert)
            if self.out is not None and news(now, incident):
                self.out(alert_line(now, incident, alert))
                self.alerts_printed += 1
        if self.sender is not None and alerts:
            self.sender.update(alerts)
            self.state.record(alerts)
        snapshot = [copy.copy(i) for i in self.detector.incidents()]
        # serialized here, on the detector's thread: GET /v1/findings only joins bytes (``Published``)
        published = [Published(i.state == "firing", i.last_seen, orjson.dumps(i.to_json())) for i in snapshot]
        with self.lock:
            self.snapshot, self.published = snapshot, published
