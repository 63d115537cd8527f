"""The request rule book: everything about a request beyond its stages, as data.

The stage table (``contract.stages``) says how a request's time splits; this module says the
rest, once, for every part: how a request ended (``OUTCOME_RULES``), which service, replica,
model and other scope attributes it belongs to (``SCOPE_SOURCES``), which hops it should have
(``EXPECTED_HOPS``) and what each stage is called and drawn as (``STAGE_LOOKS``, ``VIEW_LOOKS``).
The functions below evaluate the tables in plain Python (the contract's reference); the
collector calls them per finished request and the analyzer derives Polars expressions from the
same tables. ``tests/golden_stages.json`` holds events in / outcome, scope, missing hops out,
and every implementation reproduces it.

Terms used by the tables:

* a component's *ending* is its final hop (``contract.FINAL_HOPS``) of its highest attempt (the
  latest of them on a tie; none while that attempt is still open), classified as ``done`` (a last token), ``rejected`` (the gateway refused the
  request: auth, budget, rate limit), ``cancel`` (the caller went away: ``CANCEL_STATUSES`` or
  ``CANCEL_ERRORS``) or ``error``; ``None`` when the component never said its last word;
* the *outer* component is the one nearest the user that reported: client, else gateway,
  else engine. It speaks for what the user saw.

Which events make one request is the join rule: the request ID first (``contract``), then the
trace (``TRACE_RULE``), which only ever places an event that has no request ID of its own.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hopline.middleware.contract.events import FINAL_HOPS, LEG_HOPS, PREFILL_LEG, component, is_valid_trace_id
from hopline.middleware.contract.stages import ATTRIBUTE_SOURCES, TIME_STAGES, TTFT_STAGES, VIEWS

COMPONENTS = ("client", "gateway", "engine")  # nearest the user first

# --- joining: request ID first, then the trace ----------------------------------------------------


@dataclass(frozen=True)
class TraceRule:
    """The second join key, for events that know their trace but not their request.

    An event whose ``request_id`` is a *stand-in* (``prefix`` + its own ``trace_id``, optionally
    ``:`` + a span ID: what the OTLP receiver gives a span with no request ID of its own, e.g. a
    client span that recorded no response ID, or an engine's stage span) belongs to the request
    of the same trace that has a request ID of its own, when exactly ``owners`` such request
    exists. With none, or several (an agent that made three model calls in one trace), it keeps
    its stand-in: a request of its own, never a guess. An event with a real request ID is never
    moved by its trace, so requests that share a trace stay apart.
    """

    prefix: str
    owners: int
    why: str


TRACE_RULE = TraceRule(
    prefix="trace:",
    owners=1,
    why="a span without a request ID joins its trace's only request that has one",
)


def trace_stand_in(trace_id: str, span_id: str | None = None) -> str:
    """The stand-in request ID of an event that knows only its trace (and maybe its span)."""
    return f"{TRACE_RULE.prefix}{trace_id}" + (f":{span_id}" if span_id else "")


def is_stand_in(request_id: str, trace_id: object) -> bool:
    """``request_id`` is the stand-in made from ``trace_id`` (so the trace may place the event)."""
    return is_valid_trace_id(trace_id) and request_id.startswith(f"{TRACE_RULE.prefix}{trace_id}")


def resolve_by_trace(events: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Apply ``TRACE_RULE``: stand-in events take the request ID of their trace's only owner.

    The reference the collector's join and the analyzer's Polars follow; events without a
    stand-in come back unchanged (the same objects).
    """
    events = list(events)
    owners: dict[str, set[str]] = {}
    for ev in events:
        trace_id = ev.get("trace_id")
        if trace_id is not None and not is_stand_in(ev["request_id"], trace_id):
            owners.setdefault(trace_id, set()).add(ev["request_id"])
    out: list[Mapping[str, Any]] = []
    for ev in events:
        trace_id = ev.get("trace_id")
        found = owners.get(trace_id) if trace_id is not None else None
        if found is not None and len(found) == TRACE_RULE.owners and is_stand_in(ev["request_id"], trace_id):
            ev = {**ev, "request_id": next(iter(found))}
        out.append(ev)
    return out


def group_requests(events: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """The join rule in one call: events by request ID after ``resolve_by_trace``."""
    grouped: dict[str, list[Mapping[str, Any]]] = {}
    for ev in resolve_by_trace(events):
        grouped.setdefault(ev["request_id"], []).append(ev)
    return grouped


# --- outcome -------------------------------------------------------------------------------------

OUTCOMES = ("ok", "error", "rejected", "disconnected", "incomplete")
# An error event says the caller went away (not that the service failed) when it carries one of
# these: 499 is nginx's "client closed request"; hopline's client reports a stream closed before
# its end as ``cancelled``, its ASGI middleware a downstream that left as ``disconnected``.
CANCEL_STATUSES = (499,)
CANCEL_ERRORS = ("cancelled", "disconnected")
# The final hop's kind before the cancel test (which turns an ``error`` into a ``cancel``).
ENDING_OF_HOP = {
    hop: "done" if hop.endswith(".last_token") else "rejected" if hop == "gateway.rejected" else "error"
    for hops in FINAL_HOPS.values()
    for hop in hops
}


@dataclass(frozen=True)
class OutcomeRule:
    """``outcome`` when the ending of ``who`` is one of ``endings``.

    ``who``: a component, ``outer`` (the outermost component that reported) or ``any`` (some
    component). ``None`` in ``endings`` matches a component that never said its last word.
    """

    outcome: str
    who: str
    endings: tuple[str | None, ...]
    why: str


# First match wins; no match is ``incomplete``.
OUTCOME_RULES: tuple[OutcomeRule, ...] = (
    OutcomeRule("rejected", "gateway", ("rejected",), "the gateway refused it (401/403/429), whatever the client made of it"),
    OutcomeRule("incomplete", "outer", (None,), "the component nearest the user never saw it end"),
    OutcomeRule("disconnected", "outer", ("cancel",), "the user went away before the end (a client cancel, a 499)"),
    OutcomeRule("error", "outer", ("error", "rejected"), "the user saw an error"),
    OutcomeRule("error", "any", ("error",), "a hop failed where the user saw a clean end (an error event inside a 200 stream)"),
    OutcomeRule("ok", "outer", ("done",), "the user saw the end of the answer"),
)


def is_cancel(status: object, error: object) -> bool:
    """An error event that says the caller went away."""
    return status in CANCEL_STATUSES or error in CANCEL_ERRORS


def outer_component(seen: Iterable[str]) -> str | None:
    seen = set(seen)
    return next((c for c in COMPONENTS if c in seen), None)


def outcome_of(ending: Mapping[str, str | None]) -> str:
    """Apply ``OUTCOME_RULES`` to the components' endings."""
    outer = outer_component(ending)
    for rule in OUTCOME_RULES:
        if rule.who == "outer":
            if outer is not None and ending[outer] in rule.endings:
                return rule.outcome
        elif rule.who == "any":
            if any(e in rule.endings for e in ending.values()):
                return rule.outcome
        elif rule.who in ending and ending[rule.who] in rule.endings:
            return rule.outcome
    return "incomplete"


# --- scope ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """Read ``field`` from the events of ``where`` (a component, or one hop); ``first``: from the
    lowest attempt carrying it instead of the highest (where a request went first, what failed);
    ``leg``: only from events of that P/D leg (their ``leg`` attribute)."""

    where: str
    field: str
    first: bool = False
    leg: str | None = None


# A request's scope attributes: the first source with a value wins; within a source, the event
# of the highest attempt carrying the field (earliest on a tie), as the stage table picks hops.
# DESIGN.md: service is the client's (else the gateway's, else the engine's); replica is the
# engine replica that served the final attempt (else the gateway's ``upstream``); model is the
# engine's (else the request's). ``gateway_replica`` is the gateway instance; ``region`` and
# ``route`` are attributes the client or gateway may set. ``first_replica`` is the replica of the
# lowest attempt that reached one, ``failed_replica`` the replica of the first ``engine.error``
# (null when none): a failover's failing replica, where ``replica`` names the one that served.
SCOPE_SOURCES: dict[str, tuple[Source, ...]] = {
    "service": (Source("client", "service"), Source("gateway", "service"), Source("engine", "service")),
    "replica": (Source("engine", "replica"), Source("gateway.forwarded", "upstream")),
    "model": (Source("engine", "model"), Source("client", "model"), Source("gateway", "model")),
    "gateway_replica": (Source("gateway", "replica"),),
    "region": (Source("client", "region"), Source("gateway", "region"), Source("engine", "region")),
    "route": (Source("gateway", "route"), Source("client", "route"), Source("engine", "route")),
    "first_replica": (Source("engine", "replica", first=True), Source("gateway.forwarded", "upstream", first=True)),
    "failed_replica": (Source("engine.error", "replica", first=True),),
    # P/D: the instance that prefilled (its own events, read as ``prefill.*``, else where the
    # proxy sent the prefill leg) and the one that decoded (the engine's events of the decode leg,
    # else the proxy's decode forward); null for a request served by one engine
    "prefill_replica": (Source("prefill", "replica"), Source("gateway.forwarded", "upstream", leg="prefill")),
    "decode_replica": (Source("engine", "replica", leg="decode"), Source("gateway.forwarded", "upstream", leg="decode")),
}
_ATTRIBUTE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")


def scope_sources(extra: Iterable[str] = ()) -> dict[str, tuple[Source, ...]]:
    """``SCOPE_SOURCES`` plus any attribute a user names as a scope (``--by tenant``): read from
    the client's events, else the gateway's, else the engine's, like ``region``."""
    sources = dict(SCOPE_SOURCES)
    for name in extra:
        if name in sources:
            continue
        if not _ATTRIBUTE_NAME.fullmatch(name):
            raise ValueError(f"not an attribute name: {name!r} (letters, digits, _ . -; at most 64)")
        sources[name] = tuple(Source(comp, name) for comp in COMPONENTS)
    return sources


def _in(source: Source, hop: str) -> bool:
    return hop == source.where if "." in source.where else component(hop) == source.where


# --- expected hops -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    """A hop a component that reported on a request should have.

    ``final_attempt``: it must be there for the component's highest attempt (first and last
    tokens); otherwise any attempt will do (the gateway receives a request once, then forwards it
    once per attempt). ``stream``: only for streaming requests. ``unless``: not expected when the
    component's ending is one of these (nothing follows an error or a rejection).
    """

    hop: str
    final_attempt: bool = False
    stream: bool | None = None
    unless: tuple[str, ...] = ()


_AFTER_ERROR = ("rejected", "cancel", "error")
# In the order a healthy streaming request meets them; ``missing`` lists absent hops in this order.
# Hops not every deployment emits (gateway.admitted, engine.scheduled, engine.stats) are never missing.
EXPECTED_HOPS: tuple[Expected, ...] = (
    Expected("client.sent"),
    Expected("gateway.received"),
    Expected("gateway.forwarded", unless=("rejected",)),
    Expected("engine.received"),
    Expected("engine.first_token", final_attempt=True, stream=True, unless=_AFTER_ERROR),
    Expected("gateway.first_token", final_attempt=True, stream=True, unless=_AFTER_ERROR),
    Expected("client.first_token", final_attempt=True, stream=True, unless=_AFTER_ERROR),
    Expected("engine.last_token", final_attempt=True, unless=_AFTER_ERROR),
    Expected("gateway.last_token", final_attempt=True, unless=_AFTER_ERROR),
    Expected("client.last_token", final_attempt=True, unless=_AFTER_ERROR),
)
_STREAM_RANK = {hop: rank for rank, hop in enumerate(ATTRIBUTE_SOURCES["stream"])}


# Per hop (as read: ``read_hop``) and P/D leg, what one pass over a request's events must note:
# (its component, None for a P/D prefill leg's ``prefill.*`` hop, which only scopes read; its
# ending kind or None; the scope sources it can feed, as a function ``feed(ev, best, attempt, ts)``
# (``_feed``) or None; its rank as a source of ``stream`` or None). Made once per (hop, leg)
# (``_plan``); keyed by the hop alone for an event without a leg.
_Feeds = tuple[tuple[str, tuple[tuple[str, int, int], ...]], ...]
_Plan = tuple[str | None, str | None, Any, int | None]
_HOP_PLAN: dict[str | tuple[str, str], _Plan] = {}
_COMPONENT_SET = frozenset(COMPONENTS)


def _plan(hop: str, leg: str | None = None) -> _Plan:
    key = hop if leg is None else (hop, leg)
    plan = _HOP_PLAN.get(key)
    if plan is None:
        feeds: dict[str, list[tuple[str, int, int]]] = {}
        for name, sources in SCOPE_SOURCES.items():
            for rank, source in enumerate(sources):
                if _in(source, hop) and (source.leg is None or source.leg == leg):
                    feeds.setdefault(source.field, []).append((name, rank, 1 if source.first else -1))
        comp = component(hop)
        fed = _feed(tuple((f, tuple(t)) for f, t in feeds.items()))
        if comp not in _COMPONENT_SET:  # a P/D prefill leg's engine hop: read by scopes and stages only
            plan = (None, None, fed, None)
        else:
            plan = (comp, ENDING_OF_HOP.get(hop), fed, _STREAM_RANK.get(hop))
        if len(_HOP_PLAN) < _MAX_PLANS:  # hops and legs are the contract's; bounded all the same
            _HOP_PLAN[key] = plan
    return plan


def _feed(feeds: _Feeds) -> Any:
    """The scope sources an event of one plan feeds, as straight-line code: ``feed(ev, best,
    attempt, ts)`` notes in ``best`` (scope name -> ((rank, ±attempt, ts), value)) each of its
    fields with a value where it beats what is there. ``feeds``: (field, ((scope name, source
    rank, attempt sign: -1 highest first), ...)), in order (a field feeding several scopes is read
    once). None for no feeds."""
    if not feeds:
        return None
    lines = ["def feed(ev, best, attempt, ts):"]
    for field, targets in feeds:
        lines += [f"    value = ev.get({field!r})", "    if value is not None:"]
        for name, rank, sign in targets:
            key = f"({rank}, {'attempt' if sign > 0 else '-attempt'}, ts)"
            lines += [
                f"        cur = best.get({name!r})",
                "        if cur is None:",
                f"            best[{name!r}] = ({key}, value)",
                f"        elif {rank} <= cur[0][0]:  # a lower-ranked source never wins",
                f"            key = {key}",
                "            if key < cur[0]:",
                f"                best[{name!r}] = (key, value)",
            ]
    namespace: dict[str, Any] = {}
    code = compile("\n".join(lines) + "\n", "<hopline scope feed>", "exec")
    exec(code, namespace)  # noqa: S102 (our own table)
    return namespace["feed"]


_MAX_PLANS = 1024
# each expected hop as (hop, its component, final_attempt, stream, unless): plain tuples, read per request
_EXPECTED = tuple(
    (exp.hop, component(exp.hop), exp.final_attempt, exp.stream, exp.unless) for exp in EXPECTED_HOPS
)
# the outcome of each components' endings seen (``outcome_of``, as a tuple of (component, ending)
# in the order the request met them): a few dozen at most, bounded all the same
_OUTCOMES: dict[tuple[tuple[str, str | None], ...], str] = {}


def describe_request(events: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Outcome, scope and missing hops of one request (what the golden fixture holds per case).

    One pass over the events (the collector calls this for every finished request): each hop's
    plan (``_plan``) is made once per process, and a field feeding several scopes is read once.
    """
    top: dict[str, int] = {}  # component -> highest attempt
    final: dict[str, tuple[int, float, Mapping[str, Any]] | None] = {}
    # hop -> its highest attempt: the component's highest attempt reached the hop iff they are equal
    hop_top: dict[str, int] = {}
    best: dict[str, tuple[tuple[int, int, float], Any]] = {}  # scope name -> ((rank, ±attempt, ts), value)
    stream: tuple[int, Any] | None = None
    plans = _HOP_PLAN
    for ev in events:
        hop = ev["hop"]
        leg = ev.get("leg")
        if leg is None:
            comp, kind, feed, stream_rank = plans.get(hop) or _plan(hop)
        else:
            if leg == PREFILL_LEG:
                hop = LEG_HOPS.get(hop, hop)  # read_hop
            comp, kind, feed, stream_rank = plans.get((hop, leg)) or _plan(hop, leg)
        attempt = ev.get("attempt", 0)
        ts = ev["ts"]
        if feed is not None:
            feed(ev, best, attempt, ts)
        if comp is None:
            continue
        highest = top.get(comp)
        if highest is None:
            top[comp] = attempt
            final[comp] = None
        elif attempt > highest:
            top[comp] = attempt
        if hop not in hop_top or attempt > hop_top[hop]:
            hop_top[hop] = attempt
        if kind is not None:
            cur = final[comp]
            if cur is None or (attempt, ts) > cur[:2]:
                final[comp] = (attempt, ts, ev)
        if (
            stream_rank is not None
            and ev.get("stream") is not None
            and (stream is None or stream_rank < stream[0])
        ):
            stream = (stream_rank, ev["stream"])
    ending: dict[str, str | None] = {}
    for comp, chosen in final.items():
        if chosen is None or chosen[0] != top[comp]:  # no last word, or only for an earlier attempt
            ending[comp] = None
            continue
        ev = chosen[2]
        kind = ENDING_OF_HOP[ev["hop"]]
        ending[comp] = "cancel" if kind == "error" and is_cancel(ev.get("status"), ev.get("error")) else kind
    flag = None if stream is None else stream[1]
    missing = []
    for hop, comp, final_attempt, want_stream, unless in _EXPECTED:
        if comp not in top or ending[comp] in unless:
            continue
        if want_stream is not None and flag is not want_stream:
            continue
        if hop not in hop_top or (final_attempt and hop_top[hop] != top[comp]):
            missing.append(hop)
    scope: dict[str, Any] = dict.fromkeys(SCOPE_SOURCES)  # in SCOPE_SOURCES' order, None unless found
    for name, (_, value) in best.items():
        scope[name] = value
    endings = tuple(ending.items())
    outcome = _OUTCOMES.get(endings)
    if outcome is None:
        outcome = outcome_of(ending)
        if len(_OUTCOMES) < _MAX_PLANS:
            _OUTCOMES[endings] = outcome
    return {"outcome": outcome, "scope": scope, "missing": missing}


# --- the stage vocabulary ------------------------------------------------------------------------


@dataclass(frozen=True)
class Look:
    """How a stage (or view) is named and drawn everywhere: terminal, HTML, dashboards, sentences.

    ``colour``: hex, for the HTML report and Grafana; ``terminal``: a rich colour name.
    ``ttft_part``: a term of the TTFT sum or a fallback standing in for some of them.
    ``stands_for``: for a fallback, the stages it replaces when they cannot be split.
    ``view``: the component whose clocks measure it.
    ``phrase``: the stage in a sentence when ``<label> time`` does not read well.
    ``meaning``: what a rise of it says about the system, said after a finding's numbers.
    ``owner``: the side that owns its time when it is not the measuring ``view`` (network time is
    measured by the client and owned by the network); ``side`` is the one an alert carries.
    """

    name: str
    label: str
    colour: str
    terminal: str
    ttft_part: bool
    view: str
    stands_for: tuple[str, ...] = ()
    phrase: str = ""
    meaning: str = ""
    owner: str = ""

    @property
    def side(self) -> str:
        """Who can act on a rise of it: ``client``, ``gateway``, ``network`` or ``engine``."""
        return self.owner or self.view

    @property
    def words(self) -> str:
        """The stage in a sentence: ``queue time``."""
        return self.phrase or f"{self.label} time"


# In the order a request meets them, each fallback next to the stages it stands in for; at most
# one of a fallback and the stages it replaces has a value, so bars in this order never overlap.
STAGE_LOOKS: tuple[Look, ...] = (
    Look(
        "client_delay", "client delay", "#8c564b", "yellow", True, "client",
        phrase="client-side delay",
        meaning="the calling process was busy, not its connection pool",
    ),
    Look("connect", "connect", "#7f7f7f", "bright_black", True, "client"),
    Look("network", "network", "#17becf", "cyan", True, "client", owner="network"),
    Look("gateway", "gateway", "#9467bd", "magenta", True, "gateway"),
    Look("upstream_network", "upstream network", "#9edae5", "cyan", True, "gateway", ("network",), owner="network"),
    Look(
        "upstream", "upstream", "#1f77b4", "blue", True, "client", ("network", "frontend", "queue", "prefill"),
        owner="engine",
    ),
    Look("frontend", "engine frontend", "#bcbd22", "yellow", True, "engine"),
    Look("queue", "queue", "#d62728", "red", True, "engine"),
    Look("prefill", "prefill", "#2ca02c", "green", True, "engine"),
    Look("engine", "engine", "#ff9896", "bright_red", True, "engine", ("frontend", "queue", "prefill")),
    Look(
        "kv_transfer", "KV transfer", "#e377c2", "bright_magenta", True, "engine",
        phrase="KV transfer time",
        meaning="the decode instance waited longer for the prefill instance's KV cache",
    ),
    Look(
        "reasoning", "reasoning", "#c5b0d5", "bright_magenta", False, "engine",
        meaning="the model thought longer before its first content token",
    ),
    Look("decode", "decode", "#aec7e8", "bright_blue", False, "engine"),
)
VIEW_LOOKS: tuple[Look, ...] = (
    Look("client", "client", "#1f77b4", "cyan", False, "client"),
    Look("gateway", "gateway", "#9467bd", "magenta", False, "gateway"),
    Look("engine", "engine", "#ff7f0e", "yellow", False, "engine"),
)
LOOK = {look.name: look for look in STAGE_LOOKS}
VIEW_LOOK = {look.name: look for look in VIEW_LOOKS}
STAGE_ORDER = tuple(look.name for look in STAGE_LOOKS)  # waterfall / chart order
TTFT_PARTS = tuple(look.name for look in STAGE_LOOKS if look.ttft_part)  # terms and fallbacks
SIDES = ("client", "gateway", "network", "engine")  # who owns a finding's time (an alert's ``side``)
# where a pitfall's seconds are spent (``Pitfall.spent_in``) when that is not a stage
SPENT_OUTSIDE_STAGES = {"retry": "client"}


def side_of(spent_in: str) -> str:
    """The side owning time spent in ``spent_in`` (a stage, or ``SPENT_OUTSIDE_STAGES``)."""
    look = LOOK.get(spent_in)
    return look.side if look is not None else SPENT_OUTSIDE_STAGES.get(spent_in, "engine")


def _check() -> None:
    """The vocabulary names exactly the contract's stages and views (an import-time guard)."""
    if set(STAGE_ORDER) != set(TIME_STAGES) or len(STAGE_ORDER) != len(TIME_STAGES):
        raise RuntimeError(f"STAGE_LOOKS {STAGE_ORDER} differ from the stage table's {TIME_STAGES}")
    if tuple(VIEW_LOOK) != VIEWS:
        raise RuntimeError(f"VIEW_LOOKS {tuple(VIEW_LOOK)} differ from the contract's views {VIEWS}")
    terms = tuple(n for n in STAGE_ORDER if LOOK[n].ttft_part and not LOOK[n].stands_for)
    if set(terms) != set(TTFT_STAGES):
        raise RuntimeError(f"TTFT terms {terms} differ from the contract's {TTFT_STAGES}")


_check()
