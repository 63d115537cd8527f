"""``hopline demo`` tried as a new user would (issue 35, the first hour, round three).

Before: each live alert filled the terminal with its whole JSON (some 30 lines); the closing line
quoted the first critical alert, whatever the injected incident was; the README's
``hopline demo --seconds 20 --scenario slow-network`` could find nothing and then said "the first
finding does not name it", with no warning before it started.
"""

from __future__ import annotations

import re
from pathlib import Path

from hopline.demo.cli import closing_lines, named_line
from hopline.demo.live import alert_text
from hopline.demo.orchestrate import DemoRun
from hopline.demo.scenarios import SCENARIOS, alert_matches
from rich.console import Console
from test_demo_cli import _said_before_running

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()

QUEUE = {
    "labels": {"alertname": "HoplineShift", "severity": "critical", "direction": "up", "side": "engine",
               "stage": "queue", "replica": "r2", "model": "tiny"},
    "annotations": {"summary": "queue time tripled at 10:06 on replica r2 (p50 9 → 30 ms)",
                    "evidence": "affected_requests=80", "timeline": "hopline timeline abc DIR"},
    "startsAt": "2026-01-05T10:06:00Z",
}  # fmt: skip
NETWORK = {
    "labels": {"alertname": "HoplineShift", "severity": "warning", "direction": "up", "side": "network",
               "stage": "network", "service": "kite-chat"},
    "annotations": {"summary": "network time rose 4.9× at 10:06 on service kite-chat (p50 7.6 → 38 ms)"},
    "startsAt": "2026-01-05T10:06:10Z",
}  # fmt: skip


def printed(markup: str) -> str:
    console = Console(width=200, no_color=True, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(markup, highlight=False)
    return console.export_text()


def test_a_live_alert_is_two_lines_stage_scope_sentence_and_seconds_since_onset():
    text = printed(alert_text({"seconds_since_onset": 12.4, "alert": QUEUE})).rstrip("\n")
    lines = text.splitlines()  # before: 2 + the alert's JSON, indented (29 lines)
    assert lines == [
        "live alert FIRING +12 s since onset: queue on replica=r2, model=tiny",
        "  queue time tripled at 10:06 on replica r2 (p50 9 → 30 ms)",
    ]
    resolved = QUEUE | {"endsAt": "2026-01-05T10:07:00Z"}
    text = printed(alert_text({"seconds_since_onset": 60, "alert": resolved}))
    assert text.startswith("live alert RESOLVED +60 s")


def test_the_closing_line_quotes_the_alert_of_the_injected_incident():
    expect = SCENARIOS["slow-network"].expect
    assert alert_matches(NETWORK, expect) and not alert_matches(QUEUE, expect)
    fired = ({"seconds_since_onset": 9.0, "alert": QUEUE}, {"seconds_since_onset": 14.0, "alert": NETWORK})
    lines = closing_lines(DemoRun({}, None, 3.0, None, live_alerts=fired), html=None, expect=expect)
    # before: the first critical one, the queue's, which is not the incident the demo injected
    assert lines[0] == (
        "live: 2 alerts fired while it ran, the injected incident's 14 s after its onset: "
        "network time rose 4.9× at 10:06 on service kite-chat (p50 7.6 → 38 ms)"
    )
    only_queue = closing_lines(DemoRun({}, None, 3.0, None, live_alerts=fired[:1]), html=None, expect=expect)
    assert only_queue[0].startswith(
        "live: 1 alert fired while it ran, none for the injected incident; the first 9 s"
    )


def test_the_readmes_short_run_is_long_enough_for_its_scenario_and_a_shorter_one_is_warned(monkeypatch):
    pattern = r"^\.venv/bin/hopline demo (--seconds \d+ --scenario [\w-]+)"
    (command,) = re.findall(pattern, README, re.MULTILINE)
    seconds, scenario = command.split()[1], command.split()[3]
    assert float(seconds) >= SCENARIOS[scenario].min_seconds
    assert "too short" not in _said_before_running(monkeypatch, "--seconds", seconds, "--scenario", scenario)
    said = _said_before_running(monkeypatch, "--seconds", "20", "--scenario", "slow-network")
    assert "--seconds 20 is too short for slow-network" in said  # before: nothing said, and nothing found


def test_a_run_that_found_nothing_never_says_the_first_finding_does_not_name_it():
    chosen = SCENARIOS["slow-network"]
    nothing = named_line([], chosen, 20)
    assert "first finding" not in nothing  # before: "the first finding does not name it"
    assert nothing == (
        "[red]no finding: the analysis did not see it: --seconds 20 is under the 30 s it needs[/red]"
    )
    network = {"kind": "shift", "stage": "network", "scope": {"service": "kite-chat"}}
    queue = {"kind": "shift", "stage": "queue", "scope": {"replica": "r2"}}
    assert named_line([network], chosen, 30) == "[green]the first finding names it[/green]"
    assert named_line([queue, network], chosen, 30) == "[yellow]finding 2 names it, not the first[/yellow]"
    assert named_line([queue], chosen, 30).startswith("[red]no finding names it: rerun it longer")
