"""Failover and retries: a replica answers 503 to first attempts from a moment on and the gateway
(or the client) retries elsewhere. The first finding names the failing replica, not the healthy
ones that served the retries (tests/support/failover_scenarios.py: four replicas, two gateways,
services and models not 1:1, per-host clock offsets and drift, shuffled events)."""

from __future__ import annotations

from datetime import datetime

import polars as pl
import pytest
from hopline.analyzer.findings.failover import retried_rows
from hopline.analyzer.findings.model import to_second
from hopline.analyzer.pipeline import analyze
from hopline.analyzer.timelines import timelines
from support.failover_scenarios import failover_log

HEALTHY = {"r1", "r2", "r4"}


def scenario(by: str, **kw) -> tuple[pl.DataFrame, dict, object]:
    events, truth = failover_log(seed=3, by=by, **kw)
    tl = timelines(events.lazy()).collect()
    return tl, analyze(tl), truth


@pytest.fixture(scope="module")
def gateway_failover():
    return scenario("gateway", added_s=0.078)


@pytest.fixture(scope="module")
def client_retries():
    return scenario("client", added_s=0.5)


def test_timelines_carry_the_attempts(gateway_failover):
    tl, _, truth = gateway_failover
    retried = tl.filter(pl.col("request_id").is_in(list(truth.retried)))
    assert retried.height == len(truth.retried) > 900  # ~a quarter of the second half's 4000 requests
    # the first attempt ran on r3 and failed there with 503; the last one was served elsewhere
    assert set(retried["first_replica"]) == set(retried["failed_replica"]) == {"r3"}
    assert set(retried["replica"]) == HEALTHY
    assert set(retried["retries"]) == {1} and set(retried["client_retries"]) == {0}
    assert set(retried["failed_status"]) == {503}
    others = tl.filter(~pl.col("request_id").is_in(list(truth.retried)))
    assert set(others["retries"]) == {0}
    assert (others["first_replica"] == others["replica"]).all()  # one attempt: the same replica


def test_gateway_failover_is_the_first_finding_and_names_the_failing_replica(gateway_failover):
    tl, out, truth = gateway_failover
    first = out["findings"][0]
    assert (first["kind"], first["name"], first["scope"]) == ("pitfall", "failover", {"failed_replica": "r3"})
    ev = first["evidence"]
    assert ev["failed_first_attempts"] == first["affected_requests"] == len(truth.retried)  # exact
    assert ev["status"] == 503 and ev["retried_by"] == "gateway"
    assert ev["served_by"] == ", ".join(f"{r}: {truth.served_by[r]}" for r in sorted(truth.served_by))
    # onset: within one window of the true first failed first attempt
    assert abs(to_second_of(first["at"]) - truth.onset) <= out["window_s"]
    # added gateway time per retried request: the truth's mean within 10%
    assert ev["added_ms_mean"] == pytest.approx(truth.added_s * 1e3, rel=0.10)
    assert ev["added_s_total"] == pytest.approx(truth.added_s * len(truth.retried), rel=0.10)
    assert "replica r3 answered 503 to" in first["summary"] and "r1, r2 and r4" in first["summary"]
    # the requests the finding's scope selects are the retried ones
    got = set(retried_rows(tl).filter(pl.col("failed_replica") == "r3")["request_id"])
    precision, recall = len(got & truth.retried) / len(got), len(got & truth.retried) / len(truth.retried)
    assert precision >= 0.95 and recall >= 0.95


def test_the_gateway_rise_is_said_with_the_failover_not_apart(gateway_failover):
    _, out, _ = gateway_failover
    brought = out["findings"][0]["with_shifts"]
    assert [s["stage"] for s in brought] == ["gateway"]
    for f in out["findings"] + out["minor"]:
        # no gateway shift of its own, least of all one naming the healthy replicas
        assert not (f["kind"] == "shift" and f["stage"] == "gateway"), f["summary"]
        assert not set(f["scope"].values()) & HEALTHY, f["summary"]
    # the same seconds are not counted twice: the brought rise holds the retries' gateway time
    assert out["findings"][0]["impact_s"] == out["findings"][0]["evidence"]["added_s_total"]


def test_client_retries_name_the_failing_replica_and_the_time_before_the_retry(client_retries):
    tl, out, truth = client_retries
    first = out["findings"][0]
    assert (first["name"], first["scope"]) == ("failover", {"failed_replica": "r3"})
    ev = first["evidence"]
    assert ev["failed_first_attempts"] == len(truth.retried) and ev["retried_by"] == "client"
    assert abs(to_second_of(first["at"]) - truth.onset) <= out["window_s"]
    # the client's time between its first send and the retry's: the failed try plus its back-off
    assert ev["added_ms_mean"] == pytest.approx(truth.added_s * 1e3, rel=0.10)
    assert "the client retried them on r1, r2 and r4" in first["summary"]
    retried = tl.filter(pl.col("request_id").is_in(list(truth.retried)))
    assert set(retried["client_retries"]) == {1} and set(retried["failed_replica"]) == {"r3"}


def test_no_failover_no_finding():
    """The same stack without the incident (its 0.2% engine errors are not retried): silent."""
    events, truth = failover_log(seed=3, onset_s=1e6)
    assert not truth.retried
    out = analyze(timelines(events.lazy()).collect())
    assert all(f.get("name") != "failover" for f in out["findings"] + out["minor"])


def to_second_of(iso: str) -> float:
    """An ISO-8601 UTC time of the JSON as Unix seconds."""
    return to_second(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp())
