"""An OpenAI SDK client instrumented with OpenTelemetry only (no hopline code in this process).

Usage: python otel_openai_client.py BASE_URL TRACES_URL MODEL OUT_JSON

opentelemetry-instrumentation-openai-v2 makes a CLIENT span per call, opentelemetry-instrumentation-
httpx sends ``traceparent`` (so vLLM's span is a child in the same trace), and the SDK's OTLP/HTTP
exporter sends both to ``TRACES_URL``. An "agent" span holds three calls (one trace, three
requests); four more calls run concurrently, each in a trace of its own. Writes the trace IDs and
the response IDs it saw to OUT_JSON.
"""

from __future__ import annotations

import asyncio
import json
import sys

import httpx
import openai
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor


async def call(client: openai.AsyncOpenAI, model: str, n: int) -> dict:
    """One streaming call inside a span of the caller's (a new trace unless inside the agent's)."""
    with trace.get_tracer("agent").start_as_current_span(f"step {n}") as step:
        stream = await client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": f"Hello world, call number {n}"}],
            max_tokens=48,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        ids = set()
        async for chunk in stream:
            ids.add(chunk.id)
        return {"response_ids": sorted(ids), "trace_id": f"{step.get_span_context().trace_id:032x}"}


async def main(base_url: str, traces_url: str, model: str) -> dict:
    # openai 3.x sends through httpx2 by default, which opentelemetry-instrumentation-httpx does not
    # patch (no traceparent would go out): hand it an httpx client, which the instrumentor covers.
    client = openai.AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0, http_client=httpx.AsyncClient(timeout=300))
    with trace.get_tracer("agent").start_as_current_span("agent run"):
        agent = [await call(client, model, n) for n in range(3)]  # one after another, as an agent does
    alone = await asyncio.gather(*(call(client, model, 10 + n) for n in range(4)))
    await client.close()
    return {"agent": agent, "alone": list(alone)}


if __name__ == "__main__":
    base_url, traces_url, model, out = sys.argv[1:5]
    provider = TracerProvider(resource=Resource.create({"service.name": "otel-agent"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_url), schedule_delay_millis=200))
    trace.set_tracer_provider(provider)
    OpenAIInstrumentor().instrument()
    HTTPXClientInstrumentor().instrument()
    result = asyncio.run(main(base_url, traces_url, model))
    provider.shutdown()  # flushes the last spans
    hopline = [m for m in sys.modules if m == "hopline" or m.startswith("hopline.")]
    assert not hopline, f"hopline was imported into the OTel-only client: {hopline}"
    with open(out, "w") as f:
        json.dump(result, f)
