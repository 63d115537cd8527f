"""scan_events: NDJSON (plain, rotated, gzipped), Parquet, folders and the collector's hive store;
bad lines counted and located, never fatal; request IDs normalized; one typed schema out."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
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


# --- hostile and damaged input: a bad file is reported, the rest is read, nothing valid lost ----


def _good(n: int, prefix: str = "ok") -> list[dict]:
    return [event("client.sent", f"{prefix}-{i}", T0 + i, stream=True) for i in range(n)]


def test_lines_the_storage_types_cannot_hold_are_bad_lines_and_the_rest_is_kept(tmp_path):
    # what a collector could store before it bounded them (issue 10): each broke the whole run
    path = write_lines(
        tmp_path / "events.ndjson",
        [dumps(e) for e in _good(3)]
        + [
            # nested 300 deep: orjson reads 1,024 levels but writes 254
            b'{"ts": %r, "request_id": "deep", "hop": "client.sent", "stream": true, "extra": ' % T0
            + b'{"x": ' * 300 + b"{}" + b"}" * 300 + b"}\n",
            dumps(event("client.sent", "huge", T0, stream=True, prompt_tokens=2**63)),  # Int64 ends at 2^63-1
            dumps(event("client.sent", "far", 1e308, stream=True)),
            dumps(event("client.sent", "y2099", 4102444799.0, stream=True)),  # 2099-12-31T23:59:59Z: kept
            dumps(event("client.sent", "attempt", T0, stream=True, attempt=2**31)),  # attempt is an Int32
        ],
    )
    events, report = scan_events([path])
    df = events.collect()
    assert sorted(df["request_id"]) == ["ok-0", "ok-1", "ok-2", "y2099"]
    assert report.bad_lines == 4 and report.events == 4
    reasons = "\n".join(report.errors)
    # the contract's own bounds (validate_event), as the collector applies them
    for expected in (":4: extra nests deeper than 32 levels", ":5: prompt_tokens must be an integer that fits in 64 bits",
                     ":6: ts must be positive Unix epoch seconds before 2100", ":8: attempt must be an integer from 0"):
        assert expected in reasons, reasons


def test_a_corrupt_gzip_stream_keeps_the_complete_lines_before_the_damage(tmp_path):
    lines = b"".join(dumps(e) for e in _good(2000))
    whole = gzip.compress(lines)
    damaged = bytearray(whole)
    damaged[len(whole) // 2 : len(whole) // 2 + 64] = b"\x00" * 64
    (tmp_path / "events.ndjson.gz").write_bytes(bytes(damaged))
    (tmp_path / "cut.ndjson.gz").write_bytes(whole[: len(whole) // 3])  # truncated: no end of stream
    write_lines(tmp_path / "other.ndjson", [dumps(e) for e in _good(5, "other")])
    events, report = scan_events([tmp_path])
    ids = events.collect()["request_id"].to_list()
    assert sum(i.startswith("other") for i in ids) == 5
    # what came before the damage was read, up to a line boundary (ok-0, ok-1, ... in order)
    read = [i for i in ids if i.startswith("ok")]
    assert 0 < len(read) < 2 * 2000 and len(set(read)) == len(read)
    assert {f.split(":")[0] for f in report.bad_files} == {
        str(tmp_path / "events.ndjson.gz"), str(tmp_path / "cut.ndjson.gz")
    }
    assert any("corrupt gzip stream" in f for f in report.bad_files)
    assert any("cut short" in f for f in report.bad_files)
    assert report.bad_lines == 0  # no torn line was parsed


def test_every_member_of_a_multi_member_gzip_is_read(tmp_path):
    first, second = _good(2, "a"), _good(3, "b")
    (tmp_path / "events.ndjson.gz").write_bytes(
        gzip.compress(b"".join(map(dumps, first))) + gzip.compress(b"".join(map(dumps, second)))
    )
    events, report = scan_events([tmp_path])
    assert events.collect().height == 5 and not report.bad_files


def test_parquet_files_that_are_not_stored_hop_events_are_bad_files_not_errors(tmp_path):
    (tmp_path / "garbage.parquet").write_bytes(b"PAR1" + bytes(range(256)) * 4)
    pl.DataFrame({"foo": [1, 2], "bar": ["a", "b"]}).write_parquet(tmp_path / "other.parquet")
    pl.DataFrame({"ts": ["noon"], "request_id": ["x"], "hop": ["client.sent"]}).write_parquet(tmp_path / "types.parquet")
    pl.DataFrame({"ts": [T0], "request_id": ["p1"], "hop": ["client.sent"]}).write_parquet(tmp_path / "good.parquet")
    events, report = scan_events([tmp_path])
    assert events.collect()["request_id"].to_list() == ["p1"]
    by_file = {f.split(": ", 1)[0].rsplit("/", 1)[-1]: f.split(": ", 1)[1] for f in report.bad_files}
    assert by_file.keys() == {"garbage.parquet", "other.parquet", "types.parquet"}
    assert by_file["garbage.parquet"].startswith("not a readable Parquet file")
    assert by_file["other.parquet"] == "not hop events: missing column ts, request_id, hop (it has foo, bar)"
    assert by_file["types.parquet"] == "wrong column types: ts is String, expected Float64"
    assert report.events == 1


def test_parquet_rows_the_types_cannot_hold_are_counted_and_the_rest_kept_with_defaults(tmp_path):
    path = tmp_path / "part.parquet"
    pl.DataFrame(
        {
            "ts": [T0, 1e308, None, T0 + 1],
            "request_id": ["a", "b", "c", None],
            "hop": ["client.sent"] * 4,
            "attempt": pl.Series([0, 0, 0, 2**40], dtype=pl.Int64),  # stored wider than the Int32 it reads as
        }
    ).write_parquet(path)
    pl.DataFrame({"ts": [T0], "request_id": ["d"], "hop": ["client.sent"]}).write_parquet(tmp_path / "lean.parquet")
    events, report = scan_events([tmp_path])
    df = events.collect().sort("request_id")
    assert df["request_id"].to_list() == ["a", "d"]
    assert df["attempt"].to_list() == [0, 0] and df["v"].to_list() == [1, 1]  # absent means 0 and 1
    assert report.bad_lines == 3 and report.lines == 5 and report.events == 2


def test_emitter_health_reports_are_skipped_not_bad(tmp_path):
    health = {"v": 1, "eid": "e" * 16, "ts": T0, "hop": "emitter.stats", "emitter": "abc", "sent": 3}
    write_lines(tmp_path / "events.ndjson", [dumps(e) for e in _good(2)] + [dumps(health)])
    pl.DataFrame(
        {"ts": [T0, T0], "request_id": ["p1", None], "hop": ["client.sent", "emitter.stats"]}
    ).write_parquet(tmp_path / "part.parquet")
    events, report = scan_events([tmp_path])
    assert sorted(events.collect()["request_id"]) == ["ok-0", "ok-1", "p1"]
    assert report.bad_lines == 1 and report.events == 3  # the Parquet report has no request_id: bad row


_TS = st.one_of(
    st.just(T0), st.floats(T0, T0 + 60), st.sampled_from([None, float("nan"), float("inf"), -1.0, 0.0, 1e308])
)
_ROW = st.tuples(
    _TS,
    st.sampled_from(["a", "b", None]),
    st.sampled_from(["client.sent", "engine.received", "emitter.stats", None]),
    st.sampled_from([0, 1, None, 2**40, -(2**40)]),  # stored as Int64, read as Int32
)


@settings(max_examples=150, deadline=None, database=None)
@given(st.lists(_ROW, min_size=1, max_size=60), st.integers(1, 25), st.booleans())
def test_a_parquet_files_counts_are_its_rows_whatever_its_row_groups_and_statistics(tmp_path_factory, rows, group, statistics):
    """``check_parquet`` first asks whether any row is bad so that the row groups' statistics
    answer (no ID string decoded), then counts exactly: lines, bad rows and health reports equal
    a plain reading of the rows, with bad rows in any row group, NaN or infinite times among good
    ones, and files written with or without statistics."""
    from hopline.analyzer.io import MAX_TS, ScanReport, check_parquet

    path = tmp_path_factory.mktemp("groups") / "part.parquet"
    ts, rid, hop, attempt = zip(*rows, strict=True)
    pl.DataFrame(
        {"ts": pl.Series(ts, dtype=pl.Float64), "request_id": list(rid), "hop": list(hop),
         "attempt": pl.Series(attempt, dtype=pl.Int64)}
    ).write_parquet(path, row_group_size=group, statistics=statistics)  # fmt: skip

    def bad(t, r, h, a) -> bool:
        return t is None or r is None or h is None or not 0 < t <= MAX_TS or (a is not None and abs(a) >= 2**31)

    report = ScanReport()
    assert check_parquet(path, report) is not None
    bad_rows = sum(bad(*row) for row in rows)
    reports = sum(row[2] == "emitter.stats" and not bad(*row) for row in rows)
    assert (report.lines, report.bad_lines, report.events) == (len(rows), bad_rows, len(rows) - bad_rows - reports)


def test_a_scanned_parquet_file_holds_no_frame_until_its_events_are_asked_for(tmp_path):
    """A held Polars scan keeps the file's metadata (~170 KB each: 1.6 GiB over a 50M-request
    store's 10,000 files, for the whole run); ``scan_each`` keeps the checked schema and makes the
    frame when a group is read, with the time bounds applied then."""
    from hopline.analyzer.io import scan_each

    path = tmp_path / "part-0.parquet"
    pl.DataFrame({"ts": [T0, T0 + 60], "request_id": ["a", "b"], "hop": ["client.sent"] * 2}).write_parquet(path)
    (item,), report = scan_each([path], since=T0 + 30)
    assert item.frame is None and item.present is not None and item.rows == 2 == report.lines
    assert item.events.collect()["request_id"].to_list() == ["b"]


_PREFIXES = st.sampled_from(["", "chatcmpl-", "cmpl-", "chatcmpl-cmpl-"])
_PREFIXED = st.tuples(_PREFIXES, st.text("chatmpl-xé\n", max_size=6))


@settings(max_examples=300, deadline=None, database=None)
@given(st.lists(_PREFIXED.map("".join), min_size=1, max_size=40))
def test_the_vectorised_prefix_rule_strips_as_the_contracts_loop(ids):
    from hopline.analyzer.io import _normalized_request_id
    from hopline.middleware.contract import ENGINE_ID_PREFIXES

    def reference(value: str) -> str:  # normalize_request_id's prefix step, without its validation
        for prefix in ENGINE_ID_PREFIXES:
            if value.startswith(prefix) and len(value) > len(prefix):
                return value[len(prefix) :]
        return value

    ids += ["chatcmpl-abc", "cmpl-abc", "chatcmpl-", "cmpl-", "chatcmpl-cmpl-x", "cmpl-chatcmpl-x", "chatcmpl-é"]
    got = pl.DataFrame({"request_id": ids}).select(_normalized_request_id())["request_id"].to_list()
    assert got == [reference(v) for v in ids]
