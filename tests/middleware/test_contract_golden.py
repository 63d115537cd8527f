"""The stage table, evaluated in plain Python, reproduces the golden fixture (worked by hand)."""

from __future__ import annotations

import pytest

from hopline.middleware.contract import STAGE_NAMES, compute_stages, negative_stages, validate_event
from support.golden import GOLDEN
from hopline.middleware.contract.rules import group_requests

CASES = {c["name"]: c for c in GOLDEN["cases"]}


def requests_of(case):
    """Resolved request ID -> expected values: one request unless the case lists its ``requests``."""
    return case.get("requests") or {case["events"][0]["request_id"]: case}


SPECS = [spec for c in CASES.values() for spec in requests_of(c).values()]


def test_fixture_covers_every_stage_and_the_rows_design_asks_for():
    names = set(CASES)
    assert {"complete_streaming", "no_gateway", "no_client", "no_engine_split", "hosted_api",
            "non_streaming", "failover", "client_retry", "negative_stage", "busy_client", "full_pool_hosted_api",
            "pd_disaggregated", "pd_without_stats_no_client", "reasoning_speculative"} <= names
    # every stage of the table takes a value in at least one case, so no formula goes untested
    seen = {k for c in SPECS for k, v in c["expected"].items() if v is not None}
    assert set(STAGE_NAMES) <= seen


def joined(case):
    """The case's events as requests: the join rule (request ID, then the trace) of rules.py."""
    return group_requests(validate_event(e) for e in case["events"])


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_case(name):
    case = CASES[name]
    groups = joined(case)
    assert set(groups) == set(requests_of(case)), name
    tol = GOLDEN["tolerance_s"]
    for rid, spec in requests_of(case).items():
        got = compute_stages(groups[rid])
        for stage, want in spec["expected"].items():
            if want is None:
                assert got[stage] is None, f"{name} {rid}: {stage} should be null, got {got[stage]}"
            else:
                assert got[stage] == pytest.approx(want, abs=tol), f"{name} {rid}: {stage}"
        assert negative_stages(got) == spec["negative"]


# the identity holds for streaming requests with client and engine hops
SUM_CASES = sorted(
    n for n, c in CASES.items()
    if any(r["expected"]["client_ttft"] is not None and r["expected"]["network"] is not None for r in requests_of(c).values())
)


def test_sum_cases_are_the_streaming_ones_with_both_ends():
    assert SUM_CASES == [
        "agent_three_calls_one_trace", "busy_client", "client_cancel_mid_stream", "client_retry", "complete_streaming",
        "engine_499_after_client_finished", "error_event_client_missed", "error_in_200_stream", "failover",
        "mixed_sources_trace_join", "negative_stage", "never_finished", "no_engine_split", "no_gateway",
        "otel_only_trace_join", "pd_disaggregated", "reasoning_speculative", "retry_after_429_then_success",
        "vllm_metrics_engine_middleware_without_stats",
    ]


@pytest.mark.parametrize("name", SUM_CASES)
def test_ttft_is_the_sum_of_its_stages(name):
    rid = next(r for r, spec in requests_of(CASES[name]).items() if spec["expected"]["client_ttft"] is not None)
    got = compute_stages(joined(CASES[name])[rid])
    engine_part = got["engine"] if got["queue"] is None else got["frontend"] + got["queue"] + got["prefill"]
    engine_part += got["kv_transfer"] or 0.0  # P/D: the decode instance's wait for the KV and first forward
    total = got["client_delay"] + got["connect"] + got["network"] + (got["gateway"] or 0.0) + engine_part
    assert total == pytest.approx(got["client_ttft"], abs=GOLDEN["tolerance_s"])


def test_a_client_side_delay_is_its_own_stage_not_network():
    """A busy caller's delay (``client_delay_s``) is a term of the sum on its own: network and
    upstream stay what remains beyond the client; an event written before the attribute existed
    gives 0 (its delay sits in ``pool_wait_s``, i.e. in connect), never null."""
    busy = compute_stages(joined(CASES["busy_client"])["gold-busy-client"])
    assert (busy["client_delay"], busy["connect"]) == (pytest.approx(0.25), 0.0)
    assert busy["network"] == pytest.approx(0.09, abs=GOLDEN["tolerance_s"])
    hosted = compute_stages(joined(CASES["full_pool_hosted_api"])["gold-full-pool-hosted"])
    assert hosted["client_delay"] + hosted["connect"] + hosted["upstream"] == pytest.approx(hosted["client_ttft"])
    old = compute_stages(joined(CASES["complete_streaming"])["gold-complete"])
    assert old["client_delay"] == 0.0 and old["connect"] == pytest.approx(0.031)
    assert compute_stages(joined(CASES["no_client"])[CASES["no_client"]["events"][0]["request_id"]])["client_delay"] is None


# --- the request rules (middleware/contract/rules.py) ---------------------------------------------------

from hopline.middleware.contract.rules import SCOPE_SOURCES, describe_request  # noqa: E402


def test_fixture_covers_the_request_rules():
    assert {"client_cancel_mid_stream", "engine_499_after_client_finished", "gateway_429", "error_in_200_stream",
            "non_streaming_error", "client_retry", "retry_after_429_then_success", "failover", "never_finished"} <= set(CASES)
    # every outcome and every scope attribute is the answer of at least one case
    assert {c["outcome"] for c in SPECS} == {"ok", "error", "rejected", "disconnected", "incomplete"}
    assert {k for c in SPECS for k in c["scope"]} == set(SCOPE_SOURCES)


def expected_request(case):
    return {"outcome": case["outcome"], "scope": {k: case["scope"].get(k) for k in SCOPE_SOURCES}, "missing": case["missing"]}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_request_rules(name):
    groups = joined(CASES[name])
    for rid, spec in requests_of(CASES[name]).items():
        assert describe_request(groups[rid]) == expected_request(spec), (name, rid)


def test_fixture_covers_the_trace_rule():
    """Only OTel sources, mixed sources, and a trace with several requests (which stay apart)."""
    assert {"otel_only_trace_join", "mixed_sources_trace_join", "agent_three_calls_one_trace"} <= set(CASES)
    assert len(requests_of(CASES["agent_three_calls_one_trace"])) == 4  # three calls + one unplaced stand-in


def test_pd_failover_reads_each_scope_from_its_own_leg_and_attempt():
    """Beyond the fixture: a P/D request whose decode leg fails over (attempt 0 on d1 errs, attempt 1
    prefilled on p2 and decoded on d2). One ``replica`` or ``upstream`` value feeds several scopes
    at once, each with its own leg and attempt rule: replica / decode_replica the highest attempt's
    decode instance (d2), first_replica the lowest (d1), failed_replica the erring one (d1),
    prefill_replica the highest attempt's prefill instance (p2). The prefill legs' ``stream: false``
    is never the request's flag (their hops are ``prefill.*``, no component), so the gateway's
    first token is expected and missing here."""
    t = 1_700_000_000.0

    def ev(dt, hop, attempt=0, **attrs):
        return validate_event({"ts": t + dt, "request_id": "pd-failover", "hop": hop, "attempt": attempt, **attrs})

    gw = {"service": "gw", "replica": "gw-pd"}
    events = [
        ev(0.00, "gateway.received", **gw),
        ev(0.01, "gateway.forwarded", 0, leg="prefill", upstream="p1", **gw),
        ev(0.02, "engine.received", 0, leg="prefill", replica="p1", stream=False, service="vllm"),
        ev(0.10, "engine.last_token", 0, leg="prefill", replica="p1"),
        ev(0.11, "gateway.forwarded", 0, leg="decode", upstream="d1", **gw),
        ev(0.12, "engine.received", 0, leg="decode", replica="d1", stream=True, service="vllm"),
        ev(0.13, "engine.error", 0, leg="decode", replica="d1", status=500),
        ev(0.20, "gateway.forwarded", 1, leg="prefill", upstream="p2", **gw),
        ev(0.21, "engine.received", 1, leg="prefill", replica="p2", stream=False, service="vllm"),
        ev(0.30, "engine.last_token", 1, leg="prefill", replica="p2"),
        ev(0.31, "gateway.forwarded", 1, leg="decode", upstream="d2", **gw),
        ev(0.32, "engine.received", 1, leg="decode", replica="d2", stream=True, service="vllm"),
        ev(0.40, "engine.first_token", 1, leg="decode", replica="d2"),
        ev(0.90, "engine.last_token", 1, leg="decode", replica="d2"),
        ev(0.91, "gateway.last_token", 1, **gw),
    ]
    described = describe_request(events)
    assert described["outcome"] == "ok"
    assert described["missing"] == ["gateway.first_token"]  # streamed: the decode leg's engine.received
    scope = described["scope"]
    assert (scope["replica"], scope["decode_replica"], scope["first_replica"], scope["failed_replica"]) == (
        "d2", "d2", "d1", "d1"
    )
    assert scope["prefill_replica"] == "p2" and scope["service"] == "gw" and scope["gateway_replica"] == "gw-pd"
    # the arrival order does not matter here (no two candidates of one scope tie)
    assert describe_request(events[::-1]) == described
