"""``hopline collector --otlp-export URL``: each finished request, as the join saw it, sent as a trace.

The join calls the function below once per complete request (``Joiner.on_finish``);
``middleware.trace_export`` lays out the spans and queues them on the SDK's batch processor, so the
join never waits on the network. A failure is logged and counted, never raised into the join.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from hopline.middleware.contract import is_valid_trace_id
from hopline.middleware.log import logger
from hopline.middleware.contract.rules import COMPONENTS
from hopline.middleware.contract.trace_export import RequestTraceExporter

FIRST_HOPS = tuple(f"{c}.{h}" for c, h in zip(COMPONENTS, ("sent", "received", "received")))


def request_of(rid: str, events: list[Mapping[str, Any]], values: Mapping[str, Any], described: Mapping) -> dict:
    """The flat mapping ``RequestTraceExporter.export`` reads: stages, attributes, scope, start, trace."""
    starts = {e["hop"]: e["ts"] for e in sorted(events, key=lambda e: -e["ts"]) if e["hop"] in FIRST_HOPS}
    start = next((starts[h] for h in FIRST_HOPS if h in starts), None)
    trace_id = next((e["trace_id"] for e in events if is_valid_trace_id(e.get("trace_id"))), None)
    return {**values, **described["scope"], "outcome": described["outcome"], "request_id": rid, "start": start,
            "trace_id": trace_id}


def finished_request_exporter(url: str) -> Callable[[str, list, dict, dict], None]:
    exporter = RequestTraceExporter(url, service="hopline-collector")
    failures = 0

    def on_finish(rid: str, events: list, values: dict, described: dict) -> None:
        nonlocal failures
        try:
            exporter.export(request_of(rid, events, values, described))
        except Exception as exc:  # noqa: BLE001 - exporting must never break the join
            failures += 1
            if failures == 1 or failures % 1000 == 0:
                logger.warning("otlp_export_failed", error=str(exc), failures=failures)

    on_finish.exporter = exporter  # type: ignore[attr-defined]
    return on_finish
