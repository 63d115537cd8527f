"""Sizes, durations and instants as hopline's command lines and configs write them: one reading
of each, for every command.

- sizes (``parse_size``): ``k``, ``M``, ``G``, ``T`` (``kB``, ``MB``, ...) are powers of 1000 and
  ``Ki``, ``Mi``, ``Gi``, ``Ti`` (``KiB``, ``MiB``, ...) powers of 1024, as Kubernetes reads
  quantities and disks are sold: ``512MB`` is 512,000,000 bytes, ``512MiB`` 536,870,912. A bare
  number is bytes; a decimal or an exponent is allowed (``1.5GiB``, ``2e9``).
- durations (``parse_duration``, ``durations``): ``500ms``, ``15m``, ``14d``.
- instants (``to_epoch``, ``times``): Unix seconds or ISO-8601.
"""

from __future__ import annotations

import re

from hopline.middleware.contract.durations import parse_duration
from hopline.middleware.contract.times import to_epoch

__all__ = ["SIZE_HELP", "parse_duration", "parse_size", "to_epoch"]

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
