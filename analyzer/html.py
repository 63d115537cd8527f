"""``hopline analyze --html FILE``: one self-contained HTML report (plotly, its JS inlined).

The file opens anywhere, offline: plotly.js is embedded once, no fonts or scripts are fetched.
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

from hopline.analyzer.kv import kv_in_flight
from hopline.analyzer.waterfall import WATERFALL_ORDER
from hopline.middleware.contract import VIEWS

# The TTFT terms and the fallbacks that stand in for some of them (decode is charted apart:
# it is usually ten times the rest and would flatten every other stage).
TTFT_BARS = tuple(s for s in WATERFALL_ORDER if s != "decode")
STAGE_COLOURS = {
    "connect": "#7f7f7f",
    "network": "#17becf",
    "gateway": "#9467bd",
    "upstream_network": "#9edae5",
    "upstream": "#1f77b4",
    "frontend": "#bcbd22",
    "queue": "#d62728",
    "prefill": "#2ca02c",
    "engine": "#ff9896",
    "decode": "#aec7e8",
}
VIEW_COLOURS = {"client": "#1f77b4", "gateway": "#9467bd", "engine": "#ff7f0e"}
QUANTILES = {"p50": (0.5, "solid"), "p90": (0.9, "dash"), "p99": (0.99, "dot")}
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
    slow_by = pl.coalesce(
        *[f"{v}_ttft" for v in views], *[f"{v}_e2e" for v in VIEWS if f"{v}_e2e" in lf.collect_schema()]
    )
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


def mark_shifts(fig: go.Figure, findings: Mapping[str, Any]) -> go.Figure:
    """A dashed line where each shift begins, labelled with its stage, factor and scope."""
    for f in findings.get("findings", []):
        if f.get("kind") != "shift" or not f.get("at"):
            continue
        at = datetime.fromisoformat(str(f["at"]).replace("Z", "+00:00")).replace(tzinfo=None)
        scope = " ".join(f"{k}={v}" for k, v in (f.get("scope") or {}).items())
        fig.add_vline(x=at, line_dash="dash", line_color="#333", line_width=1)
        fig.add_annotation(x=at, y=1.0, yref="paper", yanchor="bottom", showarrow=False, font={"size": 11},
                           text=f"{f.get('stage')} ×{f.get('factor', 0):.1f} {scope}".strip())  # fmt: skip
    return fig


def stages_over_time(over_time: pl.DataFrame, window_s: int) -> go.Figure:
    fig = go.Figure()
    for stage in (s for s in TTFT_BARS if s in over_time.columns and over_time[s].is_not_null().any()):
        fig.add_bar(x=over_time["_window"], y=over_time[stage], name=stage, marker_color=STAGE_COLOURS[stage])
    fig.update_layout(barmode="relative", bargap=0.05)
    return _layout(fig, f"Mean TTFT stages per {window_s} s window (stacked)", "ms")


def ttft_quantiles(quantiles: pl.DataFrame, window_s: int) -> go.Figure:
    fig = go.Figure()
    for column in quantiles.columns[1:]:
        view, name = column.split("|")
        if quantiles[column].is_null().all():
            continue
        fig.add_scatter(
            x=quantiles["_window"],
            y=quantiles[column],
            name=f"{view} {name}",
            mode="lines",
            line={"color": VIEW_COLOURS[view], "dash": QUANTILES[name][1]},
        )
    return _layout(fig, f"TTFT quantiles per view, {window_s} s windows", "ms")


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
            y=labels, x=per_replica[stage], name=stage, orientation="h", marker_color=STAGE_COLOURS[stage]
        )
    fig.update_layout(barmode="relative", legend_traceorder="normal")
    fig = _layout(fig, "Mean TTFT stages per replica", "", height=max(300, 80 + 40 * len(labels)))
    return fig.update_xaxes(title="ms")


def slowest_waterfalls(slowest: pl.DataFrame) -> go.Figure:
    """One row per request, its stages end to end; a negative stage is drawn at zero width and
    named in the hover text and the row label, so it is visible but does not bend the axis."""
    stages = [s for s in WATERFALL_ORDER if s in slowest.columns and slowest[s].is_not_null().any()]
    flags = [pl.when(pl.col(s) < 0).then(pl.lit(f" {s}<0")) for s in stages]
    # no stage at all (events without the optional attributes): nothing can be negative
    negative = (
        slowest.select(pl.concat_str(flags, ignore_nulls=True)).to_series() if flags else [None] * slowest.height
    )
    labels = [
        f"{rid[:18]} {replica or ''}{' ⚠' + neg if neg else ''}"
        for rid, replica, neg in zip(slowest["request_id"], slowest["replica"], negative, strict=True)
    ]
    fig = go.Figure()
    for stage in stages:
        values = slowest[stage]
        fig.add_bar(
            y=labels,
            x=values.clip(lower_bound=0),
            customdata=values,
            name=stage,
            orientation="h",
            marker_color=STAGE_COLOURS[stage],
            hovertemplate=f"{stage}: %{{customdata:.1f}} ms<extra></extra>",
        )
    fig.update_layout(barmode="stack", legend_traceorder="normal")
    fig = _layout(fig, f"The {len(labels)} slowest requests (by TTFT), stages end to end", "",
                  height=max(320, 80 + 34 * len(labels)))  # fmt: skip
    return fig.update_xaxes(title="ms from the request's first hop")


def _findings_html(findings: Mapping[str, Any]) -> str:
    items = []
    for f in findings.get("findings", []):
        details = {k: v for k, v in f.items() if k not in ("summary", "kind")}
        rows = "".join(
            f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(json.dumps(v) if not isinstance(v, str) else v)}</td></tr>"
            for k, v in details.items()
        )
        items.append(
            f'<li class="finding {html.escape(str(f.get("kind", "")))}"><p><b>{html.escape(str(f.get("kind", "")))}</b> '
            f'{html.escape(str(f.get("summary", "")))}</p><table class="evidence">{rows}</table></li>'
        )
    if not items:
        return "<p>No findings: no stage shifted and no pitfall was detected.</p>"
    return '<ol class="findings">' + "".join(items) + "</ol>"


def _stages_html(stages: Mapping[str, Mapping[str, Any]]) -> str:
    def cell(value: Any, pct: bool = False) -> str:
        if value is None:
            return "<td>–</td>"
        return f"<td>{value * 100:.1f}%</td>" if pct else f"<td>{value:,.1f}</td>"

    rows = "".join(
        f"<tr><th>{html.escape(name)}</th>{cell(s.get('p50_ms'))}{cell(s.get('p90_ms'))}{cell(s.get('p99_ms'))}"
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
.evidence { margin-left: 12px; } .evidence td { text-align: left; font-family: monospace; }
.shift b { color: #d62728; } .pitfall b { color: #ff7f0e; }
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
    findings: dict[str, Any], timelines: pl.DataFrame, path: str | Path, kv_bytes_per_token: int | None = None
) -> Path:
    """Write the report to ``path`` and return it.

    ``findings`` is the findings-contract dict (DESIGN.md), ``timelines`` the collected output
    of ``timelines()`` (one row per request). With ``kv_bytes_per_token`` (``kv.KVSpec``) the
    report adds each replica's KV cache in flight over time.
    """
    path = Path(path)
    sections: list[tuple[str, str]] = [("Findings", _findings_html(findings))]
    if findings.get("stages"):
        sections.append(("Stages over all requests", _stages_html(findings["stages"])))
    if timelines.height:
        agg = _aggregates(timelines)
        window = int(agg["meta"]["window_s"][0])
        figures = [
            mark_shifts(stages_over_time(agg["over_time"], window), findings),
            mark_shifts(ttft_quantiles(agg["quantiles"], window), findings),
            replica_breakdown(agg["per_replica"]),
            slowest_waterfalls(agg["slowest"]),
        ]
        titles = ["Stages over time", "TTFT per view", "Per replica", "Slowest requests"]
        if kv_bytes_per_token:
            figures.append(kv_chart(timelines, kv_bytes_per_token, window))
            titles.append("KV cache")
        plots = [
            fig.to_html(full_html=False, include_plotlyjs=(i == 0), config=_PLOT_CONFIG)
            for i, fig in enumerate(figures)
        ]
        sections += list(zip(titles, plots, strict=True))
    else:
        sections.append(("Requests", "<p>No requests in the input.</p>"))
    generated = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    first, last = (timelines["start"].min(), timelines["start"].max()) if timelines.height else (None, None)
    span = (
        f" from {datetime.fromtimestamp(first, UTC):%Y-%m-%d %H:%M:%S} to {datetime.fromtimestamp(last, UTC):%H:%M:%S} UTC"
        if first is not None else ""
    )  # fmt: skip
    meta = f"{findings.get('requests', timelines.height):,} requests{span}; generated {generated}"
    body = "".join(f"<section><h2>{html.escape(t)}</h2>{content}</section>" for t, content in sections)
    path.write_text(
        '<!DOCTYPE html><html><head><meta charset="utf-8"><title>hopline report</title>'
        f'<style>{_CSS}</style></head><body><h1>hopline report</h1><p class="meta">{html.escape(meta)}</p>'
        f"{body}</body></html>",
        encoding="utf-8",
    )
    return path
