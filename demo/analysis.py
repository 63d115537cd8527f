"""The demo's last step: the analyzer over what the collector stored, exactly as a user would run it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
from hopline.demo.engine_sim import EngineConfig
from hopline.analyzer.io import ScanReport, scan_events
from hopline.analyzer.report import analyze, render
from hopline.analyzer.timelines import timelines
from rich.console import Console


def load_timelines(run_dir: Path) -> tuple[pl.DataFrame, ScanReport]:
    """One row per request, from the collector's store under ``run_dir/events``."""
    events, scan = scan_events([run_dir / "events"])
    return timelines(events).collect(), scan


def analyze_run(run_dir: Path, since: float | None = None) -> tuple[dict[str, Any], pl.DataFrame]:
    """The findings report (DESIGN.md's contract) and the timelines it was computed from.

    ``since`` (Unix seconds) leaves out requests that started earlier: the demo's warm-up, when
    prefix caches are empty and every code path runs for the first time (benchmark tools discard
    their warm-up requests for the same reason). Requests are cut, not events, so none is torn.
    """
    frame, scan = load_timelines(run_dir)
    if since is not None:
        frame = frame.filter(pl.col("start") >= since)
    kv_bytes = EngineConfig().model.kv.bytes_per_token
    return analyze(frame, scan=scan, kv_bytes_per_token=kv_bytes), frame


def render_html(report: dict[str, Any], frame: pl.DataFrame, path: Path) -> Path:
    from hopline.analyzer.html import render_html as render

    return render(report, frame, path)


def write_dashboards(out: Path, collector_url: str) -> list[Path]:
    """Grafana dashboards and Prometheus rules for this run (skipped without the dashboards extra)."""
    try:
        from hopline.dashboards.build import write
    except ImportError:
        return []
    return list(write(out, collector_url=collector_url))


def print_report(report: dict[str, Any], console: Console) -> None:
    """The analyzer's terminal report (as ``hopline analyze`` prints it), below the live display."""
    console.print()
    render(report, console)
