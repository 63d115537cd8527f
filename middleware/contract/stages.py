"""The stage table of DESIGN.md as data, and its evaluation: what the readers of hop events share.

* ``INPUTS``: the per-request values read from a request's events (one hop's timestamp or
  attribute each), and ``ATTRIBUTE_SOURCES``: the per-request attributes (first hop that has it);
* ``STAGES``: named quantities, each a list of ``Formula`` rows (a null-aware coalesce), and
  ``RATIOS`` (per-token speed); ``STAGE_NAMES``, ``TTFT_STAGES``, ``TIME_STAGES``, ``VIEWS``;
* ``compute_stages`` evaluates the table in plain Python (the collector compiles it,
  ``collector/stages.py``); the analyzer derives Polars expressions from the very same objects.
  ``tests/golden_stages.json`` holds events in / stages out for both.

Stages never subtract timestamps taken on different hosts: every formula below is a difference
of two timestamps of one component, a duration measured inside one, or a remainder (``network``).

Only readers (collector, analyzer, the rule book, docs) load this module; what emits events needs
``contract.events`` alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hopline.middleware.contract.events import read_hop


@dataclass(frozen=True)
class Input:
    """One per-request value read from the request's events, under its own name: an input to the
    stage table, or a timeline column of its own (one hop's attribute, e.g. ``engine_loop_lag_s``).

    ``attr`` None means the hop's timestamp. ``default`` applies when the hop is present but
    lacks the attribute (a reused connection reports no ``connect_s``: it cost 0).
    """

    name: str
    hop: str
    attr: str | None = None
    default: float | None = None


@dataclass(frozen=True)
class Formula:
    """``sum(sign * value)`` over ``terms``; null when any term is null or a condition fails.

    ``stream``: only for streaming (True) or non-streaming (False) requests.
    ``when_null``: only when every name listed is null (a fallback row of DESIGN.md).
    ``when_set``: only when every name listed has a value (a P/D row: the prefill leg was seen).
    """

    terms: tuple[tuple[int, str], ...]
    stream: bool | None = None
    when_null: tuple[str, ...] = ()
    when_set: tuple[str, ...] = ()


@dataclass(frozen=True)
class Stage:
    """A named quantity: the first formula that yields a value wins (a null-aware coalesce).

    ``kind``: ``view`` (TTFT / end-to-end as one component sees it), ``stage`` (a term of the
    TTFT sum), ``fallback`` (stands in for stages that cannot be split), ``phase`` (after the
    first token).
    """

    name: str
    kind: str
    formulas: tuple[Formula, ...]


def _f(
    *spec: str, stream: bool | None = None, when_null: tuple[str, ...] = (), when_set: tuple[str, ...] = ()
) -> Formula:
    """``_f("a", "-b", "-c")`` == a - b - c."""
    return Formula(
        tuple((-1, s[1:]) if s.startswith("-") else (1, s) for s in spec),
        stream=stream,
        when_null=when_null,
        when_set=when_set,
    )


# Which event each input comes from. For every hop the event of the request's highest attempt
# is used (earliest on a tie): a retried or failed-over request is measured on its final try,
# and the gateway's first `received` precedes every upstream attempt, so failed attempts'
# time lands in `gateway`.
INPUTS: tuple[Input, ...] = (
    Input("client_sent", "client.sent"),
    Input("client_first", "client.first_token"),
    Input("client_last", "client.last_token"),
    Input("gateway_received", "gateway.received"),
    Input("gateway_forwarded", "gateway.forwarded"),
    Input("gateway_first", "gateway.first_token"),
    Input("gateway_last", "gateway.last_token"),
    Input("engine_received", "engine.received"),
    Input("engine_scheduled", "engine.scheduled"),
    Input("engine_first", "engine.first_token"),
    Input("engine_last", "engine.last_token"),
    # absent on events from before client_delay_s existed: their delay is in pool_wait_s
    Input("client_delay_s", "client.sent", "client_delay_s", default=0.0),
    Input("pool_wait_s", "client.sent", "pool_wait_s", default=0.0),
    Input("connect_s", "client.sent", "connect_s", default=0.0),
    Input("tls_s", "client.sent", "tls_s", default=0.0),
    Input("stats_queue_s", "engine.stats", "queue_s"),
    Input("stats_prefill_s", "engine.stats", "prefill_s"),
    Input("stats_decode_s", "engine.stats", "decode_s"),
    # vLLM's per-request metrics relayed in the response (no hopline needed on the engine):
    # the gateway read the engine's response first-hand, the client after any proxy
    Input("gateway_reported_queue_s", "gateway.last_token", "engine_queue_s"),
    Input("gateway_reported_prefill_s", "gateway.last_token", "engine_prefill_s"),
    Input("gateway_reported_decode_s", "gateway.last_token", "engine_decode_s"),
    Input("client_reported_queue_s", "client.last_token", "engine_queue_s"),
    Input("client_reported_prefill_s", "client.last_token", "engine_prefill_s"),
    Input("client_reported_decode_s", "client.last_token", "engine_decode_s"),
    # the gateway's time before it called the engine, as its response's headers said it
    Input("client_reported_gateway_pre_s", "client.last_token", "gateway_pre_s"),
    # P/D: the prefill instance (LEG_HOPS), measured on its own clock
    Input("prefill_received", "prefill.received"),
    Input("prefill_last", "prefill.last_token"),
    Input("prefill_stats_queue_s", "prefill.stats", "queue_s"),
    Input("prefill_stats_prefill_s", "prefill.stats", "prefill_s"),
    # reasoning models: the first content and the first reasoning delta, each on its reader's clock
    *(
        Input(f"{view}_first_{channel}", f"{view}.last_token", f"first_{channel}_at")
        for view in ("client", "gateway", "engine")
        for channel in ("content", "reasoning")
    ),
    # how late each component's event loop ran (``loop_lag_s``) where a request waits for it unseen:
    # the client's when it read the first token, the servers' when their middleware got the request
    # (a busy server's wait before its middleware is the server's, not the network's). Not terms of
    # any stage: what tells a busy process from a slow network (the request-level ``loop_lag_s``
    # attribute stays the client's, ``client.sent`` first)
    Input("client_read_lag_s", "client.first_token", "loop_lag_s"),
    Input("engine_loop_lag_s", "engine.received", "loop_lag_s"),
    Input("gateway_loop_lag_s", "gateway.received", "loop_lag_s"),
    # how much of the CPU it asked for the engine's host gave it lately (``cpu_wait``: the share
    # of its runnable time spent waiting): a decode that slows as it rises is the host's
    Input("engine_cpu_wait", "engine.last_token", "cpu_wait"),
)
# Per-request attributes that are not stage inputs: first hop in the list that carries it wins.
ATTRIBUTE_SOURCES: dict[str, tuple[str, ...]] = {
    "stream": ("client.sent", "engine.received", "gateway.received"),
    "n": ("engine.received", "client.sent"),
    "output_tokens": ("client.last_token", "engine.last_token", "engine.stats", "gateway.last_token"),
    # reasoning models: of output_tokens, the reasoning ones (content = output_tokens - reasoning_tokens)
    "reasoning_tokens": ("client.last_token", "engine.last_token", "gateway.last_token"),
    "prompt_tokens": ("engine.stats", "engine.received", "client.last_token", "engine.last_token"),
    # P/D: the prefill instance's cache is the one that saves prefill time
    "cached_tokens": ("prefill.stats", "engine.stats", "engine.last_token"),
    "max_tokens": ("engine.received", "client.sent", "engine.stats"),
    "max_tokens_set": ("engine.received", "client.sent"),
    "finish_reason": ("client.last_token", "engine.last_token", "gateway.last_token"),
    "conn_reused": ("client.sent",),
    # whether the client's pool was full, its limit, and how late its event loop ran: what tells
    # a full pool from a busy caller (connect's pool wait vs client_delay)
    "pool_full": ("client.sent",),
    "pool_limit": ("client.sent",),
    "loop_lag_s": ("client.sent", "client.first_token"),
    "upstream": ("gateway.forwarded",),
    # P/D: the KV transfer and its bootstrap / allocation wait as the source reported them (the
    # decode side first); speculative decoding's acceptance (the engine's report, else a reader's)
    "kv_transfer_s": ("engine.stats", "prefill.stats"),
    "kv_wait_s": ("engine.stats", "prefill.stats"),
    "spec_acceptance_length": ("engine.stats", "engine.last_token", "gateway.last_token", "client.last_token"),
    "spec_draft_tokens": ("engine.stats", "engine.last_token", "gateway.last_token", "client.last_token"),
    "spec_accepted_tokens": ("engine.stats", "engine.last_token", "gateway.last_token", "client.last_token"),
    # the gateway's phases as its response's headers said them (LiteLLM's detailed timing): where
    # its hops are there too, pre-processing and the ``gateway`` stage measure the same span
    "gateway_pre_s": ("client.last_token",),
    "gateway_upstream_s": ("client.last_token",),
    "gateway_post_s": ("client.last_token",),
}

NO_ENGINE_NO_GATEWAY = ("engine_received", "gateway_received")  # a fallback row's condition
# P/D rows apply when the prefill instance was seen; the one-engine rows when it was not (the
# two never both apply, so their order does not matter: the one-engine rows come first)
PD = ("prefill_received",)
# the prefill instance's time from arrival to its answer (its engine_e2e): out of the P/D
# proxy's view between its two forwards, so the remainder (network) never counts it
PREFILL_LEG_E2E = ("-prefill_last", "prefill_received")
STAGES: tuple[Stage, ...] = (
    # views: what each component sees
    Stage("client_ttft", "view", (_f("client_first", "-client_sent", stream=True),)),
    Stage("client_e2e", "view", (_f("client_last", "-client_sent"),)),
    Stage("gateway_ttft", "view", (_f("gateway_first", "-gateway_received", stream=True),)),
    Stage("gateway_e2e", "view", (_f("gateway_last", "-gateway_received"),)),
    Stage("engine_ttft", "view", (_f("engine_first", "-engine_received", stream=True),)),
    Stage("engine_e2e", "view", (_f("engine_last", "-engine_received"),)),
    # reasoning models: time to the first *content* token (a view's TTFT counts reasoning too)
    Stage("client_content_ttft", "view", (_f("client_first_content", "-client_sent", stream=True),)),
    Stage("gateway_content_ttft", "view", (_f("gateway_first_content", "-gateway_received", stream=True),)),
    Stage("engine_content_ttft", "view", (_f("engine_first_content", "-engine_received", stream=True),)),
    # the terms of client_ttft (or of client_e2e for a non-streaming request)
    Stage("client_delay", "stage", (_f("client_delay_s"),)),
    Stage("connect", "stage", (_f("pool_wait_s", "connect_s", "tls_s"),)),
    Stage(
        "gateway",
        "stage",
        (
            _f("gateway_forwarded", "-gateway_received"),
            # no gateway hops: the gateway's pre-processing as its response's headers said it
            _f("client_reported_gateway_pre_s"),
        ),
    ),
    Stage(
        "queue",
        "stage",
        (
            _f("stats_queue_s", when_null=PD),
            _f("engine_scheduled", "-engine_received", when_null=PD),
            _f("gateway_reported_queue_s", when_null=PD),
            _f("client_reported_queue_s", when_null=PD),
            _f("prefill_stats_queue_s", when_set=PD),  # P/D: the prefill instance's queue
        ),
    ),
    Stage(
        "prefill",
        "stage",
        (
            _f("stats_prefill_s", when_null=PD),
            _f("engine_first", "-engine_scheduled", stream=True, when_null=PD),
            _f("gateway_reported_prefill_s", when_null=PD),
            _f("client_reported_prefill_s", when_null=PD),
            _f("prefill_stats_prefill_s", when_set=PD),  # P/D: the prefill instance's prefill
        ),
    ),
    # P/D: the decode instance's time before its first token: waiting for the prefill instance's
    # KV (vLLM counts WAITING_FOR_REMOTE_KVS in its queue) and the forward that loads it and makes
    # the first token; without the decode instance's stats, its whole TTFT (frontend included)
    Stage(
        "kv_transfer",
        "stage",
        (
            _f("stats_queue_s", "stats_prefill_s", when_set=(*PD, "queue")),
            _f("engine_ttft", when_set=PD),
        ),
    ),
    Stage(
        "frontend",
        "stage",
        (
            _f("engine_ttft", "-queue", "-prefill", when_null=PD),
            # P/D: both instances' HTTP, chat template and tokenization
            _f("prefill_last", "-prefill_received", "-queue", "-prefill", "engine_ttft", "-kv_transfer", when_set=PD),
        ),
    ),
    Stage(
        "engine",
        "fallback",
        (
            _f("engine_ttft", when_null=("queue", *PD)),
            _f("engine_e2e", stream=False, when_null=("queue", *PD)),
            _f("prefill_last", "-prefill_received", when_set=PD, when_null=("queue",)),
        ),
    ),
    Stage(
        "network",
        "stage",
        (
            _f("client_ttft", "-client_delay", "-connect", "-gateway", "-engine_ttft", when_null=PD),
            _f("client_ttft", "-client_delay", "-connect", "-engine_ttft", when_null=PD),
            _f("client_e2e", "-client_delay", "-connect", "-gateway", "-engine_e2e", stream=False, when_null=PD),
            _f("client_e2e", "-client_delay", "-connect", "-engine_e2e", stream=False, when_null=PD),
            _f("client_ttft", "-client_delay", "-connect", "-gateway", *PREFILL_LEG_E2E, "-engine_ttft", when_set=PD),
            _f(
                "client_e2e", "-client_delay", "-connect", "-gateway", *PREFILL_LEG_E2E, "-engine_e2e",
                stream=False, when_set=PD,
            ),
        ),
    ),
    Stage(
        "upstream_network",
        "fallback",
        (
            _f("gateway_ttft", "-gateway", "-engine_ttft", when_null=("client_sent", *PD)),
            _f("gateway_e2e", "-gateway", "-engine_e2e", stream=False, when_null=("client_sent", *PD)),
            _f("gateway_ttft", "-gateway", *PREFILL_LEG_E2E, "-engine_ttft", when_set=PD, when_null=("client_sent",)),
        ),
    ),
    Stage(
        "upstream",
        "fallback",
        (
            # no engine hops, but the engine reported queue and prefill (and decode) in its
            # response: upstream is then what remains beyond the gateway (network + engine frontend)
            _f(
                "client_ttft", "-client_delay", "-connect", "-gateway", "-queue", "-prefill",
                when_null=("engine_received",),
            ),
            _f(
                "client_ttft", "-client_delay", "-connect", "-queue", "-prefill",
                when_null=NO_ENGINE_NO_GATEWAY,
            ),
            _f(
                "client_e2e", "-client_delay", "-connect", "-gateway", "-queue", "-prefill",
                "-gateway_reported_decode_s", stream=False, when_null=("engine_received",),
            ),
            _f(
                "client_e2e", "-client_delay", "-connect", "-queue", "-prefill", "-client_reported_decode_s",
                stream=False, when_null=NO_ENGINE_NO_GATEWAY,
            ),
            _f("client_ttft", "-client_delay", "-connect", "-gateway", when_null=("engine_received",)),
            _f("client_ttft", "-client_delay", "-connect", when_null=("engine_received",)),
            _f(
                "client_e2e", "-client_delay", "-connect", "-gateway", stream=False,
                when_null=("engine_received",),
            ),
            _f("client_e2e", "-client_delay", "-connect", stream=False, when_null=("engine_received",)),
        ),
    ),
    # after the first token
    Stage(
        "decode",
        "phase",
        (
            _f("engine_last", "-engine_first"),
            _f("stats_decode_s"),
            _f("gateway_reported_decode_s"),
            _f("client_reported_decode_s"),
        ),
    ),
    # reasoning models: from the first reasoning delta to the first content delta (part of
    # decode when the model thinks first), on one reader's clock: the engine's, else the nearest
    Stage(
        "reasoning",
        "phase",
        (
            _f("engine_first_content", "-engine_first_reasoning"),
            _f("gateway_first_content", "-gateway_first_reasoning"),
            _f("client_first_content", "-client_first_reasoning"),
        ),
    ),
)
STAGE_NAMES = tuple(s.name for s in STAGES)
# The terms of the TTFT sum, in the order a request meets them (DESIGN.md):
# client_ttft == client_delay + connect + network + gateway + frontend + queue + prefill (+ kv_transfer: P/D)
TTFT_STAGES = ("client_delay", "connect", "network", "gateway", "frontend", "queue", "prefill", "kv_transfer")
# Everything that can be reported as time spent somewhere (terms, fallbacks, decode).
TIME_STAGES = tuple(s.name for s in STAGES if s.kind != "view")
VIEWS = ("client", "gateway", "engine")


@dataclass(frozen=True)
class Ratio:
    """Per-token speed: ``numerator / (output_tokens - 1)`` for ``output_tokens >= 2``, ``n == 1``."""

    name: str
    numerator: tuple[tuple[int, str], ...]


RATIOS: tuple[Ratio, ...] = (
    Ratio("client_itl", ((1, "client_e2e"), (-1, "client_ttft"))),
    Ratio("gateway_itl", ((1, "gateway_e2e"), (-1, "gateway_ttft"))),
    Ratio("engine_itl", ((1, "decode"),)),
)


def _pick(events: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """For each hop (as ``read_hop`` names it), the event of the highest attempt (earliest ts on a tie)."""
    chosen: dict[str, Mapping[str, Any]] = {}
    for ev in events:
        hop = read_hop(ev["hop"], ev.get("leg"))
        cur = chosen.get(hop)
        key = (ev.get("attempt", 0), -ev["ts"])
        if cur is None or key > (cur.get("attempt", 0), -cur["ts"]):
            chosen[hop] = ev
    return chosen


def request_inputs(events: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The stage table's inputs plus per-request attributes, from one request's events."""
    by_hop = _pick(events)
    values: dict[str, Any] = {}
    for inp in INPUTS:
        ev = by_hop.get(inp.hop)
        if ev is None:
            values[inp.name] = None
        elif inp.attr is None:
            values[inp.name] = ev["ts"]
        else:
            value = ev.get(inp.attr)
            values[inp.name] = inp.default if value is None else value
    for name, hops in ATTRIBUTE_SOURCES.items():
        values[name] = next(
            (by_hop[h][name] for h in hops if h in by_hop and by_hop[h].get(name) is not None), None
        )
    return values


def evaluate(values: dict[str, Any]) -> dict[str, float | None]:
    """Apply ``STAGES`` and ``RATIOS`` to a dict of inputs (mutated in place and returned)."""
    stream = values.get("stream")
    for stage in STAGES:
        result = None
        for formula in stage.formulas:
            if formula.stream is not None and stream is not formula.stream:
                continue
            if any(values.get(name) is not None for name in formula.when_null):
                continue
            if any(values.get(name) is None for name in formula.when_set):
                continue
            total = 0.0
            for sign, name in formula.terms:
                term = values.get(name)
                if term is None:
                    break
                total += sign * term
            else:
                result = total
                break
        values[stage.name] = result
    out_tokens, n = values.get("output_tokens"), values.get("n")
    for ratio in RATIOS:
        result = None
        if out_tokens is not None and out_tokens >= 2 and (n is None or n == 1):
            terms = [values.get(name) for _, name in ratio.numerator]
            if all(t is not None for t in terms):
                result = sum(s * t for (s, _), t in zip(ratio.numerator, terms)) / (out_tokens - 1)
        values[ratio.name] = result
    return values


def compute_stages(events: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Inputs, attributes, every stage and ratio for one request's (validated) events."""
    return evaluate(request_inputs(events))


def negative_stages(stages: Mapping[str, Any], tolerance: float = 1e-9) -> list[str]:
    """Names of stages (views included) below zero: an instrumentation or clock problem."""
    get = stages.get  # per finished request in the collector: one lookup a stage
    return [name for name in STAGE_NAMES if (value := get(name)) is not None and value < -tolerance]
