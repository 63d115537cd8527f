"""NVIDIA Dynamo's request traces (``DYN_REQUEST_TRACE=1``) read as a record format
(middleware/contract/records.py, the ``dynamo`` row): ``request_end`` records become engine hops
(an aggregated request: one engine; a disaggregated one: hopline's prefill and decode legs), joined
by request ID with a client's and a gateway's hops, by ``hopline analyze`` and the collector's
``--tail``.

The fixture is Dynamo's file-sink form, built from ai-dynamo/dynamo @ 04daeb0eb425 (see
tests/data/dynamo-request-trace/README.md). Times near 1.77e9 s: compared within 2e-6 s.
"""

from __future__ import annotations

import asyncio
import gzip
import shutil
from pathlib import Path

import orjson
import polars as pl
import pytest
from hopline.analyzer.io import scan_events
from hopline.analyzer.timelines import timelines
from hopline.collector.tail import Tailer
from hopline.middleware.contract import compute_stages, iter_ndjson, validate_event
from hopline.middleware.contract.records import DYNAMO, RecordError, format_of, record_events, translate_lines

TRACE = Path(__file__).resolve().parents[1] / "data" / "dynamo-request-trace" / "request-trace.jsonl"
T0 = 1767225600.0  # the aggregated request's request_received_ms / 1000
T1 = T0 + 20.0  # the disaggregated one's
AGG = "4c0e8a1f9b2d4e6a8c0e2f4a6b8d0c1e"  # hopline's ID, sent as the `request-id` header: Dynamo's own
DISAGG = "9f2c1d7e4b5a4c3d8e6f7a8b9c0d1e2f"  # hopline's ID as the caller's X-Request-Id (x_request_id)


def lines() -> list[dict]:
    return [orjson.loads(line) for line in TRACE.read_bytes().splitlines()]


def translated(data: bytes) -> list[dict]:
    out, errors = translate_lines(data)
    assert errors == []
    parsed = list(iter_ndjson(out))
    assert [e for _, _, e in parsed if e] == []
    return [event for _, event, _ in parsed]


def test_an_aggregated_request_is_one_engine_with_queue_prefill_decode():
    record = lines()[0]
    assert format_of(record) is DYNAMO  # the file sink's envelope: {"timestamp", "event": record}
    events = {e["hop"]: e for e in record_events(record, DYNAMO)}
    assert {h: e["ts"] - T0 for h, e in events.items()} == pytest.approx(
        {
            "engine.received": 0.0,  # request_received_ms
            "engine.scheduled": 0.0483125,  # + prefill_wait_time_ms (dispatch to the worker)
            "engine.first_token": 0.26,  # + ttft_ms
            "engine.last_token": 1.76025,  # + total_time_ms
            "engine.stats": 1.76025,
        },
        abs=2e-6,
    )
    stats = events["engine.stats"]
    assert (stats["queue_s"], stats["prefill_s"], stats["decode_s"]) == pytest.approx(
        (0.0483125, 0.2116875, 1.50025), abs=1e-9
    )
    assert (stats["prompt_tokens"], stats["output_tokens"], stats["cached_tokens"]) == (812, 76, 512)
    assert (stats["kv_hit_rate"], stats["queue_depth"]) == (pytest.approx(32 / 51), 3)
    assert "kv_transfer_s" not in stats and not any("leg" in e for e in events.values())
    assert {e["replica"] for e in events.values()} == {"7587888795263120001"}  # the worker's ID
    assert {e["request_id"] for e in events.values()} == {AGG}
    for event in events.values():
        validate_event(event)
    sent = {"ts": T0 - 0.03, "request_id": AGG, "hop": "client.sent", "stream": True}  # the record: no stream
    stages = compute_stages([sent, *events.values()])
    assert (stages["queue"], stages["prefill"], stages["decode"]) == pytest.approx(
        (0.0483125, 0.2116875, 1.50025), abs=2e-6
    )
    assert stages["frontend"] == pytest.approx(0.0, abs=2e-6)  # Dynamo's ttft_ms is wait + prefill
    assert stages["kv_transfer"] is None


def test_a_disaggregated_request_is_two_legs_with_the_kv_transfer_between():
    record = lines()[2]
    events = record_events(record, DYNAMO)
    legs = {(e["leg"], e["hop"]): e for e in events}
    assert {k: e["ts"] - T1 for k, e in legs.items()} == pytest.approx(
        {
            ("prefill", "engine.received"): 0.0,
            ("prefill", "engine.last_token"): 0.30675,  # ttft_ms: the prefill worker's result
            ("prefill", "engine.stats"): 0.30675,
            ("decode", "engine.received"): 0.30675,
            ("decode", "engine.first_token"): 0.32525,  # + kv_transfer_estimated_latency_ms
            ("decode", "engine.last_token"): 2.00675,  # total_time_ms
            ("decode", "engine.stats"): 2.00675,
        },
        abs=2e-6,
    )
    assert (legs["prefill", "engine.stats"]["queue_s"], legs["prefill", "engine.stats"]["prefill_s"]) == (
        pytest.approx(0.0055),
        pytest.approx(0.30125),
    )
    decode = legs["decode", "engine.stats"]
    assert "queue_s" not in decode and (decode["decode_s"], decode["kv_transfer_s"]) == (
        pytest.approx(1.6815),
        pytest.approx(0.0185),
    )
    assert legs["prefill", "engine.received"]["replica"] == "7587888795263120002"
    assert legs["decode", "engine.received"]["replica"] == "7587888795263120003"
    assert {e["request_id"] for e in events} == {DISAGG}  # x_request_id wins over Dynamo's UUID
    assert legs["decode", "engine.last_token"]["finish_reason"] == "stop"
    assert {e["model"] for e in events} == {"Qwen/Qwen3-8B"}
    sent = {"ts": T1 - 0.04, "request_id": DISAGG, "hop": "client.sent", "stream": True}
    stages = compute_stages([sent, *(validate_event(e) for e in events)])
    assert (stages["queue"], stages["prefill"], stages["kv_transfer"], stages["decode"]) == pytest.approx(
        (0.0055, 0.30125, 0.0185, 1.6815), abs=2e-6
    )
    assert stages["frontend"] == pytest.approx(0.0, abs=2e-6)


def test_tool_and_payload_records_are_dropped_and_the_prompt_never_passes():
    data = TRACE.read_bytes()
    out, errors = translate_lines(data)
    assert errors == []
    assert b"SECRET" not in out and b"tool_end" not in out and b"request_payload" not in out
    assert record_events(lines()[1], DYNAMO) == [] and record_events(lines()[3], DYNAMO) == []
    assert len(translated(data)) == 5 + 7


def test_the_stderr_sinks_bare_record_reads_the_same():
    wrapped = lines()[0]
    assert record_events(wrapped["event"], DYNAMO) == record_events(wrapped, DYNAMO)


def test_a_record_without_a_usable_id_or_with_a_bad_time_is_refused_with_the_reason():
    record = lines()[0]
    del record["event"]["request"]["request_id"]
    with pytest.raises(RecordError, match="request.x_request_id / request.request_id holds no usable"):
        record_events(record, DYNAMO)
    record = lines()[0]
    record["event"]["request"]["ttft_ms"] = "soon"
    out, errors = translate_lines(orjson.dumps(record) + b"\n" + orjson.dumps(lines()[2]))
    assert errors == ["line 1: dynamo record: request.ttft_ms must be a number, got 'soon'"]
    assert {e["request_id"] for e in iter_events(out)} == {DISAGG}  # the rest kept


def iter_events(data: bytes) -> list[dict]:
    return [event for _, event, _ in iter_ndjson(data) if event is not None]


def test_analyze_joins_a_gzip_segment_with_the_clients_and_gateways_hops(tmp_path: Path):
    # the default file format: rotating gzip segments <prefix>.NNNNNN.jsonl.gz, one member per flush
    half = TRACE.read_bytes().splitlines(keepends=True)
    segment = tmp_path / "request-trace.000000.jsonl.gz"
    segment.write_bytes(gzip.compress(b"".join(half[:2])) + gzip.compress(b"".join(half[2:])))
    client = [
        {"ts": T0 - 0.03, "request_id": AGG, "hop": "client.sent", "stream": True, "conn_reused": True},
        {"ts": T0 + 0.29, "request_id": AGG, "hop": "client.first_token"},
        {"ts": T0 + 1.79, "request_id": AGG, "hop": "client.last_token", "output_tokens": 76},
        {"ts": T1 - 0.04, "request_id": DISAGG, "hop": "client.sent", "stream": True, "conn_reused": True},
        {"ts": T1 + 0.35, "request_id": DISAGG, "hop": "client.first_token"},
        {"ts": T1 + 2.04, "request_id": DISAGG, "hop": "client.last_token", "output_tokens": 101},
    ]
    gateway = [  # the disaggregated request went through hopline's gateway (its own clock: 5 s off)
        {"ts": T1 + 5 - 0.03, "request_id": DISAGG, "hop": "gateway.received"},
        {"ts": T1 + 5 - 0.01, "request_id": DISAGG, "hop": "gateway.forwarded", "upstream": "dynamo"},
    ]
    (tmp_path / "client.ndjson").write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in client))
    (tmp_path / "gateway.ndjson").write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in gateway))
    frame, report = scan_events([tmp_path])
    assert report.bad_lines == 0, report.errors
    rows = {r["request_id"]: r for r in timelines(frame).collect().iter_rows(named=True)}
    agg = rows[AGG]
    assert (agg["client_ttft"], agg["engine_ttft"], agg["queue"], agg["prefill"]) == pytest.approx(
        (0.32, 0.26, 0.0483125, 0.2116875), abs=2e-6
    )
    assert (agg["network"], agg["frontend"], agg["decode"]) == pytest.approx((0.06, 0.0, 1.50025), abs=2e-6)
    assert agg["outcome"] == "ok" and agg["replica"] == "7587888795263120001"
    pd = rows[DISAGG]
    assert (pd["client_ttft"], pd["gateway"], pd["queue"], pd["prefill"], pd["kv_transfer"]) == pytest.approx(
        (0.39, 0.02, 0.0055, 0.30125, 0.0185), abs=2e-6
    )
    # the rest of the client's TTFT is the wire: 0.39 - 0.02 - (0.30675 + 0.0185) on the legs
    assert (pd["network"], pd["frontend"], pd["decode"]) == pytest.approx((0.04475, 0.0, 1.6815), abs=2e-6)
    assert pd["network"] + pd["gateway"] + pd["frontend"] + pd["queue"] + pd["prefill"] + pd[
        "kv_transfer"
    ] == pytest.approx(pd["client_ttft"], abs=2e-6)
    assert pd["outcome"] == "ok"
    assert (pd["prefill_replica"], pd["decode_replica"]) == ("7587888795263120002", "7587888795263120003")


def test_tail_feeds_the_jsonl_sink_to_the_collector_as_hop_events(tmp_path: Path):
    log = tmp_path / "request-trace.jsonl"  # DYN_REQUEST_TRACE_FILE_FORMAT=jsonl: a plain file
    shutil.copy(TRACE, log)
    ingested: list[bytes] = []

    async def ingest(data: bytes) -> None:
        ingested.append(data)

    tailer = Tailer((str(tmp_path / "*.jsonl"),), tmp_path / "tail-state.json", ingest, tail_interval=0.5)
    assert asyncio.run(tailer.poll()) == log.stat().st_size
    events = [validate_event(orjson.loads(line)) for chunk in ingested for line in chunk.splitlines()]
    assert sorted({e["request_id"] for e in events}) == [AGG, DISAGG]
    assert sorted(e.get("leg", "-") for e in events if e["hop"] == "engine.stats") == ["-", "decode", "prefill"]
    assert b"SECRET" not in b"".join(ingested)


def test_analyze_by_replica_scopes_the_legs(tmp_path: Path):
    shutil.copy(TRACE, tmp_path / "request-trace.jsonl")
    frame, report = scan_events([tmp_path])
    assert report.bad_lines == 0, report.errors
    row = timelines(frame).filter(pl.col("request_id") == DISAGG).collect().row(0, named=True)
    assert row["replica"] == "7587888795263120003"  # the decode worker served the answer
