"""What validating an ingested event costs, in instructions under callgrind (issue 39).

A figure the machine's load does not move: bench/ingest_instructions.py --validate-per-event runs
valgrind on 12,000 of the ingest bench's events, decoded only and decoded then validated
(``contract.validate_event``, owned, as ``Ingestor.parse`` does). It was 22.9k before issue 39 and
16.6-17.1k since (bench/README.md, "collector ingest: instructions per event"); the bound leaves
a fifth of margin and fails on the code before.
"""

from __future__ import annotations

from support.callgrind import bench_figures

MAX_PER_EVENT = 20_000


def test_validating_an_event_costs_under_twenty_thousand_instructions():
    figures = bench_figures("ingest_instructions.py", "--validate-per-event")
    assert figures["events"] == 12_000, figures
    # a sanity check of the harness: validation does some work for each event
    assert 5_000 < figures["validate_per_event"] <= MAX_PER_EVENT, figures
