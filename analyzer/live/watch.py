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

With an Alertmanager (``sender``), an alert that pages is printed once an Alertmanager accepted
it (``AlertSender.on_result``), not when it is found: FIRING means a page is on its way. A post
that fails is said on stderr with its reason (once per alert and Alertmanager; delivery is
retried), and ``finish`` says on stderr each alert no Alertmanager took by the end and counts
them (``hopline watch --replay`` and ``--until-quiet`` then exit 1). A firing version held back
by the state is printed as such, never as FIRING.
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
from hopline.analyzer.live.alertmanager import AlertSender, label_key, payload
from hopline.analyzer.live.detector import LiveDetector
from hopline.analyzer.live.incidents import FELT_MS, Incident, taken_back
from hopline.analyzer.findings.model import iso_utc
from hopline.middleware.contract.units import to_epoch

STATE_NAME = ".hopline-watch-state.json"  # --follow DIR's default state file, in DIR
STATE_KEEP = 1000  # alerts a state file remembers (the latest by startsAt)


def alert_name(alert: dict) -> str:
    """``HoplineShift{severity=critical, stage=queue, replica=r2, ...}``"""
    labels = alert["labels"]
    shown = ", ".join(f"{k}={v}" for k, v in labels.items() if k != "alertname")
    return f"{labels['alertname']}{{{shown}}}"


def alert_line(now: float, incident: Incident, alert: dict, *, held: bool = False) -> str:
    """``[+20s] FIRING HoplineShift{stage=queue, replica=r2, ...} queue time tripled ...``;
    ``held``: a firing version the state holds back (``SentState.holds_back``)."""
    state = "FIRING" if incident.state == "firing" else "RESOLVED"
    if held:
        state = "NOT SENT AGAIN (sent resolved before this restart)"
    elif incident.standing:
        state = "NOTED (not paged: standing, a condition with no onset)"
    elif incident.mix:
        state = "NOTED (not paged: a change in the traffic, not a slowdown)"
    elif not incident.pages and taken_back(incident.fired or incident.finding):
        state = f"NOTED (not paged: other stages of its requests fell with it, under {FELT_MS:g} ms a request net)"
    elif not incident.pages and incident.load:
        state = "NOTED (not paged: more requests in flight shared the engine, more than it slowed)"
    elif not incident.pages and incident.unfelt:
        state = f"NOTED (not paged: under {FELT_MS:g} ms a request)"
    elif not incident.pages and incident.late == "host":
        state = "NOTED (not paged: the engine's host was busy, not a slower engine)"
    elif not incident.pages:
        state = f"NOTED (not paged: the {incident.late} side's own lateness{'' if incident.late == 'client' else ', not critical'})"
    return (
        f"[{iso_utc(now)} +{now - incident.onset:.0f}s since onset] {state} {alert_name(alert)}: "
        f"{alert['annotations']['summary']}"
    )


def json_line(now: float, incident: Incident, alert: dict) -> str:
    """The alert as Alertmanager receives it, with the event-time seconds since its onset."""
    return orjson.dumps({"seconds_since_onset": round(now - incident.onset, 3), "alert": alert}).decode()


def _rank(alert: dict) -> tuple[float, int]:
    """A version of an alert: its onset, then firing before resolved."""
    return to_epoch(alert["startsAt"]), 1 if alert.get("endsAt") else 0


def said(alert: dict) -> str:
    """An alert for stderr: ``firing HoplineShift{...}: summary``."""
    status = "resolved" if alert.get("endsAt") else "firing"
    return f"{status} {alert_name(alert)}: {alert['annotations']['summary']}"


@dataclass(frozen=True)
class Awaiting:
    """A printout waiting for an Alertmanager to accept its alert (this version or a newer one)."""

    rank: tuple[float, int]
    line: str
    said: str  # for stderr (``said``)


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
    json_out: bool = False  # print the paging alerts as JSON lines (``json_line``), nothing else
    warn: Callable[[str], None] = _stderr
    awaiting: dict[tuple, list[Awaiting]] = field(default_factory=dict)  # label set -> printouts
    refused: set[tuple] = field(default_factory=set)  # (label set, version, URL) said as refused
    last_error: dict[str, str] = field(default_factory=dict)  # per Alertmanager URL
    print_lock: threading.Lock = field(default_factory=threading.Lock)
    follow_failures: int = 0  # --follow polls that could not list or open the files (``Tail.failures``)

    def __post_init__(self) -> None:
        self.detector.on_step = self.on_step
        if self.sender is not None:
            self.sender.on_result = self.delivered

    def _print(self, line: str) -> None:
        with self.print_lock:
            if self.out is not None:
                self.out(line)
                self.alerts_printed += 1

    def on_step(self, now: float, changed: list[Incident]) -> None:
        alerts = []
        # what a line says happened at: the step's event time, never past the newest event (a
        # drain, --until-quiet, steps time on without events to resolve what fires)
        newest = self.detector.newest
        at = min(now, newest) if newest is not None else now
        for incident in changed:
            alert = payload(incident, store=self.store, generator_url=self.generator_url)
            shown = self.out is not None and news(now, incident) and (incident.pages or not self.json_out)
            held = incident.pages and self.state.holds_back(alert)
            if held:
                self.held_back += 1
            elif incident.pages:
                alerts.append(alert)
            if not shown:
                continue
            if self.json_out:
                line = None if held else json_line(at, incident, alert)
            else:
                line = alert_line(at, incident, alert, held=held)
            if line is None:
                continue
            if incident.pages and not held and self.sender is not None:
                waiting = Awaiting(_rank(alert), line, said(alert))
                with self.print_lock:
                    self.awaiting.setdefault(label_key(alert), []).append(waiting)
            else:
                self._print(line)
        if self.sender is not None and alerts:
            self.sender.update(alerts)
            self.state.record(alerts)
        snapshot = [copy.copy(i) for i in self.detector.incidents()]
        # serialized here, on the detector's thread: GET /v1/findings only joins bytes (``Published``)
        published = [Published(i.state == "firing", i.last_seen, orjson.dumps(i.to_json())) for i in snapshot]
        with self.lock:
            self.snapshot, self.published = snapshot, published

    def delivered(self, url: str, batch: list[dict], error: str | None) -> None:
        """``AlertSender.on_result``: print what an Alertmanager accepted (each waiting printout of
        this version or an older one); say on stderr what one refused, once per alert version and URL."""
        with self.print_lock:
            if error is not None:
                self.last_error[url] = error
            for alert in batch:
                key, rank = label_key(alert), _rank(alert)
                if error is not None:
                    if (key, rank, url) not in self.refused:
                        if len(self.refused) >= STATE_KEEP * 10:
                            self.refused.clear()
                        self.refused.add((key, rank, url))
                        self.warn(
                            f"hopline watch: not delivered yet, Alertmanager {url} did not take it "
                            f"({error}); retrying: {said(alert)}"
                        )
                    continue
                waiting = self.awaiting.pop(key, [])
                for w in waiting:
                    if w.rank <= rank and self.out is not None:
                        self.out(w.line)
                        self.alerts_printed += 1
                left = [w for w in waiting if w.rank > rank]
                if left:
                    self.awaiting[key] = left

    def finish(self) -> int:
        """After ``sender.close()``: say on stderr each alert no Alertmanager accepted, and count them."""
        with self.print_lock:
            left = [w for waiting in self.awaiting.values() for w in waiting]
            self.awaiting.clear()
            errors = "; ".join(f"{url}: {e}" for url, e in self.last_error.items()) or "no answer in time"
        for w in left:
            self.warn(f"hopline watch: NOT DELIVERED to any Alertmanager ({errors}): {w.said}")
        return len(left)
