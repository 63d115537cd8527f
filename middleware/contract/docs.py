"""docs/contract.md, generated from the contract and the rule book so it cannot drift.

``python -m hopline.middleware.contract.docs > docs/contract.md`` writes it; a test regenerates it and
fails when the file differs. The tables below are the contract's own data; only the sentences are
written by hand. The findings JSON is documented on the analyzer's side (docs/findings.md, from
``hopline.analyzer.findings.docs``): middleware never imports the analyzer.
"""

from __future__ import annotations

import sys

from hopline.middleware import contract as c
from hopline.middleware.contract import rules as r

HOP_MEANINGS = {
    "client.sent": "the request entered the client's transport (before pool wait, connect and TLS)",
    "client.first_token": "the first chunk carrying output reached the client",
    "client.last_token": "the client read the end of the answer",
    "client.error": "the client saw a failure: an HTTP error, an error event inside a 200 stream, a cancel",
    "gateway.received": "request line and headers arrived at the gateway",
    "gateway.admitted": "auth, budget and rate limit passed",
    "gateway.forwarded": "an upstream (engine replica) was chosen and the request sent to it; once per attempt",
    "gateway.first_token": "the first chunk carrying output passed the gateway",
    "gateway.last_token": "the gateway relayed the end of the answer",
    "gateway.rejected": "the gateway refused the request (401 / 403 / 429)",
    "gateway.error": "the gateway failed the request",
    "engine.received": "the generation request arrived at the engine's HTTP server",
    "engine.scheduled": "the request left the queue; prefill starts (wall clock, where the engine exposes it)",
    "engine.first_token": "first chunk carrying output: content, reasoning_content, tool_calls or text",
    "engine.last_token": "the engine sent the end of the answer",
    "engine.stats": "durations measured inside the engine: queue, prefill, decode, token counts",
    "engine.error": "the engine failed the request (also an error event inside a 200 stream, a disconnect)",
}
# What hopline's client says on ``client.sent`` about the time before the request went out.
CLIENT_SENT_MEANINGS = {
    "conn_reused": "the request went out on a connection the pool already had (no TCP connect, no TLS)",
    "pool_full": "the client's pool had no free connection when the request entered: the requests in flight "
    "on the transport had reached its limit (absent where that is unknown: an HTTP/2 pool, a transport "
    "without httpcore's pool)",
    "pool_limit": "the pool's connection limit (httpx `Limits.max_connections`); absent: no limit",
    "pool_wait_s": "the wait for a connection from a full pool, until one was freed for this request; "
    "0 when the pool had room",
    "client_delay_s": "the rest of the time from entering the transport to its first step (connect, or "
    "sending on a pooled connection): the calling process catching up (a busy event loop, threads "
    "waiting for the GIL), not the pool",
    "connect_s": "TCP (or Unix socket) connect, on a new connection only",
    "tls_s": "TLS handshake, on a new connection only",
    "loop_lag_s": "also on `client.first_token`: the largest lateness of the client's asyncio event loop "
    "over the last seconds (a probe due every 50 ms); a sync client (no loop) puts its process's thread "
    "lateness (a thread due every 50 ms: a busy host, the GIL held). `engine.received` and "
    "`gateway.received` carry their server's (below)",
    "cpu_wait": "on `engine.last_token`: the share (0-1) of the time the engine's processes (its API server "
    "and every process below it: vLLM's engine core and the worker that runs its forward passes) were "
    "runnable over the last 2 s that they waited for a CPU (Linux schedstat; absent elsewhere)",
}
# Per-request columns of event loop lateness: inputs (contract.INPUTS) that are no stage's terms.
LOOP_LAG_MEANINGS = {
    "client_read_lag_s": "how late the client's event loop ran when it read the first token: a busy client "
    "reads its first token late, time the stage table counts in `network` (the remainder) that is the client's",
    "engine_loop_lag_s": "how late the engine's HTTP server's event loop ran when its middleware got the "
    "request: a request waits for a busy loop before `engine.received`, time the stage table counts in "
    "`network` (the remainder) that is the engine's",
    "gateway_loop_lag_s": "the same for the gateway's event loop at `gateway.received`",
    "engine_cpu_wait": "the share (0-1) of the time the engine's processes were runnable, over the last "
    "seconds when the request ended, that they waited for a CPU: a decode or prefill that slows as it rises "
    "is the host's (other work took its CPUs), not a slower engine",
}
CORE_MEANINGS = {
    "v": "contract version, 1 (absent means 1)",
    "eid": "unique per event (random 64-bit hex); the collector drops duplicates by it",
    "ts": "Unix epoch seconds on the emitting host (required)",
    "request_id": "1-64 characters of [A-Za-z0-9._:-] (required); engine prefixes chatcmpl- / cmpl- are stripped",
    "hop": "one of the hops below (required)",
    "attempt": "0 for the first try; the client counts retries, the gateway upstream attempts",
    "service": "the emitting service",
    "replica": "the emitting instance",
    "model": "the model asked for / served",
}
def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return lines + [""]


def _formula(formula: c.Formula) -> str:
    text = " ".join(("+ " if sign > 0 else "− ") + name for sign, name in formula.terms).removeprefix("+ ")
    cond = []
    if formula.stream is not None:
        cond.append("streaming" if formula.stream else "non-streaming")
    if formula.when_null:
        cond.append("when " + ", ".join(formula.when_null) + " null")
    if formula.when_set:
        cond.append("when " + ", ".join(formula.when_set) + " set")
    return f"`{text}`" + (f" ({'; '.join(cond)})" if cond else "")


def _types(types: tuple[type, ...]) -> str:
    return " or ".join({"bool": "boolean", "int": "integer", "float": "number", "str": "string"}[t.__name__] for t in types)


def render() -> str:
    out = [
        "# The hop event contract, the request rules and the findings JSON",
        "",
        "Generated from `middleware/contract/events.py`, `middleware/contract/stages.py` and "
        "`middleware/contract/rules.py` by `python -m hopline.middleware.contract.docs`; do not edit by hand "
        "(a test regenerates it).",
        "Other emitters and scripts are written against this page.",
        "",
        f"## Events (contract v{c.VERSION})",
        "",
        "One JSON object per line (NDJSON). Unknown fields are kept (stored in one JSON `attrs` column), never an error.",
        "Never prompt or completion text, never API keys or other headers' values.",
        "",
    ]
    out += _table(("field", "storage type", "meaning"), [(f"`{k}`", c.STORAGE_COLUMNS[k], CORE_MEANINGS[k]) for k in c.CORE_FIELDS])
    out += ["### Optional attributes", ""]
    out += _table(("attribute", "type", "storage type"), [(f"`{k}`", _types(t), c.STORAGE_COLUMNS[k]) for k, t in c.ATTRIBUTE_TYPES.items()])
    out += ["### Before the request went out (`client.sent`)", ""]
    out += _table(("attribute", "meaning"), [(f"`{k}`", v) for k, v in CLIENT_SENT_MEANINGS.items()])
    out += ["### Hops", "", "In the order a healthy streaming request meets them, by component.", ""]
    out += _table(("hop", "final", "meaning"), [(f"`{h}`", "yes" if h in r.ENDING_OF_HOP else "", HOP_MEANINGS[h]) for h in c.HOPS])
    out += [
        "### Disaggregated prefill/decode (P/D)",
        "",
        "A P/D request meets two engines under one request ID and one attempt: the P/D proxy calls "
        "`forwarded(upstream, leg=...)` once per leg (`gateway.forwarded` with `leg`: "
        + " then ".join(f"`{leg}`" for leg in c.LEGS)
        + ") and sends `X-Hopline-Leg`, so each engine's events carry their `leg`. The prefill instance's engine "
        "events are read under names of their own (never emitted), so every rule that reads `engine.*` sees the "
        "decode instance, which streams the answer:",
        "",
    ]
    out += _table(("event", "with `leg`", "is read as"), [(f"`{h}`", f"`{c.PREFILL_LEG}`", f"`{n}`") for h, n in c.LEG_HOPS.items()])
    out += [
        "## Stages",
        "",
        "Every stage is a difference of two timestamps of one component, a duration measured inside one, or a",
        "remainder (`network`): never a subtraction across hosts. For every hop the event of the request's highest",
        "attempt is used (the earliest on a tie). A stage is the first of its formulas that yields a value.",
        "",
        "    client_ttft == " + " + ".join(c.TTFT_STAGES),
        "",
        "### Inputs",
        "",
    ]
    out += _table(
        ("input", "from", "default"),
        [(f"`{i.name}`", f"`{i.hop}`" + (f" `{i.attr}`" if i.attr else " ts"), "" if i.default is None else f"{i.default:g}") for i in c.INPUTS],
    )
    inputs = {i.name: i for i in c.INPUTS}
    out += [
        "### Event loop lateness",
        "",
        "`loop_lag_s`: the largest lateness of the emitting process's asyncio event loop (a sync client's:",
        "of its process's threads) over the last seconds (a probe due every 50 ms), read as a request passes.",
        "Columns of their own, no stage's terms:",
        "",
    ]
    out += _table(
        ("column", "from", "meaning"),
        [(f"`{k}`", f"`{inputs[k].hop}` `{inputs[k].attr}`", v) for k, v in LOOP_LAG_MEANINGS.items()],
    )
    out += ["### The stage table", ""]
    out += _table(("stage", "kind", "formulas, first that yields a value"), [(f"`{s.name}`", s.kind, "; ".join(_formula(f) for f in s.formulas)) for s in c.STAGES])
    out += ["Per-token speed: `numerator / (output_tokens − 1)` when `output_tokens ≥ 2` and `n` is 1 or absent.", ""]
    out += _table(("ratio", "numerator"), [(f"`{q.name}`", " ".join(("+ " if s > 0 else "− ") + n for s, n in q.numerator).removeprefix("+ ")) for q in c.RATIOS])
    out += ["### Per-request attributes", "", "From the first listed hop whose chosen event carries it.", ""]
    out += _table(("attribute", "hops"), [(f"`{k}`", ", ".join(f"`{h}`" for h in hops)) for k, hops in c.ATTRIBUTE_SOURCES.items()])
    out += [
        "## Request rules",
        "",
        "A component's *ending* is its final hop of its highest attempt: `done` (a last token), `rejected`,",
        f"`cancel` (an error with status {', '.join(map(str, r.CANCEL_STATUSES))} or error "
        f"{', '.join(f'`{e}`' for e in r.CANCEL_ERRORS)}) or `error`; none while that attempt is open. The *outer*",
        "component is the one nearest the user that reported: " + ", else ".join(r.COMPONENTS) + ".",
        "",
        "### Outcome (first rule that holds)",
        "",
    ]
    out += _table(
        ("outcome", "when the ending of", "is", "why"),
        [(f"`{o.outcome}`", o.who, ", ".join("none" if e is None else e for e in o.endings), o.why) for o in r.OUTCOME_RULES]
        + [("`incomplete`", "", "otherwise", "")],
    )
    out += ["### Scope", "", "First source with a value; within a source, the event of the highest attempt carrying the field (the lowest where marked *first attempt*).", ""]
    out += _table(("attribute", "sources"), [(f"`{k}`", ", ".join(f"{s.where} `{s.field}`" + (" (first attempt)" if s.first else "") + (f" (leg `{s.leg}`)" if s.leg else "") for s in v)) for k, v in r.SCOPE_SOURCES.items()])
    out += ["### Expected hops", "", "Absent ones are listed as `missing`, in this order, for the components that reported.", ""]
    out += _table(
        ("hop", "attempt", "when"),
        [
            (
                f"`{e.hop}`",
                "the component's highest" if e.final_attempt else "any",
                "; ".join(
                    filter(None, [
                        "streaming" if e.stream else "",
                        ("unless the component's ending is " + ", ".join(e.unless)) if e.unless else "",
                    ])
                ),
            )
            for e in r.EXPECTED_HOPS
        ],
    )
    out += ["### Stage vocabulary", "", "Names and colours every report, chart and dashboard uses.", ""]
    out += _table(
        ("stage", "label", "colour", "part of TTFT", "measured by", "stands in for"),
        [(f"`{x.name}`", x.label, x.colour, "yes" if x.ttft_part else "", x.view, ", ".join(x.stands_for)) for x in r.STAGE_LOOKS],
    )
    out += ["In a sentence, and what a rise says where the stage's name alone does not:", ""]
    out += _table(("stage", "in a sentence", "a rise means"), [(f"`{x.name}`", x.words, x.meaning) for x in r.STAGE_LOOKS if x.meaning])
    out += [
        "## The findings JSON (`hopline analyze --json`)",
        "",
        "Every key of the analyzer's JSON, the findings' types and the detectors are in [findings.md](findings.md)",
        "and its schema in [findings.schema.json](findings.schema.json), generated on the analyzer's side",
        "(`python -m hopline.analyzer.findings.docs`) from the detector registry and the findings' types.",
        "",
    ]
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
