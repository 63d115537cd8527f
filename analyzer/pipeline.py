"""The offline analysis, composed in one place: ``hopline analyze``, the demo and bench call it.

    event files ── io.scan_each ──▶ events (checked; --since/--until)
                ── bounded.statistics ──▶ the statistics' frame: per-request timelines (a bucket
                                          of requests at a time) of all requests, or a seeded sample
    frame ──┬── report.Facts.of ──▶ stages, span, outcomes, windows, … (exact totals past a sample)
            └── findings.find ──▶ findings, detected, ranked and decided once
                                  ──▶ report.Analysis (rendered by report, html; --json is its to_json)

``analyze_files`` is the whole path from event files; ``analysis`` the statistics on timelines
already built (``hopline analyze --timelines``, tests); ``analyze`` that as the JSON object.

The statistics and the detectors read ``STATISTICS_COLUMNS`` of the timelines' ~110 (a narrow
table: fewer columns gathered per bucket; past the budget, only the sample's requests get them); the
whole table is built only for an output that shows it (``full_table``: the HTML report, OTLP
traces, the demo's example request).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
from hopline.analyzer import attribution, bounded, io
from hopline.analyzer.findings import Context, find
from hopline.analyzer.findings.detector import scopes_to_search
from hopline.analyzer.findings.registry import REGISTRY
from hopline.analyzer.report import Analysis, Facts
from hopline.analyzer.timelines import COLUMNS, RATIO_COLUMNS, STAGE_COLUMNS
from hopline.middleware.contract.errors import HoplineError
from hopline.middleware.contract.rules import SCOPE_SOURCES


# What Facts.of and the detectors read besides the scopes, the stages and the ratios: the hop times,
# attributes and counts named in report.py, attribution.py, windows.py and findings/ (each
# detector's ``needs`` is a part). tests/analyzer/test_pipeline.py holds the analysis of the narrow
# table equal to the whole one's on logs where every detector finds something.
READ = (
    "request_id", "start", "retries", "client_retries", "failed_status", "status", "client_sent",
    "engine_received", "engine_first", "engine_last", "prefill_received", "prefill_last",
    "pool_wait_s", "connect_s", "tls_s", "client_read_lag_s", "engine_loop_lag_s", "gateway_loop_lag_s",
    "engine_cpu_wait", "stream", "output_tokens", "reasoning_tokens", "prompt_tokens", "cached_tokens",
    "max_tokens", "max_tokens_set", "finish_reason", "conn_reused", "spec_acceptance_length",
    "engine_max_gap_s", "engine_max_gap_at", "outcome", "negative", "missing",
)  # fmt: skip
_READ = {*READ, *SCOPE_SOURCES, *STAGE_COLUMNS, *RATIO_COLUMNS, *(n for d in REGISTRY for n in d.needs)}
STATISTICS_COLUMNS = tuple(c for c in COLUMNS if c in _READ)


class NoHopEvents(HoplineError, ValueError):
    """The input holds no hop event at all; the message says where and the first reason."""


def analysis(
    timelines: pl.DataFrame,
    *,
    window: str | None = None,
    by: tuple[str, ...] = attribution.SCOPES,
    slo: attribution.Slo | None = None,
    scan: io.ScanReport | None = None,
    kv_bytes_per_token: int | None = None,
) -> Analysis:
    """Stages, findings (shifts and pitfalls, largest effect on users' time first) and the facts
    around them, of ``timelines`` (one row per request, collected)."""
    scopes = scopes_to_search(timelines, by)
    span = (timelines["start"].max() - timelines["start"].min()) if timelines.height else 0.0
    window_s = attribution.choose_window(window, span or 0.0)
    ctx = Context(window_s=window_s, scopes=scopes, kv_bytes_per_token=kv_bytes_per_token)
    facts = Facts.of(timelines, window_s=window_s, by=scopes, slo=slo, scan=scan)
    return Analysis(find(timelines, ctx), facts)


def analyze(timelines: pl.DataFrame, **options) -> dict:
    """``analysis`` (``options`` passed on) as the JSON-ready findings object."""
    return analysis(timelines, **options).to_json()


def analyze_files(
    files: list[Path],
    *,
    since: str | None = None,
    until: str | None = None,
    window: str = "auto",
    by: tuple[str, ...] = attribution.SCOPES,
    slo: attribution.Slo | None = None,
    kv_bytes: int | None = None,
    on_file: Callable[[Path], None] | None = None,
    on_step: Callable[[str], None] | None = None,
    budget: bounded.Budget | None = None,
    work_dir: Path | None = None,
    full_table: bool = True,
) -> tuple[Analysis, pl.DataFrame]:
    """The analysis of ``files`` and the per-request timelines it was computed from: every
    request's, or a seeded sample of them for a log beyond ``budget`` (``bounded``; then
    ``facts.sample`` says how many of how many, and the totals are exact); all of the timelines'
    columns, or with ``full_table=False`` only ``STATISTICS_COLUMNS`` and the extra scopes (the
    same analysis, for outputs that show no request: ``--json``, the terminal). ``NoHopEvents`` when
    the files hold none (empty, garbage, JSON that is not hop events), or when --since / --until
    leave no request."""
    scanned, scan = io.scan_each(files, since=since, until=until, progress=on_file)
    if not scan.events:
        raise NoHopEvents(no_events_message(files, scan))
    if on_step is not None:
        on_step("building timelines, then finding shifts and pitfalls")
    budget = budget or bounded.Budget.of()
    scopes = tuple(d for d in by if d not in SCOPE_SOURCES)  # the attributes timelines() must carry
    columns = None if full_table else (*STATISTICS_COLUMNS, *(d for d in scopes if d not in STATISTICS_COLUMNS))
    table = bounded.statistics(scanned, scopes, budget, work_dir, columns)
    frame = table.frame
    result = analysis(frame, window=window, by=by, slo=slo, scan=scan, kv_bytes_per_token=kv_bytes)
    if table.totals is not None:
        sample = {"requests": frame.height, "of": table.requests, "seed": bounded.SAMPLE_SEED}
        result = replace(result, facts=replace(result.facts, **table.totals, sample=sample))
    if not result.facts.requests and (since is not None or until is not None):
        raise NoHopEvents(excluded_message(scanned, since, until))
    return result, frame


def no_events_message(paths: list[Path], scan: io.ScanReport) -> str:
    """One line: no hop events in PATH, and the first reason when something was bad."""
    where = ", ".join(map(str, paths)) if len(paths) <= 3 else f"{len(paths)} files"
    counts = ((scan.bad_lines, "bad line"), (len(scan.bad_files), "bad file"))
    bad = [f"{n:,} {what}{'s' if n > 1 else ''}" for n, what in counts if n]
    detail = f" ({', '.join(bad)}; first: {scan.errors[0]})" if bad and scan.errors else ""
    return f"no hop events in {where}{detail}"


def excluded_message(scanned: list[io.Scanned], since: str | None, until: str | None) -> str:
    """One line for a --since / --until that leaves no request: how many events and requests lie
    outside it, and the time the data covers (read from the files already scanned, unbounded)."""
    every = [replace(s, bounds=(None, None)).events for s in scanned]
    frame = pl.concat(every, how="vertical") if every else pl.LazyFrame(schema=io.SCHEMA)
    inside = pl.col("ts").is_between(io.to_epoch(since) or -math.inf, io.to_epoch(until) or math.inf)
    facts = frame.select(
        events=pl.len(), inside=inside.sum(), requests=pl.col("request_id").n_unique(),
        first=pl.col("ts").min(), last=pl.col("ts").max(),
    ).collect().row(0, named=True)  # fmt: skip
    given = " ".join(f"--{name} {value}" for name, value in (("since", since), ("until", until)) if value)
    outside = facts["events"] - (facts["inside"] or 0)
    if facts["first"] is None:
        return f"no requests with {given}: the files hold no hop events"
    first, last = (datetime.fromtimestamp(facts[k], UTC) for k in ("first", "last"))
    return (
        f"no requests with {given}: {outside:,} of {facts['events']:,} events ({facts['requests']:,} "
        f"request IDs) are outside it; the data covers {first:%Y-%m-%d %H:%M:%S} to "
        f"{last:%Y-%m-%d %H:%M:%S} UTC"
    )
