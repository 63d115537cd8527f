"""Output-length logs with known truth (tests only), for ``verbose_outputs``: services that answer
at different lengths on one model all along (healthy), and one service whose answers get longer
from a moment on (a template that broke).

Built on ``synth.generate`` (per-host clocks, shuffled events): ``VerboseService`` makes a
service's answers a constant factor longer for the whole log; ``longer_from`` then lengthens one
service's answers from ``at_s`` on by rewriting its requests' last hops: more output tokens
(capped by max_tokens, ``finish_reason: length`` there) and the decode they take at the request's
own inter-token latency, every later hop moved by that much on its own host's clock.

    events, truth = longer_from(generate(...), "kite-chat", at_s=200, factor=2.0)
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from support.synth import DEFAULT_START

LAST_HOPS = ("engine.last_token", "engine.stats", "gateway.last_token", "client.last_token")


@dataclass(frozen=True)
class LongerTruth:
    service: str
    onset: float  # the first lengthened request's send time (the client's clock)
    lengthened: frozenset[str]
    extra_decode_s: float  # the decode seconds the longer answers added, in all


def longer_from(
    events: pl.DataFrame, service: str, at_s: float, factor: float = 2.0, start: float = DEFAULT_START
) -> tuple[pl.DataFrame, LongerTruth]:
    """``events`` with ``service``'s answers ``factor`` times longer for requests sent at or after
    ``at_s`` (seconds from ``start``), and the truth."""
    hop = pl.col("hop")
    sent = events.filter((hop == "client.sent") & (pl.col("service") == service)).select(
        "request_id", t0=pl.col("ts"), cap=pl.col("max_tokens")
    )
    engine = events.filter(hop.is_in(["engine.first_token", "engine.last_token"])).pivot(
        on="hop", index="request_id", values="ts", aggregate_function="first"
    )
    tokens = events.filter(hop == "engine.last_token").select("request_id", old=pl.col("output_tokens"))
    plan = (
        sent.filter(pl.col("t0") >= start + at_s)
        .join(engine, on="request_id")
        .join(tokens, on="request_id")
        .filter(pl.col("old") >= 2)
        .with_columns(itl=(pl.col("engine.last_token") - pl.col("engine.first_token")) / (pl.col("old") - 1))
        .with_columns(new=pl.min_horizontal((pl.col("old") * factor).round().cast(pl.Int64), pl.col("cap").fill_null(1 << 30)))
        .with_columns(extra=(pl.col("new") - pl.col("old")) * pl.col("itl"))
        .select("request_id", "new", "extra", "cap")
    )
    last = hop.is_in(list(LAST_HOPS))
    out = (
        events.join(plan, on="request_id", how="left")
        .with_columns(
            ts=pl.when(last & pl.col("extra").is_not_null()).then(pl.col("ts") + pl.col("extra")).otherwise(pl.col("ts")),
            output_tokens=pl.when(pl.col("new").is_not_null() & pl.col("output_tokens").is_not_null())
            .then(pl.col("new"))
            .otherwise(pl.col("output_tokens")),
            output_chunks=pl.when(pl.col("new").is_not_null() & pl.col("output_chunks").is_not_null())
            .then(pl.col("new"))
            .otherwise(pl.col("output_chunks")),
            decode_s=pl.when((hop == "engine.stats") & pl.col("extra").is_not_null())
            .then(pl.col("decode_s") + pl.col("extra"))
            .otherwise(pl.col("decode_s")),
            finish_reason=pl.when(pl.col("finish_reason").is_not_null() & pl.col("new").is_not_null())
            .then(pl.when(pl.col("new") >= pl.col("cap")).then(pl.lit("length")).otherwise(pl.lit("stop")))
            .otherwise(pl.col("finish_reason")),
        )
        .select(events.columns)
        .cast(dict(events.schema))
    )
    truth = LongerTruth(
        service=service,
        onset=float(sent.filter(pl.col("t0") >= start + at_s)["t0"].min()),
        lengthened=frozenset(plan["request_id"].to_list()),
        extra_decode_s=float(plan["extra"].sum()),
    )
    return out, truth
