"""Property-based fuzzing of the analyzer's readers: hostile files never raise, valid lines are
never lost (reader_fuzz.py says what is generated; bench/bench_fuzz_readers.py runs >= 10,000)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import orjson
import pytest
import reader_fuzz
from hypothesis import HealthCheck, given, settings
from reader_fuzz import NdjsonFile, accepted, cases, check_case, lines, valid_events


def fuzz(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


@fuzz(2000)
@given(lines)
def test_ndjson_lines_of_any_kind_never_raise_and_lose_no_valid_line(file_lines):
    with tempfile.TemporaryDirectory() as folder:
        check_case(Path(folder), [NdjsonFile(file_lines)], with_timelines=False)


@fuzz(600)
@given(cases)
def test_mixed_folders_of_hostile_files_never_raise_and_lose_no_valid_line(files):
    with tempfile.TemporaryDirectory() as folder:
        check_case(Path(folder), files)


@pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")
def test_the_property_fails_on_a_reader_that_loses_a_line(tmp_path, monkeypatch):
    # not vacuous: with a reader that drops the last event, the same check fails
    real = reader_fuzz.scan_events

    def lossy(paths):
        events, report = real(paths)
        report.events -= 1
        return events.head(report.events), report

    monkeypatch.setattr(reader_fuzz, "scan_events", lossy)
    event = valid_events.filter(accepted).example()  # one the contract takes (a generated one always should)
    with pytest.raises(AssertionError):
        check_case(tmp_path, [NdjsonFile([(orjson.dumps(event), event)])], with_timelines=False)


@pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")
def test_strategies_produce_what_they_promise():
    # a sample of cases holds valid events, hostile lines, gzip, damaged gzip, Parquet and garbage
    seen = set()
    for _ in range(100):
        for item in cases.example():
            if isinstance(item, NdjsonFile):
                seen.add("gz" if item.gz else "ndjson")
                seen |= {"damaged"} if not item.intact else set()
                seen |= {"valid" if e is not None else "hostile" for _, e in item.lines}
            else:
                seen.add(type(item).__name__)
    assert {"ndjson", "gz", "damaged", "valid", "hostile", "DataFrame", "tuple"} <= seen
