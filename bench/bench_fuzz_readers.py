"""Fuzzing the analyzer's readers at scale: >= 10,000 hostile cases each, 0 crashes expected.

    python bench/bench_fuzz_readers.py [--examples 10000] [--seed 0]

The cases and the property are tests/analyzer/reader_fuzz.py (the CI test runs a few thousand of
the same): NDJSON lines of any kind (JSON of any shape, wrong types for known fields, integers
beyond their column, ts = 1e308, nesting deeper than JSON is written back, bytes that are not
text), gzip streams cut short or damaged, Parquet files with random columns and types, bytes
that are not Parquet. A case passes when reading never raises, timelines never raise, and every
valid line of an undamaged file comes out. Prints one Markdown row per property.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from hypothesis import HealthCheck, given, seed, settings

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "analyzer"))
from reader_fuzz import NdjsonFile, cases, check_case, lines


def run(name: str, strategy, check, examples: int, at_seed: int) -> None:
    count = 0

    @seed(at_seed)
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def property_holds(value) -> None:
        nonlocal count
        count += 1
        with tempfile.TemporaryDirectory() as folder:
            check(Path(folder), value)

    start = time.perf_counter()
    try:
        property_holds()
        outcome = "0 crashes, 0 valid lines lost"
    except Exception as exc:  # noqa: BLE001 - a bench reports, the CI test fails
        outcome = f"FAILED: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    print(f"| {name} | {count:,} | {time.perf_counter() - start:.0f} s | {outcome} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print("| property | cases | time | result |\n|---|---|---|---|")
    run(
        "NDJSON lines of any kind (read only)",
        lines,
        lambda folder, file_lines: check_case(folder, [NdjsonFile(file_lines)], with_timelines=False),
        args.examples,
        args.seed,
    )
    run("folders of 1-4 hostile files (read + timelines)", cases, check_case, args.examples, args.seed)


if __name__ == "__main__":
    main()
