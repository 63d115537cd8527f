"""timelines() — Polars expressions derived from the contract's stage table — against the golden
fixture (worked by hand) and against ``contract.compute_stages`` on generated logs."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from hopline.analyzer.io import SCHEMA
from hopline.analyzer.timelines import COLUMNS, timelines
from hopline.middleware.contract import STAGE_NAMES, validate_event

GOLDEN = json.loads((Path(__file__).parents[1] / "golden_stages.json").read_text())
CASES = {c["name"]: c for c in GOLDEN["cases"]}


def frame(events: list[dict]) -> pl.LazyFrame:
    """Validated events as the analyzer's storage frame (unknown fields dropped: not needed here)."""
    rows = [validate_event(e) for e in events]
    return pl.DataFrame([{k: r.get(k) for k in SCHEMA} for r in rows], schema=SCHEMA).lazy()


@pytest.fixture(scope="module")
def golden_rows() -> dict[str, dict]:
    events = []
    for case in GOLDEN["cases"]:
        # one request per case: prefix the id so cases cannot collide
        events += [{**e, "request_id": f"{case['name']}.{e['request_id']}"} for e in case["events"]]
    out = timelines(frame(events)).collect()
    assert out.columns == list(COLUMNS)
    assert out.height == len(CASES)
    return {r["request_id"].split(".")[0]: r for r in out.iter_rows(named=True)}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_case_through_polars(name, golden_rows):
    case, got = CASES[name], golden_rows[name]
    for stage, want in case["expected"].items():
        if want is None:
            assert got[stage] is None, f"{name}: {stage} should be null, got {got[stage]}"
        else:
            assert got[stage] == pytest.approx(want, abs=GOLDEN["tolerance_s"]), f"{name}: {stage}"
    assert got["negative"] == case["negative"]


def test_every_stage_is_a_column():
    assert set(STAGE_NAMES) <= set(COLUMNS)
