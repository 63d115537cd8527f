"""``verbose_outputs`` means a template changed: one caller's answers got longer from a moment on.
Services that answer at different lengths on one model all along are not flagged
(tests/support/template_scenarios.py on synth's logs: four replicas, services and models not 1:1,
per-host clocks, shuffled events)."""

from __future__ import annotations

from datetime import datetime

import numpy as np
import polars as pl
import pytest
from hopline.analyzer.findings.common import requested_mix
from hopline.analyzer.findings.detector import Context
from hopline.analyzer.findings.verbose_outputs import VerboseOutputs
from hopline.analyzer.pipeline import analyze
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


# --- like compared with like: a change in what the caller asked for is not its template ---------
# The vLLM flood (/work/shared/repro/README.md, vllm-flood-live-2026-12-04): two chat users ask
# max_tokens=48, then a batch job under the same service name and route asks 160; every answer
# ran to its cap (ignore_eos). The caller's p50 went 48 -> 160 tokens, yet no answer got longer
# than the same request's had been.

LAST_HOPS = ("engine.last_token", "engine.stats", "gateway.last_token", "client.last_token")
START = datetime(2026, 1, 5, 10, 0).timestamp()  # synth's DEFAULT_START is 10:00 UTC


def answers(events: pl.DataFrame, plan: pl.DataFrame) -> pl.DataFrame:
    """``events`` with the requests of ``plan`` (``request_id``, ``cap``, ``tokens``) asking
    ``cap`` as max_tokens and answering ``tokens``: the decode they take at the request's own
    inter-token latency, every last hop moved by the difference on its own host's clock,
    ``finish_reason`` length where the answer reached the cap (as ``longer_from`` does)."""
    hop = pl.col("hop")
    ends = events.filter(hop.is_in(["engine.first_token", "engine.last_token"])).pivot(
        on="hop", index="request_id", values="ts", aggregate_function="first"
    )
    old = events.filter(hop == "engine.last_token").select("request_id", old=pl.col("output_tokens"))
    plan = (
        plan.join(ends, on="request_id")
        .join(old, on="request_id")
        .filter(pl.col("old") >= 2)
        .with_columns(itl=(pl.col("engine.last_token") - pl.col("engine.first_token")) / (pl.col("old") - 1))
        .select("request_id", "cap", "tokens", extra=(pl.col("tokens") - pl.col("old")) * pl.col("itl"))
    )
    last, planned = hop.is_in(list(LAST_HOPS)), pl.col("extra").is_not_null()
    return (
        events.join(plan, on="request_id", how="left")
        .with_columns(
            ts=pl.when(last & planned).then(pl.col("ts") + pl.col("extra")).otherwise(pl.col("ts")),
            max_tokens=pl.when(planned & pl.col("max_tokens").is_not_null()).then(pl.col("cap")).otherwise(pl.col("max_tokens")),
            output_tokens=pl.when(planned & pl.col("output_tokens").is_not_null()).then(pl.col("tokens")).otherwise(pl.col("output_tokens")),
            output_chunks=pl.when(planned & pl.col("output_chunks").is_not_null()).then(pl.col("tokens")).otherwise(pl.col("output_chunks")),
            decode_s=pl.when(planned & (hop == "engine.stats")).then(pl.col("decode_s") + pl.col("extra")).otherwise(pl.col("decode_s")),
            finish_reason=pl.when(planned & pl.col("finish_reason").is_not_null())
            .then(pl.when(pl.col("tokens") >= pl.col("cap")).then(pl.lit("length")).otherwise(pl.lit("stop")))
            .otherwise(pl.col("finish_reason")),
        )
        .select(events.columns)
        .cast(dict(events.schema))
    )


def kite_chat(events: pl.DataFrame, seed: int = 11) -> pl.DataFrame:
    """kite-chat's requests: ``request_id``, when sent (s from the start), what they answered,
    and a uniform draw (``u``) to pick a share of them."""
    sent = events.filter((pl.col("hop") == "client.sent") & (pl.col("service") == "kite-chat"))
    old = events.filter(pl.col("hop") == "engine.last_token").select("request_id", old=pl.col("output_tokens"))
    rows = sent.select("request_id", t=pl.col("ts") - START).join(old, on="request_id").sort("request_id")
    return rows.with_columns(u=pl.Series(np.random.default_rng(seed).random(rows.height)))


def asking_more_from(at_s: float, ignore_eos: bool) -> pl.DataFrame:
    """chat_and_agent where kite-chat asks max_tokens 48, and from ``at_s`` a batch job under the
    same name (70% of its requests from then on) asks 160, every batch answer running to its cap. With
    ``ignore_eos`` the chat answers run to 48 too (the vLLM flood); without, they end on their own
    (p50 ~30 tokens, a fifth of them at the cap)."""
    events = chat_and_agent()
    rows = kite_chat(events)
    batch = (pl.col("t") >= at_s) & (pl.col("u") < 0.7)
    chat = pl.lit(48) if ignore_eos else pl.min_horizontal(pl.col("old") // 15, pl.lit(48))
    plan = rows.select(
        "request_id",
        cap=pl.when(batch).then(160).otherwise(48),
        tokens=pl.when(batch).then(160).otherwise(pl.max_horizontal(chat, pl.lit(2))),
    )
    return timelines(answers(events, plan).lazy()).collect()


@pytest.mark.parametrize("ignore_eos", [True, False], ids=["ignore_eos", "natural_ends"])
def test_a_batch_asking_for_longer_answers_is_a_mix_change_not_verbose_outputs(ignore_eos):
    tl = asking_more_from(150, ignore_eos)
    mine = tl.filter(pl.col("service") == "kite-chat")
    late = pl.col("start") >= START + 150
    p50 = mine.group_by(late).agg(pl.col("output_tokens").median(), (pl.col("finish_reason") == "length").mean())
    (before,), (after,) = (p50.filter(~pl.col("start"))["output_tokens"], p50.filter(pl.col("start"))["output_tokens"])
    assert after >= 2.0 * before  # the caller as a whole: its p50 more than doubled...
    shares = dict(p50.select("start", "finish_reason").iter_rows())
    if not ignore_eos:
        assert shares[True] - shares[False] >= 0.25  # ...and its answers ran to the cap far more often
    out = analyze(tl)
    every = out["findings"] + out["minor"]
    assert [f for f in every if f.get("name") == "verbose_outputs"] == []
    assert not any("chat template" in f["summary"] for f in every)
    assert VerboseOutputs().detect(tl, Context(window_s=out["window_s"])) == []


def test_a_mix_change_is_said_as_one():
    """What a detector that names the change says of it: the requests asking 160 are new, the
    others answer as before."""
    tl = asking_more_from(150, ignore_eos=True)
    answered = tl.filter(pl.col("output_tokens") > 0)  # the requests that failed asked 1024 still
    mix = requested_mix(answered.filter(pl.col("service") == "kite-chat"), 5.0, 30)
    assert mix is not None and [a.max_tokens for a in mix.new] == [160] and mix.kept == (48,)
    assert abs(mix.at - (START + 150)) < 5
    assert mix.new[0].output_tokens_p50 == 160 and mix.kept_p50 == (48, 48)
    assert mix.sentence == (
        f"the requests asking 160 tokens are new from 10:02:{mix.at - START - 120:02.0f} "
        f"({mix.new[0].requests:,} requests, p50 160 tokens); the others ask 48 (p50 48 -> 48 tokens)"
    )
    assert requested_mix(answered.filter(pl.col("service") == "agent-runner"), 5.0, 30) is None  # asked 1024 all along


def test_answers_that_got_longer_at_each_max_tokens_are_found_among_like_requests():
    """kite-chat asks 1024 in a third of its requests and 4096 in the others, all along; from
    150 s its answers are 2.5x longer (a template), the 1024-token ones cut at their cap: like
    compared with like, both groups changed (the 4096 ones 2.5x longer, the 1024 ones running to
    the cap), and the finding says so."""
    events = chat_and_agent()
    plan = kite_chat(events).select("request_id", cap=pl.when(pl.col("u") < 1 / 3).then(1024).otherwise(4096), tokens="old")
    longer, truth = longer_from(answers(events, plan), "kite-chat", at_s=150, factor=2.5)
    out = analyze(timelines(longer.lazy()).collect())
    first = out["findings"][0]
    assert (first["name"], first["scope"]) == ("verbose_outputs", {"service": "kite-chat"})
    assert abs(seconds(first["at"]) - truth.onset) <= out["window_s"]
    assert first["evidence"]["max_tokens_groups"] == 2 and first["evidence"]["max_tokens"] is None
    assert first["affected_requests"] == pytest.approx(len(truth.lengthened), rel=0.05)
    assert "kite-chat's answers on llama-3.1-70b got" in first["summary"]
    assert " longer at max_tokens 1024 and 4096 from " in first["summary"]
    assert "tokens), adding " in first["summary"] and "; check its chat template and stop tokens; " in first["summary"]
    assert [s["stage"] for s in first["with_shifts"]] == ["decode"]


def test_a_template_change_next_to_a_new_batch_counts_only_like_requests():
    """The template doubles kite-chat's answers from 150 s, and from 200 s a batch under its name
    asks 4096 tokens: the finding is the template's, measured on the requests that asked 1024 as
    before, and names the batch as not counted."""
    events, truth = longer_from(chat_and_agent(), "kite-chat", at_s=150, factor=2.0)
    rows = kite_chat(events)
    batch = (pl.col("t") >= 200) & (pl.col("u") < 0.3)
    plan = rows.filter(batch).select("request_id", cap=pl.lit(4096), tokens=pl.lit(3000))
    out = analyze(timelines(answers(events, plan).lazy()).collect())
    first = out["findings"][0]
    assert (first["name"], first["scope"]) == ("verbose_outputs", {"service": "kite-chat"})
    assert abs(seconds(first["at"]) - truth.onset) <= out["window_s"]
    assert first["evidence"]["ratio"] == pytest.approx(2.0, rel=0.15)  # 3000-token answers not in it
    assert first["evidence"]["max_tokens"] == 1024
    assert "; the requests asking 4096 tokens are new from 10:03:2" in first["summary"]
    assert ", not counted; check its chat template and stop tokens" in first["summary"]
