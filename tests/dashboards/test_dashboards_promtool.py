"""Every generated PromQL parses, the rule file checks, and the alerts fire (and stay quiet) as meant.

All with Debian's promtool 2.42 (/usr/bin/promtool), no server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

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


# --- promtool test rules: synthetic series, alerts firing and not -------------------------------

BUCKETS = ("0.05", "0.1", "0.25", "0.5", "1", "2", "+Inf")
MINUTES = 100
PER_MINUTE = 60


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


def test_alerts_fire_on_synthetic_series_and_stay_quiet_otherwise(built, tmp_path: Path, promtool):
    scope = {"service": "chat", "model": "m"}
    queue = {"stage": "queue", **scope}
    series = [
        # r1: queue p50 ~0.075 s for 70 minutes, then ~0.75 s (10x); r2: ~0.075 s throughout
        *histogram("hopline_stage_seconds", {**queue, "replica": "r1"}, lambda t: 0.08 if t <= 70 else 0.8),
        *histogram("hopline_stage_seconds", {**queue, "replica": "r2"}, lambda t: 0.08),
        # r1: clients see TTFT ~1.5 s, the engine ~0.2 s (p90 gap ~1.67 s); r2: no gap
        *histogram("hopline_ttft_seconds", {"view": "client", **scope, "replica": "r1"}, lambda t: 1.5),
        *histogram("hopline_ttft_seconds", {"view": "engine", **scope, "replica": "r1"}, lambda t: 0.2),
        *histogram("hopline_ttft_seconds", {"view": "client", **scope, "replica": "r2"}, lambda t: 0.2),
        *histogram("hopline_ttft_seconds", {"view": "engine", **scope, "replica": "r2"}, lambda t: 0.2),
        # service "chat": 10 errors per 70 requests (14%); "batch": 1 per 61 (1.6%)
        counter("hopline_requests_total", {"outcome": "ok", **scope, "replica": "r1"}, 60),
        counter("hopline_requests_total", {"outcome": "error", **scope, "replica": "r1"}, 10),
        counter(
            "hopline_requests_total", {"outcome": "ok", "service": "batch", "model": "m", "replica": "r1"}, 60
        ),
        counter(
            "hopline_requests_total",
            {"outcome": "error", "service": "batch", "model": "m", "replica": "r1"},
            1,
        ),
        # one negative network stage per minute from minute 30; queue never negative
        counter("hopline_negative_stages_total", {"stage": "network"}, 1, start=30),
        counter("hopline_negative_stages_total", {"stage": "queue"}, 0),
        # rejected events keep coming for one reason; another stopped long ago (counter flat)
        counter("hopline_events_rejected_total", {"reason": "missing_field"}, 5),
        counter("hopline_events_rejected_total", {"reason": "bad_request_id"}, 0),
        # the emitters of chat on gw-1 drop from minute 40 (buffer full); those on gw-2 never do
        counter("hopline_emitter_events_dropped_total", {"service": "chat", "replica": "gw-1", "reason": "full"},
                50, start=40),
        counter("hopline_emitter_events_dropped_total", {"service": "chat", "replica": "gw-2", "reason": "full"}, 0),
    ]

    def alert(labels: dict[str, str], summary: str, dashboard: str, description: str) -> dict[str, Any]:
        return {
            "exp_labels": labels,
            "exp_annotations": {"summary": summary, "description": description, "dashboard": dashboard},
        }

    rules = {
        r["alert"]: r
        for g in yaml.safe_load((built / provisioning.RULES_FILE).read_text())["groups"]
        for r in g["rules"]
        if "alert" in r
    }

    def description(name: str) -> str:
        return rules[name]["annotations"]["description"]  # constant text: no templates in it

    queue_r1 = alert(
        {"severity": "warning", **queue, "replica": "r1"},
        "Queue time p50 on replica r1 (m) is over 3x what it was an hour ago.",
        "/d/hopline-lifecycle?var-replica=r1&var-model=m",
        description("HoplineQueueTimeShift"),
    )
    gap_r1 = alert(
        {"severity": "warning", **scope, "replica": "r1"},
        "Clients of chat wait over 0.5s longer for the first token (p90) than replica r1 takes to "
        "produce it.",
        "/d/hopline-lifecycle?var-service=chat&var-replica=r1",
        description("HoplineClientEngineTtftGap"),
    )
    errors_chat = alert(
        {"severity": "warning", **scope},
        "More than 5% of chat's requests to m did not end ok.",
        "/d/hopline-lifecycle?var-service=chat&var-model=m",
        description("HoplineErrorRatio"),
    )
    negative = alert(
        {"severity": "info", "stage": "network"},
        "Stage network came out negative for some requests.",
        "/d/hopline-lifecycle",
        description("HoplineNegativeStages"),
    )
    rejected = alert(
        {"severity": "info", "reason": "missing_field"},
        "The collector keeps rejecting hop events (missing_field).",
        "/d/hopline-lifecycle",
        description("HoplineEventsRejected"),
    )
    drops = alert(
        {"severity": "warning", "service": "chat", "replica": "gw-1", "reason": "full"},
        "Emitters of chat on gw-1 dropped hop events (full) in the last 10 minutes.",
        "/d/hopline-lifecycle?var-service=chat&var-replica=gw-1",
        description("HoplineEmitterDrops"),
    )
    cases = [
        # before the shift (and before there is an hour to compare with): quiet; after it, r1 only
        ("HoplineQueueTimeShift", "65m", []),
        ("HoplineQueueTimeShift", "85m", [queue_r1]),
        # pending for 10 minutes first, then firing for r1 only
        ("HoplineClientEngineTtftGap", "5m", []),
        ("HoplineClientEngineTtftGap", "20m", [gap_r1]),
        ("HoplineErrorRatio", "3m", []),
        ("HoplineErrorRatio", "20m", [errors_chat]),
        ("HoplineNegativeStages", "25m", []),
        ("HoplineNegativeStages", "32m", [negative]),
        ("HoplineEventsRejected", "8m", []),
        ("HoplineEventsRejected", "20m", [rejected]),
        ("HoplineEmitterDrops", "35m", []),
        ("HoplineEmitterDrops", "45m", [drops]),
    ]
    assert {name for name, _, _ in cases} == set(rules), "every alert has a firing and a quiet case"
    tests = {
        "rule_files": [str(built / provisioning.RULES_FILE)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {"eval_time": t, "alertname": name, "exp_alerts": exp} for name, t, exp in cases
                ],
            }
        ],
    }
    path = tmp_path / "hopline-rules.test.yml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    result = promtool("test", "rules", path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout

    # the same test fails when an expectation is wrong: promtool really compares
    tests["tests"][0]["alert_rule_test"] = [
        {"eval_time": "85m", "alertname": "HoplineQueueTimeShift", "exp_alerts": []}
    ]
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    assert promtool("test", "rules", path).returncode != 0
