"""OTLP out: each finished request as a trace that Jaeger, Tempo or Grafana draw as a waterfall.

A root span is the request as the user saw it (from its first hop, as long as the outer view's
end-to-end time), with one child per stage (connect, network, gateway, frontend, queue, prefill,
decode, or the fallbacks standing in for some of them), laid end to end in the rule book's order
(``rules.STAGE_ORDER``): the stages are durations from different clocks, so their positions are
a drawing, their lengths are the measurements. The trace is the request's own when its trace ID
is known (the root then starts a new branch of that trace), else a new one. Attributes: GenAI
(``gen_ai.request.model``, ``gen_ai.usage.input_tokens`` / ``output_tokens``,
``gen_ai.response.finish_reasons``) and hopline's (``hopline.request_id``, ``hopline.stage``...).

Export is the official SDK's: a ``TracerProvider`` with a ``BatchSpanProcessor`` over the OTLP/HTTP
exporter (the ``otlp`` extra), so a collector's join never waits on the network; ``close()``
flushes. The collector and the analyzer both call ``RequestTraceExporter.export`` with one flat
mapping per request (stage names, attribute names, scope, ``start``, ``trace_id``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import Any

from hopline.middleware.contract import is_valid_trace_id
from hopline.middleware.contract.rules import LOOK, STAGE_ORDER

# The outer view first: the request's length as the user saw it.
E2E_VIEWS = ("client_e2e", "gateway_e2e", "engine_e2e")
TTFT_VIEWS = ("client_ttft", "gateway_ttft", "engine_ttft")
ROOT_NAME = "hopline request"
GENAI_ATTRIBUTES = {  # flat request field -> span attribute
    "model": "gen_ai.request.model",
    "prompt_tokens": "gen_ai.usage.input_tokens",
    "output_tokens": "gen_ai.usage.output_tokens",
}
HOPLINE_ATTRIBUTES = ("request_id", "outcome", "service", "replica")


class _NextTraceId:
    """An SDK ``IdGenerator`` whose next trace ID can be set (the request's own trace)."""

    def __init__(self) -> None:
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

        self._random = RandomIdGenerator()
        self.next: int | None = None

    def generate_span_id(self) -> int:
        return self._random.generate_span_id()

    def generate_trace_id(self) -> int:
        wanted, self.next = self.next, None
        return wanted if wanted is not None else self._random.generate_trace_id()

    def is_trace_id_random(self) -> bool:
        return False  # some are the requests' own


def request_spans(request: Mapping[str, Any]) -> tuple[float, float, list[tuple[str, float, float]]] | None:
    """(root start, root end, [(stage, start, end)]) in Unix seconds, or None without a start or a view.

    Stages with no value are left out; a negative stage (a clock problem, reported elsewhere) is
    drawn with zero length.
    """
    start = request.get("start")
    e2e = next((request[v] for v in E2E_VIEWS if request.get(v) is not None), None)
    if start is None or e2e is None:
        return None
    children, t = [], start
    for name in STAGE_ORDER:
        value = request.get(name)
        if value is None:
            continue
        length = max(0.0, value)
        children.append((name, t, t + length))
        t += length
    return start, start + max(e2e, t - start), children


class RequestTraceExporter:
    """Requests -> traces -> an OTLP/HTTP endpoint (e.g. ``http://tempo:4318/v1/traces``)."""

    def __init__(self, url: str, *, service: str = "hopline", timeout_s: float = 10.0) -> None:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError as exc:
            from hopline.middleware.contract.install import install_hint

            raise RuntimeError(f"OTLP export needs the otlp extra ({install_hint('otlp')}): {exc}") from None

        self._ids = _NextTraceId()
        self._provider = TracerProvider(
            resource=Resource.create({"service.name": service, "service.instance.id": f"{os.getpid()}"}),
            id_generator=self._ids,
        )
        self._provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url, timeout=timeout_s)))
        self._tracer = self._provider.get_tracer("hopline")
        self._lock = threading.Lock()
        self.exported = 0

    def export(self, request: Mapping[str, Any]) -> bool:
        """Queue one request's trace; False when it has no start or no end-to-end view."""
        from opentelemetry.context import Context
        from opentelemetry.trace import SpanKind, set_span_in_context

        laid_out = request_spans(request)
        if laid_out is None:
            return False
        start, end, children = laid_out
        attrs: dict[str, Any] = {
            GENAI_ATTRIBUTES[k]: request[k] for k in GENAI_ATTRIBUTES if request.get(k) is not None
        }
        attrs.update({f"hopline.{k}": request[k] for k in HOPLINE_ATTRIBUTES if request.get(k) is not None})
        if request.get("finish_reason") is not None:
            attrs["gen_ai.response.finish_reasons"] = [request["finish_reason"]]
        for view in TTFT_VIEWS + E2E_VIEWS:
            if request.get(view) is not None:
                attrs[f"hopline.{view}_s"] = request[view]
        trace_id = request.get("trace_id")
        with self._lock:
            self._ids.next = int(trace_id, 16) if is_valid_trace_id(trace_id) else None
            root = self._tracer.start_span(
                ROOT_NAME, context=Context(), kind=SpanKind.SERVER, start_time=_ns(start), attributes=attrs
            )
        parent = set_span_in_context(root)
        for name, t0, t1 in children:
            look = LOOK[name]
            span = self._tracer.start_span(
                look.label,
                context=parent,
                start_time=_ns(t0),
                attributes={"hopline.stage": name, "hopline.stage_s": request[name], "hopline.view": look.view},
            )
            span.end(end_time=_ns(t1))
        root.end(end_time=_ns(end))
        self.exported += 1
        return True

    def close(self) -> None:
        """Flush what is queued and stop (the SDK also does this at interpreter exit)."""
        self._provider.shutdown()


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)
