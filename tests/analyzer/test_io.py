"""scan_events: NDJSON (plain, rotated, gzipped), Parquet, folders and the collector's hive store;
bad lines counted and located, never fatal; request IDs normalized; one typed schema out."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest
from hopline.analyzer.io import MAX_ERRORS, SCHEMA, find_files, scan_events, to_epoch
from hopline.middleware.contract import dumps
from support.events import event

T0 = 1767607200.0  # 2026-01-05T10:00:00Z


def write_lines(path: Path, lines: list[bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(lines))
    return path


def test_ndjson_bad_lines_are_counted_located_and_skipped(tmp_path):
    path = write_lines(
        tmp_path / "events.ndjson",
        [
            dumps(event("client.sent", "a", T0, stream=True, team="blue")),
            b"{not json\n",
            b"\n",  # blank lines are not lines of data
            dumps(event("nope.hop", "b", T0)),
            dumps(event("client.sent", "c", T0, stream="yes")),
            dumps(event("engine.stats", "chatcmpl-a", T0 + 1, queue_s=0.25)),
        ],
    )
    events, report = scan_events([path])
    df = events.collect()
    assert report.lines == 5 and report.bad_lines == 3
    assert report.errors[0].startswith(f"{path}:2: not JSON")
    assert report.errors[1] == f"{path}:4: unknown hop 'nope.hop'"
    assert report.errors[2] == f"{path}:5: stream must be bool, got 'yes'"
    assert df.schema == pl.Schema(SCHEMA)
    # the engine prefix is stripped, so both events belong to request "a"
    assert df["request_id"].to_list() == ["a", "a"]
    assert df["queue_s"].to_list() == [None, 0.25]
    # an unknown field is kept, as JSON, in attrs
    assert json.loads(df["attrs"][0]) == {"team": "blue"}


def test_error_list_is_capped_but_every_bad_line_counted(tmp_path):
    path = write_lines(tmp_path / "bad.jsonl", [b"[]\n"] * (MAX_ERRORS + 5))
    _, report = scan_events([path])
    assert report.bad_lines == MAX_ERRORS + 5
    assert len(report.errors) == MAX_ERRORS


def test_folder_finds_rotated_and_gzipped_logs_and_ignores_others(tmp_path):
    write_lines(tmp_path / "events.ndjson.2026112913.1", [dumps(event("client.sent", "r1", T0))])
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "events.ndjson.gz").write_bytes(gzip.compress(dumps(event("client.sent", "r2", T0))))
    write_lines(tmp_path / "notes.txt", [b"hello\n"])
    events, report = scan_events([tmp_path])
    assert sorted(events.collect()["request_id"].to_list()) == ["r1", "r2"]
    assert len(report.files) == 2 and report.bad_lines == 0


def test_parquet_with_missing_columns_is_typed_and_normalized(tmp_path):
    path = tmp_path / "part.parquet"
    pl.DataFrame(
        {
            "ts": [T0, T0 + 1],
            "request_id": ["x", "cmpl-x"],
            "hop": ["client.sent", "engine.stats"],
            "attempt": [0, 0],
            "prefill_s": [None, 0.5],
        }
    ).write_parquet(path)
    events, report = scan_events([path])
    df = events.collect()
    assert df.schema == pl.Schema(SCHEMA)
    assert df["request_id"].to_list() == ["x", "x"]
    assert df["prefill_s"].to_list() == [None, 0.5]
    assert report.lines == 2


def test_collector_store_partitions_and_time_filters(tmp_path):
    store = tmp_path / "store" / "events"
    compacted = store / "date=2026-01-05" / "hour=10" / "part-0.parquet"
    compacted.parent.mkdir(parents=True)
    pl.DataFrame(
        {"ts": [T0 + 60, T0 + 120], "request_id": ["p1", "p2"], "hop": ["client.sent"] * 2}
    ).write_parquet(compacted)
    write_lines(
        store / "date=2026-01-05" / "hour=11" / "open.ndjson", [dumps(event("client.sent", "n1", T0 + 3700))]
    )
    write_lines(
        store / "date=2026-01-05" / "hour=12" / "open.ndjson", [dumps(event("client.sent", "n2", T0 + 7300))]
    )
    write_lines(
        store / "date=2026-01-05" / "hour=08" / "open.ndjson", [dumps(event("client.sent", "o1", T0 - 7000))]
    )
    events, report = scan_events([tmp_path / "store"])
    assert sorted(events.collect()["request_id"].to_list()) == ["n1", "n2", "o1", "p1", "p2"]
    # since/until filter events; hours are by ingest time, so an hour that closed well before
    # `since` is not even opened, while hours after `until` are (late events land there)
    events, report = scan_events([tmp_path / "store"], since="2026-01-05T10:01:30Z", until=T0 + 3800)
    assert sorted(events.collect()["request_id"].to_list()) == ["n1", "p2"]
    assert not any("hour=08" in f for f in report.files)
    assert any("hour=12" in f for f in report.files)


def test_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        find_files([tmp_path / "nope"])


def test_time_bounds():
    assert to_epoch("2026-01-05T10:00:00Z") == T0
    assert to_epoch("2026-01-05T10:00:00") == T0  # naive means UTC
    assert to_epoch(str(T0)) == T0
    assert to_epoch(None) is None
