"""Fixtures of the collector tests (helpers live in tests/support/)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hopline.collector.config import CollectorConfig
from support.collector import Running, serve


@pytest.fixture
def config(tmp_path: Path) -> CollectorConfig:
    return CollectorConfig(data_dir=tmp_path / "data", grace=0.0)


@pytest.fixture
def collector(config: CollectorConfig) -> Iterator[Running]:
    with serve(config) as running:
        yield running
