"""The analysis as one object (the findings contract of DESIGN.md) and as a terminal report.

``Analysis`` is the result of ``pipeline`` (the one place that composes the analysis): the
findings, detected and decided by ``findings`` (typed; ranking, relations and ``minor`` decided
there, once), and the ``Facts`` around them (``Facts.of``: stages, span, outcomes, … over the
per-request timelines). ``render`` only draws it with rich tables; ``Analysis.to_json`` is the
object ``hopline analyze --json`` prints. Keys beyond the contract (``by_scope``, ``windows``,
``goodput``, ``negative_stages``, ``missing_hops``, ``outcomes``, ``scan``, ``span``,
``dominant``, ``minor``; ``impact_s``, ``share_of_users_time`` and ``context`` on findings) are
additive.

Findings that cost users almost nothing (``findings.rank.is_minor``: under ``MINOR_SHARE`` of
their time) are kept out of ``findings``, in ``minor``: a report leads with what a user can act on.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar

import polars as pl
import polars.selectors as cs
from hopline.analyzer import attribution
from hopline.analyzer.attribution import Slo
from hopline.analyzer.io import ScanReport
from hopline.analyzer.findings import Finding, Findings
from hopline.analyzer.findings.model import iso_utc
from hopline.analyzer.findings.rank import MINOR_SHARE
from hopline.middleware.contract import VIEWS
from hopline.middleware.contract.events import printable
from hopline.middleware.contract.rules import LOOK, STAGE_ORDER, TTFT_PARTS
from rich.console import Console
from rich.table import Table
from rich.text import Text


def _counts(series: pl.Series) -> dict[str, int]:
    """Values and how often, most first, equal counts by value (``value_counts(sort=True)`` left
    ties in any order, different from run to run; ``bounded.exact_totals`` orders them so)."""
    counted = series.alias("value").value_counts(name="len").sort("len", "value", descending=[True, False])
    return {str(k): int(v) for k, v in counted.iter_rows()}


def _listed(timelines: pl.DataFrame, column: str, key: str) -> dict[str, Any]:
    """``negative_stages`` / ``missing_hops``: how many requests list something in ``column``,
    and how often each item is listed."""
    items = timelines.select(pl.col(column).explode().drop_nulls())[column]
    return {"requests": int(timelines[column].list.len().gt(0).sum()), key: _counts(items)}


@dataclass(frozen=True)
class Facts:
    """Every key of the findings object beside the findings, in the JSON's order, as JSON-ready
    values: the stages over all requests, the span, outcomes, windows, … The optional ones
    (``windows`` with requests, ``goodput`` with --slo, ``scan`` from files, ``sample`` past the
    memory budget) are None when absent and left out of the JSON. ``Facts.EMPTY`` is the facts of
    no request (a one-second window); ``Facts.of`` computes them from per-request timelines."""

    EMPTY: ClassVar[Facts]
    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"windows", "goodput", "scan", "sample"})

    requests: int = 0
    window_s: float = 1.0
    stages: dict[str, dict] = field(default_factory=dict)
    split_requests: int = 0
    dominant: str | None = None
    span: dict[str, Any] = field(default_factory=lambda: {"start": None, "end": None, "seconds": 0.0})
    outcomes: dict[str, int] = field(default_factory=dict)
    negative_stages: dict[str, Any] = field(default_factory=lambda: {"requests": 0, "by_stage": {}})
    missing_hops: dict[str, Any] = field(default_factory=lambda: {"requests": 0, "by_hop": {}})
    by_scope: dict[str, list[dict]] = field(default_factory=dict)
    windows: list[dict] | None = None
    goodput: dict | None = None
    scan: dict | None = None
    sample: dict | None = None  # {"requests", "of", "seed"}: the statistics' sample (``bounded``)

    @classmethod
    def of(
        cls,
        timelines: pl.DataFrame,
        *,
        window_s: float,
        by: tuple[str, ...],
        slo: Slo | None = None,
        scan: ScanReport | None = None,
    ) -> Facts:
        """The facts of ``timelines`` (one row per request) in ``window_s`` windows, broken down
        by the scopes ``by``; goodput with ``slo``; the reader's counts with ``scan``."""
        scanned = scan.to_dict() if scan is not None else None
        if timelines.height == 0:
            return replace(cls.EMPTY, window_s=window_s, scan=scanned)
        start, end = timelines["start"].min(), timelines["start"].max()
        overall, scope_rows = attribution.scope_stats(timelines, by)
        stages = attribution.stage_table(overall)
        split = overall.get("split_requests", 0)
        series = attribution.windowed(timelines.lazy(), window_s).with_columns(
            cs.float().round(3), pl.col("window").dt.strftime("%Y-%m-%dT%H:%M:%SZ")
        )
        series = series.collect()
        return cls(
            requests=timelines.height,
            window_s=window_s,
            stages=stages,
            split_requests=split,
            dominant=attribution.dominant(stages, split),
            span={"start": iso_utc(start), "end": iso_utc(end), "seconds": round(end - start, 3)},
            outcomes=_counts(timelines["outcome"].cast(pl.String)),
            negative_stages=_listed(timelines, "negative", "by_stage"),
            missing_hops=_listed(timelines, "missing", "by_hop"),
            by_scope=attribution.scope_tables(scope_rows),
            windows=series.select(c.name for c in series if c.null_count() < c.len()).to_dicts(),
            goodput=attribution.goodput(timelines.lazy(), slo) if slo is not None else None,
            scan=scanned,
        )

    def to_json(self, findings: Findings) -> dict:
        """The findings object: these facts with ``findings`` after the stages (as DESIGN.md
        shows it); the optional keys only when present."""
        out: dict = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.name in self.OPTIONAL:
                continue
            out[f.name] = value
            if f.name == "stages":
                out.update(findings.to_json())
        return out


Facts.EMPTY = Facts()


@dataclass(frozen=True)
class Analysis:
    """One analysis: the decided findings (typed) and the facts around them. Outputs read it;
    ``to_json`` is the object ``hopline analyze --json`` prints."""

    findings: Findings
    facts: Facts

    def to_json(self) -> dict:
        return self.facts.to_json(self.findings)


# --- terminal ---------------------------------------------------------------------------------
# Readable at 80 columns: no table is wider than 80 characters; long text wraps inside its cell.


def plural(count: int, noun: str) -> str:
    """``1 request``, ``2 requests``, ``1,024 requests``."""
    return f"{count:,} {noun}" if count == 1 else f"{count:,} {noun}s"


def _fmt(value: float | None, unit: str = "") -> str:
    """One number format everywhere: ms with one decimal below 100, whole numbers above."""
    if value is None:
        return "–"
    if unit == "%":
        return f"{value * 100:.0f}%"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.1f}"


def _label(stage: str) -> str:
    look = LOOK.get(stage)
    return look.label if look else stage.replace("_", " ")


def _views_table(stages: dict[str, dict]) -> Table | None:
    """TTFT and e2e per view; for a reasoning model, a view's time to its first *content* token
    beside it (its TTFT is the first reasoning token)."""
    rows = []
    for v in VIEWS:
        rows.append((v, stages.get(f"{v}_ttft"), stages.get(f"{v}_e2e")))
        if stages.get(f"{v}_content_ttft"):
            rows.append((f"{v}, first content", stages[f"{v}_content_ttft"], None))
    rows = [r for r in rows if r[1] or r[2]]
    if not rows:
        return None
    table = Table(title="As each component sees it (ms)", title_justify="left", header_style="bold")
    for name in ("view", "TTFT p50", "p90", "p99", "e2e p50", "p90", "p99"):
        table.add_column(name, justify="left" if name == "view" else "right")
    for view, ttft, e2e in rows:
        cells = [_fmt((ttft or {}).get(k)) for k in ("p50_ms", "p90_ms", "p99_ms")]
        cells += [_fmt((e2e or {}).get(k)) for k in ("p50_ms", "p90_ms", "p99_ms")]
        table.add_row(view, *cells)
    return table


def _stage_table(stages: dict[str, dict], split_requests: int) -> Table:
    """Stages in the order a request meets them; shares of TTFT over the requests whose parts
    add up to their TTFT; stand-ins (fallbacks) after the split terms, with their counts."""
    table = Table(
        title=f"Where the time goes (shares of TTFT over {plural(split_requests, 'request')} with a complete split)",
        title_justify="left",
        header_style="bold",
    )
    table.add_column("stage")
    for name in ("requests", "p50 ms", "p90 ms", "p99 ms", "of TTFT", "of e2e"):
        table.add_column(name, justify="right")
    terms = [s for s in STAGE_ORDER if s in stages and not LOOK[s].stands_for]
    standins = [s for s in STAGE_ORDER if s in stages and LOOK[s].stands_for]
    for stage in terms + standins:
        row = stages[stage]
        name = _label(stage) if stage not in standins else f"{_label(stage)} (stand-in)"
        table.add_row(
            name,
            f"{row['count']:,}",
            _fmt(row["p50_ms"]),
            _fmt(row["p90_ms"]),
            _fmt(row["p99_ms"]),
            _fmt(row["share_of_ttft"], "%"),
            _fmt(row["share_of_e2e"], "%"),
            end_section=stage == terms[-1] and bool(standins) if terms else False,
        )
    return table


def _parts_text(stages: dict[str, dict], top: int = 3) -> str:
    """``queue 49% · prefill 37% · network 7%``: the largest shares of TTFT."""
    shares = sorted(
        ((s, v["share_of_ttft"]) for s, v in stages.items() if s in TTFT_PARTS and v.get("share_of_ttft")),
        key=lambda kv: -kv[1],
    )
    return " · ".join(f"{_label(s)} {share * 100:.0f}%" for s, share in shares[:top]) or "–"


def _scope_table(dim: str, rows: list[dict]) -> Table:
    table = Table(title=f"By {dim.replace('_', ' ')}", title_justify="left", header_style="bold")
    table.add_column(dim.replace("_", " "), overflow="fold", max_width=24)
    table.add_column("requests", justify="right")
    table.add_column("TTFT p50", justify="right")
    table.add_column("largest parts of TTFT", overflow="fold")
    for r in rows:
        ttft = next((r["stages"][f"{v}_ttft"] for v in VIEWS if f"{v}_ttft" in r["stages"]), {})
        parts = _parts_text(r["stages"]) if r.get("dominant") else "too few complete splits"
        table.add_row(Text(printable(str(r["scope"][dim]))), f"{r['requests']:,}", _fmt(ttft.get("p50_ms")), parts)
    return table


def _findings_table(title: str, findings: tuple[Finding, ...], first: int = 1) -> Table:
    table = Table(title=title, title_justify="left", header_style="bold")
    for name in ("#", "kind", "finding", "requests"):
        table.add_column(name, justify="right" if name in ("#", "requests") else "left")
    for i, f in enumerate(findings, first):
        table.add_row(str(i), f.kind, Text(printable(f.sentence)), f"{f.affected_requests:,}")
    return table


def minor_line(count: int, command: str) -> str:
    """The one line that says minor findings exist and how to list them (terminal and HTML)."""
    return (
        f"{plural(count, 'minor finding')} (each under {MINOR_SHARE:.0%} of users' time), "
        f"see `{command} --all`"
    )


def sample_line(facts: Facts) -> str | None:
    """What a sampled analysis (``bounded``: a log past its memory budget) was computed from, said
    beside the report: the statistics and findings come from the sample, the counts from all."""
    sample = facts.sample
    if not sample:
        return None
    return (
        f"Statistics and findings from a seeded sample of {sample['requests']:,} of "
        f"{plural(sample['of'], 'request')}; requests, outcomes, negative stages and missing hops "
        "are counted over all of them."
    )


def _render_findings(findings: Findings, console: Console, show_minor: bool, command: str) -> None:
    """The findings table; the minor ones as one line (``command`` is how to see them), or a
    table of their own with ``show_minor`` (``--all``)."""
    if findings.findings:
        console.print(_findings_table("Findings (largest effect on users' time first)", findings.findings))
    else:
        quiet = f"No shift or pitfall costs users {MINOR_SHARE:.0%} of their time or more."
        console.print(f"[green]{quiet if findings.minor else 'No shifts or pitfalls found.'}[/]")
    if findings.minor and show_minor:
        title = f"Minor findings (each under {MINOR_SHARE:.0%} of users' time)"
        console.print(_findings_table(title, findings.minor, first=len(findings.findings) + 1))
    elif findings.minor:
        console.print(minor_line(len(findings.minor), command), markup=False, highlight=False)


HEAD_WIDTH = 80  # the report's first line fits a terminal of 80 columns


def head_lines(facts: Facts) -> list[str]:
    """``2,400 requests, 2026-01-05 10:00:00 → 10:01:59 UTC (119 s, window 1 s)``: one line of at
    most ``HEAD_WIDTH`` columns, or two when the span crosses days on a long run."""
    span = facts.span
    count = f"[bold]{plural(facts.requests, 'request')}[/]"
    sizes = f"({span['seconds']:,.0f} s, window {facts.window_s:g} s)"
    if not span["start"] or not span["end"]:
        return [f"{count} {sizes}"]
    start, end = (span[k].replace("T", " ").removesuffix("Z") for k in ("start", "end"))
    if start[:10] == end[:10]:
        end = end[11:]
    line = f"{count}, {start} → {end} UTC {sizes}"
    if len(line) - len("[bold][/]") <= HEAD_WIDTH:
        return [line]
    return [f"{count} {sizes}", f"from {span['start']} to {span['end']}"]


def render(
    analysis: Analysis, console: Console, *, show_minor: bool = False, command: str = "hopline analyze …"
) -> None:
    """The analysis for a person: what to look at first, then the numbers behind it. Minor
    findings are one line (``command`` is how to see them), or a table of their own with
    ``show_minor`` (``--all``)."""
    facts = analysis.facts
    for line in head_lines(facts):
        console.print(line)
    sampled = sample_line(facts)
    if sampled:
        console.print(sampled, markup=False, highlight=False)
    _render_findings(analysis.findings, console, show_minor, command)
    views = _views_table(facts.stages)
    if views is not None:
        console.print(views)
    console.print(_stage_table(facts.stages, facts.split_requests))
    if facts.dominant:
        largest = f"[bold]{_label(facts.dominant)}[/] ({_parts_text(facts.stages)})"
        console.print(f"Largest part of TTFT: {largest}")
    for dim, rows in facts.by_scope.items():
        if len(rows) >= 2:
            console.print(_scope_table(dim, rows))
    good = facts.goodput
    if good:
        targets = ", ".join(f"{k.removesuffix('_ms')} ≤ {v:g} ms" for k, v in good["targets"].items())
        line = f"Goodput ({targets}): {good['good']:,} of {good['requests']:,} requests met every target"
        if good["goodput_rps"] is not None:
            line += f", {good['goodput_rps']:.2f} req/s"
        if good["culprit"]:
            line += f"; misses spent most extra time in [bold]{good['culprit']}[/] (+{good['excess_ms'][good['culprit']]:.0f} ms)"
        console.print(line)
    outcomes = ", ".join(f"{k} {v:,}" for k, v in facts.outcomes.items())
    console.print(f"Outcomes: {outcomes or '–'}")
    neg = facts.negative_stages
    if neg["requests"]:
        detail = ", ".join(f"{k} {v:,}" for k, v in neg["by_stage"].items())
        console.print(
            f"[yellow]{plural(neg['requests'], 'request')} with negative stages ({detail}): instrumentation or clock problem[/]"
        )
    miss = facts.missing_hops
    if miss["requests"]:
        detail = ", ".join(f"{k} {v:,}" for k, v in list(miss["by_hop"].items())[:6])
        console.print(f"{plural(miss['requests'], 'request')} with missing hops ({detail})")
    scan = facts.scan
    if scan:
        console.print(
            f"Read {plural(scan['files'], 'file')}, {plural(scan['lines'], 'line')}; "
            f"{plural(scan['bad_lines'], 'bad line')}"
        )
        for err in scan["errors"]:
            console.print(f"  {err}", style="red", markup=False, highlight=False)
