"""Request and event IDs: their form, and that a host seeding ``random`` or forking cannot make
two processes (or two calls) give the same ones. They come from hopline's own generator, not from
``os.urandom`` per ID (see ``contract.new_eid``)."""

from __future__ import annotations

import os
import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hopline.middleware.client import _traceparent
from hopline.middleware.contract import (
    EventError,
    events,
    is_valid_trace_id,
    new_eid,
    new_request_id,
    normalize_request_id,
    validate_event,
)


def test_ids_have_their_form():
    rids, eids = [new_request_id() for _ in range(2000)], [new_eid() for _ in range(2000)]
    assert all(re.fullmatch(r"[0-9a-f]{32}", r) for r in rids)
    assert all(re.fullmatch(r"[0-9a-f]{16}", e) for e in eids)
    assert all(normalize_request_id(r) == r and is_valid_trace_id(r) for r in rids)
    assert len(set(rids)) == len(rids) and len(set(eids)) == len(eids)
    # every hex digit at every position: the leading zeros are kept, not dropped
    assert all(len({r[i] for r in rids}) == 16 for i in range(32))


def test_a_host_seeding_random_does_not_repeat_hoplines_ids():
    # vLLM's --seed (default 0) calls random.seed(0) in every replica
    random.seed(0)
    first = [new_request_id(), new_eid()]
    random.seed(0)
    again = [new_request_id(), new_eid()]
    assert first[0] != again[0] and first[1] != again[1]
    seeded = random.Random(0)
    assert first[0] != f"{seeded.getrandbits(128):032x}"


def test_a_forked_child_makes_other_ids_than_its_parent():
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next IDs, to the parent
        try:
            os.write(write_end, f"{new_request_id()} {new_eid()}".encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        child = pipe.read().split()
    os.waitpid(pid, 0)
    parent = [new_request_id(), new_eid()]  # what the child would have made without a new seed
    assert len(child) == 2 and child[0] != parent[0] and child[1] != parent[1]


def test_a_fresh_traceparent_is_valid_w3c():
    header = _traceparent("not-a-trace-id")
    version, trace_id, span_id, flags = header.split("-")
    assert (version, flags) == ("00", "01")
    assert is_valid_trace_id(trace_id) and re.fullmatch(r"[0-9a-f]{16}", span_id) and span_id != "0" * 16


def test_validation_remembers_only_plain_ids_and_forgets_them_within_its_bound():
    """validate_event skips the prefix and pattern checks for an ID it saw in hopline's form: an
    engine-prefixed ID is still stripped after its bare form was seen, a bad ID is refused every
    time, and the remembered set never grows past its bound."""
    def rid_of(request_id):
        return validate_event({"ts": 1.7e9, "hop": "engine.received", "request_id": request_id})["request_id"]

    assert rid_of("abc-1") == "abc-1" and rid_of("abc-1") == "abc-1"
    assert rid_of("chatcmpl-abc-1") == "abc-1"  # stripped though its bare form is remembered
    assert "abc-1" in events._PLAIN_IDS and "chatcmpl-abc-1" not in events._PLAIN_IDS
    for _ in range(2):
        with pytest.raises(EventError, match="request_id must be 1-64 characters"):
            rid_of("a b")
    assert "a b" not in events._PLAIN_IDS
    for i in range(events._PLAIN_IDS_MAX + 10):
        assert rid_of(f"id-{i}") == f"id-{i}"
    assert len(events._PLAIN_IDS) <= events._PLAIN_IDS_MAX


def test_an_owned_event_is_normalized_in_place_as_the_copy_would_be():
    """``validate_event(obj, owned=True)`` (the collector's ingest: a dict just decoded) returns
    the very dict, normalized exactly as the copying call normalizes a copy (same keys, same
    order, same values); without ``owned`` the caller's dict is left untouched."""
    raw = {"ts": 1_700_000_000, "request_id": "chatcmpl-xyz", "hop": "engine.received", "stream": True, "zz": [1]}
    copied = validate_event(dict(raw))
    mine = dict(raw)
    owned = validate_event(mine, owned=True)
    assert owned is mine and list(owned.items()) == list(copied.items())
    assert owned["request_id"] == "xyz" and type(owned["ts"]) is float and (owned["v"], owned["attempt"]) == (1, 0)
    untouched = dict(raw)
    assert validate_event(untouched) is not untouched and untouched == raw
    with pytest.raises(EventError, match="unknown hop"):
        validate_event({**raw, "hop": "nope"}, owned=True)


def _normalized_by_the_rule(value: object) -> str | None:
    """The rule as DESIGN.md states it, written plainly: ASCII text, one engine prefix (chatcmpl-,
    cmpl-) stripped when something follows it, then 1-64 characters of [A-Za-z0-9._:-]."""
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return None
    if not isinstance(value, str):
        return None
    for prefix in ("chatcmpl-", "cmpl-"):
        if value.startswith(prefix) and len(value) > len(prefix):
            value = value[len(prefix) :]
            break
    return str(value) if re.fullmatch(r"[A-Za-z0-9._:-]{1,64}", value) else None


class _Str(str):
    pass


_ID_PARTS = st.sampled_from(["chatcmpl-", "cmpl-", "chat", "-", "a", "Z9", ".", ":", "_", " ", "é", "\n", "\x00"])
_IDS = st.one_of(
    st.lists(_ID_PARTS, max_size=8).map("".join),
    st.text(max_size=80),
    st.text(alphabet="abc-:._", min_size=60, max_size=75),  # around the 64-character limit
)


@given(_IDS)
@settings(max_examples=600, deadline=None)
def test_request_ids_are_normalized_by_the_rule_as_str_bytes_and_subclasses(value):
    expected = _normalized_by_the_rule(value)
    assert normalize_request_id(value) == expected
    assert normalize_request_id(_Str(value)) == expected
    try:
        raw = value.encode("ascii")
    except UnicodeEncodeError:
        raw = value.encode()
        expected = None
    assert normalize_request_id(raw) == expected
    assert normalize_request_id(bytearray(raw)) is None  # not bytes: as before, not an ID
    for result in (normalize_request_id(value), normalize_request_id(raw)):
        assert result is None or type(result) is str


def test_request_ids_of_other_types_are_none():
    assert [normalize_request_id(v) for v in (None, 12, 1.5, ["a"], b"\xff", memoryview(b"ab"))] == [None] * 6
    assert normalize_request_id(b"chatcmpl-") == "chatcmpl-" and normalize_request_id(b"cmpl-x") == "x"
