"""One parser for the points in time hopline's commands and APIs take (``--since``, ``?since=``).

Shared by the analyzer (``hopline analyze --since / --until``) and the collector
(``GET /v1/requests?since=…&until=…``), so both accept exactly the same text; it lives beside the
contract because both parts depend on this package and neither may import the other.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

TimeBound = float | int | str | datetime | None
EXAMPLES = "Unix seconds such as 1767607200, or ISO-8601 such as 2026-01-05T10:00:00Z"


def to_epoch(value: TimeBound) -> float | None:
    """A point in time as Unix seconds: a number, or ISO-8601 (UTC when no offset); None stays None.

    ``ValueError`` naming the text and what is accepted for anything else (``"nan"`` included)."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            try:
                value = datetime.fromisoformat(value.strip())
            except ValueError:
                raise ValueError(f"not a time: {value!r} (give {EXAMPLES})") from None
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ValueError(f"not a time: {value!r} (give {EXAMPLES})")
        return float(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.timestamp()
