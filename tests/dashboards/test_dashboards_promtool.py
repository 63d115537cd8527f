"""Every generated PromQL parses, the rule file checks, and the alerts fire (and stay quiet) as meant.

All with Debian's promtool 2.42 (/usr/bin/promtool), no server.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from hopline.collector import metric_names as m
from hopline.dashboards import provisioning
from hopline.dashboards.promql import substitute_variables
from hopline.dashboards.rules import ALERT_PREFIX


def test_every_expression_parses_after_grafana_substitutes_its_variables(expressions, parse_with_promtool):
    substituted = [(where, substitute_variables(expr)) for where, expr in expressions]
    assert not [where for where, expr in substituted if "$" in expr]
    result = parse_with_promtool([expr for _, expr in substituted])
    numbered = "\n".join(f"expr_{i}: {where}" for i, (where, _) in enumerate(substituted))
    assert result.returncode == 0, f"{result.stdout}{result.stderr}\n{numbered}"
    assert f"SUCCESS: {len(substituted)} rules found" in result.stdout
    assert len(substituted) > 80  # two dashboards and the rules: the check saw them all


def test_the_parse_check_rejects_a_broken_expression(parse_with_promtool):
    # the same wrapping that passes above must fail on a real syntax error, or it checks nothing
    ok = "sum(rate(hopline_requests_total[5m]))"
    assert parse_with_promtool([ok]).returncode == 0
    broken = parse_with_promtool([ok, "sum(rate(hopline_requests_total[5m])"])
    assert broken.returncode != 0
    assert "expr_1" in broken.stdout + broken.stderr or "unclosed" in broken.stdout + broken.stderr
    # and on a Grafana variable that was not substituted
    assert parse_with_promtool(["rate(hopline_requests_total[$__rate_interval])"]).returncode != 0


def test_the_generated_rule_file_passes_promtool_check_rules(built, rule_file, promtool):
    result = promtool("check", "rules", built / provisioning.RULES_FILE)
    assert result.returncode == 0, result.stdout + result.stderr
    rules = [r for g in rule_file["groups"] for r in g["rules"]]
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout
    alerts = [r["alert"] for r in rules if "alert" in r]
    assert alerts and all(a.startswith(ALERT_PREFIX) for a in alerts)
    # every recorded series an alert reads is recorded here
    recorded = {r["record"] for r in rules if "record" in r}
    for rule in rules:
        for name in {
            w for w in rule["expr"].replace("{", " ").replace("(", " ").split() if w.startswith("hopline:")
        }:
            assert name in recorded, f"{rule.get('alert')} reads {name}, which no rule records"


def test_the_prometheus_config_passes_promtool_check_config(built, promtool):
    # the same file the docker-compose stack mounts; check config also checks the rule file it names
    result = promtool("check", "config", built / provisioning.PROMETHEUS_FILE)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout + result.stderr


# --- promtool test rules: each alert on the series it is written for, and on a healthy look-alike ---

BUCKETS = (*map(str, m.LATENCY_BUCKETS), "+Inf")  # the collector's, as it writes them
MINUTES = 100
PER_MINUTE = 60
# a healthy run is checked at every 5 minutes from here: a rule reading "offset 1h" or "offset 10m"
# needs that much history before it says anything (a fresh Prometheus)
HEALTHY_FROM = 15


def _labels(labels: dict[str, str]) -> str:
    return ", ".join(f'{k}="{v}"' for k, v in labels.items())


def histogram(name: str, labels: dict[str, str], value_at: Any) -> list[dict[str, str]]:
    """Cumulative ``_bucket`` series: PER_MINUTE observations a minute of ``value_at(minute)``."""
    counts = {le: [0] for le in BUCKETS}
    for minute in range(1, MINUTES + 1):
        value = value_at(minute)
        for le in BUCKETS:
            counts[le].append(counts[le][-1] + (PER_MINUTE if le == "+Inf" or value <= float(le) else 0))
    return [
        {"series": f"{name}_bucket{{{_labels({**labels, 'le': le})}}}", "values": " ".join(map(str, c))}
        for le, c in counts.items()
    ]


def counter(name: str, labels: dict[str, str], per_minute: float, start: int = 0) -> dict[str, str]:
    values = [0 if minute < start else (minute - start) * per_minute for minute in range(MINUTES + 1)]
    return {"series": f"{name}{{{_labels(labels)}}}", "values": " ".join(f"{v:g}" for v in values)}


def series(name: str, labels: dict[str, str], value_at: Any) -> dict[str, str]:
    """One sample a minute of ``value_at(minute)``; ``None``: no sample (the series is absent)."""
    values = [value_at(minute) for minute in range(MINUTES + 1)]
    written = " ".join("_" if v is None else f"{v:g}" for v in values)
    return {"series": f"{name}{{{_labels(labels)}}}", "values": written}


@dataclass(frozen=True)
class Case:
    """One alert: the series it is written for (``incident``: it fires at ``fires_at`` exactly as
    ``alerts`` say, and is quiet at ``quiet_at``, before) and a healthy look-alike (``healthy``:
    quiet at every evaluation from HEALTHY_FROM on)."""

    incident: list[dict[str, str]]
    fires_at: str
    alerts: list[dict[str, Any]]
    quiet_at: str
    healthy: list[dict[str, str]]


def cases(rules: dict[str, dict[str, Any]]) -> dict[str, Case]:
    """Every generated alert's case, by name (``rules``: the generated alerting rules by name)."""
    scope = {"service": "chat", "model": "m"}
    queue = {"stage": "queue", **scope, "replica": "r1"}
    stage_seconds, ttft = "hopline_stage_seconds", "hopline_ttft_seconds"

    def alert(name: str, labels: dict[str, str], summary: str, dashboard: str) -> dict[str, Any]:
        annotations = {"summary": summary, "description": rules[name]["annotations"]["description"]}
        return {"exp_labels": labels, "exp_annotations": annotations | {"dashboard": dashboard}}

    def ttft_gap(client_s: float, engine_s: float) -> list[dict[str, str]]:
        return [
            *histogram(ttft, {"view": "client", **scope, "replica": "r1"}, lambda t: client_s),
            *histogram(ttft, {"view": "engine", **scope, "replica": "r1"}, lambda t: engine_s),
        ]

    def outcomes(errors_per_minute: float) -> list[dict[str, str]]:
        return [
            counter("hopline_requests_total", {"outcome": "ok", **scope, "replica": "r1"}, 60),
            counter(
                "hopline_requests_total", {"outcome": "error", **scope, "replica": "r1"}, errors_per_minute
            ),
        ]

    watch = {"instance": "watch:9800", "job": provisioning.WATCH_JOB}
    finding = {**watch, "kind": "shift", "stage": "queue", "scope_key": "replica", "scope_value": "r2",
               "direction": "up"}  # fmt: skip
    drops = {"service": "chat", "replica": "gw-1", "reason": "full"}
    return {
        # queue p50 ~0.08 s for 70 minutes, then ~0.8 s (10x); healthy: 0.08 -> 0.15 s (under 3x), and
        # 0.005 -> 0.04 s (8x, but under the 50 ms floor: 3 x nothing is still nothing)
        "HoplineQueueTimeShift": Case(
            incident=histogram(stage_seconds, queue, lambda t: 0.08 if t <= 70 else 0.8),
            fires_at="85m",
            alerts=[alert("HoplineQueueTimeShift", {"severity": "warning", **queue},
                          "Queue time p50 on replica r1 (m) is over 3x what it was an hour ago.",
                          "/d/hopline-lifecycle?var-replica=r1&var-model=m")],
            quiet_at="65m",
            healthy=[
                *histogram(stage_seconds, queue, lambda t: 0.08 if t <= 70 else 0.15),
                *histogram(stage_seconds, {**queue, "replica": "r2"}, lambda t: 0.005 if t <= 70 else 0.04),
            ],
        ),  # fmt: skip
        # clients see TTFT ~1.5 s, the engine ~0.2 s; healthy: 0.5 s beside 0.2 s (the network's share)
        "HoplineClientEngineTtftGap": Case(
            incident=ttft_gap(1.5, 0.2),
            fires_at="20m",
            alerts=[alert("HoplineClientEngineTtftGap", {"severity": "warning", **scope, "replica": "r1"},
                          "Clients of chat wait over 0.5s longer for the first token (p90) than replica r1 "
                          "takes to produce it.", "/d/hopline-lifecycle?var-service=chat&var-replica=r1")],
            quiet_at="5m",  # pending for its 10 minutes first
            healthy=ttft_gap(0.5, 0.2),
        ),  # fmt: skip
        # 10 errors a minute beside 60 ok (14%); healthy: 1 beside 60 (1.6%)
        "HoplineErrorRatio": Case(
            incident=outcomes(10),
            fires_at="20m",
            alerts=[alert("HoplineErrorRatio", {"severity": "warning", **scope},
                          "More than 5% of chat's requests to m did not end ok.",
                          "/d/hopline-lifecycle?var-service=chat&var-model=m")],
            quiet_at="3m",
            healthy=outcomes(1),
        ),  # fmt: skip
        # the collector makes a stage's series at its first negative value (at 1, never 0 before):
        # one negative network stage at minute 30, none after; healthy: one long before (a series
        # standing still at 3 all along)
        "HoplineNegativeStages": Case(
            incident=[
                series("hopline_negative_stages_total", {"stage": "network"}, lambda t: None if t < 30 else 1)
            ],
            fires_at="32m",
            alerts=[alert("HoplineNegativeStages", {"severity": "info", "stage": "network"},
                          "Stage network came out negative for some requests.", "/d/hopline-lifecycle")],
            quiet_at="25m",
            healthy=[series("hopline_negative_stages_total", {"stage": "queue"}, lambda t: 3)],
        ),  # fmt: skip
        # rejected events keep coming (5 a minute); healthy: some were rejected, long ago (flat)
        "HoplineEventsRejected": Case(
            incident=[counter("hopline_events_rejected_total", {"reason": "missing_field"}, 5)],
            fires_at="20m",
            alerts=[alert("HoplineEventsRejected", {"severity": "info", "reason": "missing_field"},
                          "The collector keeps rejecting hop events (missing_field).",
                          "/d/hopline-lifecycle")],
            quiet_at="8m",
            healthy=[series("hopline_events_rejected_total", {"reason": "bad_request_id"}, lambda t: 12)],
        ),  # fmt: skip
        # an emitter's buffer overflows from minute 40 (its series exist at 0 from its first report)
        "HoplineEmitterDrops": Case(
            incident=[counter("hopline_emitter_events_dropped_total", drops, 50, start=40)],
            fires_at="45m",
            alerts=[alert("HoplineEmitterDrops", {"severity": "warning", **drops},
                          "Emitters of chat on gw-1 dropped hop events (full) in the last 10 minutes.",
                          "/d/hopline-lifecycle?var-service=chat&var-replica=gw-1")],
            quiet_at="35m",
            healthy=[counter("hopline_emitter_events_dropped_total", drops, 0)],
        ),  # fmt: skip
        # the watcher serves a finding from minute 20 (factor 3); healthy: it serves none
        "HoplineLiveFinding": Case(
            incident=[series("hopline_live_finding", finding, lambda t: None if t < 20 else 3)],
            fires_at="21m",
            alerts=[alert("HoplineLiveFinding", {"severity": "none", **finding},
                          "hopline watch finds a shift of queue (up, factor 3) in replica=r2.",
                          "/d/hopline-lifecycle")],
            quiet_at="19m",
            healthy=[series("hopline_live_steps_total", watch, lambda t: 6 * t)],
        ),  # fmt: skip
        # the watcher cannot be scraped from minute 30; healthy: up, but for one failed scrape
        "HoplineWatchDown": Case(
            incident=[series("up", watch, lambda t: 1 if t < 30 else 0)],
            fires_at="40m",
            alerts=[alert("HoplineWatchDown", {"severity": "warning", **watch},
                          "hopline watch at watch:9800 cannot be scraped: live findings reach neither the "
                          "panels nor Alertmanager.", "/d/hopline-lifecycle")],
            quiet_at="33m",  # pending for its 5 minutes first
            healthy=[series("up", watch, lambda t: 0 if t == 50 else 1)],
        ),  # fmt: skip
    }


def rules_test(rule_file: Path, alerts: dict[str, Case]) -> dict[str, Any]:
    """A promtool unit-test file: per alert, one test on its incident, one on its healthy series."""
    tests = []
    for name, case in alerts.items():
        tests.append({
            "name": f"{name} fires on what it is written for",
            "interval": "1m",
            "input_series": case.incident,
            "alert_rule_test": [
                {"eval_time": case.quiet_at, "alertname": name, "exp_alerts": []},
                {"eval_time": case.fires_at, "alertname": name, "exp_alerts": case.alerts},
            ],
        })  # fmt: skip
        tests.append({
            "name": f"{name} stays silent on a healthy look-alike",
            "interval": "1m",
            "input_series": case.healthy,
            "alert_rule_test": [
                {"eval_time": f"{t}m", "alertname": name, "exp_alerts": []}
                for t in range(HEALTHY_FROM, MINUTES + 1, 5)
            ],
        })  # fmt: skip
    return {"rule_files": [str(rule_file)], "evaluation_interval": "1m", "tests": tests}


def test_every_alert_fires_on_its_series_and_stays_silent_on_a_healthy_one(built, tmp_path: Path, promtool):
    rules = {
        r["alert"]: r
        for g in yaml.safe_load((built / provisioning.RULES_FILE).read_text())["groups"]
        for r in g["rules"]
        if "alert" in r
    }
    alerts = cases(rules)
    assert set(alerts) == set(rules), "every generated alert has its case"
    tests = rules_test(built / provisioning.RULES_FILE, alerts)
    path = tmp_path / "hopline-rules.test.yml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    result = promtool("test", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout

    # promtool really compares: each rule's firing expectation dropped, each healthy run said to fire
    for name, case in alerts.items():
        wrong = {name: replace(case, alerts=[])}
        path.write_text(yaml.safe_dump(rules_test(built / provisioning.RULES_FILE, wrong)))
        assert promtool("test", "rules", path).returncode != 0, f"{name}: the firing case checks nothing"
        wrong = {name: replace(case, incident=case.healthy, quiet_at=case.fires_at)}
        path.write_text(yaml.safe_dump(rules_test(built / provisioning.RULES_FILE, wrong)))
        assert promtool("test", "rules", path).returncode != 0, f"{name}: fires on the healthy series"
