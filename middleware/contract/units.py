"""Sizes, durations and instants as hopline's command lines, configs and APIs write them: one reading
of each, for every command (the collector's and the analyzer's alike: it lives beside the contract
because both parts depend on this package and neither may import the other).

- sizes (``parse_size``): ``k``, ``M``, ``G``, ``T`` (``kB``, ``MB``, ...) are powers of 1000 and
  ``Ki``, ``Mi``, ``Gi``, ``Ti`` (``KiB``, ``MiB``, ...) powers of 1024, as Kubernetes reads
  quantities and disks are sold: ``512MB`` is 512,000,000 bytes, ``512MiB`` 536,870,912. A bare
  number is bytes; a decimal or an exponent is allowed (``1.5GiB``, ``2e9``).
- durations (``parse_duration``): ``500ms``, ``15m``, ``14d`` (the collector's ``--grace``,
  ``--ttl``, ``--retention``; the analyzer's ``--window``, ``--slo``).
- instants (``to_epoch``): Unix seconds or ISO-8601 (``hopline analyze --since / --until``, the
  collector's ``GET /v1/requests?since=…&until=…``).

``tests/test_layout.py`` checks that no other module defines such a parser.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime

__all__ = ["SIZE_HELP", "TIME_EXAMPLES", "TimeBound", "parse_duration", "parse_size", "to_epoch"]

# --- sizes ---------------------------------------------------------------------------------------
SIZE_HELP = "MB = 10^6 bytes, MiB = 2^20"
_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*(?:([kmgt])(i)?)?b?\s*", re.IGNORECASE)
_POWER = {"k": 1, "m": 2, "g": 3, "t": 4}


def parse_size(text: str) -> int:
    """``"64MiB"`` -> 67108864, ``"512MB"`` -> 512000000, ``"512k"`` -> 512000, ``"2e9"`` ->
    2000000000; a bare number is bytes (see the module doc)."""
    match = _SIZE.fullmatch(text)
    if match is None:
        raise ValueError(f"not a size: {text!r} (examples: 0, 1048576, 512KiB, 64MiB, 6GiB, 512MB; {SIZE_HELP})")
    number, prefix, binary = match.groups()
    base = 1024 if binary else 1000
    return int(float(number) * (base ** _POWER[prefix.lower()] if prefix else 1))


# --- durations -----------------------------------------------------------------------------------
_DURATION_RE = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*(us|µs|ms|s|m|min|h|d)?\s*")
_UNIT_SECONDS = {
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "min": 60.0,
    "h": 3600.0,
    "d": 86400.0,
}


def parse_duration(text: str, *, unit_required: bool = False) -> float:
    """``"500ms"`` -> 0.5, ``"14d"`` -> 1209600.0; a bare number is seconds, or with
    ``unit_required`` an error naming the forms meant (where ``40`` could be 40 ms or 40 s)."""
    match = _DURATION_RE.fullmatch(text)
    if match is None:
        raise ValueError(f"not a duration: {text!r} (examples: 500ms, 10s, 15m, 6h, 14d)")
    if match.group(2) is None and unit_required:
        number = match.group(1)
        raise ValueError(
            f"{text.strip()!r} has no unit: write {number}ms or {number}s (units: us, ms, s, m, h, d)"
        )
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2) or "s"]


# --- instants ------------------------------------------------------------------------------------
TimeBound = float | int | str | datetime | None
TIME_EXAMPLES = "Unix seconds such as 1767607200, or ISO-8601 such as 2026-01-05T10:00:00Z"


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
                raise ValueError(f"not a time: {value!r} (give {TIME_EXAMPLES})") from None
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ValueError(f"not a time: {value!r} (give {TIME_EXAMPLES})")
        return float(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.timestamp()
