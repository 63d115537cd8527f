"""``hopline analyze``: event logs in; stages, shifts and pitfalls out (terminal, JSON, HTML)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import orjson
import typer
from hopline.analyzer import attribution, io, report
from hopline.analyzer.timelines import timelines
from hopline.middleware.durations import parse_duration
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn

HELP = """Where did the time go? Per-request timelines, stage percentiles, shifts and pitfalls.

PATH: NDJSON / Parquet event files, folders, or the collector's store (DIR/events/date=…/hour=…).

Example: [bold]hopline analyze /var/log/hopline/ --since 2026-01-05T10:00 --slo ttft=500ms,itl=50ms[/bold]

It prints the stage table and findings such as "queue time tripled at 10:05 on replica r2 (p50 60 → 185 ms); prefill and decode unchanged; arrivals on r2 up 45%". Add --json for the findings object, --html report.html for an HTML report.
"""


def _dims(text: str) -> tuple[str, ...]:
    dims = tuple(d.strip() for d in text.split(",") if d.strip())
    unknown = [d for d in dims if d not in attribution.SCOPES]
    if unknown:
        raise typer.BadParameter(
            f"unknown scope {', '.join(unknown)}: choose from {', '.join(attribution.SCOPES)}"
        )
    return dims


def analyze_command(
    paths: Annotated[
        list[Path], typer.Argument(help="Event files or folders (NDJSON, Parquet, collector store).")
    ],
    since: Annotated[
        str | None,
        typer.Option(help="Only events at or after this time (ISO-8601, UTC by default, or Unix seconds)."),
    ] = None,
    until: Annotated[str | None, typer.Option(help="Only events at or before this time.")] = None,
    window: Annotated[
        str, typer.Option(help="Window for shifts and series: auto, or e.g. 10s, 1m.")
    ] = "auto",
    by: Annotated[
        str, typer.Option(help="Scopes to break down and search for shifts.")
    ] = "replica,model,service",
    slo: Annotated[
        str | None, typer.Option(help="Targets for goodput, e.g. ttft=500ms,itl=50ms,e2e=20s.")
    ] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the findings object as JSON (nothing else on stdout).")
    ] = False,
    html: Annotated[
        Path | None, typer.Option("--html", help="Also write an HTML report to this file.")
    ] = None,
    kv_config: Annotated[
        Path | None,
        typer.Option(help="Model config.json: adds KV-cache memory to the no_max_tokens evidence."),
    ] = None,
    otlp: Annotated[
        str | None,
        typer.Option(
            "--otlp",
            help="Also send each finished request as a trace (root + one span per stage) to this OTLP/HTTP "
            "traces URL, e.g. http://localhost:4318/v1/traces.",
        ),
    ] = None,
) -> None:
    err = Console(stderr=True)
    try:
        dims = _dims(by)
        slo_targets = attribution.Slo.parse(slo) if slo else None
        if window != "auto":
            parse_duration(window)  # a bad --window fails before any file is read
        kv_bytes = None
        if kv_config is not None:
            from hopline.analyzer.kv import KVConfigError, KVSpec

            try:
                kv_bytes = KVSpec.from_config(kv_config).bytes_per_token
            except KVConfigError as exc:
                raise typer.BadParameter(str(exc), param_hint="--kv-config") from exc
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc

    try:
        files = io.find_files(paths, io.to_epoch(since), io.to_epoch(until))
    except (FileNotFoundError, ValueError) as exc:
        err.print(f"hopline analyze: {exc}", markup=False)
        raise typer.Exit(2) from exc
    if not files:
        err.print(
            f"hopline analyze: no event files (*.ndjson, *.jsonl, *.parquet) under {', '.join(map(str, paths))}",
            markup=False,
        )
        raise typer.Exit(2)

    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    ) as progress:
        task = progress.add_task("reading events", total=len(files))

        def advance(path: Path) -> None:
            progress.update(task, advance=1, description=f"reading {path.name}")

        events, scan = io.scan_events(files, since=since, until=until, progress=advance)
        progress.update(task, description="building timelines")
        frame = timelines(events).collect()
        progress.update(task, description="finding shifts and pitfalls")
        result = report.analyze(
            frame, window=window, by=dims, slo=slo_targets, scan=scan, kv_bytes_per_token=kv_bytes
        )

    if otlp is not None:
        from hopline.analyzer.otlp_out import export_timelines

        sent = export_timelines(frame, otlp)
        err.print(f"hopline analyze: {sent} request(s) sent as traces to {otlp}", markup=False)
    if html is not None:
        from hopline.analyzer.html import render_html

        render_html(result, frame, html, kv_bytes_per_token=kv_bytes)
    if json_out:
        sys.stdout.buffer.write(orjson.dumps(result, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE))
        sys.stdout.flush()
    else:
        report.render(result, Console())
        if html is not None:
            Console().print(f"HTML report: {html}")


def register(app: typer.Typer) -> None:
    app.command(name="analyze", help=HELP)(analyze_command)
