"""Engines' per-request records as hop events (middleware/contract/records.py): SGLang's metrics export and
TensorRT-LLM's ``/perf_metrics``, read by ``hopline analyze`` (analyzer/io.py) and the collector's
``--tail`` (collector/tail.py).

Formats from their code: sglang 0.5.23 (the wheel: request_metrics_exporter.py,
tokenizer_manager.py, req_time_stats.py) and TensorRT-LLM main @ e7f7345e31e5
(tensorrt_llm/serve/openai_server.py); see fixtures/README.md.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import orjson
import polars as pl
import pytest
from fastapi import FastAPI
from hopline.analyzer.io import scan_events
from hopline.analyzer.timelines import timelines
from hopline.collector.tail import Tailer
from hopline.middleware.contract import compute_stages, iter_ndjson, validate_event
from hopline.middleware.contract.records import (
    SGLANG,
    TRTLLM,
    RecordError,
    record_events,
    translate_lines,
)
from hopline.middleware.trtllm_poll import poll_trtllm
from litellm_testing import FIXTURES, helpers

SGLANG_LOG = FIXTURES / "sglang-0.5.23-request-metrics.log"
TRTLLM_RECORDS = FIXTURES / "tensorrt-llm-perf-metrics.ndjson"
# times near 1.7e9 s: compared within 2e-6 s (float64 spacing there is 2.4e-7 s), as in the golden fixture
T0 = 1767225600.0


def events_from(data: bytes) -> list[dict]:
    translated, errors = translate_lines(data)
    assert errors == []
    parsed = list(iter_ndjson(translated))
    assert [e for _, _, e in parsed if e] == []
    return [event for _, event, _ in parsed]


def test_sglang_record_becomes_engine_hops_and_stats():
    first = orjson.loads(SGLANG_LOG.read_bytes().splitlines()[0])
    events = {e["hop"]: e for e in record_events(first, SGLANG)}
    assert {h: e["ts"] - T0 for h, e in events.items()} == pytest.approx(
        {
            "engine.received": 0.0,  # request_received_ts
            "engine.scheduled": 0.054,  # forward_entry_time (the scheduler's first forward)
            "engine.first_token": 0.26,  # request_received_ts + first_token_latency
            "engine.last_token": 1.76,  # request_received_ts + e2e_latency
            "engine.stats": 1.76,
        },
        abs=1e-6,
    )
    stats = events["engine.stats"]
    # queue_time; prefill_finished_time - forward_entry_time; e2e_latency - first_token_latency
    assert (stats["queue_s"], stats["prefill_s"], stats["decode_s"]) == pytest.approx(
        (0.048, 0.2, 1.5), abs=1e-6
    )
    assert (stats["prompt_tokens"], stats["output_tokens"], stats["cached_tokens"]) == (812, 76, 512)
    assert {e["request_id"] for e in events.values()} == {"caller-rid-1"}  # the rid the caller sent
    assert (events["engine.received"]["stream"], events["engine.received"]["max_tokens"]) == (True, 128)
    assert events["engine.last_token"]["finish_reason"] == "stop"  # the type only: `matched` may be text


def test_sglang_export_never_leaks_the_prompt_or_stop_text():
    translated, _ = translate_lines(SGLANG_LOG.read_bytes())
    assert b"SECRET" not in translated and b"request_parameters" not in translated


def test_sglang_stages_through_the_contract():
    events = [e for e in events_from(SGLANG_LOG.read_bytes()) if e["request_id"] == "caller-rid-1"]
    stages = compute_stages(events)
    assert (stages["engine_ttft"], stages["queue"], stages["prefill"]) == pytest.approx(
        (0.26, 0.048, 0.2), abs=2e-6
    )
    assert stages["frontend"] == pytest.approx(0.012, abs=2e-6)  # 0.26 - 0.048 - 0.2: tokenizing, dispatch
    assert stages["decode"] == pytest.approx(1.5, abs=2e-6) and stages["engine_itl"] == pytest.approx(
        0.02, abs=1e-7
    )


def test_sglang_record_without_scheduler_times_keeps_what_it_has():
    second = orjson.loads(SGLANG_LOG.read_bytes().splitlines()[1])
    events = {e["hop"]: e for e in record_events(second, SGLANG)}
    assert set(events) == {"engine.received", "engine.first_token", "engine.last_token", "engine.stats"}
    assert "queue_s" not in events["engine.stats"] and events["engine.stats"]["decode_s"] == pytest.approx(
        0.3
    )
    assert events["engine.received"]["stream"] is False


def test_analyze_joins_the_sglang_export_with_the_callers_hops(tmp_path: Path):
    shutil.copy(SGLANG_LOG, tmp_path / "sglang-request-metrics-20260101_00.log")  # the exporter's own name
    client = [
        {
            "ts": T0 - 0.03,
            "request_id": "caller-rid-1",
            "hop": "client.sent",
            "stream": True,
            "conn_reused": True,
        },
        {"ts": T0 + 0.28, "request_id": "caller-rid-1", "hop": "client.first_token"},
        {"ts": T0 + 1.78, "request_id": "caller-rid-1", "hop": "client.last_token", "output_tokens": 76},
    ]
    (tmp_path / "client.ndjson").write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in client))
    frame, report = scan_events([tmp_path])
    assert report.bad_lines == 0, report.errors
    row = timelines(frame).filter(pl.col("request_id") == "caller-rid-1").collect().row(0, named=True)
    assert (row["client_ttft"], row["queue"], row["prefill"], row["frontend"]) == pytest.approx(
        (0.31, 0.048, 0.2, 0.012), abs=2e-6
    )
    assert row["network"] == pytest.approx(0.05, abs=2e-6)  # 0.31 - 0 (reused) - 0.26
    assert row["outcome"] == "ok"


def test_tail_feeds_records_to_the_collector_as_hop_events(tmp_path: Path):
    log = tmp_path / "sglang-request-metrics-20260101_00.log"
    shutil.copy(SGLANG_LOG, log)
    ingested: list[bytes] = []

    async def ingest(data: bytes) -> None:
        ingested.append(data)

    tailer = Tailer((str(tmp_path / "sglang-*.log"),), tmp_path / "tail-state.json", ingest, tail_interval=0.5)
    assert asyncio.run(tailer.poll()) == log.stat().st_size
    events = [validate_event(orjson.loads(line)) for chunk in ingested for line in chunk.splitlines()]
    assert sorted({e["request_id"] for e in events}) == ["9f2c1d7e4b5a4c3d8e6f7a8b9c0d1e2f", "caller-rid-1"]
    assert sum(e["hop"] == "engine.stats" for e in events) == 2


def test_trtllm_record_with_the_pollers_clock_offset():
    record = orjson.loads(TRTLLM_RECORDS.read_bytes())
    events = {e["hop"]: e for e in record_events(record, TRTLLM)}
    # steady clock + offset = wall clock; the fixture's server_arrival_time is T0 + 20 s
    assert {h: e["ts"] - T0 - 20 for h, e in events.items()} == pytest.approx(
        {
            "engine.received": 0.0,  # server_arrival_time (the HTTP server's middleware)
            "engine.scheduled": 0.083,  # first_scheduled_time
            "engine.first_token": 0.386,  # server_first_token_time
            "engine.last_token": 1.883,  # last_token_time
            "engine.stats": 1.883,
        },
        abs=1e-6,
    )
    stats = events["engine.stats"]
    # perf_utils: queue = first_scheduled - arrival; prefill = first_token - first_scheduled
    assert (stats["queue_s"], stats["prefill_s"], stats["decode_s"]) == pytest.approx(
        (0.08, 0.3, 1.5), abs=1e-6
    )
    assert (
        stats["kv_blocks_allocated"],
        stats["kv_blocks_new"],
        stats["kv_blocks_reused"],
        stats["kv_blocks_missed"],
    ) == (40, 8, 32, 0)
    assert {e["request_id"] for e in events.values()} == {"17"}  # = a streamed response's chatcmpl-17
    validate_event(stats)


def test_trtllm_record_without_offset_is_refused_with_the_reason():
    record = orjson.loads(TRTLLM_RECORDS.read_bytes())
    del record["hopline_clock_offset_s"]
    with pytest.raises(RecordError, match="no hopline_clock_offset_s .* monotonic clock"):
        record_events(record, TRTLLM)
    translated, errors = translate_lines(orjson.dumps(record) + b"\n" + b'{"ts": 1.0}')
    assert translated == b'{"ts": 1.0}' and errors == [
        (
            "line 1: tensorrt-llm record 17: no hopline_clock_offset_s (its times are a monotonic clock; "
            "save records with `hopline poll-trtllm`)"
        )
    ]


def test_a_broken_record_is_reported_by_analyze_and_the_rest_kept(tmp_path: Path):
    bad = orjson.loads(SGLANG_LOG.read_bytes().splitlines()[0])
    bad["e2e_latency"] = "soon"
    (tmp_path / "records.ndjson").write_bytes(
        orjson.dumps(bad) + b"\n" + SGLANG_LOG.read_bytes().splitlines()[1] + b"\n"
    )
    frame, report = scan_events([tmp_path])
    assert (
        report.bad_lines == 1
        and "sglang record: e2e_latency must be a number, got 'soon'" in report.errors[0]
    )
    assert frame.select(pl.col("request_id").n_unique()).collect().item() == 1


def test_poll_trtllm_saves_drained_records_with_the_offset(tmp_path: Path):
    app = FastAPI()
    pending: list[list] = [[], []]

    @app.get("/perf_metrics")
    async def perf_metrics() -> list:
        return pending.pop(0) if pending else []  # drained on read, as trtllm-serve does

    record = orjson.loads(TRTLLM_RECORDS.read_bytes())
    del record["hopline_clock_offset_s"]
    pending[0] = [dict(record, request_id=i) for i in (1, 2)]
    out = tmp_path / "trtllm.ndjson"
    with helpers.running_server(app) as url:
        assert poll_trtllm(url, str(out), interval_s=0.01, rounds=2) == 2
    saved = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    # this host's wall clock minus its monotonic clock (= TensorRT-LLM's steady clock here)
    assert [r["hopline_clock_offset_s"] for r in saved] == pytest.approx(
        [time.time() - time.monotonic()] * 2, abs=0.5
    )
    events = events_from(out.read_bytes())
    assert sorted({e["request_id"] for e in events}) == ["1", "2"]
