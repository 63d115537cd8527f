"""``hopline analyze --otlp URL``: every finished request of the timelines as a trace.

The rows are the timelines' (``timelines.COLUMNS``: stages, attributes, scope, ``start``,
``trace_id``); ``middleware.trace_export`` lays out and sends the spans with the OTel SDK.
"""

from __future__ import annotations

import polars as pl
from hopline.middleware.contract.trace_export import RequestTraceExporter


def export_timelines(frame: pl.DataFrame, url: str) -> int:
    """Send the finished requests of ``frame`` (not ``incomplete``); returns how many were sent."""
    exporter = RequestTraceExporter(url)
    sent = 0
    try:
        for row in frame.filter(pl.col("outcome") != "incomplete").iter_rows(named=True):
            sent += exporter.export(row)  # stage names, attribute names, scope, start, trace_id
    finally:
        exporter.close()
    return sent
