"""Prometheus recording and alerting rules for hopline, as the dict a rule file holds.

Recording rules precompute the stage and TTFT quantiles (and stage means) over 5 minutes, per
``stage`` / ``view`` and ``service, model, replica``, so alerts compare cheap series and an
"an hour ago" comparison (``offset 1h``) costs nothing. Every alert name starts with
``ALERT_PREFIX``: the dashboards annotate ``ALERTS{alertname=~"Hopline.*"}``.

``hopline watch`` sends its own alerts (``HoplineShift``, ``HoplinePitfall``: the sentence, the
evidence, the side that owns it) to Alertmanager. ``LIVE_FINDING`` mirrors its
``hopline_live_finding`` in Prometheus' ``ALERTS`` (its alert lists and rule views), and pages
nobody: the series holds every firing finding, those the watcher decided not to page (standing,
a change in the traffic, the caller's own lateness) too, so the generated Alertmanager routes it
to a receiver without configs (``SILENT``). ``HoplineWatchDown`` says when the watcher, and so
every live finding, is gone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hopline.collector import metric_names as m
from hopline.middleware.contract import live_metrics as live

from . import promql
from .provisioning import WATCH_JOB

ALERT_PREFIX = "Hopline"
WINDOW = "5m"
QUANTILES = (0.5, 0.9, 0.99)
SCOPE = ("service", "model", "replica")
LIFECYCLE_UID = "hopline-lifecycle"
LIVE_FINDING = f"{ALERT_PREFIX}LiveFinding"
LIVE_FINDING_EXPR = f"{live.FINDING} > 0"  # the "Findings now" panel's and the annotation's query
SILENT = (LIVE_FINDING,)  # alerts the generated Alertmanager sends to no one (see the module doc)


def recorded(metric: m.Metric, statistic: str) -> str:
    """``hopline:stage_seconds:p50_5m``: level ``hopline``, the metric, the operation and window."""
    return f"hopline:{metric.name.removeprefix('hopline_')}:{statistic}_{WINDOW}"


def _pct(q: float) -> str:
    return f"p{q * 100:g}"


@dataclass(frozen=True)
class Thresholds:
    """What the alerts fire on; ``hopline dashboards build`` takes each as an option."""

    queue_factor: float = 3.0  # queue p50 vs an hour ago
    queue_floor_s: float = 0.05  # ignore queue p50 below this (3 x 0 is 0: any queueing would fire)
    ttft_gap_s: float = 0.5  # client TTFT p90 minus engine TTFT p90
    error_ratio: float = 0.05  # share of requests not "ok"


DEFAULT_THRESHOLDS = Thresholds()


def recording_rules() -> list[dict[str, str]]:
    rules = []
    for metric, label in ((m.STAGE_SECONDS, "stage"), (m.TTFT_SECONDS, "view")):
        by = (label, *SCOPE)
        for q in QUANTILES:
            rules.append(
                {
                    "record": recorded(metric, _pct(q)),
                    "expr": promql.quantile(q, metric, by, window=WINDOW, variables=False),
                }
            )
        rules.append(
            {
                "record": recorded(metric, "mean"),
                "expr": promql.mean(metric, by, window=WINDOW, variables=False),
            }
        )
    return rules


def _link(**labels: str) -> str:
    query = "&".join(f"var-{var}={{{{ $labels.{label} }}}}" for var, label in labels.items())
    return f"/d/{LIFECYCLE_UID}?{query}"


def alerting_rules(t: Thresholds = DEFAULT_THRESHOLDS) -> list[dict[str, Any]]:
    queue_p50 = recorded(m.STAGE_SECONDS, "p50") + '{stage="queue"}'
    ttft_p90 = recorded(m.TTFT_SECONDS, "p90")
    errors = promql.rate(m.REQUESTS, ("service", "model"), window=WINDOW, variables=False, outcome="!ok")
    requests = promql.rate(m.REQUESTS, ("service", "model"), window=WINDOW, variables=False)
    negative = m.NEGATIVE_STAGES.series
    return [
        {
            "alert": f"{ALERT_PREFIX}QueueTimeShift",
            "expr": f"{queue_p50} > {t.queue_factor:g} * ({queue_p50} offset 1h)"
            f" and {queue_p50} > {t.queue_floor_s:g}",
            "for": "5m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "Queue time p50 on replica {{ $labels.replica }} ({{ $labels.model }}) is over "
                f"{t.queue_factor:g}x what it was an hour ago.",
                "description": "Requests wait longer for a batch slot: more load, fewer replicas, longer "
                "prompts or outputs. Compare the replica's queue heatmap and in-flight requests.",
                "dashboard": _link(replica="replica", model="model"),
            },
        },
        {
            "alert": f"{ALERT_PREFIX}ClientEngineTtftGap",
            "expr": f'{ttft_p90}{{view="client"}} - ignoring(view) {ttft_p90}{{view="engine"}}'
            f" > {t.ttft_gap_s:g}",
            "for": "10m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": f"Clients of {{{{ $labels.service }}}} wait over {t.ttft_gap_s:g}s longer for the "
                f"first token (p90) than replica {{{{ $labels.replica }}}} takes to produce it.",
                "description": "The time is outside the engine: connection setup, network, gateway. "
                "The stacked TTFT-by-stage panel shows which.",
                "dashboard": _link(service="service", replica="replica"),
            },
        },
        {
            "alert": f"{ALERT_PREFIX}ErrorRatio",
            "expr": f"{promql.ratio(errors, requests)} > {t.error_ratio:g}",
            "for": "5m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": f"More than {t.error_ratio:.0%} of {{{{ $labels.service }}}}'s requests to "
                f"{{{{ $labels.model }}}} did not end ok.",
                "description": "See the request outcomes panel (error, rejected, disconnected, incomplete).",
                "dashboard": _link(service="service", model="model"),
            },
        },
        {
            "alert": f"{ALERT_PREFIX}NegativeStages",
            # the collector makes a stage's series at its first negative value, so that value is
            # no increase(): a series that was not there 10 minutes ago counts too (tested with
            # promtool: before, a stage's first negative values never fired)
            "expr": f"sum by (stage) (increase({negative}[10m])) > 0"
            f" or sum by (stage) ({negative} unless {negative} offset 10m) > 0",
            "labels": {"severity": "info"},
            "annotations": {
                "summary": "Stage {{ $labels.stage }} came out negative for some requests.",
                "description": "An instrumentation or clock problem (a timestamp taken in the wrong place, "
                "or a stats duration longer than the span it belongs to). hopline never clamps it.",
                "dashboard": f"/d/{LIFECYCLE_UID}",
            },
        },
        {
            "alert": f"{ALERT_PREFIX}EventsRejected",
            "expr": f"sum by (reason) (rate({m.EVENTS_REJECTED.series}[{WINDOW}])) > 0",
            "for": "10m",
            "labels": {"severity": "info"},
            "annotations": {
                "summary": "The collector keeps rejecting hop events ({{ $labels.reason }}).",
                "description": "Some middleware sends events that break the hop event contract; "
                "the collector's log names the field.",
                "dashboard": f"/d/{LIFECYCLE_UID}",
            },
        },
        {
            "alert": f"{ALERT_PREFIX}EmitterDrops",
            "expr": "sum by (service, replica, reason) "
            f"(increase({m.EMITTER_DROPPED.series}[10m])) > 0",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "Emitters of {{ $labels.service }} on {{ $labels.replica }} dropped hop events "
                "({{ $labels.reason }}) in the last 10 minutes.",
                "description": "Those requests are missing or incomplete in hopline's metrics and store. "
                "full: an emitter's buffer was full (its oldest events made room): the collector was slow "
                "or unreachable, or the traffic outgrew the sink; sink: the collector refused the events "
                "or stayed unreachable for the retry budget; closed: emitted after shutdown.",
                "dashboard": _link(service="service", replica="replica"),
            },
        },
        {
            "alert": LIVE_FINDING,
            "expr": LIVE_FINDING_EXPR,
            "labels": {"severity": "none"},
            "annotations": {
                "summary": "hopline watch finds a {{ $labels.kind }} of {{ $labels.stage }} "
                "({{ $labels.direction }}, factor {{ $value | printf \"%.3g\" }}) in "
                "{{ if $labels.scope_key }}{{ $labels.scope_key }}={{ $labels.scope_value }}"
                "{{ else }}all traffic{{ end }}.",
                "description": "A mirror of hopline watch's hopline_live_finding, for Prometheus' and "
                "Grafana's alert views: it pages nobody (the generated Alertmanager routes it to a "
                "receiver without configs). The watcher's own alert, which pages, says the sentence, "
                "the evidence, example requests and the side that owns it.",
                "dashboard": f"/d/{LIFECYCLE_UID}",
            },
        },
        {
            "alert": f"{ALERT_PREFIX}WatchDown",
            "expr": f'up{{job="{WATCH_JOB}"}} == 0',
            "for": "5m",
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "hopline watch at {{ $labels.instance }} cannot be scraped: live findings reach "
                "neither the panels nor Alertmanager.",
                "description": "The watcher follows the collector's store and sends its findings to "
                "Alertmanager; while it is down nothing pages for a change in the traffic's stages. "
                "Its log says why (a store it cannot read, a --listen port in use).",
                "dashboard": f"/d/{LIFECYCLE_UID}",
            },
        },
    ]


def rule_file(t: Thresholds = DEFAULT_THRESHOLDS) -> dict[str, Any]:
    """The rule file's content: one group of recordings, one of alerts."""
    return {
        "groups": [
            {"name": "hopline-recordings", "rules": recording_rules()},
            {"name": "hopline-alerts", "rules": alerting_rules(t)},
        ]
    }
