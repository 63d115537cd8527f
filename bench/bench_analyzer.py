"""Timelines + attribution on a large log: hopline vs DuckDB vs Spark (vs pandas on a slice), one run.

    python bench/bench_analyzer.py --requests 5000000 --pandas-requests 1000000
    python bench/bench_analyzer.py --requests 20000 --pandas-requests 20000   # a quick check
    python bench/bench_analyzer.py --requests 1000000 --pandas-requests 0 --engines hopline,duckdb,spark --per-request

The query: hop events (globally shuffled Parquet, ``bench/gen_large.py``) -> one row per request
with the contract's stages -> p50 / p90 / p99 of the 7 stages (connect, network, gateway,
frontend, queue, prefill, decode) per replica: the per-request table alone, beside other engines.
The whole analysis as ``hopline analyze`` runs it (``pipeline.analyze_files``: the table, the
facts, the findings) is ``bench_bounded.py``'s ``analyze`` engine.

* ``hopline``: ``io.scan_events`` + ``timelines.timelines`` + a Polars quantile aggregation;
* ``duckdb``: the timelines view of ``hopline sql`` (hopline.analyzer.sql; 2 threads, memory_limit)
  + ``quantile_cont``;
* ``spark``: the same view rendered for Spark SQL, pyspark in local mode (``local[2]``) + ``percentile``;
  its JVM start-up is reported apart from the query time, its memory is the process tree's (sampled);
* ``pandas``: the same stage table on pandas Series (sort, drop_duplicates, pivot);
* experiments: ``polars-narrow`` (only the inputs these 7 stages need), ``polars-narrow-hash``
  (the same grouped by a 64-bit hash of request_id), ``hopline-buckets`` (hopline's io +
  timelines on the log partitioned by request hash, one partition at a time).

Every engine runs in a fresh process (``--worker``); peak memory is that process's ru_maxrss
(``os.wait4``), time is the query inside it, Parquet read included. All engines' tables must
agree (``--rtol``); a mismatch fails the run. ``--per-request``: the engines that build the whole
per-request table (hopline, duckdb, spark) return every stage and ratio of every request instead
of the quantiles, compared request by request.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import polars as pl
from hopline.analyzer.sql import timelines_sql
from hopline.analyzer.timelines import RATIO_COLUMNS, STAGE_COLUMNS
from hopline.middleware.contract import ATTRIBUTE_SOURCES, INPUTS, STAGES

SEVEN = ("connect", "network", "gateway", "frontend", "queue", "prefill", "decode")
QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
RESULT_COLUMNS = ["replica"] + [f"{s}_{q}" for s in SEVEN for q in QUANTILES]
HERE = Path(__file__).resolve()


# --- hopline ---------------------------------------------------------------------------------


def quantiles_by_replica(per_request: pl.LazyFrame) -> pl.LazyFrame:
    return (
        per_request.group_by("replica")
        .agg(
            pl.col(s).quantile(q, interpolation="linear").alias(f"{s}_{n}")
            for s in SEVEN
            for n, q in QUANTILES.items()
        )
        .sort("replica")
    )


def run_hopline(path: Path) -> pl.DataFrame:
    from hopline.analyzer.io import scan_events
    from hopline.analyzer.timelines import timelines

    events, _ = scan_events([path])
    if PER_REQUEST:
        return timelines(events).select(PER_REQUEST_COLUMNS).collect()
    return quantiles_by_replica(timelines(events)).collect()


# --- DuckDB and Spark: the timelines view compiled to SQL (hopline.analyzer.sql) ------------------

DUCKDB_MEMORY = os.environ.get("HOPLINE_BENCH_DUCKDB_MEMORY", "8GB")
SPARK_MEMORY = os.environ.get("HOPLINE_BENCH_SPARK_MEMORY", "6g")
PER_REQUEST = os.environ.get("HOPLINE_BENCH_PER_REQUEST") == "1"  # --per-request, for the workers
# --per-request: every engine returns these per request, compared request by request
PER_REQUEST_COLUMNS = ["request_id", "replica", *STAGE_COLUMNS, *RATIO_COLUMNS]
EXTRA: dict[str, float] = {}  # what a worker reports beyond its time (Spark's start-up)


def quantile_sql(view: str, percentile: str) -> str:
    """p50 / p90 / p99 of the seven stages per replica over the per-request ``view``;
    ``percentile``: the engine's exact, linearly interpolated quantile (quantile_cont, percentile)."""
    columns = ", ".join(f"{percentile}({s}, {q}) AS {s}_{n}" for s in SEVEN for n, q in QUANTILES.items())
    return f"SELECT replica, {columns} FROM ({view}) AS per_request GROUP BY replica ORDER BY replica"


def run_duckdb(path: Path) -> pl.DataFrame:
    import duckdb

    con = duckdb.connect()
    con.execute("SET threads = 2")
    con.execute(f"SET memory_limit = '{DUCKDB_MEMORY}'")
    view = timelines_sql("duckdb", f"read_parquet('{path}')")
    query = f"SELECT {', '.join(PER_REQUEST_COLUMNS)} FROM ({view}) AS v" if PER_REQUEST else quantile_sql(view, "quantile_cont")
    return pl.from_arrow(con.sql(query).to_arrow_table())  # type: ignore[return-value]


def run_spark(path: Path) -> pl.DataFrame:
    """The view on Spark in local mode (2 cores, as DuckDB and Polars get); the result comes back
    through a Parquet folder (``toArrow`` would pass a million rows through py4j)."""
    import tempfile

    from pyspark.sql import SparkSession

    began = time.perf_counter()
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", SPARK_MEMORY)
        .config("spark.sql.shuffle.partitions", "16")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    EXTRA["startup_s"] = time.perf_counter() - began  # the JVM and the session: not the query
    view = timelines_sql("spark", f"parquet.`{path}`")
    query = f"SELECT {', '.join(PER_REQUEST_COLUMNS)} FROM ({view}) AS v" if PER_REQUEST else quantile_sql(view, "percentile")
    with tempfile.TemporaryDirectory(dir=path.parent) as out:
        spark.sql(query).write.mode("overwrite").parquet(out)
        table = pl.read_parquet(f"{out}/*.parquet")
    spark.stop()
    return table


# --- pandas: the stage table on Series ---------------------------------------------------------


def run_pandas(path: Path) -> pl.DataFrame:
    import pandas as pd

    attrs = sorted({inp.attr for inp in INPUTS if inp.attr} | {"stream", "upstream"})
    df = pd.read_parquet(path, columns=["request_id", "hop", "attempt", "ts", "replica", *attrs])
    df["neg_attempt"] = -df["attempt"]
    df = df.sort_values(["request_id", "neg_attempt", "ts"], kind="stable")
    chosen = df.drop_duplicates(["request_id", "hop"])  # the contract's event per hop
    wide = chosen.pivot(index="request_id", columns="hop", values=["ts", *attrs])

    def column(name: str, hop: str) -> pd.Series:
        return wide[(name, hop)] if (name, hop) in wide.columns else pd.Series(float("nan"), index=wide.index)

    values: dict[str, pd.Series] = {}
    for inp in INPUTS:
        if inp.attr is None:
            values[inp.name] = column("ts", inp.hop).astype("float64")
        else:
            value = column(inp.attr, inp.hop).astype("float64")
            if inp.default is not None:
                value = value.where(column("ts", inp.hop).isna(), value.fillna(inp.default))
            values[inp.name] = value
    stream = pd.Series(pd.NA, index=wide.index, dtype="boolean")
    for hop in ATTRIBUTE_SOURCES["stream"]:
        stream = stream.fillna(column("stream", hop).astype("boolean"))
    engine = df[df["hop"].str.startswith("engine.") & df["replica"].notna()].drop_duplicates("request_id")
    replica = (
        engine.set_index("request_id")["replica"]
        .reindex(wide.index)
        .fillna(column("upstream", "gateway.forwarded"))
    )
    for stage in STAGES:
        result = pd.Series(float("nan"), index=wide.index)
        for formula in stage.formulas:
            total = sum(sign * values[name] for sign, name in formula.terms)
            ok = pd.Series(True, index=wide.index)
            for name in formula.when_null:
                ok &= values[name].isna()
            if formula.stream is not None:
                ok &= (stream == formula.stream).fillna(False).astype(bool)
            result = result.fillna(total.where(ok))
        values[stage.name] = result
    staged = pd.DataFrame({"replica": replica, **{s: values[s] for s in SEVEN}})
    table = staged.groupby("replica")[list(SEVEN)].quantile(list(QUANTILES.values())).unstack()
    table.columns = [
        f"{s}_{dict(zip(QUANTILES.values(), QUANTILES, strict=True))[q]}" for s, q in table.columns
    ]
    return pl.from_pandas(table.reset_index()).select(RESULT_COLUMNS).sort("replica")


# --- an experimental shape for hopline's timelines ---------------------------------------------


def run_polars_narrow(path: Path, hashed: bool = False) -> pl.DataFrame:
    """Only what these 7 stages need, with the same pick rule and stage expressions as timelines.

    ``hashed``: group by a 64-bit hash of ``request_id`` instead of the string (hashing strings
    once is cheaper than a string-keyed hash table), keeping ``request_id`` as the group's
    first value. A second, independent hash detects a collision (two IDs in one group: its
    min and max differ); the run fails then (timelines() would recompute those groups by string).
    """
    from hopline.analyzer.timelines import stage_exprs

    needed = {inp.hop for inp in INPUTS}
    key = pl.col("ts") - pl.col("attempt").cast(pl.Float64) * 2.0**24
    lf = pl.scan_parquet(path).select("request_id", "hop", "attempt", "ts", "replica", "stream", "upstream",
                                      *{i.attr for i in INPUTS if i.attr})  # fmt: skip
    hops = sorted(needed | set(ATTRIBUTE_SOURCES["stream"]) | {"gateway.forwarded"})
    per_request = (
        lf.with_columns(pl.col("hop").cast(pl.Categorical))
        .with_columns(
            [pl.when(pl.col("hop") == h).then(key).alias(f"_k:{h}") for h in hops]
            + [
                pl.when(
                    pl.col("hop").cast(pl.String).str.starts_with("engine.") & pl.col("replica").is_not_null()
                )
                .then(key)
                .alias("_k:engine")
            ]  # fmt: skip
        )
        .group_by(pl.col("request_id").hash(0).alias("_rid") if hashed else "request_id")
        .agg(
            (
                [
                    pl.col("request_id").first(),
                    pl.col("request_id").hash(1).min().alias("_c0"),
                    pl.col("request_id").hash(1).max().alias("_c1"),
                ]
                if hashed
                else []
            )  # fmt: skip
            + [pl.col("ts").min_by(f"_k:{h}").alias(f"_ts:{h}") for h in hops]
            + [pl.col(i.attr).min_by(f"_k:{i.hop}").alias(f"_a:{i.name}") for i in INPUTS if i.attr]
            + [pl.col("stream").min_by(f"_k:{h}").alias(f"_s:{h}") for h in ATTRIBUTE_SOURCES["stream"]]
            + [
                pl.col("upstream").min_by("_k:gateway.forwarded").alias("_up"),
                pl.col("replica").min_by("_k:engine").alias("_replica"),
            ]  # fmt: skip
        )
    )
    values: dict[str, pl.Expr] = {}
    for inp in INPUTS:
        if inp.attr is None:
            values[inp.name] = pl.col(f"_ts:{inp.hop}")
        else:
            value = pl.col(f"_a:{inp.name}")
            if inp.default is not None:
                value = pl.when(pl.col(f"_ts:{inp.hop}").is_not_null()).then(value.fill_null(inp.default))
            values[inp.name] = value
    values["stream"] = pl.coalesce([pl.col(f"_s:{h}") for h in ATTRIBUTE_SOURCES["stream"]])
    values["output_tokens"] = pl.lit(None, dtype=pl.Int64)
    values["n"] = pl.lit(None, dtype=pl.Int64)
    values = stage_exprs(values)
    if hashed:
        staged = per_request.select(
            replica=pl.coalesce("_replica", "_up"),
            **{s: values[s] for s in SEVEN},
            _collided=pl.col("_c0") != pl.col("_c1"),
        ).collect()
        if staged["_collided"].any():
            raise SystemExit("request_id hash collision: those groups need the string key")
        return quantiles_by_replica(staged.lazy().drop("_collided")).collect()
    staged = per_request.select(replica=pl.coalesce("_replica", "_up"), **{s: values[s] for s in SEVEN})
    return quantiles_by_replica(staged).collect()


# --- an experimental layout: events partitioned by request --------------------------------------

BUCKETS = 8


def bucket_folder(path: Path) -> Path:
    return path.with_name(path.stem + f".buckets{BUCKETS}")


def bucketize(path: Path) -> Path:
    """Rewrite the shuffled log as ``BUCKETS`` partitions by a hash of ``request_id`` (what a
    collector could write at compaction): every request's events land in one partition, so
    timelines can be built one partition at a time, in a fraction of the memory."""
    folder = bucket_folder(path)
    if not folder.exists():
        bucket = (pl.col("request_id").hash(7) % BUCKETS).alias("bucket")
        pl.scan_parquet(path).sink_parquet(pl.PartitionBy(folder, key=bucket, include_key=False), mkdir=True)
    return folder


def run_hopline_buckets(path: Path) -> pl.DataFrame:
    """hopline's own io + timelines, one request-hash partition at a time (``bucketize``)."""
    from hopline.analyzer.io import scan_events
    from hopline.analyzer.timelines import timelines

    parts = []
    for folder in sorted(bucket_folder(path).iterdir()):
        events, _ = scan_events([folder])
        parts.append(timelines(events).select("replica", *SEVEN).collect())
    return quantiles_by_replica(pl.concat(parts).lazy()).collect()


ENGINES: dict[str, Callable[[Path], pl.DataFrame]] = {
    "hopline": run_hopline,
    "duckdb": run_duckdb,
    "spark": run_spark,
    "pandas": run_pandas,
    "polars-narrow": run_polars_narrow,
    "polars-narrow-hash": lambda path: run_polars_narrow(path, hashed=True),
    "hopline-buckets": run_hopline_buckets,
}


# --- the harness ---------------------------------------------------------------------------------


def worker(engine: str, path: Path, result: Path) -> None:
    began = time.perf_counter()
    table = ENGINES[engine](path)
    seconds = time.perf_counter() - began - EXTRA.get("startup_s", 0.0)
    table.select(PER_REQUEST_COLUMNS if PER_REQUEST else RESULT_COLUMNS).write_parquet(result)
    print(json.dumps({"seconds": seconds, **EXTRA}))


def run_worker(
    argv: list[str], max_gib: float, env: dict[str, str] | None = None
) -> tuple[bytes, int, float, float, bool]:
    """Run ``argv`` (a bench worker) in a fresh process: its stdout, exit code, CPU seconds (user +
    system, the whole process: on a shared machine less noisy than wall time), peak RSS in GiB
    (``ru_maxrss`` from ``wait4``, or the sampled peak of its process tree when larger) and whether
    it was killed. ``env``: the worker's environment (default: this one's).

    A process whose tree's RSS passes ``max_gib`` is killed (the machine is shared: an engine that
    outgrows it must not take other processes down with it). Children are sampled every 0.2 s:
    Spark's JVM is one the worker may never wait for, so ``wait4`` does not count it (its last 0.2 s
    may be missed). ``argv`` may start with ``nice``, which execs: the pid is the worker's.
    """
    import psutil

    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, env=env)
    watched, killed = psutil.Process(proc.pid), False
    tree_peak, child_cpu = 0, {}
    while True:  # not proc.poll(): it would reap the child before wait4 reads its rusage
        try:
            if watched.status() == psutil.STATUS_ZOMBIE:
                break
            rss = watched.memory_info().rss
            for child in watched.children(recursive=True):
                try:
                    rss += child.memory_info().rss
                    times = child.cpu_times()
                    child_cpu[child.pid] = times.user + times.system
                except psutil.NoSuchProcess:
                    pass
            tree_peak = max(tree_peak, rss)
            if not killed and rss > max_gib * 1024**3:
                for child in watched.children(recursive=True):
                    child.kill()
                proc.kill()
                killed = True
        except psutil.NoSuchProcess:
            break
        time.sleep(0.2)
    assert proc.stdout is not None
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    peak = max(usage.ru_maxrss * 1024, tree_peak) / 1024**3
    cpu = usage.ru_utime + usage.ru_stime + sum(child_cpu.values())
    return output, os.waitstatus_to_exitcode(status), cpu, peak, killed


def measure(engine: str, path: Path, result: Path, max_gib: float) -> dict[str, float]:
    """Run one engine in a fresh process (``run_worker``): its query time, CPU time and peak RSS."""
    argv = [sys.executable, str(HERE), "--worker", engine, "--file", str(path), "--result", str(result)]
    output, code, cpu, peak, killed = run_worker(argv, max_gib)
    if killed:
        return {"seconds": float("nan"), "cpu_s": cpu, "peak_gib": peak, "killed": 1.0}
    if code != 0:
        raise SystemExit(f"{engine} failed with exit code {code}")
    reported = json.loads(output)
    return {"seconds": reported["seconds"], "cpu_s": cpu, "peak_gib": peak, "startup_s": reported.get("startup_s", 0.0)}


def same(a: pl.DataFrame, b: pl.DataFrame, rtol: float) -> str | None:
    """None when the tables agree within ``rtol`` (relative, plus 1 ns absolute), else why not.
    Per-request tables (``--per-request``) are compared request by request, every stage and ratio."""
    if "request_id" in a.columns:
        a, b = a.sort("request_id"), b.sort("request_id")
        if not a["request_id"].equals(b["request_id"]):
            return f"requests differ: {a.height:,} vs {b.height:,} rows"
    if not a["replica"].equals(b["replica"]):
        return f"replicas differ: {a['replica'].head(8).to_list()} vs {b['replica'].head(8).to_list()}"
    for name in (PER_REQUEST_COLUMNS[2:] if "request_id" in a.columns else RESULT_COLUMNS[1:]):
        x, y = a[name], b[name]
        close = ((x - y).abs() <= 1e-9 + rtol * y.abs()) | (x.is_null() & y.is_null())
        if not close.fill_null(False).all():
            return f"{name} differs on {(~close.fill_null(False)).sum():,} rows: {x.head(5).to_list()} vs {y.head(5).to_list()}"
    return None


def report(
    engines: list[str],
    timings: dict[str, list[dict[str, float]]],
    tables: dict[str, pl.DataFrame],
    rtol: float,
    max_gib: float,
) -> bool:
    """Print one line per engine, ratios against DuckDB; True when an output differs."""
    if not tables:
        print("every engine was killed: " + ", ".join(engines))
        return True
    reference = "duckdb" if "duckdb" in tables else next(iter(tables))

    def median(engine: str, key: str) -> float:
        values = sorted(t[key] for t in timings[engine])
        return values[len(values) // 2]

    print(
        f"{'engine':<20} {'wall s median [min, max]':<26} {'CPU s':>7} {'peak GiB':>9} "
        f"{'wall ratio':>11} {'CPU ratio':>10} {'mem ratio':>10}  output"
    )
    ref_m = max(t["peak_gib"] for t in timings[reference])
    failed = False
    for engine in engines:
        peak = max(t["peak_gib"] for t in timings[engine])
        if any(t.get("killed") for t in timings[engine]):
            print(
                f"{engine:<20} {'killed':<26} {median(engine, 'cpu_s'):>7.1f} {peak:>9.2f}  (RSS over {max_gib} GiB)"
            )
            continue
        secs = sorted(t["seconds"] for t in timings[engine])
        verdict = same(tables[engine], tables[reference], rtol)
        failed |= verdict is not None
        wall = f"{median(engine, 'seconds'):.2f} [{secs[0]:.2f}, {secs[-1]:.2f}]"
        print(
            f"{engine:<20} {wall:<26} "
            f"{median(engine, 'cpu_s'):>7.1f} {peak:>9.2f} "
            f"{median(engine, 'seconds') / median(reference, 'seconds'):>10.2f}x "
            f"{median(engine, 'cpu_s') / median(reference, 'cpu_s'):>9.2f}x {peak / ref_m:>9.2f}x  "
            f"{'equal' if verdict is None else 'DIFFERENT: ' + verdict}"
            + (f"  (+ {median(engine, 'startup_s'):.1f} s start-up)" if median(engine, "startup_s") else ""),
            flush=True,
        )
    return failed


def dataset(requests: int, folder: Path) -> Path:
    path = folder / f"events-{requests}.parquet"
    if not path.exists():
        subprocess.run([sys.executable, str(HERE.parent / "gen_large.py"), "--requests", str(requests), "--out", str(path)],
                       check=True)  # fmt: skip
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=5_000_000)
    parser.add_argument("--pandas-requests", type=int, default=1_000_000, help="0 to skip pandas")
    parser.add_argument("--engines", default="hopline,duckdb,polars-narrow")
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--data", type=Path, default=Path("/work/bench-data"))
    parser.add_argument("--rtol", type=float, default=1e-9)
    parser.add_argument("--max-gib", type=float, default=12.0, help="kill an engine whose RSS passes this")
    parser.add_argument("--duckdb-memory", default=DUCKDB_MEMORY, help="DuckDB's memory_limit")
    parser.add_argument("--spark-memory", default=SPARK_MEMORY, help="Spark's driver memory (local mode)")
    parser.add_argument("--per-request", action="store_true",
                        help="compare per-request stages and ratios (hopline, duckdb, spark) instead of quantiles")  # fmt: skip
    parser.add_argument("--worker", choices=sorted(ENGINES))
    parser.add_argument("--file", type=Path)
    parser.add_argument("--result", type=Path)
    args = parser.parse_args()
    os.environ["HOPLINE_BENCH_DUCKDB_MEMORY"] = args.duckdb_memory  # for the workers
    os.environ["HOPLINE_BENCH_SPARK_MEMORY"] = args.spark_memory
    os.environ["HOPLINE_BENCH_PER_REQUEST"] = "1" if args.per_request else "0"
    if args.worker:
        worker(args.worker, args.file, args.result)
        return
    args.data.mkdir(parents=True, exist_ok=True)
    runs = [(args.requests, args.engines.split(","))]
    if args.pandas_requests:
        runs.insert(0, (args.pandas_requests, ["hopline", "duckdb", "pandas"]))
    failed = False
    for requests, engines in runs:
        path = dataset(requests, args.data)
        if "hopline-buckets" in engines and not bucket_folder(path).exists():
            began = time.perf_counter()
            bucketize(path)
            print(
                f"bucketized {path.name} into {BUCKETS} request-hash partitions in {time.perf_counter() - began:.1f} s"
            )
        events = pl.scan_parquet(path).select(pl.len()).collect().item()
        print(
            f"\n{requests:,} requests, {events:,} events, {path.stat().st_size / 1e6:,.0f} MB Parquet",
            flush=True,
        )
        timings: dict[str, list[dict[str, float]]] = {e: [] for e in engines}
        tables: dict[str, pl.DataFrame] = {}
        for rep in range(args.reps):
            for engine in engines if rep % 2 == 0 else reversed(engines):
                result = args.data / f"result-{engine}-{requests}.parquet"
                timings[engine].append(measure(engine, path, result, args.max_gib))
                if result.exists():
                    tables[engine] = pl.read_parquet(result)
                    result.unlink()
        failed |= report(engines, timings, tables, args.rtol, args.max_gib)
    if failed:
        raise SystemExit("outputs differ")


if __name__ == "__main__":
    main()
