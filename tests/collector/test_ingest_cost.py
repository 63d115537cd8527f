"""What validating an ingested event costs, in instructions under callgrind (issue 39).

A figure the machine's load does not move: bench/ingest_instructions.py --validate-per-event runs
valgrind on 12,000 of the ingest bench's events, decoded only and decoded then validated
(``contract.validate_event``, owned, as ``Ingestor.parse`` does). It was 22.9k before issue 39 and
16.6-17.1k since (bench/README.md, "collector ingest: instructions per event"); the bound leaves
a fifth of margin and fails on the code before.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
MAX_PER_EVENT = 20_000


def test_validating_an_event_costs_under_twenty_thousand_instructions():
    run = subprocess.run(
        [sys.executable, str(BENCH / "ingest_instructions.py"), "--validate-per-event"],
        cwd=BENCH, capture_output=True, text=True, timeout=900, check=True,
    )  # fmt: skip
    figures = json.loads(run.stdout)
    assert figures["events"] == 12_000, figures
    # a sanity check of the harness: validation does some work for each event
    assert 5_000 < figures["validate_per_event"] <= MAX_PER_EVENT, figures
