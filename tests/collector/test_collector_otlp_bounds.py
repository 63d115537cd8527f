"""OTLP requests an operator meets on a bad day (issue 24 items 9 and 10): one very large request, and
one span nobody can use among good ones.

Before: a 100,000-span ``POST /v1/traces`` was decoded in one protobuf call (holding the GIL) and
mapped on the event loop, so ``/healthz`` waited about a second; and one span with an attribute
nested 32 levels deep made the whole request a 400 (the protobuf decoder's recursion limit), so
the valid spans sent with it were lost.
"""

from __future__ import annotations

import gzip
import threading
import time

import pytest
from google.protobuf import json_format
from google.rpc import status_pb2
from hopline.collector.config import CollectorConfig
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from soak import percentile
from support.collector import serve, stored_lines
from test_collector_otlp import PROTOBUF, as_otlp_json, as_otlp_json_message, vllm_like_spans

DEEP = 32


def request_of(n: int, prefix: str = "big"):
    """An ExportTraceServiceRequest of ``n`` vLLM ``llm_request`` spans, request IDs ``{prefix}-{i}``."""
    message = encode_spans(vllm_like_spans())
    scope = message.resource_spans[0].scope_spans[0]
    template = next(s for s in scope.spans if s.name == "llm_request")
    del scope.spans[:]
    for i in range(n):
        span = scope.spans.add()
        span.CopyFrom(template)
        span.span_id = (i + 1).to_bytes(8, "big")
        next(kv for kv in span.attributes if kv.key == "gen_ai.request.id").value.string_value = (
            f"chatcmpl-{prefix}-{i}"
        )
    return message


def nest(value: AnyValue, levels: int) -> None:
    """``value`` becomes a key-value list nested ``levels`` deep."""
    for _ in range(levels):
        value = value.kvlist_value.values.add(key="down").value
    value.string_value = "bottom"


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
def test_a_deep_attribute_rejects_its_span_only_and_the_valid_spans_are_stored(tmp_path, encoding):
    message = request_of(4, prefix=f"deep-{encoding}")
    deep = message.resource_spans[0].scope_spans[0].spans[1]
    nest(deep.attributes.add(key="payload").value, DEEP)
    if encoding == "protobuf":
        body, headers = message.SerializeToString(), PROTOBUF
    else:
        body, headers = as_otlp_json_message(message), {"content-type": "application/json"}
    with serve(CollectorConfig(data_dir=tmp_path / "d", grace=0.0)) as c:
        r = c.client.post("/v1/traces", content=body, headers=headers)
        assert r.status_code == 200, r.content
        answer = answer_of(r)
        assert answer.partial_success.rejected_spans == 1
        assert "nested deeper than 8 levels" in answer.partial_success.error_message
        stored = {e["request_id"] for e in stored_lines(tmp_path / "d")}
    # spans 0, 2 and 3 are stored (4 engine hops each), span 1 is not
    assert stored == {f"deep-{encoding}-{i}" for i in (0, 2, 3)}


def answer_of(r) -> ExportTraceServiceResponse:
    if r.headers["content-type"].startswith("application/json"):
        return json_format.Parse(r.content, ExportTraceServiceResponse())
    return ExportTraceServiceResponse.FromString(r.content)


def test_more_spans_than_otlp_max_spans_is_a_413_with_an_otlp_error(tmp_path):
    with serve(CollectorConfig(data_dir=tmp_path / "d", otlp_max_spans=10)) as c:
        assert c.client.post("/v1/traces", content=request_of(10).SerializeToString(), headers=PROTOBUF).status_code == 200
        r = c.client.post("/v1/traces", content=request_of(11).SerializeToString(), headers=PROTOBUF)
        assert r.status_code == 413
        status = status_pb2.Status.FromString(r.content)
        assert status.code == 413 and "more than 10 spans (--otlp-max-spans)" in status.message
        # as JSON, a JSON google.rpc.Status
        r = c.client.post("/v1/traces", content=as_otlp_json(vllm_like_spans() * 6),
                          headers={"content-type": "application/json"})  # fmt: skip
        assert r.status_code == 413 and "--otlp-max-spans" in r.json()["message"]


def test_healthz_answers_while_a_100k_span_request_is_processed(tmp_path):
    """The 100,000-span request is accepted in full, and a /healthz prober running alongside gets
    answers all through it: no gap between answers as long as a quarter of the request's time
    (before: the mapping ran on the event loop, one gap nearly as long as the whole request)."""
    body = gzip.compress(request_of(100_000).SerializeToString())
    with serve(CollectorConfig(data_dir=tmp_path / "d", fsync="none")) as c:
        answers: list[tuple[float, float, int]] = []  # (sent, answered, status), monotonic seconds
        stop = threading.Event()

        def probe() -> None:
            while not stop.is_set():
                sent = time.monotonic()
                status = c.client.get("/healthz").status_code
                answers.append((sent, time.monotonic(), status))
                time.sleep(0.02)

        prober = threading.Thread(target=probe, daemon=True)
        prober.start()
        time.sleep(0.3)
        started = time.monotonic()
        import httpx

        r = httpx.post(c.url + "/v1/traces", content=body, timeout=600,
                       headers={**PROTOBUF, "content-encoding": "gzip"})  # fmt: skip
        ended = time.monotonic()
        stop.set()
        prober.join(timeout=30)
        assert r.status_code == 200, r.content
        assert not ExportTraceServiceResponse.FromString(r.content).HasField("partial_success")
        assert c.client.get("/v1/requests/big-99999").status_code == 200  # the last span was joined
    during = [a for a in answers if started <= a[0] and a[1] <= ended]
    assert {status for _, _, status in during} == {200}
    times = [started] + [answered for _, answered, _ in during] + [ended]
    largest_gap = max(b - a for a, b in zip(times, times[1:]))
    latencies = [answered - sent for sent, answered, _ in during]
    print(f"100k spans: {ended - started:.1f} s, {len(during)} /healthz answers during it, largest gap "
          f"{largest_gap * 1e3:.0f} ms, p99 {percentile(latencies, 0.99) * 1e3:.0f} ms")  # fmt: skip
    assert len(during) >= 10
    assert largest_gap < (ended - started) / 4
