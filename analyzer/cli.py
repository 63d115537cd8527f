"""``hopline analyze``: event logs in; stages, shifts and pitfalls out (terminal, JSON, HTML).

``analyze_command`` is the thin Typer layer (options, progress, output); ``event_files`` finds
the files to read; the analysis itself is ``pipeline``'s (``analyze_files``, ``analysis``).
"""

# ruff: noqa: E402 - the allocator is set before the imports below load Polars

from __future__ import annotations

import math
import os
from dataclasses import replace
from datetime import UTC, datetime
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from hopline.analyzer import allocator

allocator.keep_freed(sys.argv)  # before Polars is imported: its allocator reads the setting once

import orjson
import polars as pl
import typer
from hopline.analyzer import attribution, bounded, io, pipeline, report
from hopline.analyzer.pipeline import NoHopEvents
from hopline.analyzer.sql import TimelinesError, read_timelines
from hopline.middleware.exits import ClickException, UsageError
from hopline.middleware.contract.kv import KVConfigError, KVSpec
from hopline.middleware.contract.rules import scope_sources
from hopline.middleware.contract.units import SIZE_HELP, parse_duration
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn

HELP = """Where did the time go? Per-request timelines, stage percentiles, shifts and pitfalls.

PATH: NDJSON / Parquet event files, folders, or the collector's store (DIR/events/date=…/hour=…).

Example: [bold]hopline analyze /var/log/hopline/ --since 2026-01-05T10:00 --slo ttft=500ms,itl=50ms[/bold]

It prints the stage table and findings such as "queue time tripled at 10:05 on replica r2 (p50 60 → 185 ms); prefill and decode unchanged; arrivals on r2 up 45%". Add --json for the findings object, --html report.html for an HTML report.
"""


def parse_scopes(text: str) -> tuple[str, ...]:
    """``--by``: comma-separated scope attributes; any attribute name is allowed (rules.scope_sources)."""
    dims = tuple(d.strip() for d in text.split(",") if d.strip())
    scope_sources(dims)  # ValueError naming a bad name
    return dims


def kv_bytes_per_token(kv_config: Path | None) -> int | None:
    """``--kv-config``: a model's ``config.json`` -> its KV-cache bytes per token (None without one)."""
    return None if kv_config is None else KVSpec.from_config(kv_config).bytes_per_token


def event_files(paths: list[Path], since: str | None = None, until: str | None = None) -> list[Path]:
    """The event files to read; ``FileNotFoundError`` / ``ValueError`` naming what was wrong."""
    start, end = io.to_epoch(since), io.to_epoch(until)
    if start is not None and end is not None and start > end:
        raise ValueError(f"--since {since} is after --until {until}")
    files = io.find_files(paths, start, end)
    if not files and start is not None:
        skipped = io.find_files(paths)
        if skipped:
            raise ValueError(
                f"all {len(skipped)} event files under {', '.join(map(str, paths))} hold events from before "
                f"--since {since}"
            )
    if not files:
        raise ValueError(
            f"no event files (*.ndjson, *.jsonl, *.parquet) under {', '.join(map(str, paths))}"
        )
    return files


def analyze_command(
    paths: Annotated[
        list[Path] | None, typer.Argument(help="Event files or folders (NDJSON, Parquet, collector store).")
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(help="Only events at or after this time (ISO-8601, UTC by default, or Unix seconds)."),
    ] = None,
    until: Annotated[str | None, typer.Option(help="Only events at or before this time.")] = None,
    window: Annotated[
        str, typer.Option(help="Window for shifts and series: auto, or e.g. 10s, 1m.")
    ] = "auto",
    by: Annotated[
        str,
        typer.Option(
            help="Scopes to break down and search for shifts: replica, model, service, gateway_replica, "
            "region, route, or any attribute your events carry (e.g. tenant). gateway_replica, region and "
            "route are added by themselves when present with 2-16 values."
        ),
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
    show_all: Annotated[
        bool,
        typer.Option("--all", help=f"Also list minor findings (under {report.MINOR_SHARE:.0%} of users' time)."),
    ] = False,
    timelines_file: Annotated[
        Path | None,
        typer.Option(
            "--timelines",
            help="Analyse a per-request table instead of events: Parquet exported from the `hopline sql` "
            "view (a file or a folder of part files); --since/--until then apply to each request's start.",
        ),
    ] = None,
    otlp: Annotated[
        str | None,
        typer.Option(
            "--otlp",
            help="Also send each finished request as a trace (root + one span per stage) to this OTLP/HTTP "
            "traces URL, e.g. http://localhost:4318/v1/traces.",
        ),
    ] = None,
    max_memory: Annotated[
        str,
        typer.Option(
            help=f"Memory to stay within, e.g. 6GiB ({SIZE_HELP}): a larger log is analysed a "
            "bucket of requests at a time (temporary files under TMPDIR), its statistics on a seeded sample "
            "of requests.",
        ),
    ] = "6GiB",
) -> None:
    dims, slo_targets, budget, kv_bytes = checked_options(by, slo, max_memory, window, kv_config)
    if (timelines_file is None) == (not paths):
        raise UsageError("give event files (PATH…) or --timelines FILE" + (", not both" if paths else ""))
    err = Console(stderr=True)
    options = {"window": window, "by": dims, "slo": slo_targets, "kv_bytes": kv_bytes}
    if timelines_file is not None:
        result, frame = timelines_analysis(timelines_file, since, until, **options)
    else:
        # the whole per-request table only for the outputs that show requests; else the statistics' columns
        shown = html is not None or otlp is not None
        result, frame = events_analysis(paths, since, until, err, budget, **options, full_table=shown)
    given = ["--timelines", str(timelines_file)] if timelines_file is not None else [str(p) for p in paths]
    rerun = "hopline analyze " + " ".join(shlex.quote(arg) for arg in given)  # said beside minor findings
    outputs = Outputs(json_out, html, otlp, show_all, kv_bytes, rerun)
    write_outputs(result, frame, outputs, err)


def checked_options(
    by: str, slo: str | None, max_memory: str, window: str, kv_config: Path | None
) -> tuple[tuple[str, ...], attribution.Slo | None, bounded.Budget, int | None]:
    """The options checked before any file is read: scopes, SLO targets, memory budget, KV bytes
    per token (a bad one is a one-line usage error)."""
    try:
        dims = parse_scopes(by)
        slo_targets = attribution.Slo.parse(slo) if slo else None
        budget = bounded.Budget.of(bounded.max_memory(max_memory))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    if window != "auto":  # a bad --window fails before any file is read; a bare 5: 5 ms or 5 s? (as budget)
        try:
            width = parse_duration(window, unit_required=True)
        except ValueError as exc:
            raise UsageError(f"--window: {exc}") from None
        if width <= 0:
            raise UsageError(f"--window must be longer than 0, got {window!r} (examples: 500ms, 10s, 1m)")
    try:
        kv_bytes = kv_bytes_per_token(kv_config)
    except KVConfigError as exc:
        raise typer.BadParameter(str(exc), param_hint="--kv-config") from exc
    return dims, slo_targets, budget, kv_bytes


@dataclass(frozen=True)
class Outputs:
    """Where an analysis goes: JSON on stdout or the terminal report, an HTML file, OTLP traces."""

    json_out: bool
    html: Path | None
    otlp: str | None
    show_all: bool
    kv_bytes: int | None
    rerun: str  # the command that lists the minor findings (said beside them)


def write_outputs(result: report.Analysis, frame: pl.DataFrame, out: Outputs, err: Console) -> None:
    """Each output renders the same analysis; none changes it."""
    if out.otlp is not None:
        from hopline.analyzer.otlp_out import export_timelines

        sent = export_timelines(frame, out.otlp)
        sample = result.facts.sample
        of = f" (the sample the statistics used, of {sample['of']:,} requests)" if sample else ""
        err.print(f"hopline analyze: {sent} request(s) sent as traces to {out.otlp}{of}", markup=False)
    if out.html is not None:
        from hopline.analyzer.html import render_html

        try:
            render_html(result, frame, out.html, kv_bytes_per_token=out.kv_bytes, show_minor=out.show_all,
                        command=out.rerun)  # fmt: skip
        except OSError as exc:
            raise ClickException(f"cannot write {out.html}: {exc.strerror or exc}") from exc
        except Exception as exc:
            raise internal_error(exc) from exc
    if out.json_out:
        sys.stdout.buffer.write(orjson.dumps(result.to_json(), option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE))
        sys.stdout.flush()
    else:
        report.render(scan_as_shown(result), Console(), show_minor=out.show_all, command=out.rerun)
        if out.html is not None:
            Console().print(f"HTML report: {out.html}")


def scan_as_shown(result: report.Analysis) -> report.Analysis:
    """``result`` with its scan's errors as the terminal lists them: every bad file (the first
    ``io.MAX_ERRORS`` errors kept by the reader can all be bad lines), then how many more bad
    lines there are than the ones listed. The JSON keeps the reader's own lists."""
    scan = result.facts.scan
    if not scan:
        return result
    files = scan.get("bad_files") or []
    lines = [e for e in scan["errors"] if e not in files]
    more = scan["bad_lines"] - len(lines)
    shown = lines + ([f"… and {more:,} more bad line{'s' if more > 1 else ''}"] if more > 0 else []) + files
    return replace(result, facts=replace(result.facts, scan={**scan, "errors": shown}))


def timelines_analysis(
    path: Path, since: str | None, until: str | None, **options: Any
) -> tuple[report.Analysis, pl.DataFrame]:
    """``--timelines FILE``: the statistics on a per-request table exported from ``hopline sql``."""
    try:
        frame = read_timelines(path)
        lo, hi = io.to_epoch(since), io.to_epoch(until)
        if lo is not None or hi is not None:
            kept = frame.filter(pl.col("start").is_between(lo or 0.0, math.inf if hi is None else hi))
            if kept.is_empty() and not frame.is_empty():
                raise NoHopEvents(no_requests_started(frame, since, until))
            frame = kept
    except NoHopEvents as exc:  # a range that leaves nothing: a failure (exit 1), as for events
        raise ClickException(str(exc)) from exc
    except (TimelinesError, ValueError) as exc:
        raise UsageError(str(exc)) from exc
    try:
        kv_bytes = options["kv_bytes"]
        stats = {k: v for k, v in options.items() if k != "kv_bytes"}
        return pipeline.analysis(frame, **stats, kv_bytes_per_token=kv_bytes), frame
    except Exception as exc:  # the command's edge: one line, never a traceback
        raise internal_error(exc) from exc


def no_requests_started(frame: pl.DataFrame, since: str | None, until: str | None) -> str:
    """--timelines with a --since / --until that no request started in: how many were left out
    and when the table's requests started."""
    given = " ".join(f"--{name} {value}" for name, value in (("since", since), ("until", until)) if value)
    if frame["start"].is_null().all():
        return f"no requests with {given}: none of the table's {frame.height:,} requests has a start"
    first, last = (datetime.fromtimestamp(t, UTC) for t in (frame["start"].min(), frame["start"].max()))
    return (
        f"no requests with {given}: all {frame.height:,} requests of the table start outside it, "
        f"from {first:%Y-%m-%d %H:%M:%S} to {last:%Y-%m-%d %H:%M:%S} UTC"
    )


def events_analysis(
    paths: list[Path],
    since: str | None,
    until: str | None,
    err: Console,
    budget: bounded.Budget,
    **options: Any,
) -> tuple[report.Analysis, pl.DataFrame]:
    """PATH…: read the events (with a progress bar on a terminal), build timelines, analyse them."""
    try:
        files = event_files(paths, since, until)
    except (FileNotFoundError, ValueError) as exc:
        raise UsageError(str(exc)) from exc

    try:
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
            result, frame = pipeline.analyze_files(
                files,
                since=since,
                until=until,
                **options,
                on_file=lambda path: progress.update(task, advance=1, description=f"reading {path.name}"),
                on_step=lambda step: progress.update(task, description=step),
                budget=budget,
            )
    except NoHopEvents as exc:
        raise ClickException(str(exc)) from exc
    except OSError as exc:  # a file that vanished or cannot be read
        raise ClickException(f"cannot read events: {exc}") from exc
    except Exception as exc:  # the command's edge: one line, never a traceback
        raise internal_error(exc) from exc
    return result, frame


def internal_error(exc: Exception) -> Exception:
    """A failure inside the analysis, after the input was read and checked: hopline's bug. One line
    naming it, exit 1 (``HOPLINE_DEBUG=1`` re-raises it with its traceback)."""
    if os.environ.get("HOPLINE_DEBUG"):
        return exc
    message = str(exc).splitlines()[0][:300] if str(exc) else ""
    return ClickException(
        f"internal error ({type(exc).__name__}: {message}); please report it (HOPLINE_DEBUG=1 shows where)"
    )


def register(app: typer.Typer) -> None:
    app.command(name="analyze", help=HELP)(analyze_command)
