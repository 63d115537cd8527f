"""Words more than one detector says: a moment of the day as a sentence says it."""

from __future__ import annotations

from datetime import UTC, datetime


def clock(ts: float) -> str:
    """``10:05`` on the minute, else ``10:05:17`` (UTC)."""
    moment = datetime.fromtimestamp(round(ts), tz=UTC)
    return moment.strftime("%H:%M" if moment.second == 0 else "%H:%M:%S")
