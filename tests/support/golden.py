"""The golden fixture every implementation of the stage table reproduces (tests/golden_stages.json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

GOLDEN_PATH = Path(__file__).parents[1] / "golden_stages.json"
GOLDEN: dict[str, Any] = json.loads(GOLDEN_PATH.read_text())


def golden_case(name: str) -> dict[str, Any]:
    """One case of the fixture by name (KeyError naming the known ones)."""
    for case in GOLDEN["cases"]:
        if case["name"] == name:
            return case
    raise KeyError(f"no golden case {name!r}; known: {', '.join(c['name'] for c in GOLDEN['cases'])}")
