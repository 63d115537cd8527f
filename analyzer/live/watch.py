"""The detector's way out: each changed incident printed (as the alert Alertmanager receives,
with the event-time seconds since its onset), sent to Alertmanager, and kept for the HTTP API."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from hopline.analyzer.live.alertmanager import AlertSender, payload
from hopline.analyzer.live.detector import LiveDetector
from hopline.analyzer.live.incidents import FELT_MS, Incident
from hopline.analyzer.findings.model import iso_utc


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


@dataclass
class Watch:
    """Glue: ``detector.on_step`` -> alerts (printed with ``out``; those that page sent with
    ``sender``), and a snapshot of the incidents for ``GET /v1/findings`` and ``/metrics`` (read
    under ``lock``)."""

    detector: LiveDetector
    sender: AlertSender | None = None
    out: Callable[[str], None] | None = None
    store: str | None = None
    generator_url: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    snapshot: list[Incident] = field(default_factory=list)  # copies of the incidents, newest step
    alerts_printed: int = 0

    def __post_init__(self) -> None:
        self.detector.on_step = self.on_step

    def on_step(self, now: float, changed: list[Incident]) -> None:
        alerts = []
        for incident in changed:
            alert = payload(incident, store=self.store, generator_url=self.generator_url)
            if incident.pages:
                alerts.append(alert)
            if self.out is not None and news(now, incident):
                self.out(alert_line(now, incident, alert))
                self.alerts_printed += 1
        if self.sender is not None and alerts:
            self.sender.update(alerts)
        with self.lock:
            self.snapshot = [copy.copy(i) for i in self.detector.incidents()]
