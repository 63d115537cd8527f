"""docs/contract.md is what the contract and the rule book say, and documents every key of the
analyzer's JSON (so other emitters and scripts can be written against it)."""

from __future__ import annotations

from pathlib import Path

from hopline.middleware.contract import docs

DOC = Path(__file__).parents[1] / "docs" / "contract.md"


def test_the_committed_page_is_the_generated_one():
    assert DOC.read_text() == docs.render(), (
        "docs/contract.md is stale: run `python -m hopline.middleware.contract.docs > docs/contract.md`"
    )


def test_every_key_of_the_findings_json_is_documented():
    from hopline.analyzer import report
    from hopline.analyzer.attribution import Slo
    from hopline.analyzer.io import ScanReport
    from support.synth import StageShift, generate
    from hopline.analyzer.timelines import timelines

    events = generate(duration_s=240, seed=2, incidents=[StageShift("queue", 4.0, at_s=120, scope={"replica": "r2"})])
    result = report.analyze(
        timelines(events.lazy()).collect(), slo=Slo.parse("ttft=300ms"), scan=ScanReport()
    )
    assert set(result) <= set(docs.FINDINGS_TOP), set(result) - set(docs.FINDINGS_TOP)
    assert set(docs.FINDINGS_TOP) - set(result) == set(), "a documented key the analyzer never prints"
    for entry in result["stages"].values():
        assert set(entry) == set(docs.FINDINGS_STAGE)
    shifts = [f for f in result["findings"] if f["kind"] == "shift"]
    assert shifts, "the queue incident is found"
    for finding in shifts:
        assert set(finding) == set(docs.FINDINGS_SHIFT), set(finding) ^ set(docs.FINDINGS_SHIFT)
    for finding in (f for f in result["findings"] if f["kind"] == "pitfall"):
        assert set(finding) == set(docs.FINDINGS_PITFALL), set(finding) ^ set(docs.FINDINGS_PITFALL)
