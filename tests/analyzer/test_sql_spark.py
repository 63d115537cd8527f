"""The timelines view on a real Spark (pyspark in local mode, Java 17 from Debian): the same
per-request table as Polars, column by column, on the golden fixture and on a generated log of
20,000 requests with retries. One SparkSession for the module (local[2], no UI)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hopline.analyzer.sql import read_timelines, timelines_sql
from hopline.analyzer.timelines import COLUMNS, timelines
from pyspark.sql import SparkSession
from support.tables import assert_same_timelines, golden_events, synthetic_events

LOGS = {"golden": golden_events, "synthetic": synthetic_events}


@pytest.fixture(scope="module")
def spark():
    session = (
        SparkSession.builder.master("local[2]")
        .appName("hopline-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")  # the default 200 costs seconds on a small log
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.mark.parametrize("log", sorted(LOGS))
def test_spark_gives_polars_timelines(log, spark, tmp_path: Path):
    events = LOGS[log]()
    path = tmp_path / "events.parquet"
    events.write_parquet(path)
    out = tmp_path / "timelines"
    # as a user would export it: Spark writes a folder of part files
    spark.sql(timelines_sql("spark", f"parquet.`{path}`")).write.parquet(str(out))
    got = read_timelines(out)
    want = timelines(events.lazy()).collect()
    assert got.height == want.height > 0
    assert got.columns == list(COLUMNS)
    assert_same_timelines(got, want)
