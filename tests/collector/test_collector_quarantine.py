"""An hour that cannot be compacted is quarantined; compaction and retention go on (issue 10, item 2).

Before: one accepted line (``attempt`` >= 2**31, conflicting nested types of an unknown attribute)
made hourly compaction fail forever: that hour stayed NDJSON, later hours were never compacted,
retention deleted nothing, and the only signal was a log line a minute.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import polars as pl
from hopline.collector.app import _compact_and_expire, build_collector
from hopline.collector.compaction import PARQUET_NAME
from hopline.collector.config import CollectorConfig
from hopline.collector.store import HOUR, NDJSON_NAME, EventStore, hour_dir

T0 = 1767225600  # 2026-01-01T00:00:00Z


def store_in(data_dir: Path, clock: Callable[[], float] = time.time) -> EventStore:
    """The collector's store as configured by default, less the free-space check (its own tests)."""
    return EventStore.from_config(CollectorConfig(data_dir=data_dir, healthz_min_free=0), clock=clock)


def line(rid: str, **extra) -> bytes:
    return json.dumps({"v": 1, "ts": T0 + 1.0, "request_id": rid, "hop": "client.sent", **extra}).encode() + b"\n"


def write_hour(root, hour: int, data: bytes) -> None:
    directory = hour_dir(root / "events", hour)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / NDJSON_NAME).write_bytes(data)


def test_conflicting_types_compact_line_by_line(tmp_path):
    """An unknown attribute that is an object on one line and a list on the next is valid JSON for
    the contract; Polars' schema inference cannot type it, the line-by-line path can."""
    write_hour(tmp_path, T0, line("a", x={"k": 1}) + line("b", x=[1, 2]) + line("c", route="/v1"))
    store = store_in(tmp_path, clock=lambda: T0 + 3 * HOUR)
    quarantined = []
    written = store.compact(delay_s=0, on_quarantine=lambda p, r: quarantined.append(p))
    assert written == [hour_dir(tmp_path / "events", T0) / PARQUET_NAME]
    assert quarantined == []
    frame = pl.read_parquet(written[0]).sort("request_id")
    assert frame["attrs"].to_list() == ['{"x":{"k":1}}', '{"x":[1,2]}', None]
    assert frame["route"].to_list() == [None, None, "/v1"]


def test_invalid_lines_are_quarantined_and_later_hours_and_retention_go_on(tmp_path):
    """Lines an older collector accepted (attempt beyond Int32, a 64-bit overflow) go aside, named;
    the valid lines of the same hour and every later hour are compacted."""
    poison = line("big", attempt=2**40) + line("ok-1", stream=True) + line("huge", n=2**64 - 1)
    write_hour(tmp_path, T0, poison)
    write_hour(tmp_path, T0 + HOUR, line("ok-2", stream=True))
    store = store_in(tmp_path, clock=lambda: T0 + 3 * HOUR)
    reports = []
    written = store.compact(delay_s=0, on_quarantine=lambda p, r: reports.append((p, r)))
    assert written == [hour_dir(tmp_path / "events", h) / PARQUET_NAME for h in (T0, T0 + HOUR)]
    [(path, reason)] = reports
    assert path.is_relative_to(tmp_path / "quarantine") and reason == "2 lines are not valid events"
    assert [json.loads(x)["request_id"] for x in path.read_bytes().splitlines()] == ["big", "huge"]
    assert pl.read_parquet(written[0])["request_id"].to_list() == ["ok-1"]
    assert not list((tmp_path / "events").glob("date=*/hour=*/*.ndjson"))
    # retention removes old hours, quarantined ones included
    later = store_in(tmp_path, clock=lambda: T0 + 100 * HOUR)
    later.open()
    removed = later.expire(retention=24 * HOUR)
    assert len(removed) == 3
    assert not list(tmp_path.glob("*/date=*/hour=*"))


def test_the_collector_counts_and_logs_a_quarantined_part(tmp_path, capsys):
    config = CollectorConfig(data_dir=tmp_path, compact_delay=0)
    c = build_collector(config)
    c.store.clock = lambda: T0 + 3 * HOUR
    write_hour(tmp_path, T0, line("bad", attempt=-(2**40)) + line("fine", stream=True))
    _compact_and_expire(c)
    assert c.registry.get_sample_value("hopline_collector_quarantined_parts_total") == 1
    assert c.registry.get_sample_value("hopline_collector_compaction_failures_total") == 0
    logged = [json.loads(x) for x in capsys.readouterr().err.splitlines() if "part_quarantined" in x]
    assert len(logged) == 1 and "quarantine/date=2026-01-01/hour=00" in logged[0]["path"]
