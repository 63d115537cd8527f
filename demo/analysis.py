"""The demo's last step: the analyzer over what the collector stored, exactly as a user would run it."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import polars as pl
from hopline.demo.engine_sim import EngineConfig
from hopline.analyzer.io import find_files
from hopline.analyzer.pipeline import analyze_files
from hopline.analyzer.report import Analysis, render
from rich.console import Console


def analyze_run(run_dir: Path) -> tuple[Analysis, pl.DataFrame]:
    """The analysis (its JSON: docs/findings.md) and the timelines it was computed from (one row
    per request): ``hopline analyze RUN_DIR``'s own pipeline with its defaults, so what the demo
    prints is what the kept folder gives when analysed again as it is."""
    return analyze_files(find_files([run_dir]))


def render_html(report: Analysis, frame: pl.DataFrame, path: Path) -> Path:
    """The HTML report, with the simulated model's KV cache in flight per replica."""
    from hopline.analyzer.html import render_html as render

    return render(report, frame, path, kv_bytes_per_token=EngineConfig().model.kv.bytes_per_token)


def example_request(report: dict[str, Any], frame: pl.DataFrame) -> str | None:
    """One request to look at: the slowest (by TTFT) in the first finding's scope after it began,
    else the slowest of the run."""
    if frame.height == 0:
        return None
    ttft = pl.coalesce("client_ttft", "gateway_ttft", "engine_ttft", "client_e2e")
    pick = frame.filter(ttft.is_not_null())
    first = (report.get("findings") or [None])[0]
    if first is not None:
        scoped = pick
        for key, value in (first.get("scope") or {}).items():
            if key in scoped.columns:
                scoped = scoped.filter(pl.col(key).cast(pl.String) == str(value))
        if first.get("at"):
            at = datetime.fromisoformat(first["at"].replace("Z", "+00:00")).timestamp()
            scoped = scoped.filter(pl.col("start") >= at)
        if scoped.height:
            pick = scoped
    return pick.sort(ttft, descending=True)["request_id"][0] if pick.height else None


def write_dashboards(out: Path, collector_url: str) -> list[Path]:
    """Grafana dashboards and Prometheus rules for this run (skipped without the dashboards extra)."""
    try:
        from hopline.dashboards.build import write
    except ImportError:
        return []
    return list(write(out, collector_url=collector_url))


def print_report(report: Analysis, console: Console, folder: Path | None = None) -> None:
    """The analyzer's terminal report (as ``hopline analyze`` prints it), below the live display;
    its minor findings are listed by ``hopline analyze FOLDER --all`` when the folder is kept."""
    console.print()
    render(report, console, command=f"hopline analyze {folder or 'DIR'}")  # DIR: kept with --out DIR
