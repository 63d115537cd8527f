"""``POST /v1/traces``: an OTLP/HTTP trace receiver whose spans become hop events.

Decoding is the maintained ``opentelemetry-proto`` package's (protobuf, or OTLP/JSON through
protobuf's ``json_format`` after the spec's hex trace and span IDs are turned into the base64
that proto3 JSON expects). Each span goes through the span mapping (``middleware/contract/spans.py``);
the events it yields take the very path of ``POST /v1/events`` (validate, dedup, durable store,
join), with the same bearer token, body limits and gzip rules.

Answers follow the OTLP/HTTP specification: 200 with an ``ExportTraceServiceResponse`` (in the
request's encoding) on success, its ``partial_success`` naming the spans whose events were
rejected; 400 for a body that does not decode (not retryable), 401, 413, 415, and 503 with
``Retry-After`` when the store fails (retryable: nothing of the batch was acknowledged). Error
bodies are a ``google.rpc.Status``. Spans hopline does not understand (startup spans, HTTP
spans, other libraries) are counted in ``hopline_otlp_spans_total{outcome="ignored"}`` and
dropped: never an error, since exporters send everything their process traces.
"""

from __future__ import annotations

import asyncio

import base64
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from google.rpc import status_pb2
from hopline.collector.ingest import JSON_TYPES, IngestError, gunzip, media_type, read_body, unauthorized
from hopline.collector.store import StoreError
from hopline.middleware.log import logger
from hopline.middleware.contract.spans import resource_scope, span_events
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from prometheus_client import CollectorRegistry, Counter

if TYPE_CHECKING:
    from hopline.collector.app import Collector
    from hopline.collector.ingest import Ingestor

PROTOBUF = "application/x-protobuf"
_KIND_PREFIX = len("SPAN_KIND_")
_ID_FIELDS = ("traceId", "spanId", "parentSpanId")
SPAN_OUTCOMES = ("mapped", "ignored", "rejected")


class OtlpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _value(any_value: Any) -> Any:
    """An OTLP ``AnyValue`` as a plain Python value."""
    which = any_value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in any_value.kvlist_value.values}
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


def _hex_ids_to_base64(obj: Any) -> None:
    """OTLP/JSON writes trace and span IDs as hex; proto3 JSON reads bytes as base64."""
    for rs in obj.get("resourceSpans") or ():
        for ss in rs.get("scopeSpans") or ():
            for span in ss.get("spans") or ():
                for items in (span, *(span.get("links") or ())):
                    for name in _ID_FIELDS:
                        value = items.get(name)
                        if isinstance(value, str) and value:
                            try:
                                items[name] = base64.b64encode(bytes.fromhex(value)).decode()
                            except ValueError:
                                raise OtlpError(400, f"{name} {value[:40]!r} is not hex") from None


def decode(body: bytes, json: bool) -> ExportTraceServiceRequest:
    """An ``ExportTraceServiceRequest`` from an OTLP/HTTP body; ``OtlpError(400)`` when it does not decode."""
    message = ExportTraceServiceRequest()
    try:
        if json:
            obj = orjson.loads(body)
            if not isinstance(obj, dict):
                raise OtlpError(400, "OTLP/JSON body must be an ExportTraceServiceRequest object")
            _hex_ids_to_base64(obj)
            json_format.ParseDict(obj, message, ignore_unknown_fields=True)
        else:
            message.ParseFromString(body)
    except (orjson.JSONDecodeError, json_format.ParseError, DecodeError, ValueError) as exc:
        raise OtlpError(400, f"body is not an OTLP ExportTraceServiceRequest: {str(exc)[:200]}") from None
    return message


def spans_of(message: ExportTraceServiceRequest) -> Iterator[tuple[dict[str, Any], Span]]:
    """(resource attributes, span) for every span of the request."""
    for rs in message.resource_spans:
        resource = attributes(rs.resource.attributes)
        for ss in rs.scope_spans:
            for span in ss.spans:
                yield resource, span


class OtlpReceiver:
    """Spans -> hop events -> the collector's ingest path; counts what it mapped and ignored."""

    def __init__(
        self, ingestor: Ingestor, registry: CollectorRegistry, resource_map: Mapping[str, Sequence[str]]
    ) -> None:
        self.ingestor = ingestor
        self.resource_map = dict(resource_map)
        self.spans = Counter(
            "hopline_otlp_spans", "OTLP spans received, by outcome (ignored: no mapping row)", ["outcome"],
            registry=registry,
        )  # fmt: skip

    async def export(self, message: ExportTraceServiceRequest) -> tuple[int, str]:
        """Ingest the spans' events; returns (rejected spans, error message) for partial success."""
        events: list[dict[str, Any]] = []
        owner: list[int] = []  # events[i] came from span owner[i]
        scopes: dict[int, dict[str, str]] = {}
        mapped = ignored = 0
        for number, (resource, span) in enumerate(spans_of(message)):
            key = id(resource)
            scope = scopes.get(key)
            if scope is None:
                scope = scopes[key] = resource_scope(resource, self.resource_map)
            source, made = span_events(plain_span(span), scope)
            if source is None or not made:
                ignored += 1
                continue
            mapped += 1
            events += made
            owner += [number] * len(made)
        if ignored:
            self.spans.labels("ignored").inc(ignored)
        if not events:
            return 0, ""
        try:
            result = await self.ingestor.ingest(orjson.dumps(events), "json")
        except IngestError as exc:  # every event was invalid: every mapped span is rejected
            self.spans.labels("rejected").inc(mapped)
            return mapped, f"{mapped} span(s) made no valid hop event: {exc}"
        # the spans of the listed rejected events, plus (past the listing cap) one per unlisted event
        bad = len({owner[item["line"] - 1] for item in result.rejected})
        bad = min(mapped, bad + result.rejected_count - len(result.rejected))
        self.spans.labels("mapped").inc(mapped - bad)
        if bad:
            self.spans.labels("rejected").inc(bad)
            return bad, f"{bad} span(s) made invalid hop events, e.g. {result.rejected[0]['error']}"
        return 0, ""


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
        body = await read_body(request, config.max_body_bytes)

        def unpack() -> ExportTraceServiceRequest:  # on the parse thread: never stalls the loop
            raw = gunzip(body, config.max_decompressed_bytes) if encoding == "gzip" else body
            return decode(raw, json)

        message = await asyncio.get_running_loop().run_in_executor(collector.ingestor.parser, unpack)
        rejected, why = await collector.otlp.export(message)
    except (IngestError, OtlpError) as exc:
        return _failure(exc.status, str(exc), json)
    except StoreError as exc:
        logger.error("store_failed", error=str(exc))
        return _failure(503, f"spans not stored: {exc}", json)
    partial = ExportTracePartialSuccess(rejected_spans=rejected, error_message=why) if rejected else None
    return _answer(ExportTraceServiceResponse(partial_success=partial), json)
