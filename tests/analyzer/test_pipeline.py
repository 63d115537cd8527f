"""One composition of the offline analysis (``analyzer/pipeline.py``), called by the command, the
demo and bench; ``Facts`` a frozen value with an empty one.

The demo says it prints what ``hopline analyze RUN_DIR`` prints: here its analysis of a folder is
serialised as the command serialises it and compared byte for byte with the command's stdout.
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError, replace
from pathlib import Path

import orjson
import polars as pl
import pytest
from hopline.analyzer import bounded, pipeline
from hopline.analyzer.attribution import Slo
from hopline.analyzer.io import SCHEMA, ScanReport, find_files
from hopline.analyzer.report import Facts
from hopline.analyzer.timelines import timelines
from hopline.demo.analysis import analyze_run
from support.cli import hopline
from support.failover_scenarios import failover_log
from support.modern import cache_log, pd_log, reasoning_log
from support.synth import ColdConnections, LongPrompts, NoMaxTokens, StageShift, generate, write_ndjson

REQUESTS = 1200
# the findings object's keys in the order DESIGN.md shows them; windows, goodput, scan, sample
# only when there is something to say
KEYS = ["requests", "window_s", "stages", "findings", "minor", "split_requests", "dominant", "span",
        "outcomes", "negative_stages", "missing_hops", "by_scope"]


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("run")
    shift = StageShift("queue", 3.0, at_s=30, scope={"replica": "r2"})  # 1,200 requests at 20/s: 60 s
    events = generate(REQUESTS, seed=21, incidents=[shift])
    write_ndjson(events, folder / "events.ndjson")
    return folder


def no_requests() -> pl.DataFrame:
    return timelines(pl.LazyFrame(schema=SCHEMA)).collect()


def test_facts_are_frozen_and_empty_is_the_facts_of_no_request() -> None:
    with pytest.raises(FrozenInstanceError):
        Facts.EMPTY.requests = 1  # type: ignore[misc]
    assert pipeline.analysis(no_requests()).facts == Facts.EMPTY  # a 1-s window: auto on a 0-s span
    scan = ScanReport()
    assert pipeline.analysis(no_requests(), window="5s", scan=scan).facts == replace(
        Facts.EMPTY, window_s=5.0, scan=scan.to_dict()
    )
    empty = pipeline.analyze(no_requests())
    assert list(empty) == KEYS  # no windows without requests
    nothing = (0, [], {"start": None, "end": None, "seconds": 0.0})
    assert (empty["requests"], empty["findings"], empty["span"]) == nothing


def test_the_json_keeps_the_contracts_order(log_dir: Path) -> None:
    analysis, _ = pipeline.analyze_files(find_files([log_dir]), slo=Slo.parse("ttft=500ms"))
    assert list(analysis.to_json()) == [*KEYS, "windows", "goodput", "scan"]
    assert analysis.facts.requests == REQUESTS and analysis.facts.sample is None
    assert analysis.findings.findings[0].stage == "queue"


def test_the_demo_prints_what_the_command_prints(log_dir: Path) -> None:
    command = hopline("analyze", str(log_dir), "--json")
    assert command.returncode == 0, command.stderr
    analysis, frame = analyze_run(log_dir)
    demo = orjson.dumps(analysis.to_json(), option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE)
    assert demo.decode() == command.stdout
    assert frame.height == REQUESTS


def test_past_its_budget_the_analysis_names_its_sample_and_counts_every_request(log_dir: Path) -> None:
    budget = bounded.Budget(bucket_events=10**9, sample_requests=300)
    analysis, frame = pipeline.analyze_files(find_files([log_dir]), budget=budget)
    whole, _ = pipeline.analyze_files(find_files([log_dir]))
    sample = analysis.facts.sample
    assert sample is not None and sample["of"] == REQUESTS and sample["requests"] == frame.height
    assert 200 < frame.height < 400  # a seeded hash below 300/1200 of its range: about 300
    for key in ("requests", "span", "outcomes", "negative_stages", "missing_hops", "scan"):
        assert getattr(analysis.facts, key) == getattr(whole.facts, key), key
    assert list(analysis.to_json())[-1] == "sample"


def test_a_range_that_leaves_no_request_is_an_error_naming_it(log_dir: Path) -> None:
    with pytest.raises(pipeline.NoHopEvents, match="no requests with --since 2030-01-01"):
        pipeline.analyze_files(find_files([log_dir]), since="2030-01-01")


def narrow_and_whole(events: pl.DataFrame, folder: Path) -> tuple[dict, dict, pl.DataFrame]:
    files = [write_ndjson(events, folder / "events.ndjson")]
    whole, _ = pipeline.analyze_files(files)
    narrow, frame = pipeline.analyze_files(files, full_table=False)
    return whole.to_json(), narrow.to_json(), frame


def named(result: dict) -> set[str]:
    return {f.get("name", f["kind"]) for f in result["findings"] + result["minor"]}


@pytest.mark.parametrize("log", ["pitfalls_and_failover", "prefix_cache", "pd", "reasoning"])
def test_the_statistics_columns_give_the_analysis_of_the_whole_table(log: str, tmp_path: Path) -> None:
    """--json and the terminal build only ``STATISTICS_COLUMNS`` (and --by's extra scopes): on logs
    where the detectors find what they look for, the analysis is the whole table's, key for key."""
    if log == "pitfalls_and_failover":
        incidents = (StageShift("queue", 3.0, at_s=120, scope={"replica": "r2"}), LongPrompts("r1", queue_behind=True),
                     ColdConnections("kite-chat"), NoMaxTokens("search-assist"))  # fmt: skip
        events, _ = failover_log(3, n_requests=3000, onset_s=60.0, incidents=incidents)
        expected = {"shift", "failover", "long_prefill_stall", "new_connection_per_request", "no_max_tokens"}
    else:
        events = {"prefix_cache": cache_log, "pd": pd_log, "reasoning": reasoning_log}[log](1)
        expected = {"prefix_cache": {"prefix_cache_miss"}, "pd": {"shift"}, "reasoning": {"shift"}}[log]
    whole, narrow, frame = narrow_and_whole(events, tmp_path)
    assert expected <= named(whole)
    assert narrow == whole
    assert frame.columns == list(pipeline.STATISTICS_COLUMNS)


def test_an_extra_scope_is_built_into_the_narrow_table(log_dir: Path) -> None:
    by = ("replica", "model", "service", "tenant")
    _, frame = pipeline.analyze_files(find_files([log_dir]), by=by, full_table=False)
    assert frame.columns == [*pipeline.STATISTICS_COLUMNS, "tenant"]
