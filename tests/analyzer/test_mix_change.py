"""A change in the traffic is not a slowdown (issue 33): a new tenant's long prompts and a batch
job's long answers are said as a mix change scoped to the new traffic, never as the engine's
prefill or decode getting slower; a prefill that did get slower per token still is a shift; a
model that thinks longer is said as its reasoning phase, with decode its consequence.

Judged as the golden scenarios are: the kind, the stage, the requests the finding's scope and
time select (mostly the new traffic's), the onset (the window the change began in), and the
per-unit figure (held) that tells a mix from a slowdown."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from hopline.analyzer import io
from hopline.analyzer.findings.common import in_scope
from hopline.analyzer.findings.detector import Context
from hopline.analyzer.findings.model import Finding, MixChange, Shift
from hopline.analyzer.findings.rank import find
from hopline.analyzer.live.detector import LiveConfig, LiveDetector
from hopline.analyzer.live.feed import replay
from hopline.analyzer.live.watch import Watch
from hopline.analyzer.pipeline import analyze_files
from hopline.analyzer.timelines import timelines
from pydantic import TypeAdapter
from support import scenarios as golden
from support.cli import hopline
from support.modern import INCIDENT_S, reasoning_growth_log
from support.modern import START as MODERN_START
from support.synth import DEFAULT_START, NewTenant, StageShift, generate, write_ndjson

WINDOW_S = 10.0
SCOPES = ("replica", "service", "model")
AT_S = 300.0
SEEDS = range(4)
DATA = Path(__file__).resolve().parents[1] / "data"


def analysed(incidents: list, seed: int) -> tuple[list[Finding], pl.DataFrame]:
    events = generate(duration_s=600, rate=10, seed=seed, incidents=incidents)
    frame = timelines(events.lazy()).collect()
    found = find(frame, Context(window_s=WINDOW_S, scopes=SCOPES))
    return [*found.findings, *found.minor], frame


def rises(found: list[Finding], stage: str, kind: type) -> list[Shift]:
    return [f for f in found if type(f) is kind and f.stage == stage and f.up]


def share_new(finding: Shift, frame: pl.DataFrame, service: str) -> float:
    """Of the requests the finding's scope and time select, the share that are the new tenant's."""
    after = pl.col("start") >= finding.at
    if finding.until is not None:
        after &= pl.col("start") < finding.until
    selected = frame.filter(in_scope(finding.scope) & after)
    return selected.filter(pl.col("service") == service).height / max(selected.height, 1)


@pytest.mark.parametrize(
    ("stage", "tenant"),
    [
        ("prefill", NewTenant("doc-ingest", AT_S, share=0.3, prompt_tokens=6000)),
        ("decode", NewTenant("batch-eval", AT_S, share=0.5, prompt_tokens=700, output_tokens=900)),
    ],
    ids=["long-prompts", "long-answers"],
)
@pytest.mark.parametrize("seed", SEEDS)
def test_new_traffic_with_bigger_requests_is_a_mix_change_scoped_to_it(stage, tenant, seed):
    found, frame = analysed([tenant], seed)
    said = [f.sentence for f in found]
    assert not rises(found, stage, Shift), said  # never "the engine's prefill / decode got slower"
    mixes = rises(found, stage, MixChange)
    assert mixes, said
    first = mixes[0]
    assert first.scope.get("service") == tenant.service, said
    assert share_new(first, frame, tenant.service) >= 0.9
    assert abs(first.at - (DEFAULT_START + AT_S)) <= WINDOW_S, said
    per = first.per_unit
    assert 0.85 <= per["after_ms"] / per["before_ms"] <= 1.15 and per["units_after"] > per["units_before"]
    assert first.new_traffic["scope"] == {"service": tenant.service}
    assert "not a slower engine" in first.sentence and f"new service {tenant.service}" in first.sentence


@pytest.mark.parametrize("seed", SEEDS)
def test_a_prefill_slower_per_token_for_everyone_is_still_a_shift(seed):
    found, _ = analysed([StageShift("prefill", 1.8, AT_S)], seed)
    said = [f.sentence for f in found]
    assert not [f for f in found if isinstance(f, MixChange)], said
    (first,) = rises(found, "prefill", Shift)[:1]
    assert first.scope == {} and abs(first.at - (DEFAULT_START + AT_S)) <= WINDOW_S, said


def test_a_new_tenant_plus_a_real_prefill_regression_is_a_shift(tmp_path):
    """Both at once: the per-token figure rose with the stage, so the engine is named."""
    found, _ = analysed([NewTenant("doc-ingest", AT_S, share=0.3), StageShift("prefill", 2.0, AT_S)], 0)
    assert rises(found, "prefill", Shift), [f.sentence for f in found]
    assert not rises(found, "prefill", MixChange)


def test_a_mix_change_serializes_through_the_typed_model_and_the_cli(tmp_path):
    events = generate(duration_s=600, rate=10, seed=1, incidents=[NewTenant("doc-ingest", AT_S, share=0.3)])
    log = write_ndjson(events, tmp_path / "events.ndjson")
    run = hopline("analyze", str(log), "--json", "--window", "10s", timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout)
    mixes = [f for f in out["findings"] + out.get("minor", []) if f["kind"] == "mix_change"]
    assert mixes and mixes[0]["stage"] == "prefill", [f["summary"] for f in out["findings"]]
    assert {"per_unit", "new_traffic", "before_ms", "after_ms", "scope"} <= set(mixes[0])
    back = TypeAdapter(Finding).validate_python(mixes[0] | {"with": mixes[0]["with"]})
    assert isinstance(back, MixChange) and back.per_unit == mixes[0]["per_unit"]


def test_a_mix_change_followed_live_is_noted_and_never_pages(tmp_path):
    events = generate(duration_s=600, rate=10, seed=2, incidents=[NewTenant("doc-ingest", AT_S, share=0.3)])
    log = write_ndjson(events, tmp_path / "events.ndjson")
    detector = LiveDetector(LiveConfig(window_s=WINDOW_S, horizon_s=600.0, recent_s=300.0, lateness_s=5.0))
    Watch(detector)
    for batch in replay([log], detector.config.every_s):
        detector.feed(batch)
    detector.flush()
    incidents = detector.book.incidents
    assert not [i for i in incidents if i.pages], [i.words for i in incidents if i.pages]
    noted = [i for i in incidents if i.mix]
    assert noted and noted[0].side == "client" and noted[0].key[0] == "HoplineMixChange", [i.words for i in incidents]


@pytest.mark.parametrize("seed", range(3))
def test_a_model_that_thinks_longer_is_said_as_its_reasoning_with_decode_its_consequence(seed):
    """A template change makes a reasoning model think 3x longer: time to first content rises,
    the first token and the time per output token hold. The finding is the reasoning phase's,
    with decode (which holds the thinking) said with it, not "decode doubled" nor a mix."""
    frame = timelines(reasoning_growth_log(seed).lazy()).collect()
    found = find(frame, Context(window_s=WINDOW_S, scopes=SCOPES))
    top = [*found.findings, *found.minor]
    said = [f.sentence for f in top]
    first = top[0]
    assert (type(first), first.stage, first.scope) == (Shift, "reasoning", {}), said
    assert abs(first.at - (MODERN_START + INCIDENT_S)) <= WINDOW_S and 2.5 <= first.factor <= 3.5, said
    assert [c.stage for c in first.with_] == ["decode"], said
    assert "thought longer before its first content token" in first.sentence
    assert not [f for f in top if getattr(f, "stage", None) == "decode"], said


# --- production-shaped (tests/support/scenarios.py: three services on two models, four replicas,
# two regions, heavy tails, clock offsets, shuffled events) ---------------------------------------


@pytest.mark.parametrize(
    ("incident", "kind", "stage", "scope"),
    [
        (golden.Joined("doc-ingest", AT_S, prompt_tokens=6000), MixChange, "prefill", {"model": "X", "service": "doc-ingest"}),
        (golden.Joined("batch-eval", AT_S, share=0.4, output_tokens=900), MixChange, "decode", {"model": "X", "service": "batch-eval"}),
        (golden.Added("prefill", AT_S, {"model": "X"}, factor=2), Shift, "prefill", {"model": "X"}),
    ],
    ids=["new-tenant-long-prompts", "new-batch-long-answers", "control-prefill-per-token"],
)
@pytest.mark.parametrize("seed", range(3))
def test_production_shaped_traffic_changes_and_their_control(incident, kind, stage, scope, seed):
    log = golden.generate(seed=seed, incidents=[incident])
    frame = timelines(log.events.lazy(), scopes=("region",)).collect()
    found = find(frame, Context(window_s=WINDOW_S, scopes=(*SCOPES, "region")))
    top = [*found.findings, *found.minor]
    said = [f.sentence for f in top]
    first = top[0]
    assert (type(first), first.stage, first.scope) == (kind, stage, scope), said
    assert abs(first.at - (log.start + AT_S)) <= WINDOW_S, said
    other = MixChange if kind is Shift else Shift
    assert not [f for f in top if type(f) is other and f.stage == stage and f.up], said
    if kind is MixChange:
        assert share_new(first, frame, incident.service) >= 0.95


# A real run (``hopline demo --scenario cold-connections --seed 13``, tests/data/demo-scenarios/
# README.md): kite-cli, a client opening a connection per request and sending 4k-token prompts,
# runs from the start; by chance of its conversation keys, r1 got its first requests and r2 only
# from 9 s in. r2's prefill rose 6.9x with them, and its connect time from zero.
MOVED = DATA / "demo-scenarios" / "cold-connections-moved.parquet"


def test_traffic_routed_to_a_replica_is_said_as_new_here_after_what_was_done_wrong():
    """kite-cli is no new service: the mix change on r2 says where its traffic ran before and
    since when (``elsewhere``); the incident is kite-cli's connection per request, first, with
    r2's connect rise (its traffic's handshakes, no slower than on r1) said with it, never on its
    own; the traffic's change comes after the pitfall although its seconds are more."""
    report, _ = analyze_files(io.find_files([MOVED]))
    found = report.findings.findings
    said = [f.sentence for f in found]
    first = found[0]
    assert (first.kind, first.name, first.scope) == ("pitfall", "new_connection_per_request", {"service": "kite-cli"}), said
    assert [(s.stage, s.scope) for s in first.with_shifts] == [("connect", {"replica": "r2"})], said
    assert not [f for f in found if f.kind == "shift" and f.stage == "connect"], said
    (mix,) = [f for f in found if isinstance(f, MixChange)]
    assert (mix.stage, mix.scope) == ("prefill", {"replica": "r2", "service": "kite-cli"}), said
    there = mix.new_traffic["elsewhere"]
    assert there["where"] == {"replica": ["r1"]} and there["since"] < mix.new_traffic["since"], mix.new_traffic
    assert "new here" in mix.sentence and "on replica r1 from" in mix.sentence, mix.sentence
    assert "new service" not in mix.sentence, mix.sentence
    assert abs(mix.cost_s) > abs(first.cost_s)  # ordered after it all the same


def test_a_new_tenant_is_new_to_the_log_not_only_to_its_scope():
    """The synthetic new tenant began everywhere at once: nothing of it ran before, anywhere."""
    found, _ = analysed([NewTenant("doc-ingest", AT_S, share=0.3, prompt_tokens=6000)], 0)
    mixes = rises(found, "prefill", MixChange)
    assert mixes and all(m.new_traffic["elsewhere"] is None for m in mixes), [m.sentence for m in mixes]


def test_traffic_routed_to_a_replica_pages_nothing_on_the_request_level_watcher():
    """The same recording followed live with the demo's watch settings (``demo/live.py``): r2's
    connect rise is kite-cli's traffic (said with its pitfall, a standing condition) and r2's
    prefill rise a change of the traffic: both noted, neither paged. Before, "connect time rose
    from zero to 40 ms … on replica r2" paged."""
    config = LiveConfig(window_s=1.0, horizon_s=120.0, recent_s=60.0, settle_s=1.0, lateness_s=1.0, hold_s=5.0)
    detector = LiveDetector(config)
    Watch(detector)
    for batch in replay(io.find_files([MOVED]), config.every_s):
        detector.feed(batch)
    detector.flush()
    incidents = detector.book.incidents
    assert incidents and not [i.words for i in incidents if i.pages], [i.words for i in incidents if i.pages]
    assert not [i for i in incidents if i.key[1] == "connect"], [i.words for i in incidents]
