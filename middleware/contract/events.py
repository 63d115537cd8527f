"""The hop event contract (v1): what every emitter writes and every reader takes.

Everything that emits, stores or analyses hop events loads this module, and an emitter loads
nothing more of the contract:

* ``HOPS`` and the request-ID rule (``normalize_request_id``, the one place engine prefixes
  such as ``chatcmpl-`` are stripped), trace IDs;
* the fields (``CORE_FIELDS``, ``ATTRIBUTE_TYPES``, ``STORAGE_COLUMNS``) and ``validate_event``
  (one event in, a clean dict out, or ``EventError`` saying what was wrong), fast NDJSON
  (de)serialization with orjson;
* the emitters' own health report (``emitter.stats``).

The stage table (``INPUTS``, ``STAGES``, ``compute_stages``), which only readers need, is
``contract.stages``.
"""

from __future__ import annotations

import math
import os
import random
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import orjson
from hopline.middleware.contract.errors import HoplineError

VERSION = 1

# --- hops -------------------------------------------------------------------------------------

CLIENT_HOPS = ("client.sent", "client.first_token", "client.last_token", "client.error")
GATEWAY_HOPS = (
    "gateway.received",
    "gateway.admitted",
    "gateway.forwarded",
    "gateway.first_token",
    "gateway.last_token",
    "gateway.rejected",
    "gateway.error",
)
ENGINE_HOPS = (
    "engine.received",
    "engine.scheduled",
    "engine.first_token",
    "engine.last_token",
    "engine.stats",
    "engine.error",
)
HOPS: tuple[str, ...] = CLIENT_HOPS + GATEWAY_HOPS + ENGINE_HOPS
HOP_SET = frozenset(HOPS)
ERROR_HOPS = frozenset({"client.error", "gateway.rejected", "gateway.error", "engine.error"})
# The hop after which a component has nothing more to say about a request.
FINAL_HOPS = {
    "client": ("client.last_token", "client.error"),
    "gateway": ("gateway.last_token", "gateway.rejected", "gateway.error"),
    "engine": ("engine.last_token", "engine.error"),
}


def component(hop: str) -> str:
    """``"engine.first_token"`` -> ``"engine"``."""
    return hop.partition(".")[0]


# Disaggregated prefill/decode (P/D): one request meets two engines under one request ID and one
# attempt, the prefill instance (events with ``leg`` = ``prefill``) and then the decode instance.
# The prefill instance's engine events are read as hops of their own, ``prefill.*`` (``read_hop``;
# never emitted, never a component of the outcome rules), so every rule that reads ``engine.*``
# sees the decode instance, which streams the answer, and the stage table reads the prefill
# instance by these names. A gateway.forwarded keeps its name whatever its leg: the prefill leg's
# is the earlier, so ``gateway`` ends where the prefill leg starts.
PREFILL_LEG = "prefill"
DECODE_LEG = "decode"
LEGS = (PREFILL_LEG, DECODE_LEG)
LEG_HOPS: dict[str, str] = {hop: f"{PREFILL_LEG}.{hop.partition('.')[2]}" for hop in ENGINE_HOPS}
PREFILL_HOPS: tuple[str, ...] = tuple(LEG_HOPS.values())
ALL_HOPS: tuple[str, ...] = HOPS + PREFILL_HOPS  # every name an event is read as (read_hop)


def read_hop(hop: str, leg: object) -> str:
    """The name an event is read as: a prefill leg's engine hop is ``prefill.*`` (``LEG_HOPS``)."""
    return LEG_HOPS.get(hop, hop) if leg == PREFILL_LEG else hop


# Fields every event may carry, with their JSON types; everything else is an attribute.
CORE_FIELDS = ("v", "eid", "ts", "request_id", "hop", "attempt", "service", "replica", "model")
ATTRIBUTE_TYPES: dict[str, tuple[type, ...]] = {
    "stream": (bool,),
    "n": (int,),
    "prompt_tokens": (int,),
    "output_tokens": (int,),
    "cached_tokens": (int,),
    "max_tokens": (int,),
    "max_tokens_set": (bool,),
    "status": (int,),
    "error": (str,),
    "upstream": (str,),
    "route": (str,),
    "region": (str,),
    "finish_reason": (str,),
    "output_chunks": (int,),
    "max_gap_s": (int, float),
    "max_gap_at": (int, float),
    "pool_wait_s": (int, float),
    "connect_s": (int, float),
    "tls_s": (int, float),
    "conn_reused": (bool,),
    # on client.sent: whether the client's pool had no free connection when the request entered
    # (its requests in flight had reached the pool's limit, ``pool_limit``; absent: no limit), and
    # the delay before the first transport step that was not a full pool's wait (the calling
    # process catching up); on client.sent and client.first_token: how late the client's event
    # loop ran lately (its largest lateness over the last seconds), where an asyncio loop runs; on
    # engine.received and gateway.received the same for the server's loop (middleware/loop.py)
    "pool_full": (bool,),
    "pool_limit": (int,),
    "client_delay_s": (int, float),
    "loop_lag_s": (int, float),
    # on engine.last_token: the share (0-1) of the time the engine's processes were runnable over
    # the last seconds that they waited for a CPU (middleware/cpu_wait.py): a busy host, not a
    # slower engine
    "cpu_wait": (int, float),
    "queue_s": (int, float),
    "prefill_s": (int, float),
    "decode_s": (int, float),
    # the W3C trace the request travelled in (32 lowercase hex, never all zeros): the second
    # join key (rules.TRACE_RULE); set by hopline's client and ASGI middleware from
    # ``traceparent`` and by the OTLP receiver from each span
    "trace_id": (str,),
    # the engine's own durations as its response reported them (vLLM's per-request ``metrics``),
    # on the ``*.last_token`` of whoever read that response (sse.REPORTED_METRICS)
    "engine_queue_s": (int, float),
    "engine_prefill_s": (int, float),
    "engine_decode_s": (int, float),
    # a gateway's own phases as its response's headers reported them (LiteLLM's
    # ``x-litellm-timing-*-ms`` with LITELLM_DETAILED_TIMING=true; sse.REPORTED_GATEWAY_TIMING), on the
    # client's ``*.last_token``: before it called the engine (auth, routing: hopline's ``gateway``
    # stage), its call to the engine (on a stream: until the engine's response began), after it
    "gateway_pre_s": (int, float),
    "gateway_upstream_s": (int, float),
    "gateway_post_s": (int, float),
    # an engine's KV-cache blocks for the request (TensorRT-LLM's per-request records)
    "kv_blocks_allocated": (int,),
    "kv_blocks_new": (int,),
    "kv_blocks_reused": (int,),
    "kv_blocks_missed": (int,),
    # disaggregated prefill/decode (P/D): which leg of the request an event belongs to,
    # ``prefill`` (the instance that computes the prompt's KV) or ``decode`` (the instance the KV is
    # transferred to, which streams the answer), set by the P/D proxy's ``forwarded(leg=...)``
    # (gateway.forwarded) and by the engines it sent the legs to (``X-Hopline-Leg``); see LEG_HOPS
    "leg": (str,),
    # on engine.stats: the KV transfer as the source measured it (the decode side's wait for the
    # remote KV: SGLang's per-request transfer time, TensorRT-LLM's kv_cache_transfer_time) and the
    # wait for the transfer's bootstrap / allocation before it, where the source reports them
    "kv_transfer_s": (int, float), "kv_wait_s": (int, float),
    # on *.last_token of a stream: when the first ``content`` delta and the first
    # ``reasoning_content`` (``reasoning``) delta came, on the component's own clock (a reasoning
    # model thinks first: its first token is reasoning, the user reads content later)
    "first_content_at": (int, float), "first_reasoning_at": (int, float),
    # speculative decoding: the request's mean acceptance length (tokens per verify step, the
    # bonus token included) and its drafted / accepted draft tokens (vLLM's per-request
    # ``metrics.speculative_decoding``: mean_acceptance_length, num_draft_tokens,
    # num_accepted_draft_tokens), on engine.stats or the *.last_token that read the response
    "spec_acceptance_length": (int, float), "spec_draft_tokens": (int,), "spec_accepted_tokens": (int,),
    # reasoning models: how many of ``output_tokens`` were reasoning (the rest are content), as the
    # engine's usage said it (``usage.completion_tokens_details.reasoning_tokens``: vLLM with a
    # ``--reasoning-parser``, OpenAI; SGLang's ``usage.reasoning_tokens`` when above 0), on the
    # ``*.last_token`` of whoever read that usage; absent where the engine gave no count (never estimated)
    "reasoning_tokens": (int,),
}

# How stored events are typed (the collector's Parquet files; the analyzer reads the same):
# core fields, then every known attribute, then ``attrs``: the JSON text of all other fields.
STORAGE_COLUMNS: dict[str, str] = {
    "v": "Int16",
    "eid": "String",
    "ts": "Float64",
    "request_id": "String",
    "hop": "String",
    "attempt": "Int32",
    "service": "String",
    "replica": "String",
    "model": "String",
    **{
        name: {(bool,): "Boolean", (int,): "Int64", (str,): "String"}.get(types, "Float64")
        for name, types in ATTRIBUTE_TYPES.items()
    },
    "attrs": "String",
}

# --- request IDs -------------------------------------------------------------------------------

REQUEST_ID_MAX = 64
_REQUEST_ID_RE = re.compile(r"[A-Za-z0-9._:-]{1,64}")
ENGINE_ID_PREFIXES = ("chatcmpl-", "cmpl-")
_REQUEST_ID_BYTES_RE = re.compile(rb"[A-Za-z0-9._:-]{1,64}")
_ENGINE_ID_PREFIXES_BYTES = tuple(prefix.encode() for prefix in ENGINE_ID_PREFIXES)


# IDs come from hopline's own generator, seeded from os.urandom and seeded again in a forked
# child, not from os.urandom per ID: os.urandom releases the GIL around its getrandom() call, so
# the emitter's thread, which makes an ID per event, had to win the GIL back from the host's busy
# event loop for every event, and every such handoff costs the host's thread a switch (py-spy, the
# asgi bench in one process: a third of that thread's samples waited in new_eid). Its own
# instance, because services seed the global one (vLLM's --seed calls random.seed(0)): every
# replica would make the same IDs. Unique, not secret: nothing trusts an ID for being unguessable.
_ids = random.Random()
os.register_at_fork(after_in_child=_ids.seed)


def new_request_id() -> str:
    """A fresh request ID: 32 random hex characters (128 bits, as many as a UUID4's 122)."""
    return f"{_ids.getrandbits(128):032x}"


def new_eid() -> str:
    """A fresh event ID: a random 64-bit number as 16 hex characters."""
    return f"{_ids.getrandbits(64):016x}"


def normalize_request_id(value: object) -> str | None:
    """The request ID in hopline's form, or None when ``value`` is not a usable ID.

    Strips the prefixes engines put in front of the caller's ID (vLLM reports ``X-Request-Id:
    abc`` as ``chatcmpl-abc`` on chat and ``cmpl-abc`` on completions), once, then applies the
    rule: 1-64 characters of ``[A-Za-z0-9._:-]``.
    """
    # the two usual cases in their own types: a header's bytes (rarely prefixed: one tuple
    # ``startswith``; the rule before any decode, it admits ASCII only) and an engine's str
    # (usually prefixed: the prefixes one by one)
    kind = type(value)
    if kind is bytes:
        if value.startswith(_ENGINE_ID_PREFIXES_BYTES):  # type: ignore[union-attr]
            value = _without_engine_prefix(value, _ENGINE_ID_PREFIXES_BYTES)
        return value.decode("ascii") if _REQUEST_ID_BYTES_RE.fullmatch(value) else None  # type: ignore[union-attr, arg-type]
    if kind is str:
        for prefix in ENGINE_ID_PREFIXES:  # (inline: a call costs what the loop does)
            if value.startswith(prefix) and len(value) > len(prefix):  # type: ignore[union-attr]
                value = value[len(prefix) :]  # type: ignore[index]
                break
        return value if _REQUEST_ID_RE.fullmatch(value) else None  # type: ignore[arg-type, return-value]
    if isinstance(value, (bytes, str)):  # a subclass: as its base type
        return normalize_request_id(bytes(value) if isinstance(value, bytes) else str(value))
    return None


def _without_engine_prefix(value: Any, prefixes: tuple[Any, ...]) -> Any:
    """``value`` without the first of ``prefixes`` it starts with, when more than it is left."""
    for prefix in prefixes:
        if value.startswith(prefix) and len(value) > len(prefix):
            return value[len(prefix) :]
    return value


# --- trace IDs ----------------------------------------------------------------------------------

_TRACE_ID_RE = re.compile(r"[0-9a-f]{32}")
_TRACEPARENT_RE = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
INVALID_TRACE_ID = "0" * 32


def is_valid_trace_id(value: object) -> bool:
    """32 lowercase hex digits, not all zeros (W3C Trace Context's trace-id)."""
    return isinstance(value, str) and value != INVALID_TRACE_ID and _TRACE_ID_RE.fullmatch(value) is not None


def trace_id_of(traceparent: bytes | str | None) -> str | None:
    """The trace ID of a W3C ``traceparent`` header value, or None when it is absent or malformed."""
    if isinstance(traceparent, bytes):
        traceparent = traceparent.decode("ascii", "replace")
    if not isinstance(traceparent, str):
        return None
    match = _TRACEPARENT_RE.fullmatch(traceparent.strip())
    if match is None or match[1] == "ff" or not is_valid_trace_id(match[2]):
        return None
    return match[2]


# --- validation and serialization --------------------------------------------------------------


class EventError(HoplineError, ValueError):
    """An event that breaks the contract; the message says which field and why.

    ``reason`` is a short, bounded name for metrics (``too_deep``, ``too_large``, ...); None lets
    the reader derive one from the field the message names.
    """

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason


# Bounds that keep every accepted event storable, compactable and readable: integers fit their
# storage column (STORAGE_COLUMNS; JSON has no limit, Parquet does), durations and timestamps are
# finite and plausible (1e308 s sums to infinity), nested values stay far below what orjson can
# write back (it reads 1,024 levels, writes 254), and one event is at most MAX_EVENT_BYTES of NDJSON.
INT_RANGES = {"Int16": (-(2**15), 2**15 - 1), "Int32": (-(2**31), 2**31 - 1), "Int64": (-(2**63), 2**63 - 1)}
ATTEMPT_MAX = INT_RANGES[STORAGE_COLUMNS["attempt"]][1]
TS_MAX = 4_102_444_800.0  # 2100-01-01T00:00:00Z: later is a broken clock, not an event
MAX_DURATION_S = 7 * 86400.0  # a week: no hop of one request lasts longer
MAX_NESTING = 32  # levels of arrays / objects inside one unknown attribute
MAX_EVENT_BYTES = 64 * 1024  # one event's NDJSON line
TIMESTAMP_ATTRIBUTES = frozenset({"max_gap_at", "first_content_at", "first_reasoning_at"})
# attribute -> (lowest, highest, what the message says it must be)
_ATTRIBUTE_BOUNDS: dict[str, tuple[float, float, str]] = {
    name: (
        (*INT_RANGES["Int64"], "an integer that fits in 64 bits")
        if dtype == "Int64"
        else (0.0, TS_MAX, f"Unix epoch seconds before {TS_MAX:.0f} (2100)")
        if name in TIMESTAMP_ATTRIBUTES
        else (0.0, MAX_DURATION_S, f"seconds between 0 and {MAX_DURATION_S:.0f}")
    )
    for name, dtype in STORAGE_COLUMNS.items()
    if name in ATTRIBUTE_TYPES and dtype in ("Int64", "Float64")
}
_KNOWN_FIELDS = frozenset(CORE_FIELDS) | frozenset(ATTRIBUTE_TYPES)
_INT64_MIN, _INT64_MAX = INT_RANGES["Int64"]


def _check_nested(name: str, value: object) -> None:
    """An unknown attribute nests at most MAX_NESTING levels and holds only 64-bit integers."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        kind = type(item)
        if kind is dict or kind is list:
            if depth > MAX_NESTING:
                raise EventError(f"{name} nests deeper than {MAX_NESTING} levels", reason="too_deep")
            children = item.values() if kind is dict else item
            stack.extend((child, depth + 1) for child in children if type(child) in (dict, list, int))
        elif kind is int and not _INT64_MIN <= item <= _INT64_MAX:
            raise EventError(f"{name} holds an integer that does not fit in 64 bits", reason="invalid_int")


_MISSING = object()


def _describe(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# Exact types that pass the attribute check at once (no bool where bool is not allowed); any
# other type goes through the full ``isinstance`` check, which accepts subclasses or says why not.
_EXACT_ATTRIBUTE_TYPES = {name: frozenset(types) for name, types in ATTRIBUTE_TYPES.items()}
_SCOPE_FIELDS = ("service", "replica", "model")
# C0 and C1 control characters (ESC, CR, NUL, ...): a known string attribute (a scope value that
# becomes an alert label, a route, a finish reason) holding one could rewrite a terminal line or
# forge a "FIRING" line; the contract refuses it. ``printable`` escapes them where text from
# unknown attributes is shown.
CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with every control character written as an escape (``\\x1b``), for a terminal,
    a log line or an alert label."""
    if not CONTROL_CHARACTERS.search(text):
        return text
    return CONTROL_CHARACTERS.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
# field -> None for a core field (checked by name above the attribute pass), else the attribute's
# (exact types, bounds or None); a field not in it is an unknown attribute
_FIELD_CHECKS: dict[str, tuple[frozenset[type], tuple[float, float, str] | None] | None] = {
    **dict.fromkeys(CORE_FIELDS),
    **{name: (_EXACT_ATTRIBUTE_TYPES[name], _ATTRIBUTE_BOUNDS.get(name)) for name in ATTRIBUTE_TYPES},
}
_UNKNOWN = object()
# Request IDs seen already in hopline's form (no engine prefix, the rule's characters): the
# events of one request share their ID, so the prefix and pattern checks run once per request,
# not per event. Bounded: emptied when full.
_PLAIN_IDS: set[str] = set()
_PLAIN_IDS_MAX = 8192


# Strings already checked: at most 256 characters, no control character (scope values, routes,
# finish reasons repeat from event to event: the regular expression runs once per value, not
# per event). Bounded: emptied when full.
_CLEAN_STRINGS: set[str] = set()
_CLEAN_STRINGS_MAX = 8192


def _remember_clean(value: str) -> None:
    """Note a string that passed the control-character check (``_CLEAN_STRINGS``; none longer
    than a scope value may be, so a remembered one passes the scope fields' length check too)."""
    if type(value) is str and len(value) <= 256:  # a str subclass may compare as it likes
        if len(_CLEAN_STRINGS) >= _CLEAN_STRINGS_MAX:
            _CLEAN_STRINGS.clear()
        _CLEAN_STRINGS.add(value)


# An event's fields in order (its shape) -> (its known attributes in that order, each with
# (name, exact types, bounds or None); whether it has unknown attributes). One emitter sends a
# handful of shapes, so the attribute pass loops over its attributes only, not over every field.
# Only shapes of known fields are kept (their names are the contract's: ~60 bytes a shape), at
# most _SHAPES_MAX (emptied when full).
_SHAPES: dict[tuple[str, ...], tuple[tuple[tuple[str, frozenset[type], tuple[float, float, str] | None], ...], bool]] = {}
_SHAPES_MAX = 1024


def _shape_plan(
    shape: tuple[str, ...],
) -> tuple[tuple[tuple[str, frozenset[type], tuple[float, float, str] | None], ...], bool]:
    """The attribute pass's plan for an event of these fields (``_SHAPES``)."""
    attributes = []
    unknown = False
    for name in shape:
        check = _FIELD_CHECKS.get(name, _UNKNOWN)
        if check is _UNKNOWN:
            unknown = True
        elif check is not None:
            attributes.append((name, *check))
    plan = (tuple(attributes), unknown)
    if not unknown:
        if len(_SHAPES) >= _SHAPES_MAX:
            _SHAPES.clear()
        _SHAPES[shape] = plan
    return plan


# An event's fields in order -> a function saying True when ``validate_event`` would take the
# (owned) event as it is: valid, nothing to normalize (``v`` and ``attempt`` present, ``ts`` a
# float, a request ID and strings already checked: ``_PLAIN_IDS``, ``_CLEAN_STRINGS``), with
# nothing to remember; or None for a shape it cannot say that of. Each is generated from the
# checks above (``_FIELD_CHECKS``, the core fields' bounds) as straight-line code for its fields,
# an accept-only test: any doubt is False, and the full pass below decides (and words the error).
# Only shapes of known fields, at most _ACCEPTS_MAX, kept for the life of the process: later
# shapes take the full pass, so no stream of shapes makes each event compile code.
_ACCEPTS: dict[tuple[str, ...], Any] = {}
_ACCEPTS_MAX = 256
_ACCEPT_REQUIRED = ("v", "ts", "hop", "request_id", "attempt")


def _accept_code(shape: tuple[str, ...]) -> tuple[str, dict[str, Any]] | None:
    """The source of ``accept(event)`` for events of ``shape`` (``_ACCEPTS``) and the names it
    reads beyond this module's, or None. A field holding ``null`` is left to the full pass."""
    if not all(name in shape for name in _ACCEPT_REQUIRED):
        return None
    # each core field's reason to refuse the value ``x``
    refuse = {
        "v": "type(x) is not int or x != VERSION",
        "ts": "type(x) is not float or not 0 < x <= TS_MAX",
        "hop": "type(x) is not str or x not in HOP_SET",
        "request_id": "type(x) is not str or x not in _PLAIN_IDS",
        "attempt": "type(x) is not int or not 0 <= x <= ATTEMPT_MAX",
        "eid": "type(x) is not str or not 0 < len(x) <= 64",
        **dict.fromkeys(_SCOPE_FIELDS, "type(x) is not str or x not in _CLEAN_STRINGS"),
    }
    names: dict[str, Any] = {}
    lines = []
    for i, name in enumerate(shape):
        check = _FIELD_CHECKS[name]
        if check is None:  # a core field
            cond = refuse.get(name)
            if cond is None:  # one these checks do not know: the full pass only
                return None
        else:
            exact, bound = check
            if len(exact) == 1:
                names[f"type_{i}"] = next(iter(exact))
                conds = [f"type(x) is not type_{i}"]
            else:
                names[f"types_{i}"] = exact
                conds = [f"type(x) not in types_{i}"]
            if bound is not None:
                names[f"low_{i}"], names[f"high_{i}"] = bound[0], bound[1]
                conds.append(f"not low_{i} <= x <= high_{i}")
            if str in exact:
                conds.append("(type(x) is str and x not in _CLEAN_STRINGS)")
            if name == "trace_id":
                conds.append("not is_valid_trace_id(x)")
            cond = " or ".join(conds)
        if cond.count("x") == 1:  # only its type is read
            lines += [f"if {cond.replace('(x)', f'(event[{name!r}])')}:", "    return False"]
        else:
            lines += [f"x = event[{name!r}]", f"if {cond}:", "    return False"]
    source = "def accept(event):\n" + "".join(f"    {line}\n" for line in [*lines, "return True"])
    return source, names


def _accept_for(shape: tuple[str, ...]) -> Any:
    """``_ACCEPTS[shape]``, made (and kept, while there is room) on first use."""
    if not _KNOWN_FIELDS.issuperset(shape):
        return None  # unknown attributes: the full pass (not kept: their names are anyone's)
    code = _accept_code(shape)
    accept = None
    if code is not None:
        source, names = code
        namespace = {**globals(), **names}
        exec(compile(source, "<hopline accept>", "exec"), namespace)  # noqa: S102 (our own checks)
        accept = namespace["accept"]
    if len(_ACCEPTS) < _ACCEPTS_MAX:
        _ACCEPTS[shape] = accept
    return accept


def validate_event(obj: object, *, owned: bool = False) -> dict[str, Any]:
    """Check one decoded event against the contract and return it normalized.

    Normalized means: ``v`` and ``attempt`` filled in (1 and 0), ``ts`` a float, engine
    prefixes stripped from ``request_id``. Unknown fields are kept untouched. Raises
    ``EventError`` with a message naming the offending field.

    ``owned``: the caller hands over a plain dict nobody else holds (just decoded), which is then
    normalized in place instead of copied (on an error it may be left half normalized).

    Written for the collector's hot path (one call per ingested event): exact-type checks
    first, the general ones only when those do not settle it.
    """
    if owned and type(obj) is dict:  # the usual event of a known shape: one generated test
        shape = tuple(obj)
        accept = _ACCEPTS.get(shape, _MISSING)
        if accept is _MISSING:
            accept = _accept_for(shape) if len(_ACCEPTS) < _ACCEPTS_MAX else None
        if accept is not None and accept(obj):
            return obj
    if type(obj) is not dict and not isinstance(obj, dict):
        raise EventError(f"event must be a JSON object, got {type(obj).__name__}")
    event = obj if owned and type(obj) is dict else dict(obj)
    get = event.get
    hop = get("hop")
    if hop == EMITTER_STATS_HOP:  # an emitter's health report: no request (end of module)
        return validate_emitter_stats(event)
    v = get("v", VERSION)
    if v != VERSION or (type(v) is not int and isinstance(v, bool)):  # an exact int needs no bool check
        raise EventError(f"unsupported contract version v={_describe(v)} (this reader knows v=1)")
    event["v"] = VERSION
    ts = get("ts")
    if type(ts) is float:
        if not 0 < ts <= TS_MAX:
            raise EventError(f"ts must be positive Unix epoch seconds before 2100, got {_describe(ts)}")
    elif isinstance(ts, bool) or not isinstance(ts, (int, float)) or not 0 < ts <= TS_MAX:
        raise EventError(f"ts must be positive Unix epoch seconds before 2100, got {_describe(ts)}")
    else:
        event["ts"] = float(ts)
    if type(hop) is not str or hop not in HOP_SET:  # a list or an object is unhashable: not `in`
        raise EventError(f"unknown hop {_describe(hop)}")
    raw_rid = get("request_id", _MISSING)
    if raw_rid is _MISSING:
        raise EventError("request_id is missing")
    # a plain string already in hopline's form (the usual case) needs no normalizing
    if type(raw_rid) is not str or raw_rid not in _PLAIN_IDS:
        if (
            type(raw_rid) is not str
            or raw_rid.startswith(ENGINE_ID_PREFIXES)
            or not _REQUEST_ID_RE.fullmatch(raw_rid)
        ):
            rid = normalize_request_id(raw_rid)
            if rid is None:
                raise EventError(
                    f"request_id must be 1-{REQUEST_ID_MAX} characters of [A-Za-z0-9._:-], got "
                    f"{_describe(raw_rid)}"
                )
            event["request_id"] = rid
        else:
            if len(_PLAIN_IDS) >= _PLAIN_IDS_MAX:
                _PLAIN_IDS.clear()
            _PLAIN_IDS.add(raw_rid)
    attempt = get("attempt", 0)
    exact_int = type(attempt) is int
    if (
        not exact_int and (isinstance(attempt, bool) or not isinstance(attempt, int))
    ) or not 0 <= attempt <= ATTEMPT_MAX:
        raise EventError(f"attempt must be an integer from 0 to {ATTEMPT_MAX}, got {_describe(attempt)}")
    event["attempt"] = attempt
    eid = get("eid")
    if eid is not None and (not isinstance(eid, str) or not 0 < len(eid) <= 64):
        raise EventError(f"eid must be a string of 1-64 characters, got {_describe(eid)}")
    clean = _CLEAN_STRINGS
    for name in _SCOPE_FIELDS:
        value = get(name)
        if value is None or (type(value) is str and value in clean):
            continue
        if not isinstance(value, str) or len(value) > 256:
            raise EventError(f"{name} must be a string of at most 256 characters, got {_describe(value)}")
        if CONTROL_CHARACTERS.search(value):
            raise EventError(f"{name} must not hold control characters (ESC, CR, NUL, ...), got {_describe(value)}")
        _remember_clean(value)
    shape = tuple(event)  # the fields, in the event's order (v and attempt are in it by now)
    plan = _SHAPES.get(shape)
    if plan is None:
        plan = _shape_plan(shape)
    attributes, unknown = plan
    for name, exact, bound in attributes:  # the known attributes, in the event's order
        value = event[name]
        if value is None:
            continue
        kind = type(value)
        if kind not in exact:
            types = ATTRIBUTE_TYPES[name]
            if not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
                expected = " or ".join(t.__name__ for t in types)
                raise EventError(f"{name} must be {expected}, got {_describe(value)}")
        if bound is not None and not bound[0] <= value <= bound[1]:  # NaN fails too
            raise EventError(f"{name} must be {bound[2]}, got {_describe(value)}")
        if kind is str and value not in clean:
            if CONTROL_CHARACTERS.search(value):
                raise EventError(
                    f"{name} must not hold control characters (ESC, CR, NUL, ...), got {_describe(value)}"
                )
            _remember_clean(value)
    if unknown:  # unknown attributes (rare): any JSON, within bounds
        for name in event.keys() - _KNOWN_FIELDS:
            value = event[name]
            if type(value) in (dict, list, int):
                _check_nested(name, value)
    trace_id = get("trace_id")
    if trace_id is not None and not is_valid_trace_id(trace_id):
        raise EventError(f"trace_id must be 32 lowercase hex digits (not all zeros), got {_describe(trace_id)}")
    return event


def dedup_key(event: Mapping[str, Any]) -> tuple:
    """The duplicate key: ``eid`` when present, else (request_id, attempt, hop, ts)."""
    eid = event.get("eid")
    if eid is not None:
        return ("eid", eid)
    return (event["request_id"], event.get("attempt", 0), event["hop"], event["ts"])


# orjson's options for an event's NDJSON line (``dumps``; the collector's ingest calls orjson with
# them directly, one Python call less per event)
NDJSON_OPTIONS = orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS


def dumps(event: Mapping[str, Any]) -> bytes:
    """One event as one NDJSON line (with the trailing newline)."""
    return orjson.dumps(event, option=NDJSON_OPTIONS)


def iter_ndjson(data: bytes | Iterable[bytes]) -> Iterator[tuple[int, dict[str, Any] | None, str | None]]:
    """Parse NDJSON into ``(line_number, event, error)``; exactly one of event / error is set.

    Blank lines are skipped; line numbers start at 1 and count every line, so an error can be
    located in the original input.
    """
    lines = data.splitlines() if isinstance(data, (bytes, bytearray)) else data
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if len(line) > MAX_EVENT_BYTES:
            yield number, None, f"line exceeds {MAX_EVENT_BYTES} bytes"
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            yield number, None, f"not JSON: {exc}"
            continue
        try:
            yield number, validate_event(obj), None
        except EventError as exc:
            yield number, None, str(exc)


# --- emitter health reports (not a request hop) -------------------------------------------------
#
# Every hopline emitter reports its own counters now and then as one event of this kind, sent
# with its hop events down the same sink. It belongs to no request: it has no ``request_id``, it
# is not in ``HOPS`` (so the stage table, the joiner and the analyzer never see it as a request),
# and it always carries an ``eid`` (only hopline emitters send it), which is its duplicate key.
# The counts are cumulative for one emitter instance (``emitter``: random, new in a forked child);
# the collector turns them into ``hopline_emitter_*`` metrics.

EMITTER_STATS_HOP = "emitter.stats"
# Why an emitter lost events: ``full`` (its buffer was full: the oldest event made room),
# ``sink`` (the sink could not deliver them), ``closed`` (emitted after close).
EMITTER_DROP_REASONS = ("full", "sink", "closed")
EMITTER_STATS_COUNTS = ("sent", "buffered", "errors") + tuple(f"dropped_{r}" for r in EMITTER_DROP_REASONS)
EMITTER_COUNT_MAX = 2**63 - 1
# An emitter whose sink shards over several collectors adds ``targets``: per collector, its name
# (``host:port``) and these counts, each cumulative too (middleware/sharded_sink.py).
EMITTER_TARGET_COUNTS = ("sent", "buffered", "dropped_full", "dropped_sink")
EMITTER_TARGETS_MAX = 64


def validate_emitter_stats(event: dict[str, Any]) -> dict[str, Any]:
    """Check an ``emitter.stats`` event (a dict copy, ``hop`` already known): ``v``, ``ts``,
    ``eid``, ``emitter``, scope strings and non-negative integer counts. Raises ``EventError``."""
    if event.get("v", VERSION) != VERSION or isinstance(event.get("v"), bool):
        raise EventError(f"unsupported contract version v={_describe(event.get('v'))} (this reader knows v=1)")
    event["v"] = VERSION
    ts = event.get("ts")
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not 0 < ts < math.inf:
        raise EventError(f"ts must be positive Unix epoch seconds, got {_describe(ts)}")
    event["ts"] = float(ts)
    for name in ("eid", "emitter"):
        value = event.get(name)
        if not isinstance(value, str) or not 0 < len(value) <= 64:
            raise EventError(f"{name} must be a string of 1-64 characters, got {_describe(value)}")
    for name in _SCOPE_FIELDS:
        value = event.get(name)
        if value is not None and (not isinstance(value, str) or len(value) > 256):
            raise EventError(f"{name} must be a string of at most 256 characters, got {_describe(value)}")
        if value is not None and CONTROL_CHARACTERS.search(value):
            raise EventError(f"{name} must not hold control characters (ESC, CR, NUL, ...), got {_describe(value)}")
    for name in EMITTER_STATS_COUNTS:
        value = event.get(name, 0)
        if type(value) is not int or not 0 <= value <= EMITTER_COUNT_MAX:
            raise EventError(f"{name} must be an integer from 0 to 2^63-1, got {_describe(value)}")
    _check_emitter_targets(event.get("targets"))
    return event


def _check_emitter_targets(targets: Any) -> None:
    """``targets`` of an ``emitter.stats`` event: absent, or a list of at most
    ``EMITTER_TARGETS_MAX`` objects with a ``target`` name and ``EMITTER_TARGET_COUNTS``."""
    if targets is None:
        return
    if not isinstance(targets, list) or len(targets) > EMITTER_TARGETS_MAX:
        raise EventError(
            f"targets must be a list of at most {EMITTER_TARGETS_MAX} objects, got {_describe(targets)}"
        )
    for index, target in enumerate(targets):
        name = target.get("target") if isinstance(target, dict) else None
        if not isinstance(name, str) or not 0 < len(name) <= 256:
            raise EventError(
                f"targets[{index}].target must be a string of 1-256 characters, got {_describe(name)}"
            )
        for count in EMITTER_TARGET_COUNTS:
            value = target.get(count, 0)
            if type(value) is not int or not 0 <= value <= EMITTER_COUNT_MAX:
                raise EventError(
                    f"targets[{index}].{count} must be an integer from 0 to 2^63-1, got {_describe(value)}"
                )
