"""One reading of sizes for every command (``contract.units``): ``512MB`` was 512,000,000 bytes to
the collector and 536,870,912 to the analyzer."""

from __future__ import annotations

import pytest
from hopline.analyzer.bounded import max_memory as analyzer_size
from hopline.collector.config import settings
from hopline.middleware.contract.units import SIZE_HELP, parse_size

# how the collector reads a size setting (``--healthz-min-free``)
collector_size = next(s.parse for f, s in settings() if f.name == "healthz_min_free")

READINGS = {
    "0": 0, "1048576": 1_048_576, "10B": 10, "512k": 512_000, "1kB": 1000, "512KiB": 524_288,
    "1Ki": 1024, "512MB": 512_000_000, "512m": 512_000_000, "64MiB": 67_108_864, "5 MiB": 5_242_880,
    "6G": 6_000_000_000, "6GiB": 6_442_450_944, "1.5GiB": 1_610_612_736, "2e9": 2_000_000_000,
    "1TiB": 2**40,
}  # fmt: skip


@pytest.mark.parametrize(("text", "size"), READINGS.items())
def test_a_size_has_one_reading(text, size):
    assert parse_size(text) == size
    assert collector_size(text) == size
    if size > 0:
        assert analyzer_size(text) == size


@pytest.mark.parametrize("text", ["", "abc", "MiB", "-1", "1x", "1.2.3", "1ib", "1kk", "6 GiB of RAM"])
def test_what_is_no_size_is_refused_with_examples(text):
    for parse in (parse_size, collector_size, analyzer_size):
        with pytest.raises(ValueError, match="not a size.*MiB = 2\\^20"):
            parse(text)


def test_the_analyzer_wants_some_memory():
    with pytest.raises(ValueError, match="--max-memory must be more than 0"):
        analyzer_size("0")


def test_every_size_setting_of_the_collector_says_which_reading():
    sized = [s for _, s in settings() if s.parse is parse_size]
    assert sized and all(SIZE_HELP in s.help for s in sized)
