"""Alertmanager's v2 API as the way out: ``POST /api/v2/alerts``, off the detection path.

``AlertSender`` keeps the alerts to deliver per Alertmanager (several URLs: each gets every alert,
as Prometheus sends to each member of an Alertmanager cluster). ``update`` never blocks and never
raises: it replaces the alert of the same label set waiting in each target's queue (so a queue
holds at most one version of each alert, the newest) and wakes the target's thread.

Each target has one thread that posts its queue in batches; a failed post (connection refused,
timeout, a non-2xx answer) is retried with exponential backoff (``backoff_s`` doubling up to
``max_backoff_s``), merged with whatever newer versions arrived meanwhile, and counted
(``failures``, ``retries``). A firing alert is re-sent every ``resend_s`` (Alertmanager ends an
alert whose ``endsAt`` it set itself after its ``resolve_timeout``, 5 min by default: the resend
must come sooner, Prometheus uses 1 min); a resolved one is sent (with its ``endsAt``) until one
post succeeds. A queue is bounded (``capacity`` alerts; the oldest are dropped and counted).
``on_result`` (when set) hears of every post on the target's thread: the Alertmanager's URL, the
batch, and None when it accepted the batch, else why not (``hopline watch`` prints an alert only
once an Alertmanager took it, and says on stderr what it could not deliver).

A resend never overwrites a resolve: once an alert's resolve was queued, a firing version of it
with the same ``startsAt`` (or an older one) is stale and dropped, wherever it comes from (the
resender's copy taken just before the resolve, a failed batch put back, a restarted watcher's
replay): the newest status wins, and for one ``startsAt`` resolved beats firing. A firing alert
with a later ``startsAt`` is a new incident and is sent.

With ``ahead_s`` (``hopline watch --follow``: its ``--future``), no alert says a time later than
this host's wall clock plus ``ahead_s``: ``startsAt`` and ``endsAt`` are capped (``bounded``), so
an event time gone wrong never tells Alertmanager that an alert resolved a year from now (it
would keep it active until then).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import orjson
from hopline.middleware.contract.events import printable
from hopline.analyzer.findings.model import Shift, iso_utc
from hopline.analyzer.live.incidents import ALERTNAMES, Incident, direction
from hopline.middleware.contract.units import to_epoch

RESEND_S = 60.0  # as Prometheus' notifier; below Alertmanager's default resolve_timeout (5 min)
BATCH = 64  # alerts per POST, as Prometheus
API_PATH = "/api/v2/alerts"


def bounded(alert: dict, latest: float) -> dict:
    """``alert`` with its ``startsAt`` and ``endsAt`` no later than ``latest`` (Unix seconds): a
    copy when one moves (``endsAt`` stays at or after ``startsAt``, as Alertmanager requires)."""
    late = [k for k in ("startsAt", "endsAt") if k in alert and to_epoch(alert[k]) > latest]
    return alert | {k: iso_utc(latest) for k in late} if late else alert


def _began(alert: dict) -> float:
    """An alert's ``startsAt`` as Unix seconds (none given: the earliest time there is)."""
    return to_epoch(alert["startsAt"]) if alert.get("startsAt") else float("-inf")


def label_key(alert: dict) -> tuple:
    """An alert's identity for Alertmanager: its label set."""
    return tuple(sorted(alert["labels"].items()))


@dataclass
class SenderStats:
    """What the sender did, per Alertmanager URL (hopline's own metrics read these)."""

    sent: dict[str, int] = field(default_factory=dict)  # alerts accepted (2xx)
    failures: dict[str, int] = field(default_factory=dict)  # posts that failed
    retries: dict[str, int] = field(default_factory=dict)  # posts that were a retry
    dropped: dict[str, int] = field(default_factory=dict)  # alerts dropped from a full queue
    queued: dict[str, int] = field(default_factory=dict)  # alerts waiting now
    last_error: dict[str, str] = field(default_factory=dict)

    def add(self, counter: dict[str, int], url: str, n: int = 1) -> None:
        counter[url] = counter.get(url, 0) + n


class _Target:
    """One Alertmanager: a bounded queue of alerts (one per label set) and the thread posting it."""

    def __init__(self, url: str, sender: AlertSender) -> None:
        self.url = url.rstrip("/")
        self.sender = sender
        self.pending: OrderedDict[tuple, dict] = OrderedDict()
        self.wake = threading.Condition()
        self.thread = threading.Thread(target=self._run, name=f"hopline-alertmanager {url}", daemon=True)

    def put(self, alerts: list[dict]) -> None:
        stats = self.sender.stats
        with self.wake:
            for alert in alerts:
                if self.sender.stale(alert):  # checked under the queue's lock: a resolve wins
                    continue
                key = label_key(alert)
                self.pending.pop(key, None)
                self.pending[key] = alert
            while len(self.pending) > self.sender.capacity:
                self.pending.popitem(last=False)
                stats.add(stats.dropped, self.url)
            stats.queued[self.url] = len(self.pending)
            self.wake.notify()

    def _take(self) -> list[dict]:
        with self.wake:
            while not self.pending and not self.sender.closing:
                self.wake.wait()
            batch = []
            while self.pending and len(batch) < BATCH:
                batch.append(self.pending.popitem(last=False)[1])
            self.sender.stats.queued[self.url] = len(self.pending) + len(batch)  # in flight counts
            return batch

    def _requeue(self, batch: list[dict]) -> None:
        """A failed batch goes back to the front, unless a newer version of an alert arrived."""
        with self.wake:
            for alert in reversed(batch):
                key = label_key(alert)
                if key not in self.pending and not self.sender.stale(alert):
                    self.pending[key] = alert
                    self.pending.move_to_end(key, last=False)
            self.sender.stats.queued[self.url] = len(self.pending)

    def _run(self) -> None:
        sender, stats = self.sender, self.sender.stats
        delay, retrying = sender.backoff_s, False
        with httpx.Client(timeout=sender.timeout_s) as client:
            while True:
                batch = self._take()
                if not batch:
                    return
                if retrying:
                    stats.add(stats.retries, self.url)
                error = self._post(client, batch)
                if error is None:
                    stats.add(stats.sent, self.url, len(batch))
                    sender.tell(self.url, batch, error)  # before the queue says empty (``close``)
                    with self.wake:
                        stats.queued[self.url] = len(self.pending)
                    delay, retrying = sender.backoff_s, False
                    continue
                stats.add(stats.failures, self.url)
                stats.last_error[self.url] = error
                sender.tell(self.url, batch, error)
                self._requeue(batch)
                retrying = True
                if sender.stopped.wait(delay):
                    return
                delay = min(delay * 2, sender.max_backoff_s)

    def _post(self, client: httpx.Client, batch: list[dict]) -> str | None:
        """None when Alertmanager took the batch, else why not (one line)."""
        try:
            response = client.post(
                self.url + API_PATH, content=orjson.dumps(batch), headers={"content-type": "application/json"}
            )
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"
        if response.is_success:
            return None
        return f"HTTP {response.status_code}: {response.text[:200]}"


def check_urls(urls: list[str]) -> list[str]:
    """``urls`` when each is an Alertmanager base URL (http:// or https://), else ValueError."""
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"Alertmanager URL must start with http:// or https://, got {url!r}")
    return urls


class AlertSender:
    """Delivers alerts to one or more Alertmanagers on background threads (see the module doc)."""

    def __init__(
        self,
        urls: list[str],
        *,
        resend_s: float = RESEND_S,
        capacity: int = 10_000,
        timeout_s: float = 10.0,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        ahead_s: float | None = None,
    ) -> None:
        check_urls(urls)
        self.resend_s, self.capacity, self.timeout_s = resend_s, capacity, timeout_s
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.ahead_s = ahead_s  # None: times as the detector dates them (see the module doc)
        self.stats = SenderStats()
        self.closing = False
        self.stopped = threading.Event()
        self.targets = [_Target(url, self) for url in dict.fromkeys(urls)]
        self.firing: dict[tuple, dict] = {}  # re-sent every resend_s until resolved
        self.resolved: dict[tuple, float] = {}  # label set -> the latest startsAt queued resolved
        self.lock = threading.Lock()
        self.resender = threading.Thread(target=self._resend, name="hopline-alert-resend", daemon=True)
        # hears of each post: (url, batch, None if accepted else why not); see the module doc
        self.on_result: Callable[[str, list[dict], str | None], None] | None = None

    def tell(self, url: str, batch: list[dict], error: str | None) -> None:
        """``on_result`` for one post; what it raises is dropped (a printout never stops delivery)."""
        if self.on_result is not None:
            try:
                self.on_result(url, batch, error)
            except Exception:  # noqa: BLE001
                pass

    def start(self) -> AlertSender:
        for target in self.targets:
            target.thread.start()
        self.resender.start()
        return self

    def update(self, alerts: list[dict]) -> None:
        """Send these alerts (``payload``'s shape; with ``ahead_s``, ``bounded``): a firing one (no
        ``endsAt``) is re-sent every ``resend_s`` until an update with its ``endsAt`` (resolved) comes."""
        if not alerts or not self.targets:
            return
        if self.ahead_s is not None:
            latest = time.time() + self.ahead_s
            alerts = [bounded(alert, latest) for alert in alerts]
        with self.lock:
            fresh = []
            for alert in alerts:
                key = label_key(alert)
                if alert.get("endsAt"):
                    began = _began(alert)
                    self.resolved[key] = max(began, self.resolved.get(key, began))
                    if key in self.firing and _began(self.firing[key]) <= began:
                        del self.firing[key]
                elif self.stale(alert):
                    continue
                else:
                    self.firing[key] = alert
                fresh.append(alert)
        for target in self.targets:
            target.put(fresh)

    def stale(self, alert: dict) -> bool:
        """A firing alert whose resolve (of its ``startsAt`` or a later one) was already queued."""
        if alert.get("endsAt") or not alert.get("startsAt"):
            return False
        ended = self.resolved.get(label_key(alert))
        return ended is not None and _began(alert) <= ended

    def _resend(self) -> None:
        while not self.stopped.wait(self.resend_s):
            with self.lock:
                alerts = list(self.firing.values())
            for target in self.targets:
                target.put(alerts)

    def queue_length(self) -> int:
        return sum(self.stats.queued.values())

    def close(self, flush_s: float = 5.0) -> None:
        """Give the queues up to ``flush_s`` seconds to drain, then stop the threads."""
        deadline = time.monotonic() + flush_s
        while (
            self.queue_length()
            and time.monotonic() < deadline
            and any(t.thread.is_alive() for t in self.targets)
        ):
            time.sleep(0.05)
        self.closing = True
        self.stopped.set()
        for target in self.targets:
            with target.wake:
                target.wake.notify_all()
        for target in self.targets:
            if target.thread.is_alive():
                target.thread.join(timeout=self.timeout_s + 1)


# --- an incident as an Alertmanager alert ---------------------------------------------------
RESERVED_LABELS = ("alertname", "severity", "stage", "pitfall", "direction", "side", "standing")
_LABEL_CHARS = str.maketrans({c: "_" for c in "-.:/ "})


def scope_label(key: str) -> str:
    """A scope key as a label name (``[a-zA-Z_][a-zA-Z0-9_]*``), never one of hopline's own."""
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in key.translate(_LABEL_CHARS))
    name = name if name and not name[0].isdigit() else f"_{name}"
    return f"scope_{name}" if name in RESERVED_LABELS else name


def _evidence(incident: Incident) -> str:
    """The numbers behind the sentence, one line of ``name=value`` (those it paged with)."""
    finding = incident.fired or incident.finding
    if isinstance(finding, Shift):
        numbers = {
            "statistic": finding.statistic,
            "before_ms": round(finding.before_ms, 3),
            "after_ms": round(finding.after_ms, 3),
            "factor": None if finding.factor is None else round(finding.factor, 3),
        }
    else:
        numbers = dict(finding.evidence)
    head = {"affected_requests": finding.affected_requests, "impact_s": finding.cost_s, "sample": incident.sample}
    parts = [f"{k}={v}" for k, v in (head | numbers).items() if isinstance(v, int | float | str)]
    if incident.share is not None:
        parts.append(f"share_of_users_time_since_onset={incident.share:.1%}")
    if incident.scope_share is not None:
        parts.append(f"share_of_scope_users_time_since_onset={incident.scope_share:.1%}")
    return " ".join(parts)


def payload(incident: Incident, *, store: str | None = None, generator_url: str | None = None) -> dict:
    """One alert for Alertmanager's ``POST /api/v2/alerts`` from an incident: labels = its
    fingerprint, severity and ``side`` (who owns its time: client, gateway, network, engine),
    annotations = the sentence it paged with (resolved: with how it ended), its co-movers,
    evidence, example requests and the ``hopline timeline`` command for the first of them. The
    attributes every request in its scope shared (``common``: a one-replica deployment's
    replica) are labels too, after the scope's."""
    finding = incident.fired or incident.finding
    labels = {
        "alertname": ALERTNAMES[finding.kind],
        "severity": incident.severity,
        "direction": direction(finding),
        "side": incident.side,
    }
    if isinstance(finding, Shift):
        labels["stage"] = finding.stage
    else:
        labels["pitfall"] = finding.name
    if incident.standing:  # held from the start: a warning, once, never a critical page
        labels["standing"] = "true"
    labels |= {scope_label(k): str(v) for k, v in sorted(incident.scope.items())}
    for k, v in sorted(incident.common.items()):  # every request in scope had it
        labels.setdefault(scope_label(k), str(v))
    onset = iso_utc(incident.fired_onset if incident.fired_onset is not None else incident.onset)
    annotations = {"summary": incident.words, "evidence": _evidence(incident), "onset": onset}
    if incident.co_movers:
        annotations["co_movers"] = "; ".join(f.sentence.split("; ")[0] for f in incident.co_movers)
    if incident.examples:
        annotations["examples"] = " ".join(incident.examples)
        annotations["timeline"] = f"hopline timeline {incident.examples[0]} {store or '<store>'}"
    # a value of an attribute the contract does not know (``--by tenant``) may hold anything
    labels = {k: printable(v) for k, v in labels.items()}
    annotations = {k: printable(v) for k, v in annotations.items()}
    alert = {"labels": labels, "annotations": annotations, "startsAt": onset}
    if incident.state == "resolved" and incident.ends_at is not None:
        alert["endsAt"] = iso_utc(max(incident.ends_at, incident.fired_onset or incident.onset))
    if generator_url:
        alert["generatorURL"] = generator_url
    return alert
