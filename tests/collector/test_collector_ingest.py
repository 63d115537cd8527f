"""POST /v1/events against a real collector: answers, bad inputs, durability before the answer."""

from __future__ import annotations

import gzip
import time

from hopline.collector.config import CollectorConfig
from hopline.collector.store import NDJSON_NAME, hour_dir
from support.collector import serve, stored_lines
from support.events import event, ndjson

NDJSON = {"Content-Type": "application/x-ndjson"}


def test_mixed_batch_keeps_valid_lines_and_names_the_bad_ones(collector):
    good1 = event("client.sent", "r-1", 1767225600.0, stream=True)
    good2 = event("client.first_token", "r-1", 1767225600.2)
    body = (
        ndjson([good1])
        + b"{not json\n"
        + ndjson([{"ts": 1767225600.1, "request_id": "r-1", "hop": "client.teleported"}])
        + b"\n"  # blank lines are skipped but counted
        + ndjson([good2, {"ts": 1767225600.3, "request_id": "bad id!", "hop": "client.last_token"}])
    )
    r = collector.client.post("/v1/events", content=body, headers=NDJSON)
    assert r.status_code == 200
    answer = r.json()
    assert answer["accepted"] == 2 and answer["duplicates"] == 0
    assert [x["line"] for x in answer["rejected"]] == [2, 3, 6]
    assert answer["rejected"][0]["error"].startswith("not JSON")
    assert "unknown hop" in answer["rejected"][1]["error"]
    assert "request_id" in answer["rejected"][2]["error"]
    # acknowledged means stored: the two good lines are on disk, exactly as sent
    stored = stored_lines(collector.collector.config.data_dir)
    assert [e["eid"] for e in stored] == [good1["eid"], good2["eid"]]
    reg = collector.collector.registry
    assert reg.get_sample_value("hopline_events_rejected_total", {"reason": "not_json"}) == 1
    assert reg.get_sample_value("hopline_events_rejected_total", {"reason": "invalid_hop"}) == 1
    assert reg.get_sample_value("hopline_events_rejected_total", {"reason": "invalid_request_id"}) == 1
    assert reg.get_sample_value("hopline_events_total", {"hop": "client.sent"}) == 1


def test_lines_end_in_lf_crlf_or_cr_alike_with_the_same_line_numbers(collector):
    """A body's lines are ``bytes.splitlines``' whichever line ends it uses (``Ingestor.parse``
    splits a body without a CR on LF alone): the same events and the same rejected line numbers,
    with or without a newline after the last line."""
    good = [event("client.sent", "r-9", 1767225600.0 + i / 10) for i in range(3)]
    lines = [ndjson([good[0]]).rstrip(b"\n"), b"{not json", b"", ndjson([good[1]]).rstrip(b"\n"), b"",
             ndjson([good[2]]).rstrip(b"\n")]  # fmt: skip
    seen = []
    for end in (b"\n", b"\r\n", b"\r"):
        for last in (b"", end):
            parsed = collector.collector.ingestor.parse(end.join(lines) + last, "ndjson")
            seen.append(([e["eid"] for e in parsed.events], [r["line"] for r in parsed.result.rejected]))
    assert seen == [([g["eid"] for g in good], [2])] * 6


def test_nothing_valid_is_400_with_the_reasons(collector):
    r = collector.client.post("/v1/events", content=b'{"hop": 1}\n[]\n', headers=NDJSON)
    assert r.status_code == 400
    assert r.json()["accepted"] == 0
    assert [x["line"] for x in r.json()["rejected"]] == [1, 2]


def test_json_array_is_accepted_and_engine_prefix_normalized_before_storing(collector):
    events = [
        event("engine.received", "chatcmpl-abc", 1767225600.0, stream=True),
        event("engine.first_token", "abc", 1767225600.1),
    ]
    r = collector.client.post("/v1/events", json=events)
    assert r.json() == {"accepted": 2, "duplicates": 0, "rejected": []}
    # NDJSON with the prefix too: the stored line carries the normalized ID
    r = collector.client.post(
        "/v1/events",
        content=ndjson([event("engine.last_token", "chatcmpl-abc", 1767225601.0)]),
        headers=NDJSON,
    )
    assert r.json()["accepted"] == 1
    assert {e["request_id"] for e in stored_lines(collector.collector.config.data_dir)} == {"abc"}


def test_duplicates_are_dropped_and_counted(collector):
    a = event("client.sent", "dup-1", 1767225600.0, stream=True)
    no_eid = {k: v for k, v in event("client.first_token", "dup-1", 1767225600.5).items() if k != "eid"}
    r1 = collector.client.post("/v1/events", content=ndjson([a, no_eid]), headers=NDJSON)
    assert r1.json()["accepted"] == 2
    # a sink retry of the same batch, plus a repeat inside one batch
    r2 = collector.client.post("/v1/events", content=ndjson([a, no_eid, a]), headers=NDJSON)
    assert r2.status_code == 200
    assert r2.json() == {"accepted": 0, "duplicates": 3, "rejected": []}
    assert len(stored_lines(collector.collector.config.data_dir)) == 2
    assert collector.collector.registry.get_sample_value("hopline_events_duplicate_total") == 3


def test_a_batch_with_repeats_stores_its_new_lines_byte_for_byte_in_order(collector):
    """The lines of a batch are serialized into one buffer; when some are duplicates, the new ones
    are cut out of it: each stored exactly as validated and serialized (``contract.dumps``)."""
    from hopline.middleware.contract import dumps, validate_event

    first = [event("client.sent", f"cut-{i}", 1767225600.0 + i, stream=True) for i in range(3)]
    assert collector.client.post("/v1/events", content=ndjson(first[:1]), headers=NDJSON).json()["accepted"] == 1
    batch = [first[0], first[1], first[1], {**first[2], "request_id": "cmpl-cut-2", "ts": 1767225602}, first[0]]
    r = collector.client.post("/v1/events", content=ndjson(batch), headers=NDJSON)
    assert r.json() == {"accepted": 2, "duplicates": 3, "rejected": []}
    files = sorted((collector.collector.config.data_dir / "events").glob("date=*/hour=*/*.ndjson"))
    stored = b"".join(path.read_bytes() for path in files)
    assert stored == b"".join(dumps(validate_event(e)) for e in (first[0], first[1], batch[3]))


def test_unknown_content_type_is_415(collector):
    r = collector.client.post("/v1/events", content=b"x", headers={"Content-Type": "text/plain"})
    assert r.status_code == 415
    assert "text/plain" in r.json()["error"]


def test_gzip_body_is_accepted(collector):
    events = [event("client.sent", "gz-1", 1767225600.0, stream=True)]
    r = collector.client.post(
        "/v1/events", content=gzip.compress(ndjson(events)), headers={**NDJSON, "Content-Encoding": "gzip"}
    )
    assert r.json()["accepted"] == 1


def test_oversized_and_gzip_bomb_are_413(tmp_path):
    config = CollectorConfig(data_dir=tmp_path / "d", max_body=10_000, max_decompressed_bytes=100_000)
    with serve(config) as c:
        r = c.client.post("/v1/events", content=b" " * 10_001, headers=NDJSON)
        assert r.status_code == 413
        # 10 MB of blank lines compress to ~10 KB: under the body limit, far over the output cap
        bomb = gzip.compress(b"\n" * 10_000_000)
        assert len(bomb) < 10_000
        r = c.client.post("/v1/events", content=bomb, headers={**NDJSON, "Content-Encoding": "gzip"})
        assert r.status_code == 413
        assert "decompressed" in r.json()["error"]
        assert stored_lines(config.data_dir) == []


def test_token_is_required_when_configured(tmp_path):
    config = CollectorConfig(data_dir=tmp_path / "d", token="s3cret")
    body = ndjson([event("client.sent", "tok-1", 1767225600.0, stream=True)])
    with serve(config) as c:
        assert c.client.post("/v1/events", content=body, headers=NDJSON).status_code == 401
        wrong = c.client.post("/v1/events", content=body, headers={**NDJSON, "Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
        ok = c.client.post("/v1/events", content=body, headers={**NDJSON, "Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and ok.json()["accepted"] == 1


def test_unusable_data_dir_is_503_and_a_retry_is_accepted_once_it_works(tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the data directory's parent should be")
    config = CollectorConfig(data_dir=blocker / "data", grace=0)
    batch = ndjson([event("client.sent", "ro-1", 1767225600.0, stream=True)])
    with serve(config) as c:
        r = c.client.post("/v1/events", content=batch, headers=NDJSON)
        assert r.status_code == 503
        assert "Not a directory" in r.json()["error"] and r.headers["retry-after"] == "1"
        assert c.client.get("/v1/requests/ro-1").status_code == 404  # nothing acknowledged, nothing joined
        blocker.unlink()
        blocker.mkdir()
        # the failed batch's eids were forgotten: the sink's retry is stored, not a "duplicate"
        again = c.client.post("/v1/events", content=batch, headers=NDJSON)
        assert again.json() == {"accepted": 1, "duplicates": 0, "rejected": []}
    assert len(stored_lines(config.data_dir)) == 1


def test_disk_full_is_503_and_nothing_is_acknowledged(tmp_path):
    """The hour's event file is a symlink to /dev/full: every write fails with ENOSPC."""
    config = CollectorConfig(data_dir=tmp_path / "d", grace=0)
    now = int(time.time())
    for hour in (now, now + 3600):  # the test may straddle an hour boundary
        directory = hour_dir(config.data_dir / "events", hour // 3600 * 3600)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / NDJSON_NAME).symlink_to("/dev/full")
    with serve(config) as c:
        r = c.client.post(
            "/v1/events", content=ndjson([event("client.sent", "full-1", 1767225600.0)]), headers=NDJSON
        )
        assert r.status_code == 503
        assert "No space left on device" in r.json()["error"]
        assert c.client.get("/v1/requests/full-1").status_code == 404
        assert c.collector.registry.get_sample_value("hopline_events_total", {"hop": "client.sent"}) is None
