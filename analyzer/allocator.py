"""How long Polars' allocator keeps the memory it freed, in hopline's batch analysis.

Polars sets its jemalloc to give freed pages back to the system after 0.5 s (dirty) and 1 s
(muzzy) (``polars/__init__.py``, pola-rs/polars#18088). A bucket of the bounded analysis
(``bounded``) allocates and frees gigabytes within a few seconds, so every page given back is
faulted in again by the next step: 270k page faults and 1.3 of 4.3 CPU-s in the kernel for one
5.9M-event bucket of the 7-stage table on this project's 2-core VM, where a fault costs ~5 µs.
Kept for 5 s, the pages are reused instead (the same bucket: 60-180k faults, 0.5-0.8 CPU-s in
the kernel), for a higher peak (1.9 -> 2.6 GB there; bench/README.md, "the allocator").

The budget's per-event figure (``bounded.EVENT_BYTES``) does not count those kept pages: at
``--max-memory 2GiB`` the peak went 1.93 -> 2.26 GB with them, past the budget, while at the
default 6 GiB it was 2.8 -> 3.4-3.5 GiB (``--json``) and 4.4 GiB for the whole table. So the
pages are kept only at a budget of at least the default; a smaller one keeps Polars' setting.

jemalloc reads the setting once, when Polars is first imported: ``keep_freed`` sets it for this
process, ``environ`` for one to be started. A decay the user set in ``_RJEM_MALLOC_CONF`` is kept.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from hopline.middleware.contract.units import parse_size

DECAY_MS = 5000
MIN_BUDGET = 6 * 1024**3  # the default --max-memory (bounded.DEFAULT_MAX_MEMORY)
SETTING = f"dirty_decay_ms:{DECAY_MS},muzzy_decay_ms:{DECAY_MS}"
VARIABLE = "_RJEM_MALLOC_CONF"  # read by Polars' __init__, appended to its own defaults
# what Polars writes there (and a child of a process that imported Polars inherits)
POLARS_DEFAULT = "dirty_decay_ms:500,muzzy_decay_ms:1000"


def with_setting(value: str | None) -> str | None:
    """``VARIABLE``'s value with ``SETTING`` added, or None to leave it: a user who set a decay
    (anywhere but in Polars' own default, which a parent that imported Polars passes on) keeps it."""
    if value and "decay_ms" in value.removeprefix(POLARS_DEFAULT):
        return None
    return f"{value},{SETTING}" if value else SETTING


def keep_freed(argv: Sequence[str] = ()) -> bool:
    """Set ``SETTING`` for this process, unless ``argv`` asks for a ``--max-memory`` below
    ``MIN_BUDGET``; False when it is not set, or cannot take effect (Polars is imported already),
    or the user chose their own decay."""
    value = with_setting(os.environ.get(VARIABLE))
    if "polars" in sys.modules or value is None or _budget(argv) < MIN_BUDGET:
        return False
    os.environ[VARIABLE] = value
    return True


def _budget(argv: Sequence[str]) -> float:
    """The ``--max-memory`` of a command line (the last one given), in bytes: infinite when not
    given, 0 when it is not a size (the command then reports it)."""
    given = None
    for number, arg in enumerate(argv):
        if arg == "--max-memory":
            given = argv[number + 1] if number + 1 < len(argv) else ""
        elif arg.startswith("--max-memory="):
            given = arg.partition("=")[2]
    if given is None:
        return float("inf")
    try:
        return parse_size(given)
    except ValueError:
        return 0


def environ(base: Mapping[str, str] = os.environ) -> dict[str, str]:
    """``base`` with ``SETTING``, for a process yet to be started (a user's own decay kept)."""
    value = with_setting(base.get(VARIABLE))
    return {**base} if value is None else {**base, VARIABLE: value}
