"""Property-based fuzzing of POST /v1/events (hypothesis), shared by the CI test and bench/.

A case is a mixed NDJSON batch of valid events (drawn within every contract bound, with unknown
attributes of any JSON shape), invalid lines (each broken in one known way: not JSON, not an
object, a required field missing, a value out of its storage range, nested too deep, too large)
and blank lines, sometimes gzip-compressed, posted to a real collector. The properties: never a
5xx; every valid line is accepted (or a duplicate) and every invalid one rejected with its line
number and a reason; afterwards, every valid event is on disk exactly as validated.
"""

from __future__ import annotations

import time

import gzip
import itertools
import json
from dataclasses import dataclass, field

import httpx
import orjson
from hopline.middleware.contract import (
    ATTEMPT_MAX,
    ATTRIBUTE_TYPES,
    CORE_FIELDS,
    HOPS,
    INT_RANGES,
    MAX_DURATION_S,
    MAX_EVENT_BYTES,
    MAX_NESTING,
    STORAGE_COLUMNS,
    TIMESTAMP_ATTRIBUTES,
    TS_MAX,
    validate_event,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

INT64_MIN, INT64_MAX = INT_RANGES["Int64"]
TS_NOW_MAX = time.time() + 240.0  # a valid ts: the collector refuses one more than --max-future (5 min) ahead
KNOWN = frozenset(CORE_FIELDS) | frozenset(ATTRIBUTE_TYPES)
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
# a known string attribute holds no control character (ESC, CR, NUL, C1: the contract refuses them)
LABEL = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=12)
SCALAR = (
    st.none()
    | st.booleans()
    | st.integers(INT64_MIN, INT64_MAX)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT
)
JSON_VALUE = st.recursive(
    SCALAR, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3), max_leaves=12
)
REQUEST_ID = st.from_regex(r"[A-Za-z0-9._:-]{1,64}", fullmatch=True)
_EIDS = itertools.count(1)


def _attribute(name: str) -> st.SearchStrategy:
    if name == "trace_id":  # a W3C trace ID: 32 lowercase hex digits, not all zeros
        return st.text("0123456789abcdef", min_size=32, max_size=32).filter(lambda t: t.strip("0"))
    types = ATTRIBUTE_TYPES[name]
    if types == (bool,):
        return st.booleans()
    if types == (str,):
        return LABEL
    if STORAGE_COLUMNS[name] == "Int64":
        return st.integers(INT64_MIN, INT64_MAX)
    high = TS_MAX if name in TIMESTAMP_ATTRIBUTES else MAX_DURATION_S
    return st.floats(0.0, high) | st.integers(0, int(high))


@st.composite
def valid_event(draw) -> dict:
    ev = {
        "eid": f"{next(_EIDS):016x}",
        # up to the collector's --max-future ahead of now (its default, 5 min; a minute of slack less)
        "ts": draw(st.floats(1e-3, TS_NOW_MAX) | st.integers(1, int(TS_NOW_MAX))),
        "request_id": draw(REQUEST_ID),
        "hop": draw(st.sampled_from(HOPS)),
    }
    if draw(st.booleans()):
        ev["v"] = 1
    if draw(st.booleans()):
        ev["attempt"] = draw(st.integers(0, ATTEMPT_MAX))
    for name in ("service", "replica", "model"):
        if draw(st.booleans()):
            ev[name] = draw(LABEL)
    for name in draw(st.lists(st.sampled_from(sorted(ATTRIBUTE_TYPES)), max_size=4, unique=True)):
        ev[name] = draw(_attribute(name) | st.none())
    unknown = st.dictionaries(TEXT.filter(lambda k: k not in KNOWN), JSON_VALUE, max_size=3)
    ev.update(draw(unknown))
    return ev


class Nested(bytes):
    """JSON text of arrays nested ``levels`` deep (orjson cannot write more than 254 levels)."""

    def __new__(cls, levels: int) -> Nested:  # noqa: PYI034 - a bytes subclass, built once
        return super().__new__(cls, b"[" * levels + b"0" + b"]" * levels)


def _not_json(data: bytes) -> bool:
    try:
        orjson.loads(data)
    except orjson.JSONDecodeError:
        return True
    return False


# one way to break an event each: (field, bad value); None as the value removes the field
BREAKAGES = st.sampled_from(
    [
        ("ts", None), ("ts", -1.0), ("ts", 0), ("ts", 1e300), ("ts", TS_MAX * 2), ("ts", "now"), ("ts", True),
        ("ts", TS_MAX - 1),  # before 2100, but decades ahead of the collector's clock
        ("request_id", None), ("request_id", "has spaces"), ("request_id", "x" * 65), ("request_id", 7),
        ("hop", None), ("hop", "client.teleported"), ("attempt", -1), ("attempt", ATTEMPT_MAX + 1),
        ("attempt", 1.5), ("attempt", True), ("v", 2), ("eid", 12), ("eid", "e" * 65),
        ("n", INT64_MAX + 1), ("status", "200"), ("output_tokens", INT64_MIN - 1), ("stream", 1),
        ("queue_s", -0.5), ("prefill_s", 1e308), ("decode_s", MAX_DURATION_S * 2), ("max_gap_at", TS_MAX + 1),
        ("service", "s" * 257), ("replica", "r2\x1b[2K\rFIRING"), ("route", "\x00"), ("model", "m\x9b"),
        ("blob", Nested(MAX_NESTING + 1)), ("blob", Nested(400)),
        ("blob", {"n": [INT64_MAX + 1]}), ("blob", "x" * (MAX_EVENT_BYTES + 1)),
    ]
)


@st.composite
def invalid_line(draw) -> bytes:
    kind = draw(st.sampled_from(["not_json", "not_object", "broken"]))
    if kind == "not_json":
        return draw(
            st.binary(min_size=1, max_size=40).filter(
                lambda b: b"\n" not in b and b"\r" not in b and b.strip() != b"" and _not_json(b)
            )
        )
    if kind == "not_object":
        return orjson.dumps(draw(st.lists(SCALAR, max_size=3) | SCALAR))
    ev = draw(valid_event())
    name, value = draw(BREAKAGES)
    if value is None:
        ev.pop(name, None)
    elif isinstance(value, Nested):
        ev.pop(name, None)
        return orjson.dumps(ev)[:-1] + b', "' + name.encode() + b'": ' + value + b"}"
    else:
        ev[name] = value
    return json.dumps(ev).encode()  # the standard library writes integers of any size


LINE = st.one_of(
    valid_event().map(lambda e: ("valid", e)),
    invalid_line().map(lambda b: ("invalid", b)),
    st.sampled_from([b"", b"   ", b"\t"]).map(lambda b: ("blank", b)),
)
BATCH = st.tuples(st.lists(LINE, min_size=1, max_size=25), st.booleans())


@dataclass
class FuzzReport:
    cases: int = 0
    valid_lines: int = 0
    invalid_lines: int = 0
    server_errors: list[str] = field(default_factory=list)
    wrong_answers: list[str] = field(default_factory=list)
    expected: dict[str, dict] = field(default_factory=dict)  # eid -> the event as validated


def run_fuzz(url: str, examples: int) -> FuzzReport:
    """Post ``examples`` hypothesis cases to the collector at ``url``; what it answered."""
    report = FuzzReport()
    client = httpx.Client(base_url=url, timeout=60)

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(BATCH)
    def case(batch) -> None:
        lines, gz = batch
        body = b"".join((orjson.dumps(x) if kind == "valid" else x) + b"\n" for kind, x in lines)
        headers = {"Content-Type": "application/x-ndjson"}
        if gz:
            body, headers["Content-Encoding"] = gzip.compress(body), "gzip"
        answer = client.post("/v1/events", content=body, headers=headers)
        report.cases += 1
        valid = [x for kind, x in lines if kind == "valid"]
        invalid_at = [n for n, (kind, _) in enumerate(lines, start=1) if kind == "invalid"]
        report.valid_lines += len(valid)
        report.invalid_lines += len(invalid_at)
        if answer.status_code >= 500:
            report.server_errors.append(f"{answer.status_code}: {answer.text[:200]}")
            return
        got = answer.json()
        expected_status = 200 if valid else 400
        rejected = got.get("rejected", [])
        problems = []
        if answer.status_code != expected_status:
            problems.append(f"status {answer.status_code}, expected {expected_status}")
        if valid and got["accepted"] + got["duplicates"] != len(valid):
            problems.append(f"accepted {got['accepted']} + duplicates {got['duplicates']} != {len(valid)}")
        if [r["line"] for r in rejected] != invalid_at:
            problems.append(f"rejected lines {[r['line'] for r in rejected]} != {invalid_at}")
        if any(not r.get("error") for r in rejected):
            problems.append("a rejection without a reason")
        if problems:
            report.wrong_answers.append("; ".join(problems) + f" for {body[:300]!r}")
        for ev in valid:
            report.expected[ev["eid"]] = orjson.loads(orjson.dumps(validate_event(ev)))

    try:
        case()
    finally:
        client.close()
    return report
