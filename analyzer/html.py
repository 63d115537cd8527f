"""``hopline analyze --html FILE``: one self-contained HTML report (plotly, its JS inlined).

The file opens anywhere, offline: plotly.js's basic bundle (analyzer/assets/) is embedded once,
no fonts or scripts are fetched, and the file stays under 1.5 MB.
It shows, top to bottom, the findings with their evidence (what changed, in one sentence each),
the stage percentiles, the mean TTFT stages over time (stacked, so the stage that grew stands
out), TTFT quantiles per view over time (client, gateway, engine: where they part, the time went
between them), a per-replica breakdown, the slowest requests as waterfalls and, given the
model's KV bytes per token, each replica's KV cache in flight.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import polars as pl

from hopline.analyzer.kv_in_flight import kv_in_flight
from hopline.analyzer.findings import Finding, Findings, Pitfall, Shift
from hopline.analyzer.findings.model import iso_utc, to_second
from hopline.analyzer.report import MINOR_SHARE, Analysis, minor_line, sample_line
from hopline.middleware.contract import VIEWS
from hopline.middleware.contract.rules import LOOK, STAGE_ORDER, TTFT_PARTS, VIEW_LOOK

# The TTFT terms and the fallbacks that stand in for some of them (decode is charted apart:
# it is usually ten times the rest and would flatten every other stage); colours from the rule book.
TTFT_BARS = TTFT_PARTS
STAGE_COLOURS = {name: LOOK[name].colour for name in STAGE_ORDER}
VIEW_COLOURS = {name: look.colour for name, look in VIEW_LOOK.items()}
# TTFT per view: the median and the 90th percentile (p99 over short windows is noise)
QUANTILES = {"p50": (0.5, "solid"), "p90": (0.9, "dot")}
PLOTLY_JS = Path(__file__).parent / "assets" / "plotly-basic.min.js"
MARKER_LANE_PX = 22  # height of one row of shift labels above a chart (an 11 px label is ~17 px tall)
MARKER_MIN_PLOT_PX = 900  # labels are laid out for a plot at least this wide (the page is 1300 px)
NICE_WINDOWS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400)
SLOWEST = 12
_PLOT_CONFIG = {"displaylogo": False, "responsive": True}


def choose_window(span_s: float, target_windows: int = 60) -> int:
    """The smallest nice window (1 s … 1 day) that cuts ``span_s`` into at most ``target_windows``."""
    return next((w for w in NICE_WINDOWS_S if span_s / w <= target_windows), NICE_WINDOWS_S[-1])


def _present(frame: pl.LazyFrame, names: tuple[str, ...]) -> list[str]:
    schema = frame.collect_schema()
    return [n for n in names if n in schema]


def _aggregates(timelines: pl.DataFrame) -> dict[str, pl.DataFrame]:
    """Every table the charts need, computed in one ``collect_all``."""
    # ``start`` (the first of client.sent, gateway.received, engine.received) only places a request
    # in a window: a clock skew between hosts moves it to a neighbouring window at worst.
    lf = timelines.lazy().with_columns(_start=pl.col("start"))
    span = lf.select((pl.col("_start").max() - pl.col("_start").min()).fill_null(0)).collect().item() or 0
    window = choose_window(span)
    windowed = lf.filter(pl.col("_start").is_not_null()).with_columns(
        _window=pl.from_epoch((pl.col("_start") // window * window).cast(pl.Int64), time_unit="s")
    )
    stages = _present(lf, TTFT_BARS + ("decode",))
    views = [v for v in VIEWS if f"{v}_ttft" in lf.collect_schema()]
    ms = [(pl.col(s) * 1000).mean().alias(s) for s in stages]
    over_time = windowed.group_by("_window").agg(*ms, requests=pl.len()).sort("_window")
    quantiles = (
        windowed.group_by("_window")
        .agg(
            (pl.col(f"{v}_ttft") * 1000).quantile(q, interpolation="linear").alias(f"{v}|{name}")
            for v in views
            for name, (q, _) in QUANTILES.items()
        )
        .sort("_window")
    )
    per_replica = (
        lf.group_by(pl.col("replica").fill_null("(none)")).agg(*ms, requests=pl.len()).sort("replica")
    )
    slow_by = pl.coalesce(*[f"{v}_ttft" for v in views])
    slowest = (
        lf.with_columns(_slow=slow_by)
        .filter(pl.col("_slow").is_not_null())
        .top_k(SLOWEST, by="_slow")
        .sort("_slow")
        .select("request_id", "replica", "_slow", *[pl.col(s) * 1000 for s in stages])
    )
    names = ("over_time", "quantiles", "per_replica", "slowest")
    frames = pl.collect_all([over_time, quantiles, per_replica, slowest])
    result = dict(zip(names, frames, strict=True))
    result["meta"] = pl.DataFrame({"window_s": [window]})
    return result


def _layout(fig: go.Figure, title: str, y_title: str, height: int = 420) -> go.Figure:
    fig.update_layout(
        title=title,
        height=height,
        template="plotly_white",
        margin={"l": 70, "r": 20, "t": 50, "b": 50},
        legend={"orientation": "h", "y": -0.18},
        yaxis_title=y_title,
    )
    return fig


def _shift_labels(findings: Findings) -> list[tuple[datetime, str]]:
    """(time, label) of each shift, numbered as in the findings list (at the second the JSON says)."""
    out = []
    for i, f in enumerate(findings.findings, 1):
        if not isinstance(f, Shift):
            continue
        at = datetime.fromtimestamp(to_second(f.at), UTC).replace(tzinfo=None)
        label = LOOK[f.stage].label if f.stage in LOOK else f.stage
        factor = f" ×{round(f.factor, 3):.1f}" if f.factor else ""
        out.append((at, f"{i}. {label}{factor}"))
    return sorted(out)


def lay_out_labels(marks: list[tuple[float, str]], width_px: float = MARKER_MIN_PLOT_PX) -> list[int]:
    """A lane (row) for each label so that no two labels in one lane overlap: ``marks`` are
    (x as a fraction of the axis, text) in x order; a label is ~7 px a character, centred."""
    ends: list[float] = []  # per lane, where its last label ends (fraction of the axis)
    lanes = []
    for x, text in marks:
        half = (7.0 * len(text) + 12) / width_px / 2
        lane = next((i for i, end in enumerate(ends) if end <= x - half), len(ends))
        if lane == len(ends):
            ends.append(0.0)
        ends[lane] = x + half
        lanes.append(lane)
    return lanes


def mark_shifts(fig: go.Figure, findings: Findings, x_range: tuple[datetime, datetime]) -> go.Figure:
    """A dashed line where each shift begins, labelled with its number, stage and factor; labels
    that would collide go to another row, so none overlaps another."""
    labels = _shift_labels(findings)
    if not labels:
        return fig
    lo, hi = x_range
    span = max((hi - lo).total_seconds(), 1e-9)
    marks = [((at - lo).total_seconds() / span, text) for at, text in labels]
    lanes = lay_out_labels(marks)
    for (at, text), lane in zip(labels, lanes, strict=True):
        fig.add_vline(x=at, line_dash="dash", line_color="#333", line_width=1)
        fig.add_annotation(x=at, y=1.0, yshift=lane * MARKER_LANE_PX, yref="paper", yanchor="bottom", showarrow=False,
                           font={"size": 11}, text=html.escape(text), bgcolor="rgba(255,255,255,0.85)")  # fmt: skip
    top = fig.layout.margin.t or 50
    return fig.update_layout(margin={"t": top + MARKER_LANE_PX * (max(lanes) + 1)})


def stages_over_time(over_time: pl.DataFrame, window_s: int) -> go.Figure:
    fig = go.Figure()
    for stage in (s for s in TTFT_BARS if s in over_time.columns and over_time[s].is_not_null().any()):
        fig.add_bar(x=over_time["_window"], y=over_time[stage], name=LOOK[stage].label,
                    marker_color=STAGE_COLOURS[stage])  # fmt: skip
    fig.update_layout(barmode="relative", bargap=0.05)
    return _layout(fig, f"Mean TTFT stages per {window_s} s window (stacked)", "ms")


def ttft_quantiles(quantiles: pl.DataFrame, window_s: int) -> go.Figure:
    """TTFT per view: p50 as a solid line, p90 dotted in the same colour; where the views part,
    the time went between them."""
    fig = go.Figure()
    for column in quantiles.columns[1:]:
        view, name = column.split("|")
        if quantiles[column].is_null().all():
            continue
        solid = QUANTILES[name][1] == "solid"
        fig.add_scatter(
            x=quantiles["_window"],
            y=quantiles[column],
            name=f"{view} {name}",
            mode="lines",
            line={"color": VIEW_COLOURS[view], "dash": QUANTILES[name][1], "width": 2.5 if solid else 1.5},
            opacity=1.0 if solid else 0.7,
        )
    return _layout(fig, f"TTFT as each component sees it (p50 solid, p90 dotted; {window_s} s windows)", "ms")


def replica_breakdown(per_replica: pl.DataFrame) -> go.Figure:
    """Mean TTFT stages per replica; decode goes in the label (its bar would dwarf the rest)."""
    fig = go.Figure()
    decode = (
        per_replica["decode"] if "decode" in per_replica.columns else pl.Series([None] * per_replica.height)
    )
    labels = [
        f"{r} ({n:,} req, decode {d:,.0f} ms)" if d is not None else f"{r} ({n:,} req)"
        for r, n, d in zip(per_replica["replica"], per_replica["requests"], decode, strict=True)
    ]
    for stage in (s for s in TTFT_BARS if s in per_replica.columns and per_replica[s].is_not_null().any()):
        fig.add_bar(
            y=labels, x=per_replica[stage], name=LOOK[stage].label, orientation="h",
            marker_color=STAGE_COLOURS[stage],
        )
    fig.update_layout(barmode="relative", legend_traceorder="normal")
    fig = _layout(fig, "Mean TTFT stages per replica", "", height=max(300, 80 + 40 * len(labels)))
    return fig.update_xaxes(title="ms")


def slowest_waterfalls(slowest: pl.DataFrame) -> go.Figure:
    """The slowest requests by TTFT, one row each, its TTFT parts end to end on a TTFT-sized axis
    (decode, usually far longer, is in the row label, so the parts stay visible). A negative
    stage is drawn at zero width and named in the hover text and the row label."""
    stages = [s for s in TTFT_PARTS if s in slowest.columns and slowest[s].is_not_null().any()]
    flags = [pl.when(pl.col(s) < 0).then(pl.lit(f" {s}<0")) for s in stages]
    # no stage at all (events without the optional attributes): nothing can be negative
    negative = (
        slowest.select(pl.concat_str(flags, ignore_nulls=True)).to_series() if flags else [None] * slowest.height
    )
    decode = slowest["decode"] if "decode" in slowest.columns else pl.Series([None] * slowest.height)
    labels = [
        f"{rid[:18]} {replica or ''}{f' +{d / 1000:,.1f} s decode' if d is not None else ''}{' ⚠' + neg if neg else ''}"
        for rid, replica, d, neg in zip(slowest["request_id"], slowest["replica"], decode, negative, strict=True)
    ]
    fig = go.Figure()
    for stage in stages:
        values = slowest[stage]
        fig.add_bar(
            y=labels,
            x=values.clip(lower_bound=0),
            customdata=list(zip(values, slowest["request_id"], strict=True)),  # the label cuts the ID
            name=LOOK[stage].label,
            orientation="h",
            marker_color=STAGE_COLOURS[stage],
            hovertemplate=f"%{{customdata[1]}}<br>{LOOK[stage].label}: %{{customdata[0]:.1f}} ms<extra></extra>",
        )
    fig.update_layout(barmode="stack", legend_traceorder="normal")
    fig = _layout(fig, f"The {len(labels)} slowest requests by TTFT: where their first token's time went", "",
                  height=max(320, 80 + 34 * len(labels)))  # fmt: skip
    return fig.update_xaxes(title="ms from the request's first hop to its first token")


def slowest_table(slowest: pl.DataFrame) -> str:
    """The slowest requests, slowest first, each with its full request ID to copy (one click
    selects it) for ``hopline timeline ID PATH``: the chart's labels cut IDs to 18 characters."""
    decode = slowest["decode"] if "decode" in slowest.columns else pl.Series([None] * slowest.height)
    columns = (slowest["request_id"], slowest["replica"], slowest["_slow"], decode)
    rows = "".join(
        f'<tr><td><code class="rid" title="hopline timeline {html.escape(rid)} PATH">{html.escape(rid)}</code></td>'
        f"<td>{html.escape(replica or '–')}</td><td>{_value(slow * 1000)}</td><td>{_value(d)}</td></tr>"
        for rid, replica, slow, d in reversed(list(zip(*columns, strict=True)))
    )
    return (
        '<table class="slowest"><tr><th>request ID (hopline timeline ID PATH)</th><th>replica</th>'
        f"<th>TTFT ms</th><th>decode ms</th></tr>{rows}</table>"
    )


def _words(key: str) -> str:
    """``prompt_tokens_p50`` -> ``prompt tokens p50``; ``before_ms`` -> ``before``; ``arrivals_per_s``
    -> ``arrivals`` (its values say ``/s``, as the terminal's do)."""
    key = key.removesuffix("_per_s").removesuffix("_ms").removesuffix("_s")
    return LOOK[key].label if key in LOOK else key.replace("_", " ")


def _value(value: Any, key: str = "") -> str:
    """A value as a person reads it: numbers rounded (with their unit), lists and maps in words."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        units = (("_ms", " ms"), ("_per_s", "/s"), ("_s", " s"))
        unit = next((u for suffix, u in units if key.endswith(suffix)), "")
        if isinstance(value, float) and not unit and 0 < abs(value) < 1 and ("share" in key or "ratio" in key):
            return f"{value * 100:.0f}%"
        text = f"{value:,.0f}" if abs(value) >= 100 or isinstance(value, int) else f"{value:,.3g}"
        return text + unit
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return ", ".join(f"{_words(str(k))} {_value(v, str(k))}" for k, v in value.items()) or "–"
    if isinstance(value, (list, tuple)):
        return ", ".join(_words(str(v)) if isinstance(v, str) else _value(v) for v in value) or "–"
    return str(value)


def _scope_words(scope: Mapping[str, Any] | None) -> str:
    return ", ".join(f"{_words(str(k))} {v}" for k, v in (scope or {}).items()) or "all traffic"


def _shift_rows(f: Shift) -> list[tuple[str, str]]:
    before, after = _value(round(f.before_ms, 3), "_ms"), _value(round(f.after_ms, 3), "_ms")
    rows = [
        ("stage", _words(f.stage)),
        ("where", _scope_words(f.scope)),
        ("from", iso_utc(f.at) + (f" until {iso_utc(f.until)}" if f.until else "")),
        (f"{f.statistic} before → after", f"{before} → {after}"),
        ("requests since", _value(f.affected_requests)),
    ]
    context = f.context
    before, after = context.get("before") or {}, context.get("after") or {}
    for key, value in context.items():
        if key in ("before", "after", "covariates") or value in ({}, [], None):
            continue  # covariates: their before -> after values follow
        if isinstance(value, Mapping) and all(isinstance(v, (int, float)) for v in value.values()):
            # relative changes of what moved with it
            value = ", ".join(f"{_words(str(k))} {v * 100:+.0f}%" for k, v in value.items())
        rows.append((_words(key).replace("moved with", "moved with it"), _value(value)))
    for key in before:
        rows.append((_words(key), f"{_value(before[key], key)} → {_value(after.get(key), key)}"))
    return rows


def _pitfall_rows(f: Pitfall) -> list[tuple[str, str]]:
    rows = [("where", _scope_words(f.scope)), ("requests", _value(f.affected_requests))]
    rows += [(_words(str(k)), _value(v, str(k))) for k, v in f.evidence.items()]
    return rows


def _finding_items(findings: tuple[Finding, ...]) -> list[str]:
    """Each finding as its sentence, with the evidence behind it in a small table of words and
    rounded numbers (never raw JSON)."""
    items = []
    for f in findings:
        rows = _shift_rows(f) if isinstance(f, Shift) else _pitfall_rows(f)
        rows.append(("users' time at stake", f"{abs(f.cost_s):,.1f} s"))
        table = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
        items.append(
            f'<li class="finding {html.escape(f.kind)}"><p><b>{html.escape(f.kind)}</b> '
            f'{html.escape(f.sentence)}</p><table class="evidence">{table}</table></li>'
        )
    return items


def _findings_html(findings: Findings, show_minor: bool = False, command: str = "hopline analyze …") -> str:
    """The main findings; the minor ones as one line saying how to list them, or listed after the
    main ones with ``show_minor`` (numbered on)."""
    main = _finding_items(findings.findings)
    minor = findings.minor
    if main:
        out = '<ol class="findings">' + "".join(main) + "</ol>"
    elif minor:
        out = f"<p>No shift or pitfall costs users {MINOR_SHARE:.0%} of their time or more.</p>"
    else:
        return "<p>No findings: no stage shifted and no pitfall was detected.</p>"
    if minor and show_minor:
        out += (
            f'<h3>Minor findings (each under {MINOR_SHARE:.0%} of users\' time)</h3>'
            f'<ol class="findings minor" start="{len(main) + 1}">' + "".join(_finding_items(minor)) + "</ol>"
        )
    elif minor:
        out += f'<p class="minor">{html.escape(minor_line(len(minor), command))}</p>'
    return out


def _stages_html(stages: Mapping[str, Mapping[str, Any]]) -> str:
    def cell(value: Any, pct: bool = False) -> str:
        if value is None:
            return "<td>–</td>"
        return f"<td>{value * 100:.1f}%</td>" if pct else f"<td>{value:,.1f}</td>"

    rows = "".join(
        f"<tr><th>{html.escape(_words(name))}</th>{cell(s.get('p50_ms'))}{cell(s.get('p90_ms'))}{cell(s.get('p99_ms'))}"
        f"{cell(s.get('share_of_ttft'), pct=True)}</tr>"
        for name, s in stages.items()
    )
    return (
        '<table class="stages"><tr><th>stage</th><th>p50 ms</th><th>p90 ms</th><th>p99 ms</th>'
        f"<th>share of TTFT</th></tr>{rows}</table>"
    )


_CSS = """
body { font-family: system-ui, sans-serif; margin: 24px auto; max-width: 1300px; color: #222; }
h1 { margin-bottom: 0; } .meta { color: #666; margin-top: 4px; }
section { margin: 28px 0; } table { border-collapse: collapse; font-size: 14px; }
td, th { padding: 3px 10px; text-align: right; border-bottom: 1px solid #eee; }
th { text-align: left; } .findings li { margin-bottom: 14px; } .finding p { margin: 4px 0; }
.evidence { margin-left: 12px; font-size: 13px; } .evidence td { text-align: left; }
.evidence th { color: #555; font-weight: normal; padding-right: 16px; }
.shift b { color: #d62728; } .pitfall b { color: #ff7f0e; }
.slowest td:first-child { text-align: left; } code.rid { user-select: all; cursor: text; }
"""


def kv_chart(timelines: pl.DataFrame, bytes_per_token: int, window_s: int) -> go.Figure:
    """Each replica's KV cache in flight (peak per window), from ``kv.kv_in_flight``."""
    peaks = kv_in_flight(timelines.lazy(), bytes_per_token, every=f"{window_s}s").collect()
    fig = go.Figure()
    for (replica,), part in peaks.partition_by("replica", as_dict=True, maintain_order=True).items():
        fig.add_scatter(x=part["time"], y=part["kv_bytes"] / 1024**3, name=str(replica), mode="lines",
                        line_shape="hv")  # fmt: skip
    return _layout(fig, f"KV cache in flight per replica (peak per {window_s} s; prompt + output tokens held "
                        "from engine.received to engine.last_token)", "GiB")  # fmt: skip


def render_html(
    analysis: Analysis,
    timelines: pl.DataFrame,
    path: str | Path,
    kv_bytes_per_token: int | None = None,
    *,
    show_minor: bool = False,
    command: str = "hopline analyze …",
) -> Path:
    """Write the report to ``path`` and return it.

    ``analysis`` is ``pipeline.analysis``'s (typed findings and the facts), ``timelines`` the collected output
    of ``timelines()`` (one row per request). With ``kv_bytes_per_token`` (``kv.KVSpec``) the
    report adds each replica's KV cache in flight over time. Minor findings are one line naming
    ``command`` (how to list them), or listed with ``show_minor`` (``--all``).
    """
    path = Path(path)
    findings, facts = analysis.findings, analysis.facts
    sections: list[tuple[str, str]] = [("Findings", _findings_html(findings, show_minor, command))]
    if facts.stages:
        sections.append(("Stages over all requests", _stages_html(facts.stages)))
    if timelines.height:
        agg = _aggregates(timelines)
        window = int(agg["meta"]["window_s"][0])
        lo = datetime.fromtimestamp(timelines["start"].min(), UTC).replace(tzinfo=None)
        hi = datetime.fromtimestamp(timelines["start"].max(), UTC).replace(tzinfo=None)
        figures = [
            mark_shifts(stages_over_time(agg["over_time"], window), findings, (lo, hi)),
            mark_shifts(ttft_quantiles(agg["quantiles"], window), findings, (lo, hi)),
            replica_breakdown(agg["per_replica"]),
            slowest_waterfalls(agg["slowest"]),
        ]
        titles = ["Stages over time", "TTFT per view", "Per replica", "Slowest requests"]
        if kv_bytes_per_token:
            figures.append(kv_chart(timelines, kv_bytes_per_token, window))
            titles.append("KV cache")
        plots = [fig.to_html(full_html=False, include_plotlyjs=False, config=_PLOT_CONFIG) for fig in figures]
        plots[titles.index("Slowest requests")] += slowest_table(agg["slowest"])
        script = f"<script>{PLOTLY_JS.read_text(encoding='utf-8')}</script>"
        sections += list(zip(titles, plots, strict=True))
    else:
        script = ""
        sections.append(("Requests", "<p>No requests in the input.</p>"))
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    first, last = (timelines["start"].min(), timelines["start"].max()) if timelines.height else (None, None)
    span = (
        f" from {datetime.fromtimestamp(first, UTC):%Y-%m-%d %H:%M:%S} to {datetime.fromtimestamp(last, UTC):%H:%M:%S} UTC"
        if first is not None else ""
    )  # fmt: skip
    meta = f"{facts.requests:,} requests{span}; generated {generated}"
    sampled = sample_line(facts)
    if sampled:
        meta += f". {sampled}"
    body = "".join(f"<section><h2>{html.escape(t)}</h2>{content}</section>" for t, content in sections)
    path.write_text(
        '<!DOCTYPE html><html><head><meta charset="utf-8"><title>hopline report</title>'
        f'<style>{_CSS}</style>{script}</head><body><h1>hopline report</h1><p class="meta">{html.escape(meta)}</p>'
        f"{body}</body></html>",
        encoding="utf-8",
    )
    return path
