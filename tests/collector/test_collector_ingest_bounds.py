"""What ingest accepts is exactly what it can store, compact and read back (issue 10, items 1-3, 7).

Every case here was a real defect: a line that validated but could not be stored (500, then the
retry answered as duplicates and nothing stored), integers that broke compaction, duplicated keys
that validated one value and stored another, multi-member gzip read only to its first member,
and an infinite stage that made GET /v1/requests/{id} answer 500.
"""

from __future__ import annotations

import gzip
import json

import pytest
from support.collector import stored_lines
from support.events import event, ndjson
from hopline.collector.compaction import compact_hour
from hopline.middleware.contract import MAX_NESTING, TS_MAX

NDJSON = {"Content-Type": "application/x-ndjson"}
T = 1767225600.0


def nested(levels: int) -> object:
    value: object = 1
    for _ in range(levels):
        value = {"x": value}
    return value


def test_a_deeply_nested_line_is_rejected_with_a_reason_and_the_batch_is_stored(collector):
    """orjson reads 1,024 levels and writes 254: a 300-level attribute used to fail after dedup."""
    good = [event("client.sent", f"deep-{i}", T, stream=True) for i in range(2)]
    deep = event("client.sent", "deep-x", T, stream=True, blob=nested(300))
    body = ndjson([good[0], deep, good[1]])
    first = collector.client.post("/v1/events", content=body, headers=NDJSON)
    assert first.status_code == 200
    assert first.json()["accepted"] == 2
    [rejected] = first.json()["rejected"]
    assert rejected["line"] == 2 and f"deeper than {MAX_NESTING} levels" in rejected["error"]
    # the sink's retry of the same batch: the two stored events are duplicates, nothing is lost
    retry = collector.client.post("/v1/events", content=body, headers=NDJSON).json()
    assert retry["accepted"] == 0 and retry["duplicates"] == 2
    assert sorted(e["eid"] for e in stored_lines(collector.collector.config.data_dir)) == sorted(
        e["eid"] for e in good
    )
    reg = collector.collector.registry
    assert reg.get_sample_value("hopline_events_rejected_total", {"reason": "too_deep"}) == 2


def test_an_eid_is_remembered_only_once_its_event_is_stored(collector, monkeypatch):
    """Whatever fails between validation and the durable write, the retry is stored."""
    batch = [event("client.sent", f"once-{i}", T, stream=True) for i in range(3)]
    store = collector.collector.store
    real_append = store.append

    def broken(data: bytes) -> None:
        raise RuntimeError("disk controller on fire")

    monkeypatch.setattr(store, "append", broken)
    failed = collector.client.post("/v1/events", content=ndjson(batch), headers=NDJSON)
    assert failed.status_code == 500
    monkeypatch.setattr(store, "append", real_append)
    retry = collector.client.post("/v1/events", content=ndjson(batch), headers=NDJSON).json()
    assert retry["accepted"] == 3 and retry["duplicates"] == 0
    assert len(stored_lines(collector.collector.config.data_dir)) == 3


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("attempt", 2**31, "attempt must be an integer from 0 to 2147483647"),
        ("n", 2**63, "n must be an integer that fits in 64 bits"),
        ("status", 2**63, "status must be an integer that fits in 64 bits"),
        ("pool_wait_s", 1e308, "pool_wait_s must be seconds between 0 and 604800"),
        ("connect_s", -1.0, "connect_s must be seconds between 0 and 604800"),
        ("ts", 1e308, "ts must be positive Unix epoch seconds before 2100"),
        ("ts", TS_MAX + 1, "ts must be positive Unix epoch seconds before 2100"),
        ("max_gap_at", 253402300800.0, "max_gap_at must be Unix epoch seconds before"),
        ("extra", {"deep": [2**64 - 1]}, "extra holds an integer that does not fit in 64 bits"),
    ],
)
def test_values_that_do_not_fit_their_storage_are_rejected_with_a_reason(collector, field, value, says):
    bad = event("client.sent", "bounds", T, stream=True)
    bad[field] = value
    good = event("client.sent", "bounds-ok", T, stream=True)
    answer = collector.client.post("/v1/events", content=ndjson([bad, good]), headers=NDJSON).json()
    assert answer["accepted"] == 1
    [rejected] = answer["rejected"]
    assert rejected["line"] == 1 and rejected["error"].startswith(says), rejected


def test_what_is_stored_is_what_was_validated_even_with_duplicated_keys(collector, config):
    """JSON parsers disagree on duplicated keys; the stored line is re-serialized, so they cannot."""
    line = (
        b'{"v":1,"eid":"00000000000000d1","ts":1767225600.0,"request_id":"seen-as-a","hop":"client.sent",'
        b'"n":"not a number","stream":true,"request_id":"stored-as-b","n":2}\n'
    )
    answer = collector.client.post("/v1/events", content=line, headers=NDJSON).json()
    assert answer["accepted"] == 1
    [path] = (config.data_dir / "events").glob("date=*/hour=*/events.ndjson")
    raw = path.read_bytes()
    assert raw.count(b'"request_id"') == 1 and raw.count(b'"n"') == 1
    assert json.loads(raw)["request_id"] == "stored-as-b" and json.loads(raw)["n"] == 2
    assert collector.client.get("/v1/requests/stored-as-b").json()["hops"][0]["n"] == 2
    # and the hour compacts to what was validated
    collector.collector.store.close()
    parquet = compact_hour(path.parent)
    import polars as pl

    row = pl.read_parquet(parquet).row(0, named=True)
    assert (row["request_id"], row["n"]) == ("stored-as-b", 2)


def test_every_member_of_a_multi_member_gzip_body_is_read(collector):
    """``cat a.gz b.gz`` is valid gzip (RFC 1952): both members' events are stored."""
    a, b = event("client.sent", "gz-a", T, stream=True), event("client.sent", "gz-b", T, stream=True)
    body = gzip.compress(ndjson([a])) + gzip.compress(ndjson([b]))
    answer = collector.client.post(
        "/v1/events", content=body, headers={**NDJSON, "Content-Encoding": "gzip"}
    ).json()
    assert answer["accepted"] == 2
    garbage = gzip.compress(ndjson([event("client.sent", "gz-c", T, stream=True)])) + b"trailing junk"
    refused = collector.client.post(
        "/v1/events", content=garbage, headers={**NDJSON, "Content-Encoding": "gzip"}
    )
    assert refused.status_code == 400 and "after its last gzip member" in refused.json()["error"]
    assert {e["request_id"] for e in stored_lines(collector.collector.config.data_dir)} == {"gz-a", "gz-b"}


def test_a_timeline_with_a_non_finite_stage_reads_as_null_not_500(collector):
    """Validation rejects 1e308 now; the read path must not fail on whatever the join holds."""
    sent = event("client.sent", "inf-1", T, stream=True, pool_wait_s=1e308, connect_s=1e308)
    answer = collector.client.post("/v1/events", content=ndjson([sent]), headers=NDJSON)
    assert answer.status_code == 400 and "_s must be seconds between 0 and" in answer.json()["rejected"][0]["error"]
    sent["ts"] = T
    collector.collector.joiner.add([{**sent, "attempt": 0}])  # straight into the join, unvalidated
    got = collector.client.get("/v1/requests/inf-1")
    assert got.status_code == 200
    assert got.json()["stages"]["connect"] is None  # inf + inf: not representable in JSON
