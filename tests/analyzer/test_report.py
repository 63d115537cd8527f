"""The terminal report: readable at 80 columns, one number format, counted nouns."""

from __future__ import annotations

import io
from dataclasses import replace
from datetime import UTC, datetime

import polars as pl
import pytest
from hopline.analyzer import pipeline, report
from hopline.analyzer.findings import Context, Pitfall, Shift
from hopline.analyzer.findings.rank import caused_by_shifts
from support.synth import ColdConnections, LongPrompts, StageShift, generate, on_localhost
from hopline.analyzer.timelines import timelines
from rich.console import Console


@pytest.fixture(scope="module")
def result() -> report.Analysis:
    events = generate(
        duration_s=300,
        seed=5,
        services=("kite-chat-with-a-long-service-name", "search-assist"),
        incidents=[StageShift("queue", 3.0, at_s=150, scope={"replica": "r2"})],
    )
    return pipeline.analysis(timelines(events.lazy()).collect())


@pytest.mark.parametrize("width", [80, 150])
def test_nothing_is_cut_at_any_width(result, width):
    out = io.StringIO()
    report.render(result, Console(file=out, width=width, color_system=None))
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= width
    assert "…" not in text  # rich's sign of a truncated cell
    # every stage and replica shows up in full
    for word in ("engine frontend", "queue", "prefill", "decode", "r1", "r2", "search-assist"):
        assert word in text, word
    assert "Largest part of TTFT: queue" in text


def test_counted_nouns():
    assert report.plural(1, "request") == "1 request"
    assert report.plural(2, "request") == "2 requests"
    assert report.plural(12000, "request") == "12,000 requests"


# --- minor findings (issue 11): what costs users almost nothing is not a main finding ----------


@pytest.fixture(scope="module")
def cold_localhost() -> report.Analysis:
    """search-assist opens a connection per request, on localhost (adding 0 ms), and r2's queue
    triples: the queue is the finding, the connections a minor one."""
    events = generate(
        duration_s=300,
        seed=6,
        incidents=[
            StageShift("queue", 3.0, at_s=150, scope={"replica": "r2"}),
            ColdConnections("search-assist"),
        ],
    )
    return pipeline.analysis(timelines(on_localhost(events).lazy()).collect())


def test_a_new_connection_per_request_adding_0_ms_is_minor(cold_localhost):
    result = cold_localhost.to_json()
    names = [f.get("name") for f in result["findings"]]
    assert "new_connection_per_request" not in names, [f["summary"] for f in result["findings"]]
    (minor,) = [f for f in result["minor"] if f.get("name") == "new_connection_per_request"]
    assert "adding 0 ms" in minor["summary"]
    assert minor["share_of_users_time"] < report.MINOR_SHARE
    # the incident is still the first finding, and it costs users far more than the threshold
    first = result["findings"][0]
    assert (first["kind"], first["stage"], first["scope"]) == ("shift", "queue", {"replica": "r2"})
    assert first["share_of_users_time"] > 10 * report.MINOR_SHARE


def test_a_new_connection_per_request_that_costs_tls_is_a_main_finding():
    """The same client over a real network (~42 ms of connect + TLS per request) is not minor."""
    events = generate(duration_s=300, seed=6, incidents=[ColdConnections("search-assist")])
    result = pipeline.analyze(timelines(events.lazy()).collect())
    (cold,) = [f for f in result["findings"] if f["name"] == "new_connection_per_request"]
    assert cold["share_of_users_time"] > 0.1  # ~42 ms of a ~130 ms TTFT, on half the requests
    assert result["minor"] == []


def render_text(result: report.Analysis, **options) -> str:
    out = io.StringIO()
    report.render(result, Console(file=out, width=80, color_system=None), **options)
    return out.getvalue()


def test_the_terminal_says_minor_findings_in_one_line_and_lists_them_with_all(cold_localhost):
    result = cold_localhost.to_json()
    minor = next(f for f in result["minor"] if f.get("name") == "new_connection_per_request")
    text = " ".join(render_text(cold_localhost, command="hopline analyze logs/").split())  # unwrapped
    count = len(result["minor"])
    line = f"{report.plural(count, 'minor finding')} (each under 1% of users' time), see "
    line += "`hopline analyze logs/ --all`"
    assert line in text
    assert "opens a new connection" not in text
    listed = " ".join(render_text(cold_localhost, show_minor=True, command="hopline analyze logs/").split())
    assert "Minor findings (each under 1% of users' time)" in listed
    assert " ".join(minor["summary"].split()[:6]) in listed
    assert "--all`" not in listed


def test_the_contract_page_states_the_threshold_the_report_applies():
    from hopline.analyzer.findings import docs

    assert f"under {report.MINOR_SHARE:.0%} of their time" in docs.FINDINGS_TOP["minor"]
    assert f"< {report.MINOR_SHARE:g})" in docs.FINDINGS_TOP["minor"]


def test_a_long_prefill_stall_after_a_prefill_rise_is_said_as_its_consequence():
    """A prefill regression on r1 makes its long prompts' prefills long enough to stall the other
    streams: one incident, said from the shift, with the pitfall in its ``with_pitfalls``."""
    events = generate(
        duration_s=300,
        seed=8,
        incidents=[StageShift("prefill", 4.0, at_s=120, scope={"replica": "r1"}), LongPrompts("r1", 3, after=0.6)],
    )
    result = pipeline.analyze(timelines(events.lazy()).collect())
    names = [f.get("name") for f in result["findings"] + result["minor"]]
    assert "long_prefill_stall" not in names
    first = result["findings"][0]
    assert (first["kind"], first["stage"], first["scope"]) == ("shift", "prefill", {"replica": "r1"})
    (stall,) = first["with_pitfalls"]
    assert stall["name"] == "long_prefill_stall" and stall["scope"] == {"replica": "r1"}
    assert "(long_prefill_stall)" in first["summary"]


def test_a_queue_rise_behind_long_prefills_is_said_as_the_stalls_consequence():
    """Without chunked prefill, requests reaching r1 during one of its long prefills wait for its
    end: the queue rise that brings is the stall's (the fix is chunked prefill, not replicas), as
    in the demo's huge-prompt scenario on a busy machine."""
    stall_only = LongPrompts("r1", 80, prompt_tokens=14_000, after=0.4)
    alone = pipeline.analyze(
        timelines(generate(duration_s=300, seed=8, incidents=[stall_only]).lazy()).collect()
    )
    events = generate(duration_s=300, seed=8, incidents=[replace(stall_only, queue_behind=True)])
    result = pipeline.analyze(timelines(events.lazy()).collect())
    everything = result["findings"] + result["minor"]
    assert [f for f in everything if f["kind"] == "shift" and f["stage"] == "queue"] == []
    first = result["findings"][0]
    assert (first["kind"], first["name"], first["scope"]) == ("pitfall", "long_prefill_stall", {"replica": "r1"})
    assert {"replica": "r1"} in [s["scope"] for s in first["with_shifts"] if s["stage"] == "queue"]
    assert "(queue shift)" in first["summary"]
    # the stall's own cost (its stalled outputs) plus the queue seconds it brought
    (own,) = [f for f in alone["findings"] if f.get("name") == "long_prefill_stall"]
    assert own["with_shifts"] == []
    assert first["impact_s"] > own["impact_s"] * 1.05


def test_a_queue_rise_of_its_own_stays_a_shift_beside_long_prefills():
    """r1's queue quadruples (more load than it serves) while a few long prompts stall it: the
    rise is not the stall's, most of its queued seconds were not spent behind a long prefill."""
    incidents = [StageShift("queue", 4.0, at_s=120, scope={"replica": "r1"}),
                 LongPrompts("r1", 5, prompt_tokens=14_000, after=0.3, queue_behind=True)]  # fmt: skip
    events = generate(duration_s=300, seed=8, incidents=incidents)
    result = pipeline.analyze(timelines(events.lazy()).collect())
    first = result["findings"][0]
    assert (first["kind"], first["stage"], first["scope"]) == ("shift", "queue", {"replica": "r1"})
    (stall,) = [f for f in result["findings"] + result["minor"] if f.get("name") == "long_prefill_stall"]
    assert stall["with_shifts"] == []


def test_a_pitfall_is_folded_only_into_a_rise_of_its_stage_in_its_scope_and_time():
    ten_five = datetime(2026, 12, 1, 10, 5, tzinfo=UTC).timestamp()

    def shift(**kw) -> Shift:
        base = {"stage": "prefill", "scope": {"replica": "r1"}, "at": ten_five, "until": None, "before_ms": 30.0,
                "after_ms": 120.0, "impact_s": 50.0, "summary": "s", "statistic": "p50", "z": 9.0,
                "affected_requests": 100, "factor": 4.0}  # fmt: skip
        return Shift(**{**base, **kw})

    def stall(at: float = ten_five + 60, replica: str = "r1") -> Pitfall:
        return Pitfall(name="long_prefill_stall", summary="1 long prompt …", scope={"replica": replica},
                       affected_requests=3, evidence={}, impact_s=9.0, spent_in="decode", at=at)  # fmt: skip

    ctx = Context(window_s=1.0)
    (cause,), left = caused_by_shifts([shift()], [stall()], ctx)
    assert left == [] and cause.with_pitfalls == (stall(),)
    assert caused_by_shifts([shift(scope={})], [stall()], ctx)[1] == []  # all traffic covers r1
    for rise, pitfall in (
        (shift(), stall(at=ten_five - 60)),  # before the rise
        (shift(), stall(replica="r2")),  # elsewhere
        (shift(stage="decode"), stall()),  # another stage
        (shift(after_ms=10.0), stall()),  # a fall
        (shift(until=ten_five + 30), stall()),  # after it ended
    ):
        (cause,), left = caused_by_shifts([rise], [pitfall], ctx)
        assert left == [pitfall]
        assert cause.with_pitfalls == ()


def test_counts_with_equal_counts_are_ordered_by_name_on_every_run():
    """Outcomes, negative stages and missing hops: most first, ties by name (Polars'
    ``value_counts(sort=True)`` left ties in an order that changed from run to run, so the same log
    gave different JSON), as the sampled path's exact totals (``bounded._counts``) order them."""
    hops = ["engine.last_token", "client.first_token", "gateway.last_token", "client.first_token", "b", "a"]
    for _ in range(20):
        got = report._counts(pl.Series("missing", hops).shuffle())
        assert list(got.items()) == [("client.first_token", 2), ("a", 1), ("b", 1), ("engine.last_token", 1),
                                     ("gateway.last_token", 1)]  # fmt: skip
