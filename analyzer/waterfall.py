"""``hopline timeline REQUEST_ID PATH…``: one request's waterfall in the terminal.

The stages are laid end to end on one time axis that starts at ``client.sent`` (or at the
first hop seen when the client emits none): the TTFT terms in the order a request meets them,
then decode. Every bar is a stage of the contract's stage table, never a difference of two
hosts' timestamps. Below it, each component's raw hops are listed relative to that
component's own first hop, because hosts' clocks differ: comparing a gateway time with an
engine time would show the skew, not the request. Missing hops and negative stages are flagged.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import polars as pl
import typer
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.table import Table
from rich.text import Text

from hopline.analyzer.io import scan_events
from hopline.analyzer.timelines import resolve_by_trace, timelines
from hopline.middleware.contract.rules import LOOK, STAGE_ORDER
from hopline.middleware.contract import (
    ATTRIBUTE_TYPES,
    ERROR_HOPS,
    component,
    negative_stages,
    normalize_request_id,
)

# The bars in the order a request meets them, coloured as everywhere else (rules.STAGE_LOOKS):
# at most one of a fallback and the stages it replaces has a value, so bars never double-count.
WATERFALL_ORDER = STAGE_ORDER
STAGE_COLOURS = {name: LOOK[name].terminal for name in STAGE_ORDER}

_FALLBACK_NOTES = {
    "client": "no client hops: connect and network unknown (upstream_network stands for the gateway-engine leg)",
    "gateway": "no gateway hops: network includes any proxy",
    "engine": "no engine hops: upstream stands for everything beyond the gateway",
}
BAR_WIDTH = 48
ZOOM_WIDTH = 32
MIN_BAR = 16  # narrower, a chart shows nothing a reader can compare
GAP = 2  # between two columns of a borderless table


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f} ms"


def stage_bars(stages: Mapping[str, Any]) -> list[tuple[str, float, float]]:
    """``(stage, start_s, duration_s)`` laid end to end from 0; a negative stage takes no width.

    Without engine hops there is no ``decode``; the time after the first token is then shown as
    one component saw it (its end-to-end minus its TTFT: two timestamps of one host).
    """
    bars, start = [], 0.0
    for name in WATERFALL_ORDER:
        value = stages.get(name)
        if value is None:
            continue
        bars.append((name, start, value))
        start += max(value, 0.0)
    if stages.get("decode") is None:
        for view in ("client", "gateway"):
            ttft, e2e = stages.get(f"{view}_ttft"), stages.get(f"{view}_e2e")
            if ttft is not None and e2e is not None:
                bars.append((f"after first token ({view})", start, e2e - ttft))
                break
    return bars


def _bar(start: float, duration: float, span: float, colour: str, width: int) -> Text:
    """One bar on an axis of ``width`` characters for ``span`` seconds; past the axis: ``▸``."""
    scale = width / span if span > 0 else 0.0
    left = min(width, round(start * scale))
    if start >= span > 0:
        return Text(" " * (width - 1) + "▸", style="dim")
    if duration < 0:
        return Text(" " * left + "◂ negative", style="bold red")
    size = min(max(1, round(duration * scale)) if duration > 0 else 0, width - left)
    text = Text(" " * left)
    text.append("█" * size, style=colour)
    if start + duration > span > 0:
        text.append("▸", style="dim")
    return text


def _axes(stages: Mapping[str, Any]) -> tuple[list[tuple[str, float, float]], float, float, bool]:
    """The bars, the whole request's span, the first token's time, and whether to zoom on it
    (when decode dwarfs the time to first token, so that the TTFT terms stay readable)."""
    bars = stage_bars(stages)
    end = max((s + max(d, 0.0) for _, s, d in bars), default=0.0)
    total = max(end, stages.get("client_e2e") or 0.0, stages.get("gateway_e2e") or 0.0)
    after = [s for name, s, _ in bars if name == "decode" or name.startswith("after first token")]
    ttft_end = after[0] if after else end
    return bars, total, ttft_end, 0 < ttft_end < total / 3


def chart_widths(room: int, zoom: bool) -> tuple[int, ...] | None:
    """The charts' widths side by side in ``room`` characters (the zoom first; each column is a
    character wider, for the ``▸`` past its axis), or None when they do not fit at ``MIN_BAR``
    each: the caller then gives them rows of their own."""
    if not zoom:
        return (min(BAR_WIDTH, room - 1),) if room - 1 >= MIN_BAR else None
    room -= 2 + GAP
    if room < 2 * MIN_BAR:
        return None
    first = min(ZOOM_WIDTH, room // 2)
    return first, min(BAR_WIDTH - ZOOM_WIDTH // 2, room - first)


def waterfall_tables(stages: Mapping[str, Any], width: int = 10_000) -> list[Table]:
    """The stages as bars on two time axes: the whole request, and (when decode dwarfs it) a
    zoom on the time to first token. Stage names and times are never cut: when the charts do not
    fit beside them in ``width`` columns, they get narrower, then go below the numbers, one
    chart per table when even two side by side do not fit."""
    bars, total, ttft_end, zoom = _axes(stages)
    negative = set(stages["negative"] if stages.get("negative") is not None else negative_stages(stages))
    names = [Text(name, style="bold red" if name in negative else "") for name, _, _ in bars]
    starts = [_ms(start) for _, start, _ in bars]
    durations = [Text(_ms(d), style="bold red" if n in negative else "") for n, _, d in bars]
    axes = [(ttft_end, f"0 … {_ms(ttft_end)} (first token)")] if zoom else []
    axes.append((total, f"0 … {_ms(total)}"))
    numbers = [("stage", names), ("start", starts), ("duration", durations)]
    widths = [max([len(title)] + [len(str(c)) for c in cells]) for title, cells in numbers]
    beside = chart_widths(width - sum(widths) - GAP * len(widths), zoom)
    if beside is not None:
        return [_stage_table(numbers, bars, list(zip(axes, beside)))]
    below = chart_widths(width - widths[0] - GAP, zoom)
    one_each = max(4, min(BAR_WIDTH, width - widths[0] - GAP - 1))
    groups = [list(zip(axes, below))] if below else [[(axis, one_each)] for axis in axes]
    return [_stage_table(numbers, bars, [])] + [_stage_table(numbers[:1], bars, group) for group in groups]


def _stage_table(
    columns: list[tuple[str, list[Any]]],
    bars: list[tuple[str, float, float]],
    charts: list[tuple[tuple[float, str], int]],
) -> Table:
    """A borderless table: text ``columns`` that are never wrapped nor cut, then one chart column
    per ``((axis span, title), width)`` with ``bars`` drawn on it."""
    table = Table(show_edge=False, pad_edge=False, box=None)
    for title, cells in columns:
        fits = max([len(title)] + [len(str(c)) for c in cells])  # as waterfall_tables counts them
        table.add_column(title, justify="left" if title == "stage" else "right", no_wrap=True, min_width=fits)
    for (_, title), width in charts:
        table.add_column(title, width=width + 1)  # + 1: the ▸ past the axis
    for i, (name, start, duration) in enumerate(bars):
        drawn = [_bar(start, duration, span, STAGE_COLOURS.get(name, "blue"), w) for (span, _), w in charts]
        table.add_row(*(cells[i] for _, cells in columns), *drawn)
    return table


class Waterfall:
    """The stage tables, laid out for the width they are printed at (``waterfall_tables``)."""

    def __init__(self, stages: Mapping[str, Any]) -> None:
        self.stages = stages

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield from waterfall_tables(self.stages, options.max_width)


def _hop_attributes(event: Mapping[str, Any]) -> str:
    parts = []
    for name in ATTRIBUTE_TYPES:
        value = event.get(name)
        if value is None:
            continue
        if name.endswith("_s") and isinstance(value, float):
            parts.append(f"{name[:-2]}={value * 1000:.1f}ms")
        elif name != "max_gap_at":
            parts.append(f"{name}={value}")
    return " ".join(parts)


def hops_tables(events: pl.DataFrame) -> list[Table]:
    """One table per host (component and replica): its hops relative to its own first hop.

    A gateway that failed over to a second engine replica shows two engine tables: the two
    engines' clocks are not comparable, so neither are their times.
    """
    frame = events.with_columns(component=pl.col("hop").str.split_exact(".", 1).struct.field("field_0"))
    tables = []
    for comp in ("client", "gateway", "engine"):
        own = frame.filter(pl.col("component") == comp)
        for host in own["replica"].unique(maintain_order=True).sort(nulls_last=False).to_list():
            hops = own.filter(pl.col("replica").eq_missing(host)).sort("ts", "hop")
            first = hops["ts"].min()
            title = f"{comp}{' ' + host if host else ''} hops (ms after its first hop)"
            table = Table(title=title, title_justify="left", box=None, pad_edge=False)
            for column, justify in (
                ("+ms", "right"),
                ("hop", "left"),
                ("attempt", "right"),
                ("attributes", "left"),
            ):
                # names and times whole; only the attributes wrap
                table.add_column(column, justify=justify, no_wrap=column != "attributes")  # type: ignore[arg-type]
            for event in hops.iter_rows(named=True):  # one request's handful of events: display only
                table.add_row(
                    f"{(event['ts'] - first) * 1000:,.1f}",
                    Text(event["hop"], style="red" if event["hop"] in ERROR_HOPS else ""),
                    str(event.get("attempt") or 0),
                    _hop_attributes(event),
                )
            tables.append(table)
    return tables


def problems(stages: Mapping[str, Any], events: pl.DataFrame) -> list[Text]:
    """Errors, absent components, missing hops and negative stages, one line each.

    ``missing`` and ``negative`` come from the request's timelines row (the analyzer's rules);
    negative stages are recomputed with the contract's rule when the row lacks the column.
    """
    lines = []
    errors = events.filter(pl.col("hop").is_in(list(ERROR_HOPS))).sort("ts")
    for hop, attempt in zip(errors["hop"].to_list(), errors["attempt"].fill_null(0).to_list(), strict=True):
        lines.append(Text(f"{hop} on attempt {attempt}", style="bold red"))
    seen = {component(h) for h in events["hop"].to_list()}
    lines += [Text(note, style="yellow") for comp, note in _FALLBACK_NOTES.items() if comp not in seen]
    missing = list(stages.get("missing") or [])
    if missing:
        lines.append(Text(f"missing hops: {', '.join(missing)}", style="yellow"))
    negative = stages["negative"] if stages.get("negative") is not None else negative_stages(stages)
    for name in negative:
        lines.append(
            Text(
                f"negative stage {name} = {_ms(stages[name])}: an instrumentation or clock problem",
                style="bold red",
            )
        )
    return lines


def render_waterfall(request_id: str, stages: Mapping[str, Any], events: pl.DataFrame) -> Group:
    """Everything ``hopline timeline`` prints for one request (``stages``: its timelines row)."""
    origin = (
        "client.sent"
        if stages.get("client_sent") is not None
        else f"its first hop ({events.sort('ts')['hop'][0]})"
    )
    header = Text.assemble(
        ("request ", "bold"),
        (request_id, "bold cyan"),
        f"  service={stages.get('service') or '-'} replica={stages.get('replica') or '-'} "
        f"model={stages.get('model') or '-'} stream={stages.get('stream')} outcome={stages.get('outcome') or '-'}",
    )
    parts: list[Any] = [
        header,
        Text(f"time axis from {origin}; stages end to end (TTFT terms, then decode)", style="dim"),
    ]
    parts.append(Waterfall(stages))
    for view in ("client", "gateway", "engine"):
        ttft, e2e = stages.get(f"{view}_ttft"), stages.get(f"{view}_e2e")
        if ttft is not None or e2e is not None:
            parts.append(
                Text(
                    f"{view} view: TTFT {_ms(ttft) if ttft is not None else '-'}, "
                    f"end-to-end {_ms(e2e) if e2e is not None else '-'}"
                )  # fmt: skip
            )
    parts.extend(problems(stages, events))
    parts.extend(hops_tables(events))
    return Group(*parts)


def ids_starting_with(events: pl.LazyFrame, prefix: str, shown: int = 5) -> tuple[int, list[str]]:
    """How many request IDs start with ``prefix``, and the first ``shown`` of them (sorted)."""
    ids = events.filter(pl.col("request_id").str.starts_with(prefix)).select(pl.col("request_id").unique())
    found = ids.select(count=pl.len(), first=pl.col("request_id").sort().head(shown).implode()).collect()
    return found["count"][0], found["first"][0].to_list()


def timeline_command(
    request_id: Annotated[
        str,
        typer.Argument(
            help="The request ID (X-Request-Id; a chatcmpl- prefix is stripped), or its first characters "
            "when they belong to one request only."
        ),
    ],
    paths: Annotated[
        list[Path], typer.Argument(help="Event files: NDJSON or Parquet, as the collector stores them.")
    ],
) -> None:
    """Draw one request's waterfall: its stages on a time axis and every component's raw hops.

    Example:

    hopline timeline 4f1c2a9e8b7d4c3a events/*.ndjson
    """
    err = Console(stderr=True)
    rid = normalize_request_id(request_id)
    if rid is None:
        err.print(
            f"[red]hopline timeline:[/red] {request_id!r} is not a request ID (1-64 characters of [A-Za-z0-9._:-])"
        )
        raise typer.Exit(2)
    try:
        events, _report = scan_events(paths)
    except (OSError, ValueError) as exc:
        err.print(f"[red]hopline timeline:[/red] {exc}")
        raise typer.Exit(2) from exc
    events = resolve_by_trace(events)  # the join rule: a stand-in's events belong to their request
    mine = events.filter(pl.col("request_id") == rid).collect()
    if mine.is_empty():  # an ID cut short (the HTML report's chart labels, a terminal): a unique prefix
        count, shown = ids_starting_with(events, rid)
        if count > 1:
            more = f", … ({count:,} in all)" if count > len(shown) else ""
            err.print(
                f"[red]hopline timeline:[/red] {rid!r} is the start of {count:,} request IDs "
                f"({', '.join(shown)}{more}); give more of the ID",
                highlight=False,
            )
            raise typer.Exit(1)
        if count == 1:
            rid = shown[0]
            mine = events.filter(pl.col("request_id") == rid).collect()
    if mine.is_empty():
        held = events.select(pl.col("request_id").n_unique()).collect().item()
        err.print(
            f"[red]hopline timeline:[/red] request {rid!r} not found; "
            f"{len(paths)} file(s) hold {held:,} request(s)"
        )
        raise typer.Exit(1)
    row = timelines(mine.lazy()).collect().row(0, named=True)
    Console().print(render_waterfall(rid, row, mine))


def register(app: typer.Typer) -> None:
    """Add ``hopline timeline`` to the ``hopline`` command."""
    app.command(name="timeline")(timeline_command)
