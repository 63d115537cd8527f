"""Events -> one row per request: every hop time, every stage, derived from the contract's table.

The Polars expressions here are generated from ``contract.INPUTS``, ``ATTRIBUTE_SOURCES``,
``STAGES`` and ``RATIOS`` (the same objects ``contract.compute_stages`` evaluates in plain
Python), so the collector and the analyzer cannot disagree; ``tests/golden_stages.json`` checks it.

Query shape (the part that decides speed and memory on tens of millions of events): the
contract picks, per hop, the event of the highest attempt (earliest ``ts`` on a tie; the first in
the log on an exact tie, as ``contract.request_inputs`` does): the minimum of
``pick = ts - attempt * 2**24`` (exact in float64 for Unix timestamps; correctly ordered while
one hop's attempts of one request lie within 2**24 s = 194 days). Scope attributes and a
component's ending are chosen the same way by their own keys (``_keyed_columns``). The events
are reduced to one row per request by ``picks.per_request``: each (request, hop) cell's chosen
event found once, each key's once, every output column a gather at those rows (2.4M events:
~2 CPU-s). ``aggregated`` is the same step as one Polars ``group_by`` of ~130 ``min`` /
``min_by`` aggregations (6.3 CPU-s there, and on an exact tie it took either event, differently
from run to run): the reference the tests hold ``picks`` to, and the fallback should two request
IDs share a hash. ``columns`` narrows it all: only what the asked columns are computed from is
read, keyed and gathered. No window expression anywhere: ``over()`` does not stream and
materialised every event (13.7 GiB for 59M events).
"""

from __future__ import annotations

from functools import partial

import polars as pl
from hopline.analyzer import picks
from hopline.middleware.contract import (
    ALL_HOPS,
    ATTRIBUTE_SOURCES,
    ERROR_HOPS,
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
    OUTCOMES,
    SCOPE_SOURCES,
    TRACE_RULE,
    Source,
    scope_sources,
)

HOP_ENUM = pl.Enum(list(ALL_HOPS))  # the hops, and a P/D prefill leg's engine hops as read (LEG_HOPS)
# Few distinct values: categorical while grouping (4 bytes an event instead of a 16-byte view).
LABELS = ["service", "replica", "model", "upstream", "finish_reason"]
ATTEMPT_SPAN_S = 2.0**24  # the attempt weight in ``pick``: a power of two keeps it exact
NEGATIVE_TOLERANCE_S = 1e-9  # as contract.negative_stages
OUTCOME_ENUM = pl.Enum(list(OUTCOMES))
SCOPE_RANK_SPAN = 1e12  # a scope source's rank outweighs any pick (Unix seconds, ~1.7e9)
ERROR_ATTRS = ("status", "error")
MASK_BITS = 32  # flags per bit mask in ``names_where``
# Per-request extras read from one hop's chosen event, beyond the contract's inputs/attributes:
# where the largest output gap was (long_prefill_stall) as the engine and the client saw it.
GAP_COLUMNS = {
    "engine_max_gap_s": ("engine.last_token", "max_gap_s"),
    "engine_max_gap_at": ("engine.last_token", "max_gap_at"),
    "client_max_gap_s": ("client.last_token", "max_gap_s"),
    "client_max_gap_at": ("client.last_token", "max_gap_at"),
}


def pick_key() -> pl.Expr:
    """The contract's pick as one number per event: the smallest is the highest attempt's
    earliest event (see the module docstring)."""
    return pl.col("ts") - pl.col("attempt").cast(pl.Float64) * ATTEMPT_SPAN_S


def first_key() -> pl.Expr:
    """A ``first`` source's order (rules.Source): the smallest is the lowest attempt's earliest event."""
    return pl.col("ts") + pl.col("attempt").cast(pl.Float64) * ATTEMPT_SPAN_S


def _hop_ts(hop: str) -> str:
    return f"_ts:{hop}"


def _hop_attr(hop: str, attr: str) -> str:
    return f"_{attr}:{hop}"


def _attr(name: str) -> str:
    return f"_attr:{name}"


# Attributes taken from the first listed hop whose chosen event carries them: the contract's,
# plus the error's status and text (from the error hops, in a fixed order).
SOURCES: dict[str, tuple[str, ...]] = {
    **ATTRIBUTE_SOURCES,
    **{name: tuple(sorted(ERROR_HOPS)) for name in ERROR_ATTRS},
}
# Attributes read from one hop: the stage table's inputs and the output-gap columns.
HOP_ATTRS: tuple[tuple[str, str], ...] = tuple(
    dict.fromkeys(
        [(inp.hop, inp.attr) for inp in INPUTS if inp.attr is not None] + list(GAP_COLUMNS.values())
    )
)
# Hops whose time is needed: inputs, presence checks (missing hops, outcome, defaults).
TIMED_HOPS: tuple[str, ...] = tuple(
    dict.fromkeys(
        [inp.hop for inp in INPUTS]
        + [exp.hop for exp in EXPECTED_HOPS]
        + sorted(ERROR_HOPS)
    )
)
FIRST_HOPS = ("client.sent", "gateway.received", "engine.received")  # where a request starts


def _source_hops(where: str) -> list[str]:
    """The hops a rule-book source reads: one hop, or every hop of a component."""
    return [where] if "." in where else [h for h in ALL_HOPS if component(h) == where]


# Events of other hops carry nothing a timeline uses: dropped before grouping.
READ_HOPS = list(
    dict.fromkeys(
        TIMED_HOPS
        + tuple(h for hops in SOURCES.values() for h in hops)
        + tuple(h for h, _ in HOP_ATTRS)
        + tuple(h for sources in SCOPE_SOURCES.values() for src in sources for h in _source_hops(src.where))
    )
)
# The status the first failed attempt got (the replica is the scope ``failed_replica``), read as
# the scope attributes are: the failover finding's "r3 answered 503".
FAILURE_SOURCES = {"failed_status": (Source("engine.error", "status", first=True),)}
SCOPE_FIELDS = tuple(dict.fromkeys(src.field for sources in SCOPE_SOURCES.values() for src in sources))


def _hop_key(hop: str) -> str:
    return f"_k:{hop}"


def _hop_pick(hop: str) -> str:
    return f"_pick:{hop}"


def _unpick(pick: pl.Expr) -> pl.Expr:
    """The chosen event's ``ts`` from its pick: its attempt is the number of ``ATTEMPT_SPAN_S``
    between the pick and any time of the request (all lie well within half a span)."""
    attempt = ((pl.col("_ts:request") - pick) / ATTEMPT_SPAN_S).round()
    return pick + attempt * ATTEMPT_SPAN_S


def _source(name: str, hop: str) -> str:
    return f"_{name}@{hop}"


def _hop_columns() -> list[pl.Expr]:
    """Row-wise columns the reference ``group_by`` aggregates per hop: each read hop's pick (null on
    other hops' events), a hop's first time, each component's time and attempt."""
    hop = pl.col("hop")
    key = pick_key()
    cols = [pl.when(hop == h).then(key).alias(_hop_key(h)) for h in READ_HOPS]
    cols += [pl.when(hop == h).then(pl.col("ts")).alias(f"_first:{h}") for h in FIRST_HOPS]
    for comp in COMPONENTS:
        in_comp = hop.is_in(_component_hops(comp))
        cols.append(pl.when(in_comp).then(pl.col("ts")).alias(f"_ts:{comp}"))
        cols.append(pl.when(in_comp).then(pl.col("attempt")).alias(f"_att:{comp}"))
    return cols


def _component_hops(comp: str) -> list[str]:
    return [h for h in HOPS if component(h) == comp]


def _keyed_columns(sources: dict = SCOPE_SOURCES) -> list[pl.Expr]:
    """Row-wise keys and values of the choices among several hops: one per scope attribute, one
    per component's ending."""
    hop = pl.col("hop")
    cols = []
    # one key and value per scope attribute (rules.SCOPE_SOURCES), so each is one aggregation:
    # the first source the event belongs to and carries the field; its rank, then the pick
    # (highest attempt, earliest; a ``first`` source: lowest attempt, earliest) orders the candidates
    for name, chain in {**sources, **FAILURE_SOURCES}.items():
        key = value = pl
        for rank, src in enumerate(chain):
            here = hop.is_in(_source_hops(src.where)) & pl.col(src.field).is_not_null()
            if src.leg is not None:
                here = here & (pl.col("leg") == src.leg).fill_null(False)
            key_expr = first_key() if src.first else pick_key()
            key = key.when(here).then(key_expr + rank * SCOPE_RANK_SPAN)
            value = value.when(here).then(pl.col(src.field))
        cols += [key.alias(f"_key:{name}"), value.alias(f"_val:{name}")]
    # a component's ending (rules): its final hop of the highest attempt, the latest on a tie
    for comp in COMPONENTS:
        final = hop.is_in(list(FINAL_HOPS[comp]))
        cols.append(pl.when(final).then(-(pl.col("ts") + pl.col("attempt").cast(pl.Float64) * ATTEMPT_SPAN_S))
                    .alias(f"_endkey:{comp}"))
    cancel = pl.col("status").is_in(list(CANCEL_STATUSES)) | pl.col("error").is_in(list(CANCEL_ERRORS))
    cols.append(cancel.fill_null(False).alias("_cancel"))
    return cols


def _aggregations(sources: dict = SCOPE_SOURCES) -> list[pl.Expr]:
    """Per hop, the chosen event's pick (``min``) and attributes (``min_by`` the pick)."""
    aggs = [pl.col(_hop_key(h)).min().alias(_hop_pick(h)) for h in TIMED_HOPS]
    aggs.append(pl.col("ts").min().alias("_ts:request"))
    aggs += [pl.col(a).min_by(_hop_key(h)).alias(_hop_attr(h, a)) for h, a in HOP_ATTRS]
    aggs += [
        pl.col(name).min_by(_hop_key(h)).alias(_source(name, h))
        for name, hops in SOURCES.items()
        for h in hops
    ]
    aggs += [pl.col(f"_first:{h}").min() for h in FIRST_HOPS]
    aggs += [pl.col(f"_ts:{comp}").min().alias(f"_seen:{comp}") for comp in COMPONENTS]
    aggs += [pl.col(f"_val:{name}").min_by(f"_key:{name}").alias(name) for name in {**sources, **FAILURE_SOURCES}]
    for comp in COMPONENTS:
        aggs.append(pl.col("hop").min_by(f"_endkey:{comp}").alias(f"_endhop:{comp}"))
        aggs.append(pl.col("_cancel").min_by(f"_endkey:{comp}").alias(f"_endcancel:{comp}"))
        aggs.append(pl.col(f"_endkey:{comp}").min())
        aggs.append(pl.col(f"_att:{comp}").max().alias(f"_top:{comp}"))
    aggs.append((pl.col("attempt").max() + 1).alias("attempts"))  # tries seen by any component
    return aggs


def aggregated(read: pl.LazyFrame, sources: dict, traced: bool) -> pl.LazyFrame:
    """The per-request step as one Polars ``group_by`` (the reference ``picks.per_request`` is held
    to): ``read`` is the per-event frame with ``_keyed_columns``."""
    trace = pl.col("trace_id").max() if traced else pl.lit(None, pl.String)
    return (
        read.with_columns(_hop_columns())
        .group_by(pl.col("request_id"))
        .agg(trace.alias("trace_id"), *_aggregations(sources))
    )


def picks_plan(sources: dict) -> picks.Plan:
    """``_aggregations`` as ``picks.per_request`` builds them: by the event each one reads."""
    hop_columns = {_hop_pick(h): (h, "_pick") for h in TIMED_HOPS}
    hop_columns |= {_hop_attr(h, a): (h, a) for h, a in HOP_ATTRS}
    hop_columns |= {_source(name, h): (h, name) for name, hops in SOURCES.items() for h in hops}
    keyed = {name: (f"_key:{name}", f"_val:{name}") for name in {**sources, **FAILURE_SOURCES}}
    for comp in COMPONENTS:
        end = f"_endkey:{comp}"
        keyed |= {f"_endhop:{comp}": (end, "hop"), f"_endcancel:{comp}": (end, "_cancel"), end: (end, end)}
    earliest: dict[str, list[str] | None] = {"_ts:request": None}
    earliest |= {f"_first:{h}": [h] for h in FIRST_HOPS}
    earliest |= {f"_seen:{comp}": _component_hops(comp) for comp in COMPONENTS}
    tops: dict[str, list[str] | None] = {f"_top:{comp}": _component_hops(comp) for comp in COMPONENTS}
    tops["attempts"] = None
    return picks.Plan(hop_columns, keyed, earliest, tops, frozenset({"attempts"}))


def _per_request(read: pl.LazyFrame, sources: dict, traced: bool, need: set[str]) -> pl.LazyFrame:
    """``aggregated``'s columns in ``need``, built by ``picks.per_request`` when the plan is
    collected (the Polars ``group_by`` if it declines). Only the per-event columns those read are
    computed and read (Polars prunes ``read`` to them)."""
    full = aggregated(read, sources, traced).collect_schema()
    schema = pl.Schema({name: dtype for name, dtype in full.items() if name in need or name == "request_id"})
    plan = picks_plan(sources).only(set(schema))
    reads = ["request_id", "hop", "ts", "attempt", *(["trace_id"] if "trace_id" in schema and traced else [])]
    reads += [c for c in plan.reads() if c not in reads]

    def run() -> pl.DataFrame:
        events = read.select(*reads, pick_key().alias("_pick")).collect()
        frame = picks.per_request(events, plan, schema)
        if frame is None:
            frame = aggregated(read, sources, traced).select(list(schema)).collect()
        return frame

    return pl.defer(run, schema=schema)


def _needed(columns: list[str], layers: list[dict[str, pl.Expr]]) -> set[str]:
    """``columns`` and every column they are computed from through ``layers`` (each computed
    from the ones before it and the per-request aggregations)."""
    need = set(columns)
    for layer in reversed(layers):
        for name, expr in layer.items():
            if name in need:
                need |= set(expr.meta.root_names())
    return need


def _attempt_of(pick: pl.Expr) -> pl.Expr:
    """The attempt of a chosen event, from its pick (see ``_unpick``)."""
    return ((pl.col("_ts:request") - pick) / ATTEMPT_SPAN_S).round().cast(pl.Int64)


def _ending(comp: str) -> pl.Expr:
    """rules' ending of a component: done / rejected / cancel / error, null without a last word
    for its highest attempt (or when it never reported)."""
    hop = pl.col(f"_endhop:{comp}").cast(pl.String)
    attempt = ((-pl.col(f"_endkey:{comp}") - pl.col("_ts:request")) / ATTEMPT_SPAN_S).round().cast(pl.Int64)
    kind = pl.when(hop.is_null() | (attempt != pl.col(f"_top:{comp}"))).then(None)
    for h in FINAL_HOPS[comp]:
        ending = ENDING_OF_HOP[h]
        if ending == "error":
            kind = kind.when(hop == h).then(
                pl.when(pl.col(f"_endcancel:{comp}")).then(pl.lit("cancel")).otherwise(pl.lit("error"))
            )
        else:
            kind = kind.when(hop == h).then(pl.lit(ending))
    return kind


def _sourced() -> dict[str, pl.Expr]:
    """Hop times back from their pick; attributes from the first listed hop whose chosen event
    carries them; each component's ending."""
    exprs = {_hop_ts(h): _unpick(pl.col(_hop_pick(h))) for h in TIMED_HOPS}
    exprs |= {
        _attr(name): pl.coalesce([pl.col(_source(name, h)) for h in hops]) for name, hops in SOURCES.items()
    }
    for comp in COMPONENTS:
        exprs[f"_ending:{comp}"] = _ending(comp)
    return exprs


def _present(hop: str) -> pl.Expr:
    return pl.col(_hop_ts(hop)).is_not_null()


def _inputs() -> dict[str, pl.Expr]:
    """``contract.request_inputs`` as expressions over the aggregated row."""
    exprs: dict[str, pl.Expr] = {}
    for inp in INPUTS:
        if inp.attr is None:
            exprs[inp.name] = pl.col(_hop_ts(inp.hop))
        else:
            value = pl.col(_hop_attr(inp.hop, inp.attr))
            if inp.default is not None:
                value = pl.when(_present(inp.hop)).then(value.fill_null(inp.default))
            exprs[inp.name] = value
    for name in ATTRIBUTE_SOURCES:
        exprs[name] = pl.col(_attr(name))
    return exprs


def formula_expr(formula: Formula, values: dict[str, pl.Expr]) -> pl.Expr:
    """One ``Formula``: the signed sum of its terms when its conditions hold, else null."""
    total: pl.Expr | None = None
    for sign, name in formula.terms:
        term = values[name].cast(pl.Float64)
        if total is None:
            total = term if sign > 0 else -term
        else:
            total = total + term if sign > 0 else total - term
    conditions = [values[name].is_null() for name in formula.when_null]
    conditions += [values[name].is_not_null() for name in formula.when_set]
    if formula.stream is not None:
        conditions.append(values["stream"] == formula.stream)
    return pl.when(*conditions).then(total) if conditions else total


def stage_exprs(values: dict[str, pl.Expr]) -> dict[str, pl.Expr]:
    """Every stage (a coalesce over its formulas, in order) and ratio, added to ``values``."""
    for stage in STAGES:
        exprs = [formula_expr(f, values) for f in stage.formulas]
        values[stage.name] = pl.coalesce(exprs) if len(exprs) > 1 else exprs[0]
    tokens, n = values["output_tokens"], values["n"]
    for ratio in RATIOS:
        numerator = formula_expr(Formula(ratio.numerator), values)
        ok = (tokens >= 2) & (n.is_null() | (n == 1))
        values[ratio.name] = pl.when(ok).then(numerator / (tokens - 1).cast(pl.Float64))
    return values


def _seen(comp: str) -> pl.Expr:
    return pl.col(f"_seen:{comp}").is_not_null()


def _ending_in(comp: str, endings: tuple[str | None, ...]) -> pl.Expr:
    """The component reported and its ending is one of ``endings`` (None: no last word)."""
    ending = pl.col(f"_ending:{comp}")
    named = [e for e in endings if e is not None]
    test = ending.is_in(named).fill_null(False) if named else pl.lit(False)
    if None in endings:
        test = test | ending.is_null()
    return _seen(comp) & test


def _outcome() -> pl.Expr:
    """rules.OUTCOME_RULES as one when-chain: the first rule that holds names the outcome."""
    chain = pl
    for rule in OUTCOME_RULES:
        if rule.who == "outer":
            # the outermost component that reported speaks for the user
            cond = pl.when(_seen(COMPONENTS[0])).then(_ending_in(COMPONENTS[0], rule.endings))
            for comp in COMPONENTS[1:]:
                cond = cond.when(_seen(comp)).then(_ending_in(comp, rule.endings))
            cond = cond.otherwise(False)
        elif rule.who == "any":
            cond = pl.any_horizontal([_ending_in(comp, rule.endings) for comp in COMPONENTS])
        else:
            cond = _ending_in(rule.who, rule.endings)
        chain = chain.when(cond).then(pl.lit(rule.outcome))
    return chain.otherwise(pl.lit("incomplete")).cast(OUTCOME_ENUM)


def names_where(flags: list[pl.Expr], names: list[str]) -> pl.Expr:
    """The list of ``names`` whose flag holds (null counts as false), in their order.

    The flags become a bit mask per row (cheap, columnar; one per ``MASK_BITS`` flags), and each
    distinct mask's list is made once: nearly every row has mask 0, so this is a lookup of a few
    lists rather than ``concat_list(...).list.drop_nulls()``, which built a list per row and flag
    (≈ 5 µs a row, a quarter of ``timelines()``'s CPU)."""
    parts = []
    for lo in range(0, len(flags), MASK_BITS):
        chunk, chunk_names = flags[lo : lo + MASK_BITS], names[lo : lo + MASK_BITS]
        mask = pl.sum_horizontal([f.fill_null(False).cast(pl.UInt64) * (1 << i) for i, f in enumerate(chunk)])
        names_of = partial(_names_of_masks, names=chunk_names)
        parts.append(mask.map_batches(names_of, return_dtype=pl.List(pl.String), is_elementwise=True))
    return parts[0] if len(parts) == 1 else pl.concat_list(parts)


def _names_of_masks(masks: pl.Series, names: list[str]) -> pl.Series:
    distinct = masks.unique().sort()
    lists = pl.Series([[n for i, n in enumerate(names) if m >> i & 1] for m in distinct], dtype=pl.List(pl.String))
    return lists.gather(distinct.search_sorted(masks))


def _missing() -> pl.Expr:
    """rules.EXPECTED_HOPS absent from the components that reported, in request order."""
    flags = []
    for exp in EXPECTED_HOPS:
        comp = component(exp.hop)
        expected = _seen(comp) & ~_ending_in(comp, exp.unless)
        if exp.stream is not None:
            expected = expected & (pl.col("stream") == exp.stream).fill_null(False)
        absent = ~_present(exp.hop)
        if exp.final_attempt:
            absent = absent | (_attempt_of(pl.col(_hop_pick(exp.hop))) != pl.col(f"_top:{comp}"))
        flags.append(expected & absent)
    return names_where(flags, [exp.hop for exp in EXPECTED_HOPS])


def _negative() -> pl.Expr:
    """Stages (views included) below zero: an instrumentation or clock problem, never clamped."""
    return names_where([pl.col(s.name) < -NEGATIVE_TOLERANCE_S for s in STAGES], [s.name for s in STAGES])


INPUT_NAMES = tuple(inp.name for inp in INPUTS)
STAGE_COLUMNS = tuple(s.name for s in STAGES)
# An attribute named like a stage (``upstream``: the gateway's chosen replica) is shadowed by the
# stage in the contract's evaluation; here it keeps its value under a prefixed name.
ATTRIBUTE_COLUMNS = {name: f"gateway_{name}" if name in STAGE_COLUMNS else name for name in ATTRIBUTE_SOURCES}
ATTRIBUTE_NAMES = tuple(ATTRIBUTE_COLUMNS.values())
RATIO_COLUMNS = tuple(r.name for r in RATIOS)
ID_COLUMNS = ("request_id", *SCOPE_SOURCES, "start", "attempts", "trace_id")
# Attempts (a failover, a client's retries): tries beyond the first, those the client made (the
# attempt of its last ``client.sent``), and the status of the first failed attempt
# (``failed_replica`` is its replica)
ATTEMPT_COLUMNS = ("retries", "client_retries", *FAILURE_SOURCES)
EXTRA_COLUMNS = tuple(GAP_COLUMNS) + ("status", "error")
STATUS_COLUMNS = ("outcome", "negative", "missing")
COLUMNS = (
    ID_COLUMNS
    + ATTEMPT_COLUMNS
    + INPUT_NAMES
    + ATTRIBUTE_NAMES
    + EXTRA_COLUMNS
    + STAGE_COLUMNS
    + RATIO_COLUMNS
    + STATUS_COLUMNS
)


def read_hop_expr() -> pl.Expr:
    """``contract.read_hop`` on the ``HOP_ENUM`` column: a P/D prefill leg's engine hop is read as
    its ``prefill.*`` name."""
    hop = pl.col("hop")
    return pl.when(pl.col("leg") == PREFILL_LEG).then(hop.replace(LEG_HOPS)).otherwise(hop)


def resolve_by_trace(events: pl.LazyFrame) -> pl.LazyFrame:
    """``rules.TRACE_RULE`` as Polars (the reference is ``rules.resolve_by_trace``): an event whose
    request ID is its trace's stand-in takes the request ID of the trace's only owner.

    Only stand-in events go through the join with the owners (a frame without ``trace_id``, or
    without stand-ins, comes back as it is but for one filtered pass), so the one-pass group_by of
    ``timelines`` still sees one key per request.
    """
    if "trace_id" not in events.collect_schema():
        return events
    trace, rid = pl.col("trace_id"), pl.col("request_id")
    stand_in = trace.is_not_null() & rid.str.starts_with(pl.lit(TRACE_RULE.prefix) + trace)
    owners = (
        events.filter(trace.is_not_null() & ~stand_in)
        .group_by("trace_id")
        .agg(pl.col("request_id").n_unique().alias("_owners"), pl.col("request_id").max().alias("_owner"))
        .filter(pl.col("_owners") == TRACE_RULE.owners)
        .select("trace_id", "_owner")
    )
    placed = (
        events.filter(stand_in)
        .join(owners, on="trace_id", how="left")
        .with_columns(request_id=pl.coalesce(pl.col("_owner"), rid))
        .drop("_owner")
    )
    return pl.concat([events.filter(~stand_in.fill_null(False)), placed])


def per_event(events: pl.LazyFrame, sources: dict) -> pl.LazyFrame:
    """The events a timeline reads, each with its read hop, its scope attributes beyond the rule
    book's (``sources``: ``rules.scope_sources``; from their own column or the JSON of unknown
    fields) and the keys of the choices among several hops (``_keyed_columns``)."""
    extra = [name for name in sources if name not in SCOPE_SOURCES]
    schema = events.collect_schema()
    pulled = [
        pl.col("attrs").str.json_path_match(f'$["{name}"]').alias(name)
        for name in extra
        if name not in schema and "attrs" in schema
    ]
    missing = [pl.lit(None, dtype=pl.String).alias(n) for n in extra if n not in schema and "attrs" not in schema]
    no_leg = [] if "leg" in schema else [pl.lit(None, dtype=pl.String).alias("leg")]
    return (
        events.with_columns(pl.col("hop").cast(HOP_ENUM, strict=False), *no_leg)
        .with_columns(hop=read_hop_expr())
        .filter(pl.col("hop").is_in(READ_HOPS))
        .with_columns(*pulled, *missing)
        .with_columns(pl.col(LABELS).cast(pl.Categorical))
        .with_columns(_keyed_columns(sources))
    )


def timelines(
    events: pl.LazyFrame, scopes: tuple[str, ...] = (), resolve: bool = True, columns: tuple[str, ...] | None = None
) -> pl.LazyFrame:
    """One row per request (columns ``COLUMNS``, then one per extra scope): hop times, attributes,
    stages, ratios, status.

    ``events`` has the storage columns (``hopline.analyzer.io.scan_events``); ``hop`` may be a
    string or already the ``HOP_ENUM``. Times are Unix seconds (``start``, inputs) and seconds
    (stages); ``negative`` and ``missing`` are lists of stage / hop names. ``scopes``: attributes
    beyond the rule book's scope attributes to cut by (``--by tenant``), read like ``region``
    (rules.scope_sources) from their own column or from the JSON of unknown fields (``attrs``).
    ``resolve=False`` when ``resolve_by_trace`` was applied already, to the whole log (a bucket of
    it holds only some of a trace's owners, and could resolve a stand-in the whole log does not).
    ``columns``: only these (only what they are computed from is read and aggregated; the 7
    stages and ``replica`` need a third of the whole table's work).
    """
    sources = scope_sources(scopes)
    extra = [name for name in sources if name not in SCOPE_SOURCES]
    read = per_event(resolve_by_trace(events) if resolve else events, sources)
    values = _inputs()
    attributes = {name: values[name] for name in ATTRIBUTE_SOURCES}
    values = stage_exprs(values)
    sourced = _sourced()
    row = {
        "start": pl.coalesce(
            pl.col("_first:client.sent"), pl.col("_first:gateway.received"), pl.col("_first:engine.received")
        ),
        **{name: values[name] for name in INPUT_NAMES},
        **{column: attributes[name] for name, column in ATTRIBUTE_COLUMNS.items()},
        **{name: pl.col(_hop_attr(hop, attr)) for name, (hop, attr) in GAP_COLUMNS.items()},
        "retries": pl.col("attempts") - 1,
        "client_retries": _attempt_of(pl.col(_hop_pick("client.sent"))),  # the client's last send's attempt
        "status": pl.col(_attr("status")),
        "error": pl.col(_attr("error")),
        **{name: values[name] for name in STAGE_COLUMNS + RATIO_COLUMNS},
    }
    status = {"outcome": _outcome(), "negative": _negative(), "missing": _missing()}
    wanted = [*COLUMNS, *extra] if columns is None else list(columns)
    need = _needed(wanted, [sourced, row, status])
    traced = "trace_id" in events.collect_schema()
    return (
        _per_request(read, sources, traced, need)
        .with_columns(pl.col(pl.Categorical).cast(pl.String))
        .with_columns(**{name: expr for name, expr in sourced.items() if name in need})
        .with_columns(**{name: expr for name, expr in row.items() if name in need})
        .with_columns(**{name: expr for name, expr in status.items() if name in need})
        .select(wanted)
    )
