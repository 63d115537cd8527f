"""The timelines view compiled to SQL (analyzer/sql.py) run on real engines: DuckDB and ClickHouse
(chdb, in-process) give Polars' per-request table, column by column, on the golden fixture and on
a generated log of 20,000 requests with retries; Trino's rendering is only parsed (no Trino runs
here). ``hopline analyze --timelines`` on the exported table gives the findings of ``analyze`` on
the events. Spark: test_sql_spark.py."""

from __future__ import annotations

import json
from pathlib import Path

import chdb
import duckdb
import polars as pl
import pytest
import sqlglot
from hopline.analyzer.sql import DIALECTS, read_timelines, timelines_sql
from hopline.analyzer.timelines import COLUMNS, timelines
from support.cli import hopline
from support.golden import GOLDEN
from support.synth import StageShift, generate
from support.tables import assert_same_timelines, golden_events, synthetic_events

LOGS = {"golden": golden_events, "synthetic": synthetic_events}


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> dict[str, tuple[Path, pl.DataFrame]]:
    """Each log as a Parquet file of events and Polars' timelines of it."""
    folder = tmp_path_factory.mktemp("sql")
    out = {}
    for name, make in LOGS.items():
        events = make()
        path = folder / f"{name}.parquet"
        events.write_parquet(path)
        out[name] = (path, timelines(events.lazy()).collect())
    return out


def run_duckdb(events: Path, out: Path) -> Path:
    """The view on DuckDB, exported as Parquet (as a user would: COPY ... TO)."""
    query = timelines_sql("duckdb", f"read_parquet('{events}')")
    duckdb.connect().execute(f"COPY ({query}) TO '{out}' (FORMAT parquet)")
    return out


def run_clickhouse(events: Path, out: Path) -> Path:
    """The view on ClickHouse (chdb), exported as Parquet with INTO OUTFILE."""
    query = timelines_sql("clickhouse", f"file('{events}', Parquet)")
    chdb.query(f"{query} INTO OUTFILE '{out}' FORMAT Parquet")
    return out


ENGINES = {"duckdb": run_duckdb, "clickhouse": run_clickhouse}


@pytest.mark.parametrize("log", sorted(LOGS))
@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_the_view_gives_polars_timelines(engine, log, logs, tmp_path):
    events, want = logs[log]
    got = read_timelines(ENGINES[engine](events, tmp_path / "timelines.parquet"))
    assert got.height == want.height > 0
    assert got.columns == list(COLUMNS)
    assert_same_timelines(got, want)


def test_the_view_reproduces_the_golden_stages(logs, tmp_path):
    """The fixture's hand-worked stages, straight from DuckDB's rows (not only via Polars)."""
    got = read_timelines(run_duckdb(logs["golden"][0], tmp_path / "t.parquet"))
    rows = {r["request_id"]: r for r in got.iter_rows(named=True)}
    checked = 0
    for case in GOLDEN["cases"]:
        if "requests" in case:
            continue  # trace-joined cases: compared through Polars above
        row = rows[f"{case['name']}.{case['events'][0]['request_id']}"]
        for stage, want in case["expected"].items():
            assert (row[stage] is None) if want is None else row[stage] == pytest.approx(want, abs=1e-6), (
                case["name"], stage)  # fmt: skip
        assert (row["outcome"], row["missing"], row["negative"]) == (case["outcome"], case["missing"], case["negative"])
        checked += 1
    assert checked >= 20


def test_every_dialect_renders_and_parses():
    """Each rendering is one SELECT that sqlglot reads back in its own dialect (for Trino, which
    nothing runs here, that parse is the only check), over the source as given."""
    for dialect in DIALECTS:
        text = timelines_sql(dialect, "logs.hop_events")
        tree = sqlglot.parse_one(text, read=dialect, error_level=sqlglot.ErrorLevel.RAISE)
        assert isinstance(tree, sqlglot.exp.Select)
        assert "logs.hop_events" in text and "hopline_source_table" not in text
        assert [s.alias_or_name for s in tree.selects] == list(COLUMNS)
    trino = timelines_sql("trino", pretty=False)
    assert "MIN_BY(" in trino and "FILTER(ARRAY[" in trino  # Trino's names, not DuckDB's
    assert "argMin(" in timelines_sql("clickhouse", pretty=False) and "MIN_BY(" in timelines_sql("spark", pretty=False)


def test_bad_dialect_or_source_is_one_line():
    with pytest.raises(ValueError, match="unknown SQL dialect 'mysql'"):
        timelines_sql("mysql")
    with pytest.raises(ValueError, match="one table name"):
        timelines_sql("duckdb", "events; DROP TABLE events")
    proc = hopline("sql", "--dialect", "postgres")
    assert proc.returncode == 2 and "unknown SQL dialect 'postgres'" in proc.stderr
    assert proc.stdout == ""


def test_sql_command_prints_the_view():
    proc = hopline("sql", "--dialect", "spark", "--source", "parquet.`/data/events`")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == timelines_sql("spark", "parquet.`/data/events`")


def test_analyze_timelines_gives_the_findings_of_analyze(tmp_path):
    """The statistics on DuckDB's per-request table equal those on the events: same stages, same
    findings (a queue shift on r2), same outcomes and missing hops."""
    events = generate(6000, seed=21, incidents=[StageShift("queue", 3.0, at_s=150, scope={"replica": "r2"})],
                      error_rate=0.01)  # fmt: skip
    log = tmp_path / "events.parquet"
    events.write_parquet(log)
    table = run_duckdb(log, tmp_path / "timelines.parquet")
    from_events = hopline("analyze", str(log), "--json")
    from_table = hopline("analyze", "--timelines", str(table), "--json")
    assert from_events.returncode == 0 and from_table.returncode == 0, from_table.stderr
    a, b = json.loads(from_events.stdout), json.loads(from_table.stdout)
    assert a.pop("scan") and "scan" not in b  # what was read: events there, a table here
    assert ("shift", "queue", {"replica": "r2"}) in [(f["kind"], f.get("stage"), f["scope"]) for f in b["findings"]]
    assert b == a


def test_analyze_timelines_rejects_a_table_that_is_not_one(tmp_path):
    bad = tmp_path / "bad.parquet"
    pl.DataFrame({"request_id": ["a"], "queue": [0.1]}).write_parquet(bad)
    proc = hopline("analyze", "--timelines", str(bad))
    assert proc.returncode == 2
    assert "is not a timelines table" in proc.stderr and "lacks service" in proc.stderr
    both = hopline("analyze", str(bad), "--timelines", str(bad))
    assert both.returncode == 2 and "not both" in both.stderr
    neither = hopline("analyze")
    assert neither.returncode == 2 and "--timelines FILE" in neither.stderr


def test_analyze_timelines_since_until_cut_by_request_start(tmp_path):
    events = generate(2000, seed=5)
    log = tmp_path / "events.parquet"
    events.write_parquet(log)
    table = run_duckdb(log, tmp_path / "timelines.parquet")
    starts = read_timelines(table)["start"].sort()
    middle = float(starts[1000])
    proc = hopline("analyze", "--timelines", str(table), "--since", str(middle), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["requests"] == int((starts >= middle).sum()) == 1000
    proc = hopline("analyze", "--timelines", str(table), "--until", str(middle), "--json")
    assert json.loads(proc.stdout)["requests"] == 1001
