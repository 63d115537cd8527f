"""POST /v1/traces on a real collector: OTLP/HTTP protobuf (the SDK's own exporter) and JSON, gzip,
partial success, status codes; spans become hop events on the /v1/events path (stored, joined).

The spans are made with the OpenTelemetry SDK (1.45.2) the way vLLM 0.32.0's ``do_tracing`` makes
``llm_request`` (explicit start time, SERVER, ``gen_ai.*`` attributes) and openai-v2 2.4b0 makes
``chat {model}``, so the bytes on the wire are the SDK's.
"""

from __future__ import annotations

import base64
import gzip
import json

import pytest
from support.collector import serve, stored_lines
from google.protobuf import json_format
from google.rpc import status_pb2
from hopline.collector.config import CollectorConfig
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

T0 = 1_767_225_600_000_000_000
MS = 1_000_000
TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736
PROTOBUF = {"content-type": "application/x-protobuf"}


def vllm_like_spans(request_id: str = "chatcmpl-probe-123", ttft: float = 0.35) -> list:
    """An llm_request span (and a startup span vLLM also exports) in trace TRACE, in memory."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "vllm", "service.instance.id": "r1"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("vllm.llm_engine")
    parent = trace.set_span_in_context(
        NonRecordingSpan(SpanContext(TRACE, 0x00F067AA0BA902B7, is_remote=True, trace_flags=TraceFlags(1)))
    )
    tracer.start_span("Overall Loading", start_time=T0 - 9_000 * MS).end(end_time=T0 - 1_000 * MS)
    span = tracer.start_span("llm_request", context=parent, kind=SpanKind.SERVER, start_time=T0, attributes={
        "gen_ai.latency.time_to_first_token": ttft, "gen_ai.latency.e2e": 2.0,
        "gen_ai.latency.time_in_queue": 0.2, "gen_ai.latency.time_in_model_prefill": 0.1,
        "gen_ai.latency.time_in_model_decode": 1.6, "gen_ai.usage.prompt_tokens": 12,
        "gen_ai.usage.completion_tokens": 81, "gen_ai.request.id": request_id, "gen_ai.request.n": 1,
    })  # fmt: skip
    span.end(end_time=T0 + 2_010 * MS)
    provider.shutdown()
    return list(memory.get_finished_spans())


def as_otlp_json(spans) -> bytes:
    """OTLP/JSON as the spec writes it: proto3 JSON with hex trace and span IDs."""
    return as_otlp_json_message(encode_spans(spans))


def as_otlp_json_message(message) -> bytes:
    """An encoded ``ExportTraceServiceRequest`` as OTLP/JSON (hex trace and span IDs)."""
    obj = json_format.MessageToDict(message)
    for rs in obj["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for name in ("traceId", "spanId", "parentSpanId"):
                    if name in span:
                        span[name] = base64.b64decode(span[name]).hex()
    return json.dumps(obj).encode()


@pytest.fixture
def running(tmp_path):
    with serve(CollectorConfig(data_dir=tmp_path / "d", grace=0.0, token="s3cret")) as running:
        running.client.headers["Authorization"] = "Bearer s3cret"  # the read endpoints need it too
        yield running


AUTH = {"authorization": "Bearer s3cret"}


def spans_counted(running, outcome: str) -> float:
    return running.collector.registry.get_sample_value("hopline_otlp_spans_total", {"outcome": outcome}) or 0.0


def test_the_sdk_exporter_delivers_protobuf_gzip_and_the_span_joins(running, tmp_path):
    exporter = OTLPSpanExporter(endpoint=running.url + "/v1/traces", headers=AUTH, compression=Compression.Gzip)
    spans = vllm_like_spans()
    assert exporter.export(spans) == SpanExportResult.SUCCESS
    got = running.client.get("/v1/requests/probe-123").json()
    assert [h["hop"] for h in got["hops"]] == ["engine.received", "engine.first_token", "engine.last_token", "engine.stats"]
    assert {h["trace_id"] for h in got["hops"]} == {f"{TRACE:032x}"}
    assert (got["service"], got["replica"]) == ("vllm", "r1")
    assert got["stages"]["queue"] == pytest.approx(0.2) and got["stages"]["prefill"] == pytest.approx(0.1)
    assert got["stages"]["engine_e2e"] == pytest.approx(2.0, abs=1e-6)
    assert spans_counted(running, "mapped") == 1 and spans_counted(running, "ignored") == 1  # Overall Loading
    # stored durably, like /v1/events
    assert {e["hop"] for e in stored_lines(tmp_path / "d")} == {"engine.received", "engine.first_token", "engine.last_token", "engine.stats"}
    # an exporter's retry of the same batch is dropped as duplicates (event IDs from the span ID)
    assert exporter.export(spans) == SpanExportResult.SUCCESS
    assert len(running.client.get("/v1/requests/probe-123").json()["hops"]) == 4


def test_json_body_gets_a_json_answer(running):
    r = running.client.post("/v1/traces", content=as_otlp_json(vllm_like_spans("cmpl-json-1")),
                            headers={"content-type": "application/json", **AUTH})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    assert r.json() == {}  # full success: no partial_success
    assert running.client.get("/v1/requests/json-1").status_code == 200


def test_partial_success_names_the_spans_whose_events_were_rejected(running):
    # an infinite time to first token makes engine.first_token a non-finite time: not a valid event
    body = encode_spans(vllm_like_spans("chatcmpl-bad-1", ttft=float("inf"))).SerializeToString()
    r = running.client.post("/v1/traces", content=body, headers={**PROTOBUF, **AUTH})
    assert r.status_code == 200
    answer = ExportTraceServiceResponse.FromString(r.content)
    assert answer.partial_success.rejected_spans == 1
    assert "ts must be positive" in answer.partial_success.error_message
    # the span's valid events were kept
    assert "engine.stats" in [h["hop"] for h in running.client.get("/v1/requests/bad-1").json()["hops"]]
    assert spans_counted(running, "rejected") == 1


def test_spans_without_a_mapping_are_a_success_not_an_error(running):
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    provider.get_tracer("x").start_span("POST", kind=SpanKind.CLIENT).end()
    provider.shutdown()
    r = running.client.post("/v1/traces", content=encode_spans(memory.get_finished_spans()).SerializeToString(),
                            headers={**PROTOBUF, **AUTH})
    assert r.status_code == 200 and not ExportTraceServiceResponse.FromString(r.content).HasField("partial_success")
    assert spans_counted(running, "ignored") == 1
    empty = running.client.post("/v1/traces", content=b"", headers={**PROTOBUF, **AUTH})  # no spans at all
    assert empty.status_code == 200


@pytest.mark.parametrize(
    "headers,body,status,says",
    [
        ({**PROTOBUF, "authorization": "Bearer wrong"}, b"", 401, "bearer token"),
        ({"content-type": "text/plain", **AUTH}, b"x", 415, "unsupported content type"),
        ({**PROTOBUF, "content-encoding": "br", **AUTH}, b"x", 415, "content encoding"),
        ({**PROTOBUF, **AUTH}, b"\xff\xff\xff", 400, "not an OTLP"),
        ({**PROTOBUF, "content-encoding": "gzip", **AUTH}, b"not gzip", 400, "gzip"),
        ({"content-type": "application/json", **AUTH}, b"[1]", 400, "ExportTraceServiceRequest"),
    ],
)
def test_refusals_follow_otlp_http(running, headers, body, status, says):
    r = running.client.post("/v1/traces", content=body, headers=headers)
    assert r.status_code == status
    if headers.get("content-type") == "application/json":
        assert says in r.json()["message"]
    else:
        assert says in status_pb2.Status.FromString(r.content).message


def test_a_span_with_an_id_that_is_not_hex_is_rejected_alone(running):
    """Before (issue 24 item 10): the whole request got a 400. Now that span is rejected (partial success)."""
    body = b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}'
    r = running.client.post("/v1/traces", content=body, headers={"content-type": "application/json", **AUTH})
    assert r.status_code == 200
    assert r.json()["partialSuccess"]["rejectedSpans"] == "1"  # proto3 JSON writes int64 as a string
    assert "traceId 'zz' is not hex" in r.json()["partialSuccess"]["errorMessage"]


def test_body_limits_are_those_of_v1_events(tmp_path):
    with serve(CollectorConfig(data_dir=tmp_path / "d", max_body=1000, max_decompressed_bytes=5000)) as running:
        big = encode_spans(vllm_like_spans() * 20).SerializeToString()
        assert len(big) > 1000
        assert running.client.post("/v1/traces", content=big, headers=PROTOBUF).status_code == 413
        bomb = gzip.compress(b"\0" * 10_000)
        r = running.client.post("/v1/traces", content=bomb, headers={**PROTOBUF, "content-encoding": "gzip"})
        assert r.status_code == 413
