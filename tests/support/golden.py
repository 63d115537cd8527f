"""The golden fixture every implementation of the stage table reproduces (tests/golden_stages.json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hopline.middleware.contract.rules import is_stand_in

GOLDEN_PATH = Path(__file__).parents[1] / "golden_stages.json"
GOLDEN: dict[str, Any] = json.loads(GOLDEN_PATH.read_text())


def golden_case(name: str) -> dict[str, Any]:
    """One case of the fixture by name (KeyError naming the known ones)."""
    for case in GOLDEN["cases"]:
        if case["name"] == name:
            return case
    raise KeyError(f"no golden case {name!r}; known: {', '.join(c['name'] for c in GOLDEN['cases'])}")


def golden_log() -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Every case's events in one log, real request IDs prefixed with the case name so cases cannot
    collide; trace stand-ins kept as they are (their trace is the case's own). Returns the events
    and stand-in request ID -> case name."""
    events, stand_ins = [], {}
    for case in GOLDEN["cases"]:
        for e in case["events"]:
            rid = e["request_id"]
            if is_stand_in(rid, e.get("trace_id")):
                stand_ins[rid] = case["name"]
            else:
                rid = f"{case['name']}.{rid}"
            events.append({**e, "request_id": rid})
    return events, stand_ins
