"""``hopline demo --scenario cold-connections``: the first finding names the injected incident."""

from __future__ import annotations

from pathlib import Path

from demo_testing import PITFALL_SECONDS, first_finding, processes_of, run_demo
from hopline.analyzer.demo.scenarios import SCENARIOS, matches


def test_first_finding_names_the_incident(tmp_path: Path) -> None:
    report = run_demo(tmp_path, "cold-connections", PITFALL_SECONDS)
    finding = first_finding(report)
    assert matches(finding, SCENARIOS["cold-connections"].expect), (finding, report["findings"][1:3])
    assert processes_of(tmp_path) == []
