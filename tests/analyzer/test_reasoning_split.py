"""``verbose_outputs`` counts a reasoning model's reasoning and content tokens apart where the
engine gives them (issue 33): a template change that makes the model think 3x longer is said as
its reasoning growing with the content unchanged, never as answers that ran on ("check its chat
template and stop tokens"); content that grows with the reasoning flat is said as the content.
Where the count is unknown the whole output is judged as before.

The logs are tests/support/modern.py's ``reasoning_growth_log``: a reasoning model that thinks
~120 tokens and answers ~150 tokens of content at 10 ms a token; from 10:05 one part grows 3x
(so the whole output grows 1.9x, under the 2x the whole would need, for the reasoning; 2.1x for
the content). ``counted``: the engine's usage gives ``reasoning_tokens``."""

from __future__ import annotations

import json

import polars as pl
import pytest
from hopline.analyzer.findings.detector import Context
from hopline.analyzer.findings.model import Finding, Pitfall, Shift
from hopline.analyzer.findings.rank import find
from hopline.analyzer.findings.verbose_outputs import VerboseOutputs, content_tokens
from hopline.analyzer.timelines import timelines
from pydantic import TypeAdapter
from support.cli import hopline
from support.modern import INCIDENT_S, START, reasoning_growth_log
from support.synth import write_ndjson

WINDOW_S = 10.0
CTX = Context(window_s=WINDOW_S, scopes=("replica", "service", "model"))
TEMPLATE_ADVICE = "check its chat template and stop tokens"


def verbose(log: pl.DataFrame) -> tuple[list[Finding], list[Pitfall]]:
    """The findings, and the verbose_outputs pitfalls among them or said with a shift."""
    found = find(timelines(log.lazy()).collect(), CTX)
    top = [*found.findings, *found.minor]
    every = [*top, *(p for f in top if isinstance(f, Shift) for p in f.with_pitfalls)]
    return top, [f for f in every if isinstance(f, Pitfall) and f.name == "verbose_outputs"]


def test_the_timelines_carry_the_engines_reasoning_count_and_the_content_is_the_rest():
    frame = timelines(reasoning_growth_log(0, counted=True).lazy()).collect()
    assert frame["reasoning_tokens"].null_count() == 0
    before = frame.filter(pl.col("start") < START + INCIDENT_S)
    before = before.select("reasoning_tokens", content=content_tokens())
    assert before["content"].null_count() == 0
    # ~1.2 s of thought and ~1.5 s of content (and its stop token) at 10 ms a token
    assert before["reasoning_tokens"].median() == pytest.approx(120, rel=0.05)
    assert before["content"].median() == pytest.approx(151, rel=0.05)
    unknown = timelines(reasoning_growth_log(0).lazy()).collect()
    assert unknown["reasoning_tokens"].null_count() == unknown.height
    assert unknown.select(content_tokens())["output_tokens"].null_count() == unknown.height


@pytest.mark.parametrize("seed", range(3))
def test_a_model_that_thinks_3x_longer_is_said_as_reasoning_with_content_unchanged(seed):
    top, found = verbose(reasoning_growth_log(seed, counted=True))
    said = [f.sentence for f in top]
    # the reasoning phase's shift stays the headline (test_mix_change); the pitfall, said with it
    # (one incident: their seconds are the same), adds the tokens
    assert (type(top[0]), top[0].stage) == (Shift, "reasoning"), said
    assert len(found) == 1 and found[0] in top[0].with_pitfalls, said
    assert "reasoning got 3.0x longer" in top[0].sentence, said
    p = found[0]
    assert (p.kind, p.name, p.scope) == ("pitfall", "verbose_outputs", {"service": "chat"}), said
    assert abs(p.at - (START + INCIDENT_S)) <= WINDOW_S
    e = p.evidence
    assert e["longer"] == "reasoning"
    assert e["reasoning_tokens_p50_before"] == pytest.approx(120, rel=0.05)
    assert e["reasoning_tokens_p50_after"] == pytest.approx(360, rel=0.05)
    assert e["reasoning_ratio"] == pytest.approx(3.0, rel=0.08)
    assert e["content_tokens_p50_before"] == pytest.approx(151, rel=0.05)
    assert e["content_ratio"] == pytest.approx(1.0, abs=0.05)
    assert e["ratio"] < 2.0  # the whole output did not double: judged as one length, nothing was found
    assert "reasoning got 3.0x longer (p50 " in p.sentence and "; content unchanged (p50 " in p.sentence
    assert "think longer" in p.sentence and "reasoning-effort or chat-template change" in p.sentence
    assert TEMPLATE_ADVICE not in p.sentence and "answers on m got" not in p.sentence


@pytest.mark.parametrize("seed", range(3))
def test_content_that_grows_3x_with_the_reasoning_flat_is_said_as_content(seed):
    top, found = verbose(reasoning_growth_log(seed, counted=True, grows="content"))
    said = [f.sentence for f in top]
    assert len(found) == 1 and top[0] is found[0], said  # the longer answers lead; decode's rise is theirs
    p = found[0]
    assert (p.kind, p.name, p.scope) == ("pitfall", "verbose_outputs", {"service": "chat"}), said
    assert abs(p.at - (START + INCIDENT_S)) <= WINDOW_S
    e = p.evidence
    assert e["longer"] == "content"
    assert e["content_tokens_p50_before"] == pytest.approx(151, rel=0.05)
    assert e["content_tokens_p50_after"] == pytest.approx(451, rel=0.05)
    assert e["content_ratio"] == pytest.approx(3.0, rel=0.08)
    assert e["reasoning_ratio"] == pytest.approx(1.0, abs=0.05)
    assert "content got 3.0x longer (p50 " in p.sentence and "; reasoning unchanged (p50 " in p.sentence
    assert TEMPLATE_ADVICE in p.sentence and "think longer" not in p.sentence


@pytest.mark.parametrize("grows", ["reasoning", "content"])
def test_where_the_engine_gives_no_count_the_whole_output_is_judged_as_before(grows):
    """The same logs without ``reasoning_tokens``: the reasoning's 3x is a 1.9x output (no
    finding); the content's is a 2.1x output, said as before, its split null."""
    _, found = verbose(reasoning_growth_log(0, grows=grows))
    if grows == "reasoning":
        assert found == []
        return
    (p,) = found
    assert p.evidence["longer"] == "output" and p.evidence["reasoning_tokens_p50_before"] is None
    assert p.evidence["content_ratio"] is None and p.evidence["ratio"] == pytest.approx(2.1, rel=0.05)
    assert "got 2.1x longer from 10:05:00 (p50 " in p.sentence and TEMPLATE_ADVICE in p.sentence
    assert "reasoning" not in p.sentence and "content" not in p.sentence


def test_a_count_on_too_few_of_a_groups_requests_is_not_a_split():
    """Half the requests carry the count (two clients, one reading usage): judged as one length."""
    log = reasoning_growth_log(1, counted=True, grows="content")
    odd = pl.col("request_id").str.extract(r"-(\d+)$").cast(pl.Int64) % 2 == 1
    log = log.with_columns(reasoning_tokens=pl.when(odd).then(pl.col("reasoning_tokens")))
    _, (p,) = verbose(log)
    assert p.evidence["longer"] == "output" and p.evidence["content_ratio"] is None


def test_a_part_that_doubles_from_a_few_tokens_is_no_finding():
    """A model that reasons 4 tokens and later 12, on ~150 tokens of content: its reasoning tripled,
    its answers did not get longer in any way a user waits for."""
    log = reasoning_growth_log(2, counted=True, factor=1.0)
    late = pl.col("ts") >= START + INCIDENT_S
    few = pl.when(late).then(12).otherwise(4)
    log = log.with_columns(reasoning_tokens=pl.when(pl.col("reasoning_tokens").is_not_null()).then(few))
    assert VerboseOutputs().detect(timelines(log.lazy()).collect(), CTX) == []


@pytest.mark.parametrize("grows", ["reasoning", "content"])
def test_the_split_serializes_through_the_typed_model_and_the_cli(tmp_path, grows):
    log = write_ndjson(reasoning_growth_log(0, counted=True, grows=grows), tmp_path / "events.ndjson")
    run = hopline("analyze", str(log), "--json", "--window", "10s", timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout)
    everything = out["findings"] + out.get("minor", [])
    nested = [p for f in everything for p in f.get("with_pitfalls", [])]
    found = [f for f in everything + nested if f.get("name") == "verbose_outputs"]
    assert len(found) == 1, [f["summary"] for f in everything]
    p = found[0]
    assert p["evidence"]["longer"] == grows and p["scope"] == {"service": "chat"}
    assert isinstance(p["evidence"]["reasoning_tokens_p50_after"], float)
    assert f"{grows} got 3.0x longer" in p["summary"]
    back = TypeAdapter(Finding).validate_python(p)
    assert isinstance(back, Pitfall) and back.evidence == p["evidence"]
