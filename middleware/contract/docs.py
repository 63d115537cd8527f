"""docs/contract.md, generated from the contract and the rule book so it cannot drift.

``python -m hopline.middleware.contract.docs > docs/contract.md`` writes it; a test regenerates it and
fails when the file differs, and checks that every key the analyzer's JSON holds is documented
here. The tables below are the contract's own data; only the sentences are written by hand.
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
    "over the last seconds (a probe due every 50 ms); absent outside asyncio",
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
# The analyzer's JSON (``hopline analyze --json``): every key it prints, and what it means.
FINDINGS_TOP = {
    "requests": "requests in the log (after --since / --until)",
    "window_s": "the window width used for shifts and series",
    "stages": "stage name -> statistics over all requests that have the stage (below)",
    "split_requests": "requests whose TTFT parts add up to their TTFT: the common set of every share_of_ttft",
    "findings": "shifts and pitfalls, the largest effect on users' time first (minor ones excluded)",
    "minor": "findings that cost users under 1% of their time (share_of_users_time < 0.01), same order and "
    "shape; the terminal and HTML reports list them with --all",
    "dominant": "the TTFT part with the largest share, null when fewer than 20 requests have a complete split",
    "span": "start, end (ISO-8601 UTC) and seconds of the log",
    "outcomes": "outcome -> requests (the rule book's outcomes)",
    "negative_stages": "requests with a stage below zero, and counts by stage (a clock or instrumentation problem)",
    "missing_hops": "requests missing an expected hop, and counts by hop",
    "by_scope": "scope attribute -> one entry per value: requests, split_requests, dominant, stages",
    "windows": "per window: request count and p50 / p90 / p99 of each stage, TTFT and e2e",
    "goodput": "with --slo: requests meeting every target, per second, and the culprit stage of the misses",
    "scan": "files and lines read, bad lines and why",
}
FINDINGS_STAGE = {
    "p50_ms": "median, ms", "p90_ms": "90th percentile, ms", "p99_ms": "99th percentile, ms",
    "share_of_ttft": "share of TTFT over the complete splits (TTFT parts only)",
    "share_of_e2e": "mean stage over mean end-to-end time of the same requests",
    "mean_ms": "mean, ms", "count": "requests with a value",
}
FINDINGS_SHIFT = {
    "kind": "shift", "summary": "one sentence", "stage": "the stage that moved",
    "part": "for connect: which part moved (pool_wait: the client's own pool; connect: new connections), else null",
    "at": "ISO-8601 UTC to the second: the start of the first window after the change",
    "until": "when a burst ended (null: it lasted to the end of the log)",
    "scope": "the narrowest scope the change is confined to ({} for all traffic; two attributes, e.g. "
    "{replica, model}, when it is confined to one cell of them)",
    "statistic": "p50 or p90: the quantile that moved most clearly", "before_ms": "before, ms",
    "after_ms": "after, ms", "factor": "after / before", "z": "the rank test's z score",
    "affected_requests": "requests after the change in the scope",
    "impact_s": "users' seconds at stake (for ordering; the sum over the shifts it heads)",
    "share_of_users_time": "abs(impact_s) over the users' total time: their e2e for decode, else their wait "
    "for the first output (TTFT, or a non-streaming request's e2e)",
    "with": "shifts in the same scope that began with it, said as its consequences: stage, part, at, statistic, "
    "before_ms, after_ms, impact_s",
    "with_pitfalls": "pitfalls this rise brought with it, e.g. a long_prefill_stall "
    "after a prefill rise: whole pitfall findings, listed here instead of among the findings",
    "context": "what moved with it: other stages, load",
}
FINDINGS_PITFALL = {
    "kind": "pitfall", "summary": "one sentence",
    "name": "user_vs_engine_gap, new_connection_per_request, long_prefill_stall, no_max_tokens or verbose_outputs",
    "scope": "where it was seen", "affected_requests": "requests it concerns", "evidence": "the numbers behind it",
    "impact_s": "users' seconds at stake (for ordering)",
    "spent_in": "the stage those seconds are spent in (decode, connect, network or gateway)",
    "share_of_users_time": "as for a shift, with spent_in as its stage",
    "at": "ISO-8601 UTC: when it began (long_prefill_stall: its first long prefill), null for the others",
    "with_shifts": "rises this pitfall brought with it, e.g. a queue rise behind the long prefills of a "
    "long_prefill_stall (most of its queued seconds spent while one ran on the replica): whole shift "
    "findings, listed here instead of among the findings; impact_s includes theirs",
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
    return f"`{text}`" + (f" ({'; '.join(cond)})" if cond else "")


def _types(types: tuple[type, ...]) -> str:
    return " or ".join({"bool": "boolean", "int": "integer", "float": "number", "str": "string"}[t.__name__] for t in types)


def render() -> str:
    out = [
        "# The hop event contract, the request rules and the findings JSON",
        "",
        "Generated from `middleware/contract/events.py` and `middleware/contract/rules.py` by "
        "`python -m hopline.middleware.contract.docs`; do not edit by hand (a test regenerates it).",
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
    out += ["### Scope", "", "First source with a value; within a source, the event of the highest attempt carrying the field.", ""]
    out += _table(("attribute", "sources"), [(f"`{k}`", ", ".join(f"{s.where} `{s.field}`" for s in v)) for k, v in r.SCOPE_SOURCES.items()])
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
    out += ["## The findings JSON (`hopline analyze --json`)", ""]
    out += _table(("key", "meaning"), [(f"`{k}`", v) for k, v in FINDINGS_TOP.items()])
    out += ["Each entry of `stages`:", ""]
    out += _table(("key", "meaning"), [(f"`{k}`", v) for k, v in FINDINGS_STAGE.items()])
    out += ["A shift finding:", ""]
    out += _table(("key", "meaning"), [(f"`{k}`", v) for k, v in FINDINGS_SHIFT.items()])
    out += ["A pitfall finding:", ""]
    out += _table(("key", "meaning"), [(f"`{k}`", v) for k, v in FINDINGS_PITFALL.items()])
    return "\n".join(out).rstrip() + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
