"""``validate_event``'s generated per-shape test (``events._ACCEPTS``) only takes what the full
pass takes unchanged: on valid and broken events alike, the same event back (same keys, order,
values and types) or the same error, with it and without it."""

from __future__ import annotations

import math
import random

import pytest
from hopline.middleware.contract import events
from hopline.middleware.contract.events import HOPS, EventError, validate_event

_VALUES = {
    "v": [1, 1, 1, True, 1.0, 2, "1"],
    "ts": [1_700_000_000.5, 1_700_000_000.25, 1_700_000_000, True, 0.0, -1.0, 5e9, math.nan, "x"],
    "request_id": ["req-1", "req-2", "chatcmpl-req-1", "bad id", "", 7, "a" * 300],
    "hop": [*HOPS[:6], "emitter.stats", "nope", 3],
    "attempt": [0, 0, 1, 2, True, -1, 1.0, 10**9],
    "eid": ["e1", "e2", "", "x" * 65, 5, None],
    "service": ["chat", "chat", "gw", None, "a\x1bb", "s" * 257, 4],
    "replica": ["r0", "r1", None, ["r"]],
    "model": ["m", None, 1.5],
    "stream": [True, False, None, 1, "yes"],
    "status": [200, 499, None, True, 2**70, 1.5],
    "output_tokens": [0, 12, None, -1, 2**64, 1.0, False],
    "queue_s": [0.0, 0.25, 1, None, math.inf, -0.5, math.nan, True],
    "finish_reason": ["stop", "length", None, "st\x00op", 3],
    "leg": ["prefill", "decode", None, 7],
    "trace_id": ["0af7651916cd43dd8448eb211c80319c", "0" * 32, "ABC", None, 5],
    "error": ["cancelled", "boom", None, "\x9b"],
    "tenant": ["t1", {"a": [1, 2]}, 2**70],  # an unknown attribute
}
_CORE = ("v", "ts", "request_id", "hop", "attempt")
_OPTIONAL = tuple(name for name in _VALUES if name not in _CORE)


def _random_event(rng: random.Random) -> dict:
    """Valid values but for at most one field (so each check is met on its own), in any order."""
    names = list(_CORE) + rng.sample(_OPTIONAL, rng.randint(0, 6))
    if rng.random() < 0.1:
        names.remove(rng.choice(_CORE))
    rng.shuffle(names)
    event = {name: _VALUES[name][0] for name in names}
    event["request_id"] = rng.choice(_VALUES["request_id"][:2])
    if rng.random() < 0.6:
        name = rng.choice(names)
        event[name] = rng.choice(_VALUES[name])
    return event


def _outcome(obj: dict, owned: bool = True) -> tuple:
    """What validating ``obj`` gives; not ``owned``: the full pass only (on a copy)."""
    try:
        event = validate_event(obj, owned=owned)
    except EventError as exc:
        return ("error", str(exc), exc.reason)
    assert (event is obj) is owned
    return ("event", list(event.items()), [type(v) for v in event.values()])


def test_the_generated_test_takes_only_what_the_full_pass_takes_unchanged():
    rng = random.Random(5)
    accepted = 0
    for _ in range(6000):
        obj = _random_event(rng)
        full = _outcome(dict(obj), owned=False)  # the full pass only (it fills the caches)
        before = len(events._PLAIN_IDS), len(events._CLEAN_STRINGS)
        shape = tuple(obj)
        accept = events._ACCEPTS.get(shape) or events._accept_for(shape)
        taken = accept is not None and accept(dict(obj))
        got = _outcome(dict(obj))
        assert repr(got) == repr(full), obj  # repr: NaN equals itself there
        if taken:
            accepted += 1
            assert full[0] == "event" and (len(events._PLAIN_IDS), len(events._CLEAN_STRINGS)) == before
    assert accepted > 1500  # the generated test did take a good share of them


def test_no_shape_beyond_the_bound_compiles_code(monkeypatch):
    """Past ``_ACCEPTS_MAX`` shapes, new ones take the full pass (no code made per event)."""
    monkeypatch.setattr(events, "_ACCEPTS", {})
    monkeypatch.setattr(events, "_ACCEPTS_MAX", 3)
    monkeypatch.setattr(events, "_accept_for", lambda shape: pytest.fail("compiled past the bound"))
    events._ACCEPTS.update({("a",): None, ("b",): None, ("c",): None})
    event = {"v": 1, "ts": 1_700_000_000.5, "request_id": "req-1", "hop": HOPS[0], "attempt": 0, "n": 1}
    assert validate_event(dict(event), owned=True) == event
