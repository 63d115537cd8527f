"""Hop events for tests: builders (one argument order: hop, request ID, time), NDJSON, emitters in memory."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from hopline.middleware.contract import new_eid
from hopline.middleware.emit import Emitter
from hopline.middleware.sinks import MemorySink

from support.servers import wait_until


def event(hop: str, request_id: str, ts: float, **attrs: Any) -> dict[str, Any]:
    """One contract-v1 event with a fresh ``eid``, as every hopline emitter writes it."""
    return {"v": 1, "eid": new_eid(), "ts": ts, "request_id": request_id, "hop": hop, **attrs}


def ndjson(events: Iterable[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(e).encode() + b"\n" for e in events)


def memory_emitter(**static: Any) -> Emitter:
    """An emitter into a ``MemorySink`` that flushes often; ``static`` as for ``Emitter``."""
    return Emitter(MemorySink(), flush_interval=0.02, **static)


def events_of(emitter: Emitter) -> list[dict[str, Any]]:
    emitter.flush()
    return list(emitter.sink.events)  # type: ignore[attr-defined]


def wait_for(
    emitter: Emitter, predicate: Callable[[list[dict[str, Any]]], bool], timeout: float = 5.0
) -> list[dict[str, Any]]:
    """The emitter's events once ``predicate`` holds for them (AssertionError after ``timeout``)."""
    caught: list[list[dict[str, Any]]] = [[]]

    def ready() -> bool:
        caught[0] = events_of(emitter)
        return predicate(caught[0])

    try:
        wait_until("the events", ready, timeout=timeout, interval=0.02)
    except AssertionError:
        raise AssertionError(
            f"condition not met; events: {[(e['hop'], e.get('error')) for e in caught[0]]}"
        ) from None
    return caught[0]


def hops_of(events: list[dict[str, Any]], request_id: str | None = None) -> list[str]:
    """Hop names in timestamp order (of one request when ``request_id`` is given)."""
    chosen = [e for e in events if request_id is None or e["request_id"] == request_id]
    return [e["hop"] for e in sorted(chosen, key=lambda e: e["ts"])]


def one(events: list[dict[str, Any]], hop: str, **match: Any) -> dict[str, Any]:
    """The single event of ``hop`` whose attributes equal ``match``."""
    found = [e for e in events if e["hop"] == hop and all(e.get(k) == v for k, v in match.items())]
    assert len(found) == 1, f"expected one {hop} {match}, got {len(found)}: {[e['hop'] for e in events]}"
    return found[0]
