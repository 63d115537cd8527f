"""What ingesting an event costs, in instructions under callgrind (issue 39).

Figures the machine's load does not move (bench/README.md, "collector ingest: instructions per
event", has them and their history):

* validating one: bench/ingest_instructions.py --validate-per-event runs valgrind on 12,000 of the
  ingest bench's events, decoded only and decoded then validated (``contract.validate_event``,
  owned, as ``Ingestor.parse`` does). It was 22.9k before issue 39, 16.6-17.1k since, and 15.2k
  since the run imports no collector module (2026-12-07); the bound leaves a fifth of margin and
  fails on the code before.
* the whole ingest (parse, validate, store, join, the finished requests' stages, rule book,
  metrics, summaries and windows): bench/ingest_instructions.py --ingest-per-event runs the
  bench's ``ingest`` under valgrind on 500 and on 1,500 requests' events and divides the difference
  by the 12,000 events between them. 84.6k on 2026-12-05 (90.7k at 9351732, the same method and
  sitting), 81.5k since the generated per-shape test of ``validate_event`` (84.8k at fff2ed0, the
  same sitting), 76.2k since the histograms count a finished request's observations in bulk
  (``histogram.Rows``; 79.1k at 55e0c69, the same sitting, both with the bench's one scrape at
  the end); the bound is that figure plus a tenth (two valgrind runs of the collector side by side:
  ~1-2 min).
"""

from __future__ import annotations

from support.callgrind import bench_figures

MAX_PER_EVENT = 20_000
MAX_INGEST_PER_EVENT = 83_800  # 76.2k + 10%


def test_validating_an_event_costs_under_twenty_thousand_instructions():
    figures = bench_figures("ingest_instructions.py", "--validate-per-event")
    assert figures["events"] == 12_000, figures
    # a sanity check of the harness: validation does some work for each event
    assert 5_000 < figures["validate_per_event"] <= MAX_PER_EVENT, figures


def test_ingesting_an_event_costs_under_eighty_four_thousand_instructions():
    figures = bench_figures("ingest_instructions.py", "--ingest-per-event")
    assert figures["events"] == 12_000, figures
    # the lower bound checks the harness: an ingested event costs more than its validation alone
    assert MAX_PER_EVENT < figures["ingest_per_event"] <= MAX_INGEST_PER_EVENT, figures
