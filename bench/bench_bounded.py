"""The bounded analyzer on 5M-50M requests: hopline a bucket of requests at a time vs the best
DuckDB query we could write, each in a fresh process, time, CPU and peak RSS.

    python bench/gen_large.py --requests 50000000 --buckets 80    # -> /work/bench-data/store-50000000
    python bench/bench_bounded.py --requests 50000000 --engines hopline,analyze,duckdb
    python bench/bench_bounded.py --requests 20000000 --store /work/bench-data/store-50000000

The log is a store bucketed by request (``gen_large.py --buckets``: ``bucket=K`` folders,
~7.4M events each at 12 events a request), as a collector's compaction could write it.

* ``hopline``: ``io.scan_each`` + ``bounded.build_table`` (per-request timelines of one bucket
  at a time, written to a Parquet table) + p50 / p90 / p99 of the 7 stages per replica read
  from that table, in one query;
* ``hopline-seven``: the same with a table of ``replica`` and the 7 stages only
  (``build_table(columns=...)``: Polars computes only the aggregations those need), i.e. the
  same output as the DuckDB query's;
* ``analyze``: ``hopline analyze --json``'s whole analysis (``pipeline.analyze_files``: the table
  of the statistics' columns, then the findings on it, a seeded sample of requests beyond the
  budget's); ``analyze-whole``: the same on the whole table (every column, as ``--html`` builds it);
* ``anchor``: issue 26's anchor, an independently written DuckDB query (``ANCHOR_SQL``,
  ``../shared/reference/perf-anchor-duckdb.sql`` or ``$HOPLINE_BENCH_ANCHOR_SQL``),
  the reference the ratios are taken against when it runs;
* ``duckdb``: the contract's stage table as one query over every file (only the inputs the 7
  stages need; grouped by a 64-bit hash of ``request_id``; hop times as a plain ``min`` of
  the pick ``ts - attempt * 2**24``, attributes ``arg_min_null`` by it; 2 threads,
  ``memory_limit`` 6 GB, a temp directory to spill to, insertion order not kept).

``hopline``, ``hopline-seven`` and ``duckdb`` produce the same table (checked, relative 1e-9). A watchdog kills
an engine whose RSS passes ``--max-gib``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl
from bench_analyzer import QUANTILES, RESULT_COLUMNS, SEVEN, run_worker, same
from hopline.analyzer import allocator
from hopline.analyzer.sql import formula_sql
from hopline.middleware.contract import INPUTS, STAGES


class _Quoted(dict):
    """Every input and stage by its quoted column name (the per-request table's, lateral aliases)."""

    def __missing__(self, name: str) -> str:
        return f'"{name}"'


QUOTED = _Quoted()

HERE = Path(__file__).resolve()
DUCKDB_MEMORY = os.environ.get("HOPLINE_BENCH_DUCKDB_MEMORY", "6GB")
SPAN = 16777216.0  # 2**24: the attempt's weight in the pick, as in timelines.py


# --- hopline ---------------------------------------------------------------------------------


def replica_quantiles(table: pl.LazyFrame) -> pl.DataFrame:
    """p50 / p90 / p99 per replica of each of the 7 stages: one query, so each column is read and
    ``replica`` grouped once (not once per stage)."""
    quantiles = (
        pl.col(s).quantile(q, interpolation="linear").alias(f"{s}_{n}") for s in SEVEN for n, q in QUANTILES.items()
    )
    return (
        table.select(pl.col("replica").cast(pl.Categorical), *SEVEN)
        .group_by("replica")
        .agg(quantiles)
        .with_columns(pl.col("replica").cast(pl.String))
        .collect()
        .sort("replica")
    )


def store_files(store: Path, requests: int, chunk: int = 500_000) -> list[Path]:
    """The store's files holding its first ``requests`` requests (``gen_large.py --buckets``
    writes chunk ``c`` of ``chunk`` requests as ``bucket=K/cCCCCC.parquet``): a 50M store
    serves as the 5M and 20M logs too, each a contiguous span of time."""
    chunks = -(-requests // chunk)
    return sorted(f for f in store.rglob("c*.parquet") if int(f.stem[1:]) < chunks)


def run_hopline(files: list[Path], columns: tuple[str, ...] | None = None) -> pl.DataFrame:
    from hopline.analyzer import bounded, io

    scanned, _ = io.scan_each(files)
    table = bounded.build_table(scanned, (), bounded.Budget.of(), columns=columns)
    try:
        return replica_quantiles(table.frame)
    finally:
        table.close()


def run_hopline_seven(files: list[Path]) -> pl.DataFrame:
    """The same output as the DuckDB query: a table of ``replica`` and the 7 stages only."""
    return run_hopline(files, ("replica", *SEVEN))


def run_analyze(files: list[Path], full_table: bool = False) -> pl.DataFrame:
    from hopline.analyzer.pipeline import analyze_files

    # the command's own composition (analyzer/pipeline.py), its table as --json builds it: the statistics' columns
    analysis, _ = analyze_files(files, full_table=full_table)
    result = analysis.to_json()
    print(json.dumps({"requests": result["requests"], "sample": result.get("sample"),
                      "findings": len(result["findings"])}), file=sys.stderr)  # fmt: skip
    return pl.DataFrame()


def run_analyze_whole(files: list[Path]) -> pl.DataFrame:
    """The same analysis on the whole per-request table (as ``--html`` / ``--otlp`` build it; what
    ``--json`` built before issue 39)."""
    return run_analyze(files, full_table=True)


# --- DuckDB ------------------------------------------------------------------------------------


def needed(stages: tuple[str, ...]) -> set[str]:
    """The stages and contract inputs the stages' formulas read, directly or through others."""
    by_name = {s.name: s for s in STAGES}
    seen: set[str] = set()
    todo = list(stages)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in by_name:
            for formula in by_name[name].formulas:
                todo += [n for _, n in formula.terms] + list(formula.when_null)
    return seen


def duckdb_sql(files: list[Path]) -> str:
    """Per request (a 64-bit hash of its ID): the needed inputs, stream and replica; then the
    stages those need and their quantiles per replica."""
    names = needed(SEVEN)
    inputs = [inp for inp in INPUTS if inp.name in names]
    hops = sorted({inp.hop for inp in inputs} | {"client.sent", "engine.received", "gateway.received",
                                                 "gateway.forwarded"} | {h for h in _ENGINE_HOPS})  # fmt: skip
    cols = []
    for inp in inputs:
        if inp.attr is None:
            cols.append(f"min(k) FILTER (WHERE hop = '{inp.hop}') AS \"_p_{inp.name}\"")
        else:
            value = f"arg_min_null({inp.attr}, k) FILTER (WHERE hop = '{inp.hop}')"
            if inp.default is not None:
                value = f"CASE WHEN count(*) FILTER (WHERE hop = '{inp.hop}') > 0 THEN coalesce({value}, {inp.default}) END"
            cols.append(f'{value} AS "{inp.name}"')
    stream = ", ".join(f"arg_min_null(stream, k) FILTER (WHERE hop = '{h}')" for h in ("client.sent", "engine.received",
                                                                                        "gateway.received"))  # fmt: skip
    replica = (
        "coalesce(arg_min(replica, k) FILTER (WHERE hop LIKE 'engine.%'), "
        "arg_min_null(upstream, k) FILTER (WHERE hop = 'gateway.forwarded')) AS replica"
    )
    times = ", ".join(
        f'"_p_{i.name}" + round((t0 - "_p_{i.name}") / {SPAN}) * {SPAN} AS "{i.name}"' for i in inputs if i.attr is None
    )
    stages = []
    for stage in (s for s in STAGES if s.name in names):  # a stage may use those before it (lateral aliases)
        formulas = [formula_sql(f, QUOTED) for f in stage.formulas]
        expr = f"coalesce({', '.join(formulas)})" if len(formulas) > 1 else formulas[0]
        stages.append(f'{expr} AS "{stage.name}"')
    quantiles = ", ".join(f'quantile_cont("{s}", {q}) AS "{s}_{n}"' for s in SEVEN for n, q in QUANTILES.items())
    hop_list = ", ".join(f"'{h}'" for h in hops)
    return f"""
        WITH ev AS (
            SELECT hash(request_id) AS rid, hop, ts, ts - attempt * {SPAN} AS k, replica, upstream, stream,
                   {", ".join(sorted({i.attr for i in inputs if i.attr}))}
            FROM read_parquet([{", ".join(f"'{f}'" for f in files)}]) WHERE hop IN ({hop_list})
        ), per_request AS (
            SELECT min(ts) AS t0, {", ".join(cols)}, coalesce({stream}) AS stream, {replica}
            FROM ev GROUP BY rid
        ), timed AS (
            SELECT *, {times} FROM per_request
        ), staged AS (
            SELECT replica, {", ".join(stages)} FROM timed
        )
        SELECT replica, {quantiles} FROM staged GROUP BY replica ORDER BY replica
    """


_ENGINE_HOPS = ("engine.received", "engine.scheduled", "engine.first_token", "engine.last_token", "engine.stats",
                "engine.error")  # fmt: skip


def run_duckdb(files: list[Path]) -> pl.DataFrame:
    import duckdb

    spill = tempfile.mkdtemp(prefix="duckdb-spill-", dir=os.environ.get("TMPDIR"))
    con = duckdb.connect()
    con.execute("SET threads = 2")
    con.execute(f"SET memory_limit = '{DUCKDB_MEMORY}'")
    con.execute(f"SET temp_directory = '{spill}'")
    con.execute("SET preserve_insertion_order = false")
    try:
        return pl.from_arrow(con.sql(duckdb_sql(files)).to_arrow_table())  # type: ignore[return-value]
    finally:
        con.close()
        subprocess.run(["rm", "-rf", spill], check=False)


# issue 26's anchor query, kept beside the checkout (``../shared/reference/``, as the issue names it)
ANCHOR_SQL = Path(os.environ.get("HOPLINE_BENCH_ANCHOR_SQL", HERE.parents[2] / "shared/reference/perf-anchor-duckdb.sql"))


def run_anchor(files: list[Path]) -> pl.DataFrame:
    """The anchor of issue 26: an independently written DuckDB query (``ANCHOR_SQL``:
    three group-bys by hop family on an ENUM, ``arg_min`` for the attempt pick, FULL JOINs), its
    file path and temp directory replaced by the store's files and a fresh spill folder; its
    ``SET`` lines as written (2 threads, 8 GB), but ``$HOPLINE_BENCH_ANCHOR_MEMORY`` replaces its
    memory limit (at 20M requests the query runs out of its 8 GB: "could not allocate block")."""
    import duckdb

    spill = tempfile.mkdtemp(prefix="duckdb-anchor-", dir=os.environ.get("TMPDIR"))
    text = ANCHOR_SQL.read_text()
    if memory := os.environ.get("HOPLINE_BENCH_ANCHOR_MEMORY"):
        if "SET memory_limit = '8GB'" not in text:
            raise SystemExit(f"HOPLINE_BENCH_ANCHOR_MEMORY: {ANCHOR_SQL} has no \"SET memory_limit = '8GB'\" line to replace")
        text = text.replace("SET memory_limit = '8GB'", f"SET memory_limit = '{memory}'")
    text = text.replace("'/tmp/perf-d/events-5m.parquet'", "[" + ", ".join(f"'{f}'" for f in files) + "]")
    text = text.replace("'/tmp/perf-d/duck-tmp'", f"'{spill}'")
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--"))
    statements = [part.strip() for part in code.split(";") if part.strip()]
    con = duckdb.connect()
    try:
        for statement in statements[:-1]:
            con.execute(statement)
        return pl.from_arrow(con.sql(statements[-1]).to_arrow_table())  # type: ignore[return-value]
    finally:
        con.close()
        subprocess.run(["rm", "-rf", spill], check=False)


ENGINES = {"hopline": run_hopline, "hopline-seven": run_hopline_seven, "analyze": run_analyze,
           "analyze-whole": run_analyze_whole, "duckdb": run_duckdb, "anchor": run_anchor}  # fmt: skip


# --- the harness ---------------------------------------------------------------------------------


def worker(engine: str, files: list[Path], result: Path) -> None:
    began = time.perf_counter()
    table = ENGINES[engine](files)
    seconds = time.perf_counter() - began
    if table.height:
        table.select(RESULT_COLUMNS).write_parquet(result)
    print(json.dumps({"seconds": seconds}))


def measured(engine: str, store: Path, requests: int, chunk: int, result: Path, max_gib: float) -> dict:
    """One engine in a fresh, niced process (``bench_analyzer.run_worker``): its seconds (inside),
    CPU (user + system) and peak RSS; killed past ``max_gib``. Polars' allocator is set as
    ``hopline analyze`` sets it (``allocator``: freed memory kept 5 s; the anchor's DuckDB has
    its own)."""
    argv = ["nice", "-n", "10", sys.executable, str(HERE), "--worker", engine, "--store", str(store), "--requests", str(requests),
            "--chunk", str(chunk), "--result", str(result)]  # fmt: skip
    output, code, cpu, peak, killed = run_worker(argv, max_gib, allocator.environ())
    if not killed and code != 0:
        raise SystemExit(f"{engine} failed with exit code {code}")
    return {"seconds": float("nan") if killed else json.loads(output)["seconds"], "cpu_s": cpu, "peak_gib": peak, "killed": killed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=5_000_000)
    parser.add_argument("--engines", default="hopline,analyze,duckdb")
    parser.add_argument("--data", type=Path, default=Path("/work/bench-data"))
    parser.add_argument("--max-gib", type=float, default=10.0)
    parser.add_argument("--worker", choices=sorted(ENGINES))
    parser.add_argument("--store", type=Path, help="default: DATA/store-REQUESTS; a larger store's first REQUESTS")
    parser.add_argument("--chunk", type=int, default=500_000, help="the store's requests per chunk file")
    parser.add_argument("--result", type=Path)
    parser.add_argument("--duckdb-memory", default=DUCKDB_MEMORY, help="DuckDB's memory_limit")
    args = parser.parse_args()
    os.environ["HOPLINE_BENCH_DUCKDB_MEMORY"] = args.duckdb_memory  # for the workers
    store = args.store or args.data / f"store-{args.requests}"
    files = store_files(store, args.requests, args.chunk)
    if args.worker:
        worker(args.worker, files, args.result)
        return
    events = pl.scan_parquet(files).select(pl.len()).collect().item()
    size = sum(f.stat().st_size for f in files) / 1e9
    print(f"{args.requests:,} requests, {events:,} events, {size:.2f} GB Parquet in {len(files)} files", flush=True)
    tables, rows = {}, {}
    for engine in args.engines.split(","):
        result = args.data / f"result-bounded-{engine}.parquet"
        rows[engine] = measured(engine, store, args.requests, args.chunk, result, args.max_gib)
        if result.exists():
            tables[engine] = pl.read_parquet(result)
            result.unlink()
        print(engine, json.dumps(rows[engine]), flush=True)
    reference = next((e for e in ("anchor", "duckdb") if e in rows and not rows[e]["killed"]), None)
    if reference is not None:
        ref = rows[reference]
        for engine, row in rows.items():
            print(f"{engine}: wall {row['seconds'] / ref['seconds']:.2f}x, CPU {row['cpu_s'] / ref['cpu_s']:.2f}x {reference}; "
                  f"{row['seconds'] / args.requests * 1e6:.2f} s and {row['cpu_s'] / args.requests * 1e6:.2f} CPU-s "
                  "per million requests")  # fmt: skip
    for engine in ("hopline", "hopline-seven", "duckdb"):
        if engine in tables and reference in tables and engine != reference:
            verdict = same(tables[engine], tables[reference], 1e-9)
            print(f"{engine} vs {reference}:", "equal" if verdict is None else "DIFFERENT: " + verdict)


if __name__ == "__main__":
    main()
