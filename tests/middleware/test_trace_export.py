"""OTLP out (middleware/contract/trace_export.py), through ``hopline analyze --otlp`` and the collector's
``--otlp-export``: the SDK's exporter posts to a real HTTP receiver on 127.0.0.1, which decodes the
bodies with opentelemetry-proto. One trace per finished request (the request's own when its trace
ID is known), a root with one child per stage, and the children's durations equal the stages.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections import defaultdict
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hopline.middleware.contract import compute_stages, dumps, validate_event
from hopline.middleware.contract.rules import STAGE_ORDER, describe_request, group_requests
from hopline.middleware.contract.trace_export import ROOT_NAME
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from support.golden import GOLDEN  # noqa: E402
CASES = {c["name"]: c for c in GOLDEN["cases"]}
# streaming and not, with and without a trace ID, an unplaced stand-in, an incomplete request
USED = ["complete_streaming", "non_streaming", "hosted_api", "otel_only_trace_join", "mixed_sources_trace_join",
        "agent_three_calls_one_trace", "never_finished"]  # fmt: skip
TOL = 2e-6


class Receiver(ThreadingHTTPServer):
    """POST /v1/traces -> decoded ExportTraceServiceRequests in ``self.requests``."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self.lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(handler) -> None:
                body = handler.rfile.read(int(handler.headers["content-length"]))
                message = ExportTraceServiceRequest.FromString(body)
                with self.lock:
                    self.requests.append(message)
                answer = ExportTraceServiceResponse().SerializeToString()
                handler.send_response(200 if handler.path == "/v1/traces" else 404)
                handler.send_header("content-type", "application/x-protobuf")
                handler.send_header("content-length", str(len(answer)))
                handler.end_headers()
                handler.wfile.write(answer)

            def log_message(handler, *args) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1/traces"

    def spans(self) -> list:
        with self.lock:
            return [s for m in self.requests for rs in m.resource_spans for ss in rs.scope_spans for s in ss.spans]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def expected_requests() -> dict[str, dict]:
    """Finished requests of the used cases: request ID -> (stages, trace ID), by the contract."""
    out = {}
    for name in USED:
        for rid, events in group_requests(validate_event(e) for e in CASES[name]["events"]).items():
            stages = compute_stages(events)
            if describe_request(events)["outcome"] == "incomplete" or all(
                stages[v] is None for v in ("client_e2e", "gateway_e2e", "engine_e2e")
            ):
                continue  # not finished, or no view of its length (a call that failed before any answer)
            traces = {e["trace_id"] for e in events if e.get("trace_id")}
            out[rid] = {"stages": stages, "trace_id": traces.pop() if traces else None}
    return out


def check_traces(spans, want: dict[str, dict]) -> None:
    by_parent = defaultdict(list)
    for span in spans:
        by_parent[span.trace_id, span.parent_span_id].append(span)
    roots = [s for s in spans if s.name == ROOT_NAME]
    assert len(roots) == len(want) and len(spans) == len(roots) + sum(len(v) for k, v in by_parent.items() if k[1])
    # each request in one trace: its own when known (an agent's calls share the agent's), else a new one
    fresh = [r.trace_id for r in roots if want[_rid(r)]["trace_id"] is None]
    assert len(set(fresh)) == len(fresh) and not set(fresh) & {r.trace_id for r in roots if want[_rid(r)]["trace_id"]}
    for root in roots:
        attrs = {kv.key: kv.value for kv in root.attributes}
        rid = attrs["hopline.request_id"].string_value
        stages, trace_id = want[rid]["stages"], want[rid]["trace_id"]
        if trace_id is not None:
            assert root.trace_id.hex() == trace_id, rid  # the request's own trace
        assert root.parent_span_id == b""
        children = by_parent[root.trace_id, root.span_id]
        got = {}
        for child in children:
            stage = {kv.key: kv.value for kv in child.attributes}["hopline.stage"].string_value
            got[stage] = (child.end_time_unix_nano - child.start_time_unix_nano) / 1e9
        assert set(got) == {n for n in STAGE_ORDER if stages[n] is not None}, rid
        for name, seconds in got.items():
            assert seconds == pytest.approx(max(0.0, stages[name]), abs=TOL), (rid, name)
        e2e = next(stages[v] for v in ("client_e2e", "gateway_e2e", "engine_e2e") if stages[v] is not None)
        assert (root.end_time_unix_nano - root.start_time_unix_nano) / 1e9 >= e2e - TOL
        if stages.get("output_tokens") is not None:
            assert attrs["gen_ai.usage.output_tokens"].int_value == stages["output_tokens"]
        if stages.get("model") is not None:
            assert attrs["gen_ai.request.model"].string_value


def _rid(root) -> str:
    return next(kv.value.string_value for kv in root.attributes if kv.key == "hopline.request_id")


def test_analyze_otlp_sends_one_trace_per_finished_request(receiver, tmp_path):
    path = tmp_path / "events.ndjson"
    path.write_bytes(b"".join(dumps(e) for name in USED for e in CASES[name]["events"]))
    run = subprocess.run([sys.executable, "-m", "hopline.middleware.cli", "analyze", str(path), "--json",
                          "--otlp", receiver.url], capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    want = expected_requests()
    assert f"{len(want)} request(s) sent as traces" in run.stderr
    assert json.loads(run.stdout)["requests"] == len(want) + 2  # + the one that never finished, the failed call
    check_traces(receiver.spans(), want)
    gold = next(s for s in receiver.spans() if s.name == ROOT_NAME and any(
        kv.key == "hopline.request_id" and kv.value.string_value == "gold-complete" for kv in s.attributes))
    attrs = {kv.key: kv.value for kv in gold.attributes}
    assert attrs["gen_ai.request.model"].string_value == "m"
    assert attrs["gen_ai.usage.input_tokens"].int_value == 6000 and attrs["gen_ai.usage.output_tokens"].int_value == 401
    assert [v.string_value for v in attrs["gen_ai.response.finish_reasons"].array_value.values] == ["stop"]


def test_collector_otlp_export_sends_each_finished_request(receiver, tmp_path):
    from hopline.collector.app import build_collector
    from hopline.collector.config import CollectorConfig

    c = build_collector(CollectorConfig(data_dir=tmp_path / "d", grace=30.0, otlp_export=receiver.url))
    c.joiner.add([validate_event(e) for name in USED for e in CASES[name]["events"]])
    c.joiner.finish_all()  # as at shutdown: every complete request is finished (and exported) now
    c.joiner.on_finish.exporter.close()  # flush the batch processor
    check_traces(receiver.spans(), expected_requests())
