"""The durable store: layout, torn-line repair, compaction to Parquet, retention, no backwards hours."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest
from hopline.collector.compaction import PARQUET_NAME
from hopline.collector.config import CollectorConfig
from hopline.collector.store import HOUR, NDJSON_NAME, EventStore, StoreError, hour_dir, parse_hour_dir
from hopline.middleware.contract import STORAGE_COLUMNS

T0 = 1767225600  # 2026-01-01T00:00:00Z


def store_in(data_dir: Path, clock: Callable[[], float] = time.time) -> EventStore:
    """The collector's store as configured by default, less the free-space check (its own tests)."""
    return EventStore.from_config(CollectorConfig(data_dir=data_dir, healthz_min_free=0), clock=clock)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def line(rid: str, ts: float, hop: str = "client.sent", **extra) -> bytes:
    return json.dumps({"v": 1, "ts": ts, "request_id": rid, "hop": hop, **extra}).encode() + b"\n"


def test_layout_is_hive_partitions_by_ingest_hour(tmp_path):
    clock = Clock(T0 + 5 * HOUR + 10)
    store = store_in(tmp_path, clock=clock)
    store.open()
    store.append(line("a", 1.0))  # the event's own ts is irrelevant: ingest time decides
    store.close()
    path = tmp_path / "events" / "date=2026-01-01" / "hour=05" / NDJSON_NAME
    assert path.read_bytes() == line("a", 1.0)
    assert parse_hour_dir(path.parent) == T0 + 5 * HOUR
    assert parse_hour_dir(tmp_path / "events" / "date=2026-01-01" / "hour=24") is None


def test_torn_tail_from_a_crash_is_cut_before_appending(tmp_path):
    clock = Clock(T0 + 10)
    directory = hour_dir(tmp_path / "events", T0)
    directory.mkdir(parents=True)
    (directory / NDJSON_NAME).write_bytes(line("a", 1.0) + b'{"v":1,"ts":2,"requ')  # killed mid-write
    store = store_in(tmp_path, clock=clock)
    store.open()
    store.append(line("b", 3.0))
    store.close()
    assert (directory / NDJSON_NAME).read_bytes() == line("a", 1.0) + line("b", 3.0)


def test_closed_hours_are_compacted_to_the_storage_schema(tmp_path):
    clock = Clock(T0 + 100)
    store = store_in(tmp_path, clock=clock)
    store.open()
    store.append(
        line("r2", 5.0, "engine.stats", queue_s=1, attempt=1)
        + line("r1", 4.0, stream=True, route="/v1/chat", x={"k": [1]})
    )
    clock.now = T0 + HOUR + 30  # the hour closed 30 s ago
    assert store.compact(delay_s=60) == []  # too early: late batches of that hour may still be in flight
    store.append(line("r3", 6.0))  # the next hour
    clock.now = T0 + HOUR + 61
    written = store.compact(delay_s=60)
    first = hour_dir(tmp_path / "events", T0)
    assert written == [first / PARQUET_NAME]
    assert not (first / NDJSON_NAME).exists()
    assert (hour_dir(tmp_path / "events", T0 + HOUR) / NDJSON_NAME).exists()  # the open hour stays NDJSON
    df = pl.read_parquet(first / PARQUET_NAME)
    assert dict(df.schema) == {name: getattr(pl, dtype) for name, dtype in STORAGE_COLUMNS.items()}
    assert df["request_id"].to_list() == ["r1", "r2"]  # sorted by request
    assert df["attempt"].to_list() == [0, 1]
    assert df["queue_s"].to_list() == [None, 1.0]
    assert df["route"].to_list() == ["/v1/chat", None]
    assert [json.loads(a) if a else None for a in df["attrs"].to_list()] == [{"x": {"k": [1]}}, None]
    store.close()


def test_a_quiet_collector_still_compacts_its_last_hour(tmp_path):
    clock = Clock(T0 + 100)
    store = store_in(tmp_path, clock=clock)
    store.open()
    store.append(line("q", 1.0))
    clock.now = T0 + 3 * HOUR  # nothing written since
    assert store.compact(delay_s=60) == [hour_dir(tmp_path / "events", T0) / PARQUET_NAME]
    store.append(line("q2", 2.0))
    assert (hour_dir(tmp_path / "events", T0 + 3 * HOUR) / NDJSON_NAME).exists()


def test_hours_never_go_back_to_a_compacted_hour(tmp_path):
    clock = Clock(T0 + 100)
    store = store_in(tmp_path, clock=clock)
    store.open()
    store.append(line("a", 1.0))
    clock.now = T0 + 2 * HOUR
    store.compact(delay_s=0)
    store.close()
    clock.now = T0 + 200  # the wall clock stepped back, and the collector restarted
    again = store_in(tmp_path, clock=clock)
    again.open()
    again.append(line("b", 2.0))
    again.close()
    assert not (hour_dir(tmp_path / "events", T0) / NDJSON_NAME).exists()
    assert (hour_dir(tmp_path / "events", T0 + HOUR) / NDJSON_NAME).read_bytes() == line("b", 2.0)


def test_crash_between_rename_and_unlink_keeps_each_event_once(tmp_path):
    clock = Clock(T0 + 100)
    store = store_in(tmp_path, clock=clock)
    store.open()
    store.append(line("a", 1.0))
    store.close()
    directory = hour_dir(tmp_path / "events", T0)
    kept = (directory / NDJSON_NAME).read_bytes()
    clock.now = T0 + 2 * HOUR
    store.compact(delay_s=0)
    (directory / NDJSON_NAME).write_bytes(kept)  # as if the process died before removing it
    store.compact(delay_s=0)
    assert sorted(p.name for p in directory.iterdir()) == [PARQUET_NAME]
    assert pl.read_parquet(directory / PARQUET_NAME).height == 1


def test_retention_deletes_old_hours_and_empty_dates(tmp_path):
    clock = Clock(T0 + 100)
    store = store_in(tmp_path, clock=clock)
    store.open()
    store.append(line("old", 1.0))
    clock.now = T0 + 30 * HOUR
    store.append(line("new", 2.0))
    removed = store.expire(retention=24 * HOUR)
    assert removed == [hour_dir(tmp_path / "events", T0)]
    assert not (tmp_path / "events" / "date=2026-01-01").exists()
    assert (hour_dir(tmp_path / "events", T0 + 30 * HOUR) / NDJSON_NAME).exists()
    store.close()


def test_unusable_directory_raises_store_error(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(StoreError, match="Not a directory|cannot create"):
        store_in(tmp_path / "f" / "d").open()
