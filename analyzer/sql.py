"""The timelines view as SQL: the contract's stage table and the rule book compiled for the engine
where the events already live (DuckDB, Spark, Trino, ClickHouse).

``timelines_sql(dialect, source)`` returns one ``SELECT`` over a table in the collector's storage
schema (``contract.STORAGE_COLUMNS``) with one row per request and the columns of Polars'
``timelines.timelines()`` (``timelines.COLUMNS``: hop times, attributes, scopes, stages, ratios,
outcome, negative stages, missing hops), so the heavy pivot runs next to the data and
``hopline analyze --timelines`` runs the statistics on the small per-request table it exports.

Like ``timelines.py``, everything is generated from the contract's data (``INPUTS``, ``STAGES``,
``RATIOS``, ``ATTRIBUTE_SOURCES``) and the rule book (``SCOPE_SOURCES``, ``OUTCOME_RULES``,
``EXPECTED_HOPS``, ``TRACE_RULE``): never a second hand-written copy of a rule.

The query is written once in DuckDB's dialect and rendered into the others by sqlglot, which
knows each engine's spelling (``arg_min`` / ``min_by`` / ``argMin``, list literals and
lambdas, integer division) better than four hand-kept strings would. Only aggregate functions
every engine has are used; the one semantic difference between them (whether ``arg_min``
skips a null value) is sidestepped: a chosen event's attribute is read as "null when the
chosen event's flag says it is null, else ``arg_min`` of the value", which is the chosen
event's value under either rule. The pick key is the one ``timelines.pick_key`` computes:
``ts - attempt * 2**24``, smallest on the highest attempt's earliest event.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import polars as pl
import sqlglot
import typer
from hopline.middleware.contract.errors import HoplineError
from hopline.analyzer.io import SCHEMA
from hopline.analyzer.timelines import (
    ATTEMPT_SPAN_S,
    ATTRIBUTE_COLUMNS,
    COLUMNS,
    ERROR_ATTRS,
    FAILURE_SOURCES,
    FIRST_HOPS,
    GAP_COLUMNS,
    HOP_ATTRS,
    NEGATIVE_TOLERANCE_S,
    READ_HOPS,
    SCOPE_RANK_SPAN,
    SOURCES,
    TIMED_HOPS,
    _source_hops,
    timelines,
)
from hopline.middleware.exits import UsageError
from hopline.middleware.contract import (
    ATTRIBUTE_SOURCES,
    FINAL_HOPS,
    HOPS,
    INPUTS,
    LEG_HOPS,
    PREFILL_LEG,
    RATIOS,
    STAGES,
    Formula,
    component,
)
from hopline.middleware.contract.rules import (
    CANCEL_ERRORS,
    CANCEL_STATUSES,
    COMPONENTS,
    ENDING_OF_HOP,
    EXPECTED_HOPS,
    OUTCOME_RULES,
    SCOPE_SOURCES,
    TRACE_RULE,
)

DIALECTS = ("duckdb", "spark", "trino", "clickhouse")
SOURCE_MARK = "hopline_source_table"  # replaced by the caller's table (expression) after rendering
# One row per request, as Polars makes it: what a table exported from the view is read back as.
TIMELINES_SCHEMA: pl.Schema = timelines(pl.LazyFrame(schema=SCHEMA)).collect_schema()
SPAN = f"{ATTEMPT_SPAN_S:.1f}"
# The event columns the query reads (everything else in the store is left where it is).
READ_COLUMNS = tuple(
    dict.fromkeys(
        ["request_id", "hop", "attempt", "ts", "trace_id", "leg"]
        + [src.field for sources in SCOPE_SOURCES.values() for src in sources]
        + [attr for _, attr in HOP_ATTRS]
        + list(SOURCES)
    )
)


def _lit(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _slug(hop: str) -> str:
    """``client.sent`` -> ``client_sent``: a hop as part of a plain identifier (no quoting needed)."""
    return hop.replace(".", "_")


def _hop_in(hops: list[str] | tuple[str, ...]) -> str:
    return f"hop = {_lit(hops[0])}" if len(hops) == 1 else f"hop IN ({', '.join(map(_lit, hops))})"


def _key(hop: str) -> str:
    """The pick key on ``hop``'s events only (null on every other event)."""
    return f"CASE WHEN hop = {_lit(hop)} THEN ts - attempt * {SPAN} END"


def _chosen(column: str, hop: str) -> str:
    """``column`` of ``hop``'s chosen event, null when that event lacks it (see the module docstring)."""
    return (
        f"CASE WHEN ARG_MIN(CASE WHEN {column} IS NULL THEN 1 ELSE 0 END, {_key(hop)}) = 0 "
        f"THEN ARG_MIN({column}, {_key(hop)}) END"
    )


def _t(hop: str) -> str:
    return f"_t_{_slug(hop)}"


def _a(hop: str) -> str:
    return f"_a_{_slug(hop)}"


def _v(hop: str, attr: str) -> str:
    return f"_v_{_slug(hop)}__{attr}"


def _comp_hops(comp: str) -> list[str]:
    return [h for h in HOPS if component(h) == comp]


def _aggregates() -> list[str]:
    """Per request (GROUP BY request_id): the chosen event's time, attempt and attributes per hop,
    first times, each component's presence, top attempt and ending, and the scope attributes."""
    # no alias is the name of an event column: ClickHouse would read the alias inside other aggregates
    cols = ["MAX(trace_id) AS _trace_id", "MAX(attempt) + 1 AS attempts"]
    for hop in TIMED_HOPS:
        cols += [f"ARG_MIN(ts, {_key(hop)}) AS {_t(hop)}", f"ARG_MIN(attempt, {_key(hop)}) AS {_a(hop)}"]
    pairs = dict.fromkeys(list(HOP_ATTRS) + [(h, name) for name, hops in SOURCES.items() for h in hops])
    cols += [f"{_chosen(attr, hop)} AS {_v(hop, attr)}" for hop, attr in pairs]
    cols += [f"MIN(CASE WHEN hop = {_lit(h)} THEN ts END) AS _first_{_slug(h)}" for h in FIRST_HOPS]
    cancel = (
        f"CASE WHEN status IN ({', '.join(map(str, CANCEL_STATUSES))}) "
        f"OR error IN ({', '.join(map(_lit, CANCEL_ERRORS))}) THEN 1 ELSE 0 END"
    )
    for comp in COMPONENTS:
        here = _hop_in(_comp_hops(comp))
        end_key = f"CASE WHEN {_hop_in(FINAL_HOPS[comp])} THEN -(ts + attempt * {SPAN}) END"
        cols += [
            f"MIN(CASE WHEN {here} THEN ts END) AS _seen_{comp}",
            f"MAX(CASE WHEN {here} THEN attempt END) AS _top_{comp}",
            f"ARG_MIN(hop, {end_key}) AS _endhop_{comp}",
            f"ARG_MIN(attempt, {end_key}) AS _endatt_{comp}",
            f"ARG_MIN({cancel}, {end_key}) AS _endcancel_{comp}",
        ]
    for name, chain in {**SCOPE_SOURCES, **FAILURE_SOURCES}.items():
        key, value = [], []
        for rank, src in enumerate(chain):
            here = f"{_hop_in(_source_hops(src.where))} AND {src.field} IS NOT NULL"
            if src.leg is not None:
                here += f" AND leg = {_lit(src.leg)}"
            sign = "+" if src.first else "-"  # a first source: the lowest attempt, earliest
            key.append(f"WHEN {here} THEN ts {sign} attempt * {SPAN} + {rank * SCOPE_RANK_SPAN:.1f}")
            value.append(f"WHEN {here} THEN {src.field}")
        cols.append(f"ARG_MIN(CASE {' '.join(value)} END, CASE {' '.join(key)} END) AS _scope_{name}")
    return cols


def _ending(comp: str) -> str:
    """rules' ending of a component (done / rejected / cancel / error; null without a last word
    for its highest attempt)."""
    whens = []
    for hop in FINAL_HOPS[comp]:
        kind = ENDING_OF_HOP[hop]
        then = (
            f"CASE WHEN _endcancel_{comp} = 1 THEN 'cancel' ELSE 'error' END" if kind == "error" else _lit(kind)
        )
        whens.append(f"WHEN _endhop_{comp} = {_lit(hop)} THEN {then}")
    return (
        f"CASE WHEN _endhop_{comp} IS NULL OR _endatt_{comp} <> _top_{comp} THEN NULL {' '.join(whens)} END"
    )


def _row() -> list[str]:
    """From the aggregated row: the contract's inputs and attributes, the per-request extras, and
    what outcome and missing hops need."""
    cols = [
        "request_id",
        *(f"_scope_{name} AS {name}" for name in SCOPE_SOURCES),
        f"COALESCE({', '.join(f'_first_{_slug(h)}' for h in FIRST_HOPS)}) AS start",
        "attempts",
        "_trace_id AS trace_id",
        "attempts - 1 AS retries",
        f"{_a('client.sent')} AS client_retries",
        *(f"_scope_{name} AS {name}" for name in FAILURE_SOURCES),
    ]
    for inp in INPUTS:
        if inp.attr is None:
            cols.append(f"{_t(inp.hop)} AS {inp.name}")
        elif inp.default is None:
            cols.append(f"{_v(inp.hop, inp.attr)} AS {inp.name}")
        else:
            value = f"COALESCE({_v(inp.hop, inp.attr)}, {inp.default!r})"
            cols.append(f"CASE WHEN {_t(inp.hop)} IS NOT NULL THEN {value} END AS {inp.name}")
    for name, column in ATTRIBUTE_COLUMNS.items():
        cols.append(f"COALESCE({', '.join(_v(h, name) for h in ATTRIBUTE_SOURCES[name])}) AS {column}")
    cols += [f"{_v(hop, attr)} AS {name}" for name, (hop, attr) in GAP_COLUMNS.items()]
    cols += [f"COALESCE({', '.join(_v(h, name) for h in SOURCES[name])}) AS {name}" for name in ERROR_ATTRS]
    cols += [f"_seen_{comp}" for comp in COMPONENTS]
    cols += [f"_top_{comp}" for comp in COMPONENTS]
    cols += [f"{_ending(comp)} AS _ending_{comp}" for comp in COMPONENTS]
    cols += [f"{_t(e.hop)} AS _has_{_slug(e.hop)}" for e in EXPECTED_HOPS]
    cols += [f"{_a(e.hop)} AS _att_{_slug(e.hop)}" for e in EXPECTED_HOPS if e.final_attempt]
    return cols


def formula_sql(formula: Formula, values: dict[str, str]) -> str:
    """One ``Formula``: the signed sum of its terms when its conditions hold, else null."""
    total = " ".join(("+ " if sign > 0 else "- ") + f"({values[name]})" for sign, name in formula.terms)
    conditions = [f"({values[name]}) IS NULL" for name in formula.when_null]
    conditions += [f"({values[name]}) IS NOT NULL" for name in formula.when_set]
    if formula.stream is not None:
        conditions.append(f"stream = {'TRUE' if formula.stream else 'FALSE'}")
    total = total.removeprefix("+ ")
    return f"CASE WHEN {' AND '.join(conditions)} THEN {total} END" if conditions else f"({total})"


def stage_columns() -> dict[str, str]:
    """Every stage (a coalesce over its formulas, in order) and ratio as a SQL expression over the
    inputs, earlier stages written out in full (no alias refers to another in one SELECT)."""
    values = {inp.name: f"CAST({inp.name} AS DOUBLE)" for inp in INPUTS}
    for stage in STAGES:
        exprs = [formula_sql(f, values) for f in stage.formulas]
        values[stage.name] = f"COALESCE({', '.join(exprs)})" if len(exprs) > 1 else exprs[0]
    for ratio in RATIOS:
        numerator = formula_sql(Formula(ratio.numerator), values)
        values[ratio.name] = (
            f"CASE WHEN output_tokens >= 2 AND (n IS NULL OR n = 1) "
            f"THEN {numerator} / CAST(output_tokens - 1 AS DOUBLE) END"
        )
    return {name: values[name] for name in [s.name for s in STAGES] + [r.name for r in RATIOS]}


def _ending_in(comp: str, endings: tuple[str | None, ...]) -> str:
    named = [e for e in endings if e is not None]
    test = f"COALESCE(_ending_{comp} IN ({', '.join(map(_lit, named))}), FALSE)" if named else "FALSE"
    if None in endings:
        test = f"({test} OR _ending_{comp} IS NULL)"
    return f"(_seen_{comp} IS NOT NULL AND {test})"


def _outcome() -> str:
    """rules.OUTCOME_RULES: the first rule that holds names the outcome, else ``incomplete``."""
    whens = []
    for rule in OUTCOME_RULES:
        if rule.who == "outer":
            inner = " ".join(
                f"WHEN _seen_{c} IS NOT NULL THEN {_ending_in(c, rule.endings)}" for c in COMPONENTS
            )
            cond = f"CASE {inner} ELSE FALSE END"
        elif rule.who == "any":
            cond = " OR ".join(_ending_in(c, rule.endings) for c in COMPONENTS)
        else:
            cond = _ending_in(rule.who, rule.endings)
        whens.append(f"WHEN {cond} THEN {_lit(rule.outcome)}")
    return f"CASE {' '.join(whens)} ELSE 'incomplete' END"


def _names_where(flags: list[tuple[str, str]]) -> str:
    """A list of the names whose condition holds, in the given order (an empty list for none)."""
    items = ", ".join(f"CASE WHEN {cond} THEN {_lit(name)} END" for name, cond in flags)
    return f"LIST_FILTER([{items}], x -> x IS NOT NULL)"


def _missing() -> str:
    """rules.EXPECTED_HOPS absent from the components that reported, in request order."""
    flags = []
    for exp in EXPECTED_HOPS:
        comp = component(exp.hop)
        expected = f"_seen_{comp} IS NOT NULL AND NOT {_ending_in(comp, exp.unless)}"
        if exp.stream is not None:
            expected += f" AND COALESCE(stream = {'TRUE' if exp.stream else 'FALSE'}, FALSE)"
        absent = f"_has_{_slug(exp.hop)} IS NULL"
        if exp.final_attempt:
            absent = f"({absent} OR _att_{_slug(exp.hop)} <> _top_{comp})"
        flags.append((exp.hop, f"{expected} AND {absent}"))
    return _names_where(flags)


def _negative() -> str:
    return _names_where([(s.name, f"{s.name} < -{NEGATIVE_TOLERANCE_S!r}") for s in STAGES])


def _stand_in(table: str = "") -> str:
    """rules.TRACE_RULE: the event's request ID is its own trace's stand-in (``table``: a qualifier)."""
    prefix, trace, rid = TRACE_RULE.prefix, f"{table}trace_id", f"{table}request_id"
    return (
        f"({trace} IS NOT NULL AND SUBSTRING({rid}, 1, LENGTH({trace}) + {len(prefix)}) "
        f"= CONCAT({_lit(prefix)}, {trace}))"
    )


def _read_hop() -> str:
    """``contract.read_hop``: a P/D prefill leg's engine hop is read as its ``prefill.*`` name."""
    whens = " ".join(f"WHEN {_lit(hop)} THEN {_lit(name)}" for hop, name in LEG_HOPS.items())
    return f"CASE WHEN leg = {_lit(PREFILL_LEG)} THEN CASE hop {whens} ELSE hop END ELSE hop END AS hop"


def _duckdb_query() -> str:
    """The whole view in DuckDB's dialect, over ``SOURCE_MARK``."""
    read = ", ".join(READ_COLUMNS)
    others = ", ".join(f"s.{c}" for c in READ_COLUMNS if c != "request_id")
    stand_in = _stand_in()
    stages = stage_columns()
    row_columns = [c.rsplit(" AS ", 1)[-1] for c in _row()]
    # ``NULLIF(o.owner, '')``: ClickHouse's LEFT JOIN gives '' (not NULL) where nothing matched by
    # default; a request ID is never empty, so '' is "no owner" in every dialect.
    return f"""
WITH src AS (
  SELECT {", ".join(_read_hop() if c == "hop" else c for c in READ_COLUMNS)} FROM {SOURCE_MARK}
), owners AS (
  SELECT trace_id, MAX(request_id) AS owner FROM src
  WHERE trace_id IS NOT NULL AND NOT {stand_in}
  GROUP BY trace_id HAVING COUNT(DISTINCT request_id) = {TRACE_RULE.owners}
), joined AS (
  SELECT {read} FROM src WHERE NOT COALESCE({stand_in}, FALSE)
  UNION ALL
  SELECT COALESCE(NULLIF(o.owner, ''), s.request_id) AS request_id, {others}
  FROM src AS s LEFT JOIN owners AS o ON s.trace_id = o.trace_id
  WHERE {_stand_in("s.")}
), per_request AS (
  SELECT request_id, {", ".join(_aggregates())}
  FROM joined WHERE {_hop_in(READ_HOPS)} GROUP BY request_id
), inputs AS (
  SELECT {", ".join(_row())} FROM per_request
), staged AS (
  SELECT {", ".join(row_columns)}, {", ".join(f"{e} AS {n}" for n, e in stages.items())} FROM inputs
)
SELECT {", ".join(c for c in COLUMNS if c not in ("outcome", "negative", "missing"))},
  {_outcome()} AS outcome, {_negative()} AS negative, {_missing()} AS missing
FROM staged
"""


def timelines_sql(dialect: str = "duckdb", source: str = "events", pretty: bool = True) -> str:
    """The timelines view for ``dialect`` over ``source``: a table name, or any table expression
    of that dialect (``read_parquet('store/**/*.parquet')``, ``parquet.`/data/events```,
    ``file('events.parquet', Parquet)``), inserted as written."""
    if dialect not in DIALECTS:
        raise ValueError(f"unknown SQL dialect {dialect!r}; choose one of {', '.join(DIALECTS)}")
    source = source.strip()
    if not source or ";" in source:
        raise ValueError(f"--source must be one table name or table expression, got {source!r}")
    rendered = sqlglot.transpile(_duckdb_query(), read="duckdb", write=dialect, pretty=pretty)[0]
    return rendered.replace(SOURCE_MARK, source)


# --- reading an exported per-request table back --------------------------------------------------


class TimelinesError(HoplineError, ValueError):
    """A per-request table that is not the timelines view's output; the message says why."""


def read_timelines(path: Path) -> pl.DataFrame:
    """A Parquet table exported from the SQL view, typed as ``timelines()`` makes it.

    ``path`` is one Parquet file or a folder of them (Spark writes ``part-*.parquet`` files).
    Every column of ``timelines.COLUMNS`` must be there (columns beyond them are kept); a
    missing or uncastable column is a ``TimelinesError`` naming it.
    """
    path = Path(path)
    files = sorted(path.glob("**/*.parquet")) if path.is_dir() else [path]
    if not files:
        raise TimelinesError(f"no Parquet files (*.parquet) in {path}")
    try:
        frame = pl.read_parquet(files)
    except (OSError, pl.exceptions.ComputeError, pl.exceptions.InvalidOperationError) as exc:
        raise TimelinesError(f"cannot read {path} as Parquet: {str(exc).splitlines()[0]}") from exc
    absent = [c for c in COLUMNS if c not in frame.columns]
    if absent:
        shown = ", ".join(absent[:6]) + (f" and {len(absent) - 6} more" if len(absent) > 6 else "")
        raise TimelinesError(f"{path} is not a timelines table (`hopline sql`): it lacks {shown}")
    casts = []
    for name in COLUMNS:
        dtype = TIMELINES_SCHEMA[name]
        column = pl.col(name)
        if isinstance(dtype, pl.Enum):
            column = column.cast(pl.String)
        casts.append(column.cast(dtype).alias(name))
    extra = [c for c in frame.columns if c not in COLUMNS]
    try:
        return frame.select(*casts, *extra)
    except (pl.exceptions.InvalidOperationError, pl.exceptions.ComputeError) as exc:
        raise TimelinesError(f"{path}: a column has the wrong type ({str(exc).splitlines()[0]})") from exc


# --- ``hopline sql`` -------------------------------------------------------------------------------

HELP = """Print the timelines view as SQL, to run where the events are (DuckDB, Spark, Trino, ClickHouse).

One SELECT over a table of hop events in the collector's storage columns; one row per request with the columns of `hopline analyze`'s timelines (hop times, stages, scopes, tokens, outcome, missing hops). Export its result as Parquet and run the statistics on it with `hopline analyze --timelines FILE`.

Example: [bold]hopline sql --dialect spark --source 'parquet.`s3://logs/hopline/events`'[/bold]

DuckDB: [bold]duckdb -c "COPY ($(hopline sql --source "read_parquet('store/events/**/*.parquet')")) TO 't.parquet'"[/bold]
"""


def sql_command(
    dialect: Annotated[
        str, typer.Option(help=f"The engine's SQL dialect: {', '.join(DIALECTS)}.")
    ] = "duckdb",
    source: Annotated[
        str,
        typer.Option(
            help="The events table: a name (logs.hop_events) or a table expression of the dialect, "
            "e.g. read_parquet('events/**/*.parquet'), parquet.`/data/events`, file('e.parquet', Parquet)."
        ),
    ] = "events",
) -> None:
    try:
        text = timelines_sql(dialect, source)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    typer.echo(text)


def register(app: typer.Typer) -> None:
    """Add ``hopline sql`` to the ``hopline`` command."""
    app.command(name="sql", help=HELP)(sql_command)
