"""The terminal report: readable at 80 columns, one number format, counted nouns."""

from __future__ import annotations

import io

import pytest
from hopline.analyzer import report
from support.synth import StageShift, generate
from hopline.analyzer.timelines import timelines
from rich.console import Console


@pytest.fixture(scope="module")
def result() -> dict:
    events = generate(
        duration_s=300,
        seed=5,
        services=("kite-chat-with-a-long-service-name", "search-assist"),
        incidents=[StageShift("queue", 3.0, at_s=150, scope={"replica": "r2"})],
    )
    return report.analyze(timelines(events.lazy()).collect())


@pytest.mark.parametrize("width", [80, 150])
def test_nothing_is_cut_at_any_width(result, width):
    out = io.StringIO()
    report.render(result, Console(file=out, width=width, color_system=None))
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= width
    assert "…" not in text  # rich's sign of a truncated cell
    # every stage and replica shows up in full
    for word in ("engine frontend", "queue", "prefill", "decode", "r1", "r2", "search-assist"):
        assert word in text, word
    assert "Largest part of TTFT: queue" in text


def test_counted_nouns():
    assert report.plural(1, "request") == "1 request"
    assert report.plural(2, "request") == "2 requests"
    assert report.plural(12000, "request") == "12,000 requests"
