"""The bounded path (``analyzer/bounded.py``) finds what the in-memory one finds.

A log of 3,000 requests with a queue shift, cold connections, long prompts and missing
``max_tokens``, plus a retried request and a trace stand-in whose owner's request hashes to
another bucket, is analysed twice from the same files: in one piece (the default budget: one
bucket, every request in the statistics) and one bucket of requests at a time (a budget of
5,000 events a bucket: 8 buckets written to a Parquet table and read back). The findings
objects (``hopline analyze --json``) must be equal, key for key, and so must the timelines.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from hopline.analyzer import bounded, io
from hopline.analyzer.cli import event_files
from hopline.analyzer.pipeline import analyze_files
from hopline.middleware.contract.rules import trace_stand_in
from support.cli import hopline
from support.events import event
from support.synth import ColdConnections, LongPrompts, NoMaxTokens, StageShift, generate, write_ndjson

INCIDENTS = [
    StageShift("queue", 3.0, at_s=90, scope={"replica": "r2"}),
    ColdConnections("search-assist"),
    LongPrompts("r1"),
    NoMaxTokens("kite-chat"),
]
REQUESTS = 3000
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SMALL = bounded.Budget(bucket_events=5_000, sample_requests=10**9)  # many buckets, no sample


def _extra_events() -> list[dict]:
    """A request retried by its client (attempt 1 wins) and a gateway event known only by its
    trace (it joins the trace's one request, ``rules.TRACE_RULE``)."""
    t = 1_767_607_300.0
    retried = [
        event("client.sent", "retried-1", t, attempt=0, stream=True, service="kite-chat"),
        event("client.error", "retried-1", t + 0.2, attempt=0, status=503, error="upstream", service="kite-chat"),
        event("client.sent", "retried-1", t + 0.3, attempt=1, stream=True, service="kite-chat"),
        event("client.first_token", "retried-1", t + 0.5, attempt=1, service="kite-chat"),
        event("client.last_token", "retried-1", t + 1.5, attempt=1, output_tokens=40, service="kite-chat"),
    ]
    traced = [
        event("client.sent", "traced-1", t + 2, attempt=0, stream=True, trace_id=TRACE, service="kite-chat"),
        event("client.first_token", "traced-1", t + 2.4, attempt=0, trace_id=TRACE, service="kite-chat"),
        event("client.last_token", "traced-1", t + 3.0, attempt=0, trace_id=TRACE, output_tokens=20, service="kite-chat"),
        event("gateway.received", trace_stand_in(TRACE), t + 2.01, attempt=0, trace_id=TRACE, service="gateway"),
        event("gateway.forwarded", trace_stand_in(TRACE), t + 2.02, attempt=0, trace_id=TRACE, service="gateway"),
    ]
    return retried + traced


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("logs")
    events = generate(REQUESTS, seed=14, incidents=INCIDENTS, engine_id_prefix=True)
    events = pl.concat([events, pl.DataFrame(_extra_events(), schema_overrides=events.schema)], how="diagonal_relaxed")
    engine = events.filter(pl.col("hop").str.starts_with("engine"))
    engine.select(events.columns).write_parquet(folder / "engine.parquet")  # as a compacted hour
    write_ndjson(events.filter(~pl.col("hop").str.starts_with("engine")), folder / "edge.ndjson")
    return folder


def _both(paths: list[Path], **options) -> tuple[tuple[dict, pl.DataFrame], tuple[dict, pl.DataFrame]]:
    files = event_files(paths)
    whole, whole_tl = analyze_files(files, **options)
    buckets, buckets_tl = analyze_files(files, budget=SMALL, **options)
    return (whole.to_json(), whole_tl), (buckets.to_json(), buckets_tl)


def _sorted(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.sort("request_id")


def test_buckets_find_what_memory_finds(log_dir):
    (whole, whole_tl), (buckets, buckets_tl) = _both([log_dir], slo=None)
    assert whole["requests"] == REQUESTS + 2
    kinds = {(f["kind"], f.get("stage") or f.get("name")) for f in whole["findings"]}
    assert {("shift", "queue"), ("pitfall", "new_connection_per_request"), ("pitfall", "no_max_tokens")} <= kinds
    assert "sample" not in buckets  # every request in the statistics
    assert json.dumps(buckets, sort_keys=True) == json.dumps(whole, sort_keys=True)
    assert _sorted(buckets_tl).equals(_sorted(whole_tl))


def test_bucket_count_and_the_rules_that_cross_buckets(log_dir, tmp_path, monkeypatch):
    """The small budget really splits the log (the work folder is gone after), the retry's
    attempt 1 is the one timed, and the stand-in's gateway hops joined their request although
    the two IDs hash to different buckets."""
    assert bounded.bucket_of(Path("x/bucket=3/c1.parquet")) == 3
    ids = pl.Series([trace_stand_in(TRACE), "traced-1"])
    buckets = 8
    assert (ids.hash(bounded.BUCKET_SEED) % buckets).n_unique() == 2
    made: list[Path] = []
    real_split = bounded.split

    def counting(events, folder, n, seed):
        made.append(folder)
        parts = real_split(events, folder, n, seed)
        assert len(parts) == buckets
        return parts

    monkeypatch.setattr(bounded, "split", counting)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    _, frame = analyze_files(event_files([log_dir]), budget=SMALL)
    assert len(made) == 1 and not made[0].exists() and not list(tmp_path.iterdir())
    traced = frame.filter(pl.col("request_id") == "traced-1").row(0, named=True)
    assert traced["gateway_received"] is not None
    assert frame.filter(pl.col("request_id").str.starts_with("trace:")).height == 0
    retried = frame.filter(pl.col("request_id") == "retried-1").row(0, named=True)
    assert retried["attempts"] == 2 and retried["client_ttft"] == pytest.approx(0.2)


def test_a_table_within_the_statistics_budget_is_held_the_same_as_one_written(log_dir, tmp_path):
    """Buckets whose timelines together fit ``sample_requests`` are held in memory (no work
    folder left, nothing written); past it every part goes to Parquet, the held ones included.
    The two tables are the same, request for request (each bucket's group-by leaves its rows in
    no set order), dtypes included (Enum, lists)."""
    scanned, _ = io.scan_each(event_files([log_dir]))
    held = bounded.build_table(scanned, (), SMALL, work_dir=tmp_path)
    written = bounded.build_table(scanned, (), bounded.Budget(SMALL.bucket_events, 1), work_dir=tmp_path)
    try:
        assert held.folder is None and written.folder is not None
        assert [p.name for p in tmp_path.iterdir()] == [written.folder.name]
        parts = sorted((written.folder / "timelines").glob("*.parquet"))
        assert len(parts) > 1  # the log is really split, the parts held before the spill written too
        assert held.requests == written.requests == REQUESTS + 2
        assert _sorted(held.frame.collect()).equals(_sorted(written.frame.collect()))
        assert held.frame.collect_schema() == written.frame.collect_schema()
    finally:
        held.close()
        written.close()


@pytest.mark.parametrize("budget", [bounded.Budget.of(), SMALL], ids=["one-bucket", "buckets"])
def test_a_table_of_some_columns_holds_those_of_the_whole_table(log_dir, budget):
    """``build_table(columns=...)`` (Polars computes only the aggregations they need) gives the
    whole table's values of those columns, in one piece and bucket by bucket; negative stages and
    missing hops (lists made from a bit mask per row) included."""
    scanned, _ = io.scan_each(event_files([log_dir]))
    columns = ("request_id", "replica", "queue", "decode", "outcome", "negative", "missing")
    whole = bounded.build_table(scanned, (), budget)
    some = bounded.build_table(scanned, (), budget, columns=columns)
    try:
        got, want = some.frame.collect(), whole.frame.select(columns).collect()
    finally:
        whole.close()
        some.close()
    assert got.columns == list(columns)
    assert _sorted(got).equals(_sorted(want))
    assert want.filter(pl.col("missing").list.len() > 0).height > 0  # the lists are not all empty


def test_bucketed_store_and_time_range(log_dir, tmp_path):
    """A store already bucketed by request (``bucket=K`` folders, as bench/gen_large.py
    --buckets writes it) is read a bucket at a time; --since / --until apply the same way."""
    events = pl.concat(
        [pl.read_parquet(log_dir / "engine.parquet"), pl.read_ndjson(log_dir / "edge.ndjson", infer_schema_length=None)],
        how="diagonal_relaxed",
    )
    events = events.with_columns(pl.col("request_id").str.strip_prefix("chatcmpl-"))
    # the writer keeps a trace's stand-in events in its request's bucket (bounded's docstring)
    home = pl.when(pl.col("request_id") == trace_stand_in(TRACE)).then(pl.lit("traced-1")).otherwise("request_id")
    key = home.hash(bounded.BUCKET_SEED) % 3
    for (bucket,), part in events.with_columns(_b=key).partition_by("_b", as_dict=True).items():
        write_ndjson(part.drop("_b"), tmp_path / "store" / f"bucket={bucket}" / "events.ndjson")
    since, until = "2026-01-05T10:00:30Z", "2026-01-05T10:02:30Z"
    reference = analyze_files(event_files([log_dir]), since=since, until=until)[0].to_json()
    files = event_files([tmp_path / "store"])
    assert {bounded.bucket_of(f) for f in files} == {0, 1, 2}
    result = analyze_files(files, since=since, until=until, budget=bounded.Budget.of())[0].to_json()
    assert 0 < result["requests"] < REQUESTS
    result["scan"]["files"] = reference["scan"]["files"]  # 3 files instead of 2, the same lines
    assert json.dumps(result, sort_keys=True) == json.dumps(reference, sort_keys=True)


def test_cli_samples_a_log_beyond_its_budget(log_dir):
    """``--max-memory`` small enough that the statistics take a seeded sample: the totals are
    still exact, the sample is named and is the same on every run."""
    full = json.loads(hopline("analyze", str(log_dir), "--json").stdout)
    runs = [hopline("analyze", str(log_dir), "--json", "--max-memory", "3MiB") for _ in range(2)]
    assert all(p.returncode == 0 for p in runs), runs[0].stderr
    first, second = (json.loads(p.stdout) for p in runs)
    budget = bounded.Budget.of(3 * 1024**2)
    assert first["sample"] == {"requests": pytest.approx(budget.sample_requests, rel=0.25), "of": REQUESTS + 2,
                               "seed": bounded.SAMPLE_SEED}  # fmt: skip
    for key in ("requests", "span", "outcomes", "negative_stages", "missing_hops", "scan"):
        assert first[key] == full[key], key
    assert first == second
    sampled = f"from a seeded sample of {first['sample']['requests']:,} of {REQUESTS + 2:,} requests"
    said = hopline("analyze", str(log_dir), "--max-memory", "3MiB", "--html", str(log_dir.parent / "r.html"))
    assert said.returncode == 0, said.stderr
    assert sampled in " ".join(said.stdout.split())  # the terminal says what its numbers are from
    assert sampled in (log_dir.parent / "r.html").read_text()
    unsampled = hopline("analyze", str(log_dir))
    assert "seeded sample" not in unsampled.stdout
    bad = hopline("analyze", str(log_dir), "--max-memory", "lots")
    assert bad.returncode == 2 and "not a size: 'lots'" in bad.stderr


@pytest.mark.parametrize("guess_low", [bounded.GUESS_LOW, 0.05, 20.0], ids=["default", "guess-wide", "guess-too-high"])
@pytest.mark.parametrize("sample_requests", [400, 1500, 2999, REQUESTS + 2])
def test_statistics_sample_and_totals_are_the_whole_tables(log_dir, monkeypatch, guess_low, sample_requests):
    """``bounded.statistics`` builds only the sample's requests with the statistics' columns and
    the rest with the totals' few: its frame is ``sample`` of the whole table (rows, order, dtypes)
    and its totals ``exact_totals`` of it, whatever the guess of the requests left does: a wide
    superset (0.05), or a guess so high that the superset misses sampled requests (20: the buckets
    are built again for the sample counted exactly). A log that turns out to fit is not sampled."""
    monkeypatch.setattr(bounded, "GUESS_LOW", guess_low)
    scanned, _ = io.scan_each(event_files([log_dir]))
    budget = bounded.Budget(bucket_events=5_000, sample_requests=sample_requests)
    columns = ("request_id", "replica", "queue", "decode", "outcome")
    whole = bounded.build_table(scanned, (), bounded.Budget(5_000, 10**9), columns=tuple(dict.fromkeys((*columns, *bounded.TOTALS_COLUMNS))))
    try:
        want = bounded.sample(whole, sample_requests).collect().select(columns)
        want_totals = bounded.exact_totals(whole)
        got = bounded.statistics(scanned, (), budget, columns=columns)
    finally:
        whole.close()
    assert got.requests == whole.requests == REQUESTS + 2
    assert got.frame.equals(want) and got.frame.schema == want.schema
    if sample_requests < got.requests:
        assert 0.5 * sample_requests < got.frame.height < min(REQUESTS, 1.5 * sample_requests)
        assert got.totals == want_totals
    else:
        assert got.frame.height == got.requests and got.totals is None
    assert want_totals["missing_hops"]["requests"] > 0 and len(want_totals["outcomes"]) > 1
