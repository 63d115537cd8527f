"""``verbose_outputs`` means a template changed: one caller's answers got longer from a moment on.
Services that answer at different lengths on one model all along are not flagged
(tests/support/template_scenarios.py on synth's logs: four replicas, services and models not 1:1,
per-host clocks, shuffled events)."""

from __future__ import annotations

from datetime import datetime

import polars as pl
import pytest
from hopline.analyzer.report import analyze
from hopline.analyzer.timelines import timelines
from support.synth import VerboseService, generate
from support.template_scenarios import longer_from

SERVICES = ("kite-chat", "agent-runner", "search-assist")
# kite-chat and agent-runner share a model; search-assist has its own
MODELS = {"kite-chat": "llama-3.1-70b", "agent-runner": "llama-3.1-70b", "search-assist": "qwen-2.5-32b"}


def chat_and_agent(seed: int = 5) -> pl.DataFrame:
    """300 s of traffic where kite-chat's answers are 2.5x agent-runner's on the same model, all along."""
    return generate(
        6000, seed=seed, services=SERVICES, models=MODELS, replicas=("r1", "r2", "r3", "r4"),
        incidents=[VerboseService("kite-chat", 2.5)],
    )  # fmt: skip


def seconds(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def test_a_chat_service_answering_longer_than_an_agent_all_along_is_not_a_finding():
    tl = timelines(chat_and_agent().lazy()).collect()
    p50 = dict(tl.group_by("service").agg(pl.col("output_tokens").median()).iter_rows())
    assert p50["kite-chat"] > 2.2 * p50["agent-runner"]  # the old rule's 2x between services holds
    out = analyze(tl)
    assert [f for f in out["findings"] + out["minor"] if f.get("name") == "verbose_outputs"] == []


@pytest.mark.parametrize("ratio", [2.0, 5.0])
def test_stable_differences_of_two_to_five_fold_are_not_findings(ratio):
    events = generate(
        4000, seed=7, services=("kite-chat", "agent-runner"), models={"kite-chat": "m", "agent-runner": "m"},
        incidents=[VerboseService("kite-chat", ratio)],
    )  # fmt: skip
    out = analyze(timelines(events.lazy()).collect())
    assert all(f.get("name") != "verbose_outputs" for f in out["findings"] + out["minor"])


@pytest.fixture(scope="module")
def doubled():
    events, truth = longer_from(chat_and_agent(), "kite-chat", at_s=150, factor=2.0)
    tl = timelines(events.lazy()).collect()
    return tl, analyze(tl), truth


def test_answers_that_double_from_mid_run_are_the_first_finding_with_their_onset(doubled):
    tl, out, truth = doubled
    first = out["findings"][0]
    assert (first["name"], first["scope"]) == ("verbose_outputs", {"service": "kite-chat"})
    assert first["evidence"]["model"] == "llama-3.1-70b"
    assert abs(seconds(first["at"]) - truth.onset) <= out["window_s"]
    assert first["evidence"]["ratio"] == pytest.approx(2.0, rel=0.15)
    # the requests it concerns: kite-chat's after the onset, which are the lengthened ones
    after = tl.filter((pl.col("service") == "kite-chat") & (pl.col("start") >= seconds(first["at"]) - 1))
    got = set(after["request_id"])
    hit = len(got & truth.lengthened)
    assert hit / len(got) >= 0.95 and hit / len(truth.lengthened) >= 0.95
    assert first["affected_requests"] == pytest.approx(len(truth.lengthened), rel=0.05)
    # the decode the longer answers added: the truth within 10%
    assert first["evidence"]["extra_decode_s"] == pytest.approx(truth.extra_decode_s, rel=0.10)
    assert "kite-chat's answers on llama-3.1-70b got" in first["summary"]


def test_the_decode_rise_is_said_with_the_longer_answers_not_apart(doubled):
    _, out, _ = doubled
    first = out["findings"][0]
    assert [s["stage"] for s in first["with_shifts"]] == ["decode"]
    assert not any(f["kind"] == "shift" and f["stage"] == "decode" for f in out["findings"] + out["minor"])
    # counted once: the rise holds the same decode seconds as the finding's own
    assert first["impact_s"] == pytest.approx(first["evidence"]["extra_decode_s"], abs=0.1)
