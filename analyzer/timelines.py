"""Events -> one row per request: every hop time, every stage, derived from the contract's table.

The Polars expressions here are generated from ``contract.INPUTS``, ``ATTRIBUTE_SOURCES``,
``STAGES`` and ``RATIOS`` (the same objects ``contract.compute_stages`` evaluates in plain
Python), so the collector and the analyzer cannot disagree; ``tests/golden_stages.json`` checks it.

Query shape (the part that decides speed and memory on tens of millions of events): one
streaming ``group_by`` whose aggregations are plain ``min`` / ``max`` / ``min_by`` of columns
computed beforehand, row-wise. No window expression: ``over()`` does not stream and
materialised every event (13.7 GiB for 59M events). The contract picks, per hop, the event of
the highest attempt (earliest ``ts`` on a tie): the minimum of ``pick = ts - attempt * 2**24``
(exact in float64 for Unix timestamps; correctly ordered while one hop's attempts of one request
lie within 2**24 s = 194 days). A column ``_k:<hop>`` holds the pick on that hop's events only;
a hop's time is its ``min`` (``ts`` comes back by adding the attempt, the whole number of spans
between the pick and any time of the request), an attribute of a hop is a ``min_by`` it, and an
attribute read from the first of several hops that carries it is a coalesce over them.

The group key is two independent 64-bit hashes of ``request_id`` (a collision of both among
5M IDs: ~1e-25) rather than the string, and low-cardinality labels are categorical while
grouping: the streaming group-by buffers the rows of keys not in its hot table, so every byte an
event carries into it counts 59M times (5M requests: 7.7 GiB peak instead of 13.7).
"""

from __future__ import annotations

import polars as pl
from hopline.middleware.contract import (
    ATTRIBUTE_SOURCES,
    ERROR_HOPS,
    HOPS,
    INPUTS,
    RATIOS,
    STAGES,
    Formula,
    component,
)

HOP_ENUM = pl.Enum(list(HOPS))
HASH_SEEDS = (11, 12)  # the group key: two independent 64-bit hashes of request_id
# Few distinct values: categorical while grouping (4 bytes an event instead of a 16-byte view).
LABELS = ["service", "replica", "model", "upstream", "finish_reason"]
ATTEMPT_SPAN_S = 2.0**24  # the attempt weight in ``pick``: a power of two keeps it exact
NEGATIVE_TOLERANCE_S = 1e-9  # as contract.negative_stages
OUTCOMES = ("ok", "error", "rejected", "disconnected", "incomplete")
OUTCOME_ENUM = pl.Enum(list(OUTCOMES))
COMPONENTS = ("client", "gateway", "engine")
# Hops a component that saw a request is expected to report; first tokens only when streaming,
# and nothing after an error (or the gateway's rejection) of that component.
EXPECTED_HOPS = {
    "client": ("client.sent", "client.first_token", "client.last_token"),
    "gateway": ("gateway.received", "gateway.forwarded", "gateway.first_token", "gateway.last_token"),
    "engine": ("engine.received", "engine.first_token", "engine.last_token"),
}
ERROR_ATTRS = ("status", "error")
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
        + [h for hops in EXPECTED_HOPS.values() for h in hops]
        + sorted(ERROR_HOPS)
    )
)
FIRST_HOPS = ("client.sent", "gateway.received", "engine.received")  # where a request starts
# Events of other hops (gateway.admitted) carry nothing a timeline uses: dropped before grouping.
READ_HOPS = list(
    dict.fromkeys(
        TIMED_HOPS + tuple(h for hops in SOURCES.values() for h in hops) + tuple(h for h, _ in HOP_ATTRS)
    )
)


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


def _per_event_columns() -> list[pl.Expr]:
    """Row-wise columns the single group_by aggregates: each read hop's pick (null on other
    hops' events), a hop's first time, each component's time, request-level keys."""
    hop = pl.col("hop")
    key = pick_key()
    cols = [pl.when(hop == h).then(key).alias(_hop_key(h)) for h in READ_HOPS]
    cols += [pl.when(hop == h).then(pl.col("ts")).alias(f"_first:{h}") for h in FIRST_HOPS]
    in_comp = {comp: hop.is_in([h for h in HOPS if component(h) == comp]) for comp in COMPONENTS}
    cols += [pl.when(in_comp[comp]).then(pl.col("ts")).alias(f"_ts:{comp}") for comp in COMPONENTS]
    # one key per request-level name, so each is a single aggregation (see ``timelines``):
    # service: a client's, else the gateway's; replica: the final attempt's engine;
    # model: the final attempt's engine's, else the client's, else the gateway's.
    cols.append(
        pl.when(pl.col("service").is_not_null())
        .then(pl.when(in_comp["client"]).then(0.0).when(in_comp["gateway"]).then(1.0))
        .alias("_key:service")
    )
    cols.append(pl.when(in_comp["engine"] & pl.col("replica").is_not_null()).then(key).alias("_key:replica"))
    cols.append(
        pl.when(pl.col("model").is_not_null())
        .then(
            pl.when(in_comp["engine"])
            .then(key)
            .when(in_comp["client"])
            .then(1e12)
            .when(in_comp["gateway"])
            .then(2e12)
        )
        .alias("_key:model")
    )
    gone = (pl.col("status") == 499) | pl.col("error").str.contains("(?i)disconnect")
    cols.append(gone.fill_null(False).alias("_gone"))
    return cols


def _aggregations() -> list[pl.Expr]:
    """Per hop, the chosen event's pick (``min``) and attributes (``min_by`` the pick)."""
    aggs = [pl.col(_hop_key(h)).min().alias(_hop_pick(h)) for h in TIMED_HOPS]
    aggs.append(pl.col("ts").min().alias("_ts:request"))
    aggs += [pl.col(a).min_by(_hop_key(h)).alias(_hop_attr(h, a)) for h, a in HOP_ATTRS]
    aggs += [
        pl.col(name).min_by(_hop_key(h)).alias(_source(name, h))
        for name, hops in SOURCES.items()
        for h in hops
    ]
    aggs += [pl.col("_gone").min_by(_hop_key(h)).alias(_source("_gone", h)) for h in sorted(ERROR_HOPS)]
    aggs += [pl.col(f"_first:{h}").min() for h in FIRST_HOPS]
    aggs += [pl.col(f"_ts:{comp}").min().alias(f"_seen:{comp}") for comp in COMPONENTS]
    aggs += [pl.col(name).min_by(f"_key:{name}") for name in ("service", "replica", "model")]
    aggs.append((pl.col("attempt").max() + 1).alias("attempts"))  # tries seen by any component
    return aggs


def _sourced() -> dict[str, pl.Expr]:
    """Hop times back from their pick; attributes from the first listed hop whose chosen event
    carries them; disconnection."""
    exprs = {_hop_ts(h): _unpick(pl.col(_hop_pick(h))) for h in TIMED_HOPS}
    exprs |= {
        _attr(name): pl.coalesce([pl.col(_source(name, h)) for h in hops]) for name, hops in SOURCES.items()
    }
    exprs["_disconnected"] = pl.any_horizontal(
        [pl.col(_source("_gone", h)) for h in sorted(ERROR_HOPS)]
    ).fill_null(False)
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


def _outcome() -> pl.Expr:
    """ok / error / rejected / disconnected / incomplete, from the outermost component seen."""
    errors = [_present(h) for h in sorted(ERROR_HOPS)]
    any_error = pl.any_horizontal(errors)
    disconnected = pl.col("_disconnected")
    outer_done = (
        pl.when(pl.col("_seen:client").is_not_null())
        .then(_present("client.last_token") & ~_present("client.error"))
        .when(pl.col("_seen:gateway").is_not_null())
        .then(_present("gateway.last_token") & ~_present("gateway.error") & ~_present("gateway.rejected"))
        .otherwise(_present("engine.last_token") & ~_present("engine.error"))
    )
    return (
        pl.when(disconnected)
        .then(pl.lit("disconnected"))
        .when(outer_done)
        .then(pl.lit("ok"))
        .when(_present("gateway.rejected") & pl.col("_seen:engine").is_null())
        .then(pl.lit("rejected"))
        .when(any_error)
        .then(pl.lit("error"))
        .otherwise(pl.lit("incomplete"))
        .cast(OUTCOME_ENUM)
    )


def _missing() -> pl.Expr:
    """Expected hops absent from the components that did report on the request."""
    flags = []
    for comp, hops in EXPECTED_HOPS.items():
        seen = pl.col(f"_seen:{comp}").is_not_null()
        failed = pl.any_horizontal([_present(h) for h in ERROR_HOPS if component(h) == comp])
        for hop in hops:
            expected = seen
            if hop.endswith("_token"):
                expected = expected & ~failed
                if hop.endswith("first_token"):
                    expected = expected & (pl.col("stream") == True).fill_null(False)
            if hop == "gateway.forwarded":
                expected = expected & ~_present("gateway.rejected")
            flags.append(pl.when(expected & ~_present(hop)).then(pl.lit(hop)))
    return pl.concat_list(flags).list.drop_nulls()


def _negative() -> pl.Expr:
    """Stages (views included) below zero: an instrumentation or clock problem, never clamped."""
    flags = [pl.when(pl.col(s.name) < -NEGATIVE_TOLERANCE_S).then(pl.lit(s.name)) for s in STAGES]
    return pl.concat_list(flags).list.drop_nulls()


INPUT_NAMES = tuple(inp.name for inp in INPUTS)
STAGE_COLUMNS = tuple(s.name for s in STAGES)
# An attribute named like a stage (``upstream``: the gateway's chosen replica) is shadowed by the
# stage in the contract's evaluation; here it keeps its value under a prefixed name.
ATTRIBUTE_COLUMNS = {name: f"gateway_{name}" if name in STAGE_COLUMNS else name for name in ATTRIBUTE_SOURCES}
ATTRIBUTE_NAMES = tuple(ATTRIBUTE_COLUMNS.values())
RATIO_COLUMNS = tuple(r.name for r in RATIOS)
ID_COLUMNS = ("request_id", "service", "replica", "model", "start", "attempts")
EXTRA_COLUMNS = tuple(GAP_COLUMNS) + ("status", "error")
STATUS_COLUMNS = ("outcome", "negative", "missing")
COLUMNS = (
    ID_COLUMNS
    + INPUT_NAMES
    + ATTRIBUTE_NAMES
    + EXTRA_COLUMNS
    + STAGE_COLUMNS
    + RATIO_COLUMNS
    + STATUS_COLUMNS
)


def timelines(events: pl.LazyFrame) -> pl.LazyFrame:
    """One row per request (columns ``COLUMNS``): hop times, attributes, stages, ratios, status.

    ``events`` has the storage columns (``hopline.analyzer.io.scan_events``); ``hop`` may be a
    string or already the ``HOP_ENUM``. Times are Unix seconds (``start``, inputs) and seconds
    (stages); ``negative`` and ``missing`` are lists of stage / hop names.
    """
    read = (
        events.with_columns(pl.col("hop").cast(HOP_ENUM, strict=False))
        .filter(pl.col("hop").is_in(READ_HOPS))
        .with_columns(pl.col(LABELS).cast(pl.Categorical))
        .with_columns(_per_event_columns())
    )
    rid = pl.col("request_id")
    per_request = (
        read.group_by(*(rid.hash(seed).alias(f"_rid{seed}") for seed in HASH_SEEDS))
        .agg(rid.max(), *_aggregations())  # max, not first: first() on a string is not streamed
        .drop(*(f"_rid{seed}" for seed in HASH_SEEDS))
        .with_columns(pl.col(pl.Categorical).cast(pl.String))
        .with_columns(**_sourced())
    )
    values = _inputs()
    attributes = {name: values[name] for name in ATTRIBUTE_SOURCES}
    values = stage_exprs(values)
    row = {
        "replica": pl.coalesce(pl.col("replica"), pl.col(_attr("upstream"))),
        "start": pl.coalesce(
            pl.col("_first:client.sent"), pl.col("_first:gateway.received"), pl.col("_first:engine.received")
        ),
        **{name: values[name] for name in INPUT_NAMES},
        **{column: attributes[name] for name, column in ATTRIBUTE_COLUMNS.items()},
        **{name: pl.col(_hop_attr(hop, attr)) for name, (hop, attr) in GAP_COLUMNS.items()},
        "status": pl.col(_attr("status")),
        "error": pl.col(_attr("error")),
        **{name: values[name] for name in STAGE_COLUMNS + RATIO_COLUMNS},
    }
    return (
        per_request.with_columns(**row)
        .with_columns(outcome=_outcome(), negative=_negative(), missing=_missing())
        .select(COLUMNS)
    )
