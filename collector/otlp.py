"""``POST /v1/traces``: an OTLP/HTTP trace receiver whose spans become hop events.

Decoding is the maintained ``opentelemetry-proto`` package's (protobuf, or OTLP/JSON through
protobuf's ``json_format`` after the spec's hex trace and span IDs are turned into the base64
that proto3 JSON expects). Each span goes through the span mapping (``middleware/contract/spans.py``);
the events it yields take the very path of ``POST /v1/events`` (validate, dedup, durable store,
join), with the same bearer token, body limits and gzip rules.

Answers follow the OTLP/HTTP specification: 200 with an ``ExportTraceServiceResponse`` (in the
request's encoding) on success, its ``partial_success`` counting the rejected spans (a span that
does not decode, is larger than ``MAX_SPAN_BYTES``, has an attribute nested deeper than
``MAX_ATTRIBUTE_DEPTH``, or whose events are invalid: the other spans are kept); 400 for a body
whose framing does not decode (not retryable), 401, 413 (bytes, or more than ``--otlp-max-spans``
spans), 415, and 503 with ``Retry-After`` when the store fails (retryable: the slices stored before
the failure are dropped as duplicates on the retry).

Nothing of a large request runs on the event loop but the join: the body is split into its spans
without decoding them (the protobuf wire format, walked two levels deep: decoding 100,000 spans in
one call holds the GIL for hundreds of milliseconds), then each slice of ``SLICE`` spans is decoded
and mapped on the parse thread and stored and joined before the next. Error
bodies are a ``google.rpc.Status``. Spans hopline does not understand (startup spans, HTTP
spans, other libraries) are counted in ``hopline_otlp_spans_total{outcome="ignored"}`` and
dropped: never an error, since exporters send everything their process traces.
"""

from __future__ import annotations

import asyncio

import base64
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from google.rpc import status_pb2
from hopline.middleware.contract.errors import HoplineError
from hopline.collector.config import CollectorConfig
from hopline.collector.ingest import JSON_TYPES, IngestError, gunzip, media_type, read_body, unauthorized
from hopline.collector.store import StoreError
from hopline.middleware.log import logger
from hopline.middleware.contract.spans import resource_scope, span_events
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from prometheus_client import CollectorRegistry, Counter

if TYPE_CHECKING:
    from hopline.collector.app import Collector
    from hopline.collector.ingest import Ingestor

PROTOBUF = "application/x-protobuf"
_KIND_PREFIX = len("SPAN_KIND_")
_ID_FIELDS = ("traceId", "spanId", "parentSpanId")
SPAN_OUTCOMES = ("mapped", "ignored", "rejected")


MAX_ATTRIBUTE_DEPTH = 8  # nested arrays / key-value lists in one attribute value; deeper: span rejected
MAX_SPAN_BYTES = 64 * 1024  # one span, encoded; larger: rejected (hop events hold a few numbers)
SLICE = 2_000  # spans decoded and mapped per job on the parse thread (~10-50 ms), then stored and joined


class OtlpError(HoplineError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class SpanError(HoplineError, ValueError):
    """One span cannot be taken (too deep, too large, does not decode): it alone is rejected."""


def _value(any_value: Any, depth: int = 0) -> Any:
    """An OTLP ``AnyValue`` as a plain Python value; ``SpanError`` past ``MAX_ATTRIBUTE_DEPTH``."""
    which = any_value.WhichOneof("value")
    if which is None:
        return None
    if which in ("array_value", "kvlist_value") and depth >= MAX_ATTRIBUTE_DEPTH:
        raise SpanError(f"an attribute is nested deeper than {MAX_ATTRIBUTE_DEPTH} levels")
    if which == "array_value":
        return [_value(v, depth + 1) for v in any_value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _value(kv.value, depth + 1) for kv in any_value.kvlist_value.values}
    return getattr(any_value, which)


def attributes(kvs: Sequence[Any]) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


def plain_span(span: Span) -> dict[str, Any]:
    """A protobuf span in the form ``spans.span_events`` reads."""
    return {
        "name": span.name,
        "kind": Span.SpanKind.Name(span.kind)[_KIND_PREFIX:],
        "trace_id": span.trace_id.hex(),
        "span_id": span.span_id.hex(),
        "parent_span_id": span.parent_span_id.hex(),
        "start": span.start_time_unix_nano,
        "end": span.end_time_unix_nano,
        "attributes": attributes(span.attributes),
        "events": [(e.name, e.time_unix_nano) for e in span.events],
        "status": "ERROR" if span.status.code == Status.STATUS_CODE_ERROR else "OK",
    }


def _hex_ids_to_base64(span: dict[str, Any]) -> None:
    """OTLP/JSON writes trace and span IDs as hex; proto3 JSON reads bytes as base64."""
    for items in (span, *(span.get("links") or ())):
        if not isinstance(items, dict):
            continue
        for name in _ID_FIELDS:
            value = items.get(name)
            if isinstance(value, str) and value:
                try:
                    items[name] = base64.b64encode(bytes.fromhex(value)).decode()
                except ValueError:
                    raise SpanError(f"{name} {value[:40]!r} is not hex") from None


# -- splitting a request into its spans, undecoded (the protobuf wire format, two levels deep) ------


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise OtlpError(400, "body is not an OTLP ExportTraceServiceRequest: truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _fields(buf: bytes, start: int, end: int) -> Iterator[tuple[int, int, int]]:
    """(field number, start, end) of each length-delimited field in ``buf[start:end]``; other wire
    types are skipped. ``OtlpError(400)`` on a malformed message."""
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = _varint(buf, pos)
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        elif wire == 2:
            size, pos = _varint(buf, pos)
            if pos + size > end:
                raise OtlpError(400, "body is not an OTLP ExportTraceServiceRequest: a field runs past its end")
            yield number, pos, pos + size
            pos += size
        else:
            raise OtlpError(400, f"body is not an OTLP ExportTraceServiceRequest: wire type {wire}")
    if pos != end:
        raise OtlpError(400, "body is not an OTLP ExportTraceServiceRequest: a field runs past its end")


class Spans:
    """A request split into resources and undecoded spans: protobuf bytes, or OTLP/JSON objects."""

    def __init__(self, json: bool) -> None:
        self.json = json
        self.resources: list[dict[str, Any]] = []  # resource attributes, one per ResourceSpans
        self.items: list[tuple[int, Any]] = []  # (resource index, encoded span)

    def add(self, resource: int, span: Any, max_spans: int) -> None:
        if len(self.items) >= max_spans:
            raise OtlpError(413, f"request has more than {max_spans} spans (--otlp-max-spans): send smaller batches")
        self.items.append((resource, span))

    def decode(self, index: int) -> Span:
        """The span at ``index``; ``SpanError`` when it does not decode or is too large."""
        raw = self.items[index][1]
        try:
            if self.json:
                if not isinstance(raw, dict):
                    raise SpanError("a span is not a JSON object")
                _hex_ids_to_base64(raw)
                span = json_format.ParseDict(raw, Span(), ignore_unknown_fields=True)
            else:
                span = Span.FromString(raw)
        except (json_format.ParseError, DecodeError, RecursionError, ValueError, TypeError) as exc:
            if isinstance(exc, SpanError):
                raise
            raise SpanError(f"a span does not decode: {str(exc)[:200]}") from None
        if span.ByteSize() > MAX_SPAN_BYTES:
            raise SpanError(f"a span is larger than {MAX_SPAN_BYTES} bytes")
        return span


def _resource(message_bytes: bytes | None, obj: Any) -> dict[str, Any]:
    """A ``Resource``'s attributes (protobuf bytes or an OTLP/JSON object); ``{}`` when they are unusable."""
    try:
        if obj is not None:
            resource = json_format.ParseDict(obj, Resource(), ignore_unknown_fields=True)
        else:
            resource = Resource.FromString(message_bytes or b"")
        return attributes(resource.attributes)
    except (json_format.ParseError, DecodeError, RecursionError, ValueError, TypeError):
        return {}


def split_protobuf(body: bytes, max_spans: int) -> Spans:
    """ExportTraceServiceRequest (1: resource_spans) > ResourceSpans (1: resource, 2: scope_spans) >
    ScopeSpans (2: spans): the spans' bytes, without decoding them (a 100,000-span request decoded
    at once holds the GIL, and so the event loop, for hundreds of milliseconds)."""
    out = Spans(json=False)
    for number, start, end in _fields(body, 0, len(body)):
        if number != 1:
            continue
        resource, scopes = b"", []
        for n, s, e in _fields(body, start, end):
            if n == 1:
                resource = body[s:e]
            elif n == 2:
                scopes.append((s, e))
        out.resources.append(_resource(resource, None))
        for s, e in scopes:
            for n, span_start, span_end in _fields(body, s, e):
                if n == 2:
                    out.add(len(out.resources) - 1, body[span_start:span_end], max_spans)
    return out


def split_json(body: bytes, max_spans: int) -> Spans:
    """The same for OTLP/JSON (``resourceSpans`` > ``scopeSpans`` > ``spans``)."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise OtlpError(400, f"body is not an OTLP ExportTraceServiceRequest: {str(exc)[:200]}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("resourceSpans", []), list):
        raise OtlpError(400, "OTLP/JSON body must be an ExportTraceServiceRequest object")
    out = Spans(json=True)
    for rs in obj.get("resourceSpans") or ():
        if not isinstance(rs, dict):
            raise OtlpError(400, "OTLP/JSON body: resourceSpans holds a non-object")
        out.resources.append(_resource(None, rs.get("resource") or {}))
        for ss in rs.get("scopeSpans") or ():
            for span in (ss.get("spans") or ()) if isinstance(ss, dict) else ():
                out.add(len(out.resources) - 1, span, max_spans)
    return out


def decode(body: bytes, json: bool, max_spans: int = 10**9) -> Spans:
    """A request's spans, undecoded; ``OtlpError`` 400 when the request does not decode, 413 above
    ``max_spans``."""
    return split_json(body, max_spans) if json else split_protobuf(body, max_spans)


@dataclass
class Mapped:
    """One slice of spans as hop events: ``owner[i]``: the span ``events[i]`` came from."""

    events: list[dict[str, Any]] = field(default_factory=list)
    owner: list[int] = field(default_factory=list)
    mapped: int = 0
    ignored: int = 0
    rejected: list[str] = field(default_factory=list)  # why, one per rejected span


def map_slice(spans: Spans, start: int, stop: int, resource_map: Mapping[str, Sequence[str]]) -> Mapped:
    """Decode and map spans ``[start, stop)`` (on the parse thread)."""
    out = Mapped()
    scopes: dict[int, dict[str, str]] = {}
    for number in range(start, min(stop, len(spans.items))):
        resource = spans.items[number][0]
        scope = scopes.get(resource)
        if scope is None:
            scope = scopes[resource] = resource_scope(spans.resources[resource], resource_map)
        try:
            source, made = span_events(plain_span(spans.decode(number)), scope)
        except SpanError as exc:
            out.rejected.append(str(exc))
            continue
        if source is None or not made:
            out.ignored += 1
            continue
        out.mapped += 1
        out.events += made
        out.owner += [number] * len(made)
    return out


class OtlpReceiver:
    """Spans -> hop events -> the collector's ingest path; counts what it mapped, ignored, rejected."""

    def __init__(
        self, ingestor: Ingestor, registry: CollectorRegistry, *, otlp_resource: Mapping[str, Sequence[str]]
    ) -> None:
        self.ingestor = ingestor
        self.resource_map = dict(otlp_resource)
        self.spans = Counter(
            "hopline_otlp_spans", "OTLP spans received, by outcome (ignored: no mapping row)", ["outcome"],
            registry=registry,
        )  # fmt: skip

    @classmethod
    def from_config(
        cls, config: CollectorConfig, ingestor: Ingestor, registry: CollectorRegistry
    ) -> OtlpReceiver:
        return cls(ingestor, registry, otlp_resource=config.otlp_resource)

    async def export(self, spans: Spans) -> tuple[int, str]:
        """Map, store and join the spans in slices, each decoded and mapped on the parse thread;
        returns (rejected spans, error message) for partial success."""
        loop = asyncio.get_running_loop()
        rejected, why = 0, ""
        for start in range(0, len(spans.items), SLICE):
            part = await loop.run_in_executor(
                self.ingestor.parser, map_slice, spans, start, start + SLICE, self.resource_map
            )
            bad, error = await self._ingest(part)
            rejected += bad
            why = why or error
        return rejected, why

    async def _ingest(self, part: Mapped) -> tuple[int, str]:
        """One slice's events through the ingest path; (rejected spans, the first reason)."""
        if part.ignored:
            self.spans.labels("ignored").inc(part.ignored)
        bad, why = len(part.rejected), (f"span rejected: {part.rejected[0]}" if part.rejected else "")
        if part.events:
            try:
                result = await self.ingestor.ingest(orjson.dumps(part.events), "json")
            except IngestError as exc:  # every event was invalid: every mapped span is rejected
                self.spans.labels("rejected").inc(part.mapped + bad)
                return part.mapped + bad, why or f"{part.mapped} span(s) made no valid hop event: {exc}"
            # the spans of the listed rejected events, plus (past the listing cap) one per unlisted event
            invalid = len({part.owner[item["line"] - 1] for item in result.rejected})
            invalid = min(part.mapped, invalid + result.rejected_count - len(result.rejected))
            self.spans.labels("mapped").inc(part.mapped - invalid)
            if invalid:
                bad += invalid
                why = why or f"{invalid} span(s) made invalid hop events, e.g. {result.rejected[0]['error']}"
        if bad:
            self.spans.labels("rejected").inc(bad)
        return bad, why


def _answer(message: Any, json: bool, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    if json:
        body = json_format.MessageToJson(message, indent=None).encode()
        return Response(body, status_code=status, media_type="application/json", headers=headers)
    return Response(message.SerializeToString(), status_code=status, media_type=PROTOBUF, headers=headers)


def _failure(status: int, text: str, json: bool) -> Response:
    """An OTLP/HTTP error: a ``google.rpc.Status`` body, Retry-After on 503, WWW-Authenticate on 401."""
    headers = {"Retry-After": "1"} if status == 503 else {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return _answer(status_pb2.Status(code=status, message=text), json, status, headers)


router = APIRouter()


@router.post("/v1/traces")
async def post_traces(request: Request) -> Response:
    """OTLP/HTTP spans (protobuf or JSON) -> hop events on the ingest path; an OTLP answer."""
    collector: Collector = request.app.state.collector
    config, headers = collector.config, request.headers
    kind = media_type(headers.get("content-type"))
    json = kind in JSON_TYPES
    if unauthorized(config.writes_token, headers.get("authorization")):
        return _failure(401, "missing or wrong bearer token", json)
    if kind != PROTOBUF and not json:
        return _failure(415, f"unsupported content type {kind!r}: send {PROTOBUF} or application/json", json)
    encoding = headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("gzip", "identity", ""):
        return _failure(415, f"unsupported content encoding {encoding!r}: send gzip or identity", json)
    try:
        body = await read_body(request, config.max_body)

        def unpack() -> Spans:  # on the parse thread: never stalls the loop
            raw = gunzip(body, config.max_decompressed_bytes) if encoding == "gzip" else body
            return decode(raw, json, config.otlp_max_spans)

        message = await asyncio.get_running_loop().run_in_executor(collector.ingestor.parser, unpack)
        rejected, why = await collector.otlp.export(message)
    except (IngestError, OtlpError) as exc:
        return _failure(exc.status, str(exc), json)
    except StoreError as exc:
        logger.error("store_failed", error=str(exc))
        return _failure(503, f"spans not stored: {exc}", json)
    partial = ExportTracePartialSuccess(rejected_spans=rejected, error_message=why) if rejected else None
    return _answer(ExportTraceServiceResponse(partial_success=partial), json)
