"""docs/contract.md is what the contract and the rule book say; docs/findings.md and
docs/findings.schema.json are what the findings' types and the detector registry say, and document
every key of the analyzer's JSON (so other emitters and scripts can be written against them)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hopline.analyzer.findings import docs as findings_docs
from hopline.analyzer.findings.model import Pitfall, Shift, validate
from hopline.middleware.contract import docs

DOCS = Path(__file__).parents[1] / "docs"


def test_the_committed_page_is_the_generated_one():
    assert (DOCS / "contract.md").read_text() == docs.render(), (
        "docs/contract.md is stale: run `python -m hopline.middleware.contract.docs > docs/contract.md`"
    )


def test_the_committed_findings_page_and_schema_are_the_generated_ones(tmp_path):
    written = findings_docs.write(tmp_path)
    assert [p.name for p in written] == ["findings.md", "findings.schema.json"]
    for path in written:
        assert (DOCS / path.name).read_text() == path.read_text(), (
            f"docs/{path.name} is stale: run `python -m hopline.analyzer.findings.docs docs`"
        )


@pytest.fixture(scope="module")
def result() -> dict:
    from hopline.analyzer import pipeline
    from hopline.analyzer.attribution import Slo
    from hopline.analyzer.io import ScanReport
    from hopline.analyzer.timelines import timelines
    from support.synth import ColdConnections, LongPrompts, StageShift, generate

    incidents = [
        StageShift("queue", 4.0, at_s=120, scope={"replica": "r2"}),
        StageShift("prefill", 4.0, at_s=120, scope={"replica": "r1"}),
        LongPrompts("r1", 3, after=0.6),
        ColdConnections("search-assist"),
    ]
    events = generate(duration_s=240, seed=2, incidents=incidents)
    return pipeline.analyze(timelines(events.lazy()).collect(), slo=Slo.parse("ttft=300ms"), scan=ScanReport())


def test_every_key_of_the_findings_json_is_documented(result):
    top, stage = findings_docs.FINDINGS_TOP, findings_docs.FINDINGS_STAGE
    assert set(result) <= set(top), set(result) - set(top)
    assert set(top) - set(result) == set(), "a documented key the analyzer never prints"
    for entry in result["stages"].values():
        assert set(entry) == set(stage)
    shift_keys, pitfall_keys = findings_docs.keys(Shift), findings_docs.keys(Pitfall)
    everything = result["findings"] + result["minor"]
    shifts = [f for f in everything if f["kind"] == "shift"]
    pitfalls = [f for f in everything if f["kind"] == "pitfall"]
    assert shifts and pitfalls, "the incidents are found"
    for finding in shifts:
        assert list(finding) == list(shift_keys), set(finding) ^ set(shift_keys)  # same keys, same order
    for finding in pitfalls:
        assert list(finding) == list(pitfall_keys), set(finding) ^ set(pitfall_keys)
    assert any(s["with_pitfalls"] for s in shifts), "a relation is exercised (the stall after the prefill rise)"
    for nested in (p for s in shifts for p in s["with_pitfalls"]):
        assert list(nested) == [k for k in pitfall_keys if k != "share_of_users_time"]


def test_the_findings_json_validates_against_its_types_and_schema(result):
    """The JSON read back through the types that generate the schema (pydantic; no extra key,
    every value of its type), and the schema names every registered pitfall."""
    decided = validate(result)
    assert len(decided.findings) == len(result["findings"]) and len(decided.minor) == len(result["minor"])
    schema = findings_docs.findings_schema()
    names = schema["$defs"]["Pitfall"]["properties"]["name"]["enum"]
    assert names == ["user_vs_engine_gap", "new_connection_per_request", "long_prefill_stall", "no_max_tokens",
                     "verbose_outputs", "failover", "prefix_cache_miss"]  # fmt: skip
    assert all(p["name"] in names for p in result["findings"] + result["minor"] if p["kind"] == "pitfall")
    bad = {**result, "findings": [{**result["findings"][0], "undocumented": 1}]}
    with pytest.raises(ValueError, match="undocumented"):
        validate(bad)
