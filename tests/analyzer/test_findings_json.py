"""The findings serialise as plain JSON whatever types a detector computed them in: numpy's
``float64`` subclasses ``float`` (``round`` keeps it numpy), and orjson without
``OPT_SERIALIZE_NUMPY`` refuses it (``hopline analyze --json`` failed on a vLLM log whose
``verbose_outputs`` evidence held ``np.median``s). ``model.pitfall`` makes every value plain; this
checks it on scalar mixes (hypothesis) and on every registered detector's real findings."""

from __future__ import annotations

import math
from decimal import Decimal

import numpy as np
import orjson
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hopline.analyzer.findings.detector import Context
from hopline.analyzer.findings.model import Findings, Pitfall, Shift, pitfall, plain, validate
from hopline.analyzer.findings.rank import find
from hopline.analyzer.findings.registry import REGISTRY
from hopline.analyzer.timelines import timelines
from support.failover_scenarios import failover_log
from support.modern import cache_log
from support.synth import ColdConnections, LongPrompts, NoMaxTokens, StageShift, generate
from support.template_scenarios import longer_from

PLAIN = (int, float, str, type(None))
INT64 = st.integers(-(2**63), 2**63 - 1)
FLOATS = st.floats(allow_nan=True, allow_infinity=True, width=64)

# Every scalar type a detector computes evidence in: Python's, numpy's (from np.median, .mean(),
# a frame's .to_numpy()), and what polars' scalar accessors hand back.
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.booleans().map(np.bool_),
    INT64,
    INT64.map(np.int64),
    st.integers(-(2**31), 2**31 - 1).map(np.int32),
    st.integers(0, 2**16 - 1).map(np.uint16),
    FLOATS,
    FLOATS.map(np.float64),
    st.floats(width=32).map(np.float32),
    st.text(max_size=20),
    st.text(max_size=20).map(np.str_),
    st.decimals(allow_nan=False, allow_infinity=False, places=6),
    FLOATS.map(lambda x: pl.Series([x]).item()),
    INT64.map(lambda x: pl.Series([x], dtype=pl.Int64).item()),
)


def expected(value: object) -> object:
    """What the JSON holds for ``value``: its plain value, floats to 4 digits, null for what JSON
    cannot say (NaN, infinities)."""
    if value is None or isinstance(value, str):
        return None if value is None else str(value)  # np.str_("") != "" (numpy compares it as an array)
    if isinstance(value, bool | np.bool_):
        return int(value)
    if isinstance(value, int | np.integer):
        return int(value)
    number = float(value)
    return round(number, 4) if math.isfinite(number) else None


@settings(max_examples=300, deadline=None)
@given(
    evidence=st.dictionaries(st.text(min_size=1, max_size=12), SCALARS, max_size=8),
    impact=st.one_of(st.floats(-1e9, 1e9), st.floats(-1e9, 1e9).map(np.float64), st.integers(0, 10**6).map(np.int64)),
    at=st.one_of(st.none(), st.floats(1e9, 2e9).map(np.float64), st.floats(1e9, 2e9)),
    affected=st.integers(0, 10**9).map(np.int64),
)
def test_pitfall_evidence_of_any_scalar_mix_serialises_and_reads_back(evidence, impact, at, affected):
    p = pitfall("verbose_outputs", {"service": "kite-chat"}, affected, evidence, "said", impact, "decode", at=at)
    assert all(type(v) in PLAIN for v in p.evidence.values())
    assert p.evidence == {k: expected(v) for k, v in evidence.items()}
    assert type(p.impact_s) is float and type(p.affected_requests) is int
    assert p.at is None or type(p.at) is float
    # top level and nested in a shift's relation: the JSON the CLI prints, without numpy support
    shift = Shift(summary="s", stage="decode", at=1.7e9, scope={}, statistic="p50", before_ms=1.0,
                  after_ms=2.0, factor=2.0, z=5.0, affected_requests=1, impact_s=1.0, with_pitfalls=(p,))  # fmt: skip
    data = Findings(findings=(p, shift)).to_json()
    text = orjson.dumps(data)
    back = orjson.loads(text)
    decided = validate(back)  # the types' own reading of it: no key, type or value they refuse
    read, holder = decided.findings
    assert isinstance(read, Pitfall) and isinstance(holder, Shift)
    assert read.evidence == holder.with_pitfalls[0].evidence == back["findings"][0]["evidence"]
    assert orjson.loads(orjson.dumps(read.to_json())) == back["findings"][0]  # and it says the same again


def test_plain_refuses_what_is_not_a_number_or_a_string():
    assert plain(np.float64(1 / 3)) == 0.3333 and type(plain(np.float64(1 / 3))) is float
    assert plain(np.bool_(True)) == 1 and type(plain(np.bool_(True))) is int
    assert plain(Decimal("2.50000")) == 2.5
    with pytest.raises(TypeError, match="evidence 'when'"):
        pitfall("failover", {}, 1, {"when": object()}, "said", 0.0, "gateway")


# --- every detector's findings, on the synthetic logs the tests build each pitfall from ---------


def _frame(events: pl.DataFrame) -> pl.DataFrame:
    return timelines(events.lazy()).collect()


def _frames() -> dict[str, pl.DataFrame]:
    """One log per family of incidents, as tests/analyzer/test_pitfalls.py, test_failover.py,
    test_modern_findings.py and test_verbose_outputs.py build them."""
    stack = generate(
        5000, seed=31,
        incidents=[StageShift("queue", 4.0, at_s=120, scope={"replica": "r2"}),
                   StageShift("network", 25.0, at_s=0, scope={"service": "search-assist"}),
                   ColdConnections("kite-chat"), LongPrompts("r1", count=3), NoMaxTokens("kite-chat", share=0.3)],
    )  # fmt: skip
    longer, _ = longer_from(
        generate(6000, seed=5, services=("kite-chat", "agent-runner"), replicas=("r1", "r2", "r3", "r4")),
        "kite-chat", at_s=150, factor=2.5,
    )  # fmt: skip
    failing, _ = failover_log(seed=3, by="gateway", added_s=0.078)
    return {
        "stack": _frame(stack),
        "longer": _frame(longer),
        "failover": _frame(failing),
        "cache": _frame(cache_log(1)),
    }


def _names(found: list) -> set[str]:
    """Every detector a finding, or a finding held in another's relation, comes from."""
    out = set()
    for f in found:
        if isinstance(f, Shift):
            out |= {"stage_shift"} | _names(list(f.with_pitfalls))
        else:
            out |= {f.name} | _names(list(f.with_shifts))
    return out


def _evidence(found: list) -> list[dict]:
    out = []
    for f in found:
        if isinstance(f, Shift):
            out += _evidence(list(f.with_pitfalls))
        else:
            out += [f.evidence, *_evidence(list(f.with_shifts))]
    return out


def test_every_detectors_findings_serialise_as_plain_json():
    found_by: set[str] = set()
    for label, frame in _frames().items():
        decided = find(frame, Context(window_s=10.0, kv_bytes_per_token=131_072))
        every = [*decided.findings, *decided.minor]
        text = orjson.dumps(decided.to_json())  # no OPT_SERIALIZE_NUMPY: what numpy is left fails here
        assert validate(orjson.loads(text)) is not None, label
        for evidence in _evidence(every):
            assert all(type(v) in PLAIN for v in evidence.values()), (label, evidence)
        found_by |= _names(every)
    # not vacuous: each registered detector made at least one of the findings serialised above
    assert found_by >= {d.name for d in REGISTRY}, {d.name for d in REGISTRY} - found_by
