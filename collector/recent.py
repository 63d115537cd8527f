"""Recently finished requests in brief, for ``GET /v1/requests?since=…&until=…&slowest=N``.

"This call was slow" often comes without a request ID; this answers "which were the slowest
requests of the last ten minutes?" from memory, with their IDs for ``hopline timeline ID``.

Every request the join finishes (complete, or closed incomplete: expired, evicted, overflow)
leaves one ``Summary``: when it started (its earliest event's ``ts``), its ID, its TTFT and
end-to-end time as the outermost view saw them (``contract.VIEWS``: the client's, else the
gateway's, else the engine's, and which one), and the rule book's outcome and scope
(``rules.describe_request``). Memory is bounded by count: the last ``capacity`` summaries
(``--recent-requests``, 100,000 by default; ~350 bytes each with 32-character IDs, measured by
``bench/bench_recent_requests.py``: 33 MiB when full), oldest dropped first. Older requests
are in the store, for ``hopline analyze --since``.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from operator import itemgetter
from typing import Any, NamedTuple

from hopline.middleware.contract.errors import HoplineError
from hopline.middleware.contract import VIEWS

RANKINGS = ("ttft", "e2e")  # what ?by= may rank ?slowest= by
DEFAULT_LIMIT = 100  # without ?slowest=: the newest requests, at most this many
MAX_LIMIT = 10_000  # one answer stays a few MiB whatever is asked


class Summary(NamedTuple):
    started: float  # the request's earliest event ts (Unix seconds)
    request_id: str
    ttft_s: float | None
    ttft_view: str | None
    e2e_s: float | None
    e2e_view: str | None
    outcome: str
    state: str  # complete, expired, evicted, overflow
    service: str | None
    model: str | None
    replica: str | None

    def answer(self) -> dict[str, Any]:
        return self._asdict()


# measure -> ((``<view>_<measure>``, view), ...) nearest the user first (the names made once)
_VIEW_KEYS: dict[str, tuple[tuple[str, str], ...]] = {}
_TS = itemgetter("ts")


def outermost(values: Mapping[str, Any], measure: str) -> tuple[float | None, str | None]:
    """``(value, view)`` of ``<view>_<measure>`` for the first view (nearest the user) that has it."""
    keys = _VIEW_KEYS.get(measure)
    if keys is None:
        keys = tuple((f"{view}_{measure}", view) for view in VIEWS)
        if measure in RANKINGS:  # the measures the join asks for; any other is not kept
            _VIEW_KEYS[measure] = keys
    for key, view in keys:
        value = values.get(key)
        if value is not None:
            return value, view
    return None, None


def summarize(
    request_id: str,
    events: Iterable[Mapping[str, Any]],
    values: Mapping[str, Any],
    described: Mapping[str, Any],
    state: str,
) -> Summary:
    """One finished request's summary, from its stage values and the rule book's description."""
    scope = described["scope"]
    ttft, ttft_view = outermost(values, "ttft")
    e2e, e2e_view = outermost(values, "e2e")
    return Summary._make((  # tuple.__new__ without the named constructor's Python call
        min(map(_TS, events)),
        request_id,
        ttft,
        ttft_view,
        e2e,
        e2e_view,
        described["outcome"],
        state,
        scope.get("service"),
        scope.get("model"),
        scope.get("replica"),
    ))


class QueryError(HoplineError, ValueError):
    """A query parameter that is wrong; the message names it (400)."""


def select(
    summaries: list[Summary],
    *,
    since: float | None = None,
    until: float | None = None,
    slowest: int | None = None,
    by: str = "ttft",
    limit: int = DEFAULT_LIMIT,
) -> dict[str, Any]:
    """The answer of ``GET /v1/requests``: requests that started in ``[since, until]``, either the
    ``slowest`` N by ``by`` (slowest first; requests without that measure, e.g. non-streaming ones
    for TTFT, are counted in ``unranked``, not listed), or the newest ``limit`` (newest first).
    ``summaries`` is a snapshot in finishing order (blocking on 100,000: run it off the event loop)."""
    if by not in RANKINGS:
        raise QueryError(f"by must be one of {', '.join(RANKINGS)}, got {by!r}")
    if since is not None and until is not None and since > until:
        raise QueryError(f"since {_iso(since)} is after until {_iso(until)}")
    lo = float("-inf") if since is None else since
    hi = float("inf") if until is None else until
    matched = [s for s in summaries if lo <= s.started <= hi]
    answer: dict[str, Any] = {
        "kept": len(summaries),
        "oldest_started": min((s.started for s in summaries), default=None),
        "matched": len(matched),
    }
    if slowest is not None:
        field = f"{by}_s"
        ranked = [s for s in matched if getattr(s, field) is not None]
        chosen = heapq.nlargest(slowest, ranked, key=lambda s: getattr(s, field))
        answer.update(ranked_by=by, unranked=len(matched) - len(ranked))
    else:
        chosen = matched[-limit:][::-1]
    answer["requests"] = [s.answer() for s in chosen]
    return answer


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class RecentRequests:
    """The last ``capacity`` finished requests' summaries (a bounded deque: O(1) per request)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._kept: deque[Summary] = deque(maxlen=capacity)

    def add(self, summary: Summary) -> None:
        self._kept.append(summary)

    def __len__(self) -> int:
        return len(self._kept)

    def snapshot(self) -> list[Summary]:
        """A copy to query on another thread (the join appends on the event loop meanwhile)."""
        return list(self._kept)
