"""One parser for the durations hopline's command lines and configs take (``500ms``, ``15m``, ``14d``).

Shared by the collector (``--grace``, ``--ttl``, ``--retention``) and the analyzer (``--window``,
``--slo``); it lives beside the contract because both parts already depend on this package.
"""

from __future__ import annotations

import re

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
