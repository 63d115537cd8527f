"""``GET /metrics`` of ``hopline watch``: the active findings as a bounded series, and the
watcher's own counters, built on an explicit registry (``build_registry``).

``hopline_live_finding{kind, stage, scope_key, scope_value, direction}`` = the factor of each
firing incident (a pitfall: 1; a shift from a stage at 0 ms: +Inf), at most ``MAX_SERIES``
series (the largest share of users' time first; the rest counted in
``hopline_live_findings_not_shown``). A scope of several keys is one label pair, keys and values
joined by ``,`` in the same order (``replica,model`` / ``r2,m1``); all traffic is ``""``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from hopline.analyzer.findings.model import Shift
from hopline.analyzer.live.incidents import Incident, direction, subject
from hopline.analyzer.live.watch import Watch
from hopline.middleware.contract import live_metrics
from hopline.middleware.http_limits import WHY, ConnectionLimits
from hopline.middleware.contract.live_metrics import FINDING
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

NOT_SHOWN = "hopline_live_findings_not_shown"
ALERTS_SENT = "hopline_live_alerts_sent"  # _total added by the exposition
SEND_FAILURES = "hopline_live_alert_send_failures"
RETRIES = "hopline_live_alert_retries"
DROPPED = "hopline_live_alerts_dropped"
QUEUE = "hopline_live_alert_queue_length"
FINISHED = "hopline_live_finished_requests"
STEPS = "hopline_live_steps"
STEP_CPU = "hopline_live_step_cpu_seconds"
EVENT_TIME = "hopline_live_event_time_seconds"
SAMPLE = "hopline_live_sample_ratio"
NOT_SAMPLED = "hopline_live_events_not_sampled"
FROM_FUTURE = "hopline_live_events_from_future"
FOLLOW_FAILURES = "hopline_live_follow_failures"
HTTP_CLOSED = "hopline_live_http_connections_closed"
MAX_SERIES = 100
FINDING_LABELS = list(live_metrics.FINDING_LABELS)


def finding_value(incident: Incident) -> float:
    finding = incident.finding
    if not isinstance(finding, Shift):
        return 1.0
    return float(finding.factor) if finding.factor is not None else math.inf


def finding_labels(incident: Incident) -> list[str]:
    finding = incident.finding
    scope = finding.scope
    keys = sorted(scope)
    return [finding.kind, subject(finding), ",".join(keys), ",".join(str(scope[k]) for k in keys), direction(finding)]


class LiveCollector(Collector):
    """Yields the families from the watch's newest snapshot and its sender's counters."""

    def __init__(self, watch: Watch, limits: ConnectionLimits | None = None) -> None:
        self.watch = watch
        self.limits = limits

    def collect(self) -> Iterator:
        with self.watch.lock:
            firing = [i for i in self.watch.snapshot if i.state == "firing"]
        firing.sort(key=lambda i: -(i.share or 0.0))
        gauge = GaugeMetricFamily(
            FINDING, "Firing findings: the factor of each (pitfall: 1)", labels=FINDING_LABELS
        )
        for incident in firing[:MAX_SERIES]:
            gauge.add_metric(finding_labels(incident), finding_value(incident))
        yield gauge
        yield GaugeMetricFamily(
            NOT_SHOWN, "Firing findings beyond the series cap", value=max(0, len(firing) - MAX_SERIES)
        )
        detector = self.watch.detector
        yield CounterMetricFamily(
            FINISHED, "Finished requests the detector took in", value=detector.finished_requests
        )
        yield CounterMetricFamily(STEPS, "Detection steps run", value=detector.steps)
        yield CounterMetricFamily(
            STEP_CPU, "Process CPU seconds spent in detection steps", value=detector.cpu_s
        )
        yield GaugeMetricFamily(
            EVENT_TIME, "Event time of the last step (Unix seconds)", value=detector.now or 0.0
        )
        yield GaugeMetricFamily(SAMPLE, "The fraction of requests analysed (--sample)", value=detector.config.sample)
        yield CounterMetricFamily(
            NOT_SAMPLED, "Events of requests outside the sample", value=detector.events_not_sampled
        )
        yield CounterMetricFamily(
            FROM_FUTURE,
            "Events dropped as dated ahead: of the wall clock by more than --future, or a leap of event "
            "time no other request confirmed",
            value=detector.events_from_future,
        )
        yield CounterMetricFamily(
            FOLLOW_FAILURES,
            "--follow: polls that could not list or open the followed files (out of file descriptors: "
            "EMFILE); retried on the next poll",
            value=self.watch.follow_failures,
        )
        if self.limits is not None:
            closed = CounterMetricFamily(
                HTTP_CLOSED,
                "HTTP connections closed before their request was read: over_cap (beyond --max-connections), "
                "header_timeout (no complete headers within --header-timeout), body_timeout",
                labels=["why"],
            )
            for why in WHY:
                closed.add_metric([why], self.limits.closed[why])
            yield closed
        yield from self._sender()

    def _sender(self) -> Iterator:
        sender = self.watch.sender
        urls = [t.url for t in sender.targets] if sender is not None else []
        stats = sender.stats if sender is not None else None
        for name, help_, attr, family in (
            (ALERTS_SENT, "Alerts Alertmanager accepted", "sent", CounterMetricFamily),
            (SEND_FAILURES, "Posts to Alertmanager that failed", "failures", CounterMetricFamily),
            (RETRIES, "Posts to Alertmanager that retried a failed one", "retries", CounterMetricFamily),
            (DROPPED, "Alerts dropped from a full queue", "dropped", CounterMetricFamily),
            (QUEUE, "Alerts waiting to be sent", "queued", GaugeMetricFamily),
        ):
            metric = family(name, help_, labels=["alertmanager"])
            for url in urls:
                metric.add_metric([url], getattr(stats, attr).get(url, 0))
            yield metric


def build_registry(watch: Watch, limits: ConnectionLimits | None = None) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LiveCollector(watch, limits))
    return registry
