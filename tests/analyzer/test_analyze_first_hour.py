"""``hopline analyze`` tried as a new user would (issue 35, the first hour, round three).

Before: ``--window 5`` ran with 5 s where 5 ms may have been meant (``hopline budget`` refuses a
bare number); the first line, "2,400 requests from 2026-01-05T10:00:00Z to 2026-01-05T10:01:59Z
(119 s, window 1 s)", was 86 columns and wrapped on an 80-column terminal; the README's "What you
see" showed a "Stages (all requests)" table the report no longer prints.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hopline.analyzer.report import HEAD_WIDTH, Facts, head_lines
from support.cli import hopline
from support.synth import StageShift, generate, write_ndjson

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
TABLE_RULES = "┏┡└━─"


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rise = StageShift("queue", 3.0, at_s=300, scope={"replica": "r2"})
    events = generate(duration_s=600, seed=3, incidents=[rise])
    return write_ndjson(events, tmp_path_factory.mktemp("log") / "events.ndjson")


def test_a_window_without_a_unit_is_refused_as_budget_refuses_a_duration_without_one(log):
    run = hopline("analyze", str(log), "--window", "5")
    assert run.returncode == 2, run.stdout[:300]  # before: 0, a report on 5 s windows
    units = "(units: us, ms, s, m, h, d)\n"
    assert run.stderr == f"hopline analyze: --window: '5' has no unit: write 5ms or 5s {units}"
    budget = hopline("budget", "--network", "40", "--queue", "10ms", "--prefill", "100ms", "--itl", "10ms",
                     "--prompt-tokens", "10", "--output-tokens", "10", "--layers", "2", "--kv-heads", "2",
                     "--head-dim", "2", "--dtype", "bf16")  # fmt: skip
    assert budget.returncode == 2
    assert budget.stderr == f"hopline budget: --network: '40' has no unit: write 40ms or 40s {units}"
    assert hopline("analyze", str(log), "--window", "5s").returncode == 0


def test_the_first_line_fits_80_columns(log):
    run = hopline("analyze", str(log))
    assert run.returncode == 0, run.stderr
    first = run.stdout.splitlines()[0]
    assert first == "12,000 requests, 2026-01-05 10:00:00 → 10:09:53 UTC (593 s, window 5 s)"
    assert len(first) <= 80


@pytest.mark.parametrize(
    "requests, start, end, seconds, window",
    [
        (12_345_678, "2026-01-05T00:00:00Z", "2026-01-05T23:59:59Z", 86_399, 300),
        (12_345_678, "2026-01-05T23:00:00Z", "2026-01-07T01:00:00Z", 93_600, 600),  # across days: two lines
        (0, None, None, 0, 1),
    ],
)
def test_the_head_fits_80_columns_whatever_the_span(requests, start, end, seconds, window):
    span = {"start": start, "end": end, "seconds": seconds}
    facts = Facts(requests=requests, span=span, window_s=window)
    lines = [line.replace("[bold]", "").replace("[/]", "") for line in head_lines(facts)]
    assert all(len(line) <= HEAD_WIDTH for line in lines), lines
    assert lines[0].startswith(f"{requests:,} requests")
    if start:
        assert start[:10] in " ".join(lines) and end[11:19] in " ".join(lines)


def shape(line: str) -> str:
    """A printed line with its numbers, times and cell padding made alike."""
    line = re.sub(r"\d[\d,.:T\-Z]*", "0", line.strip())
    return re.sub(r"\s+", " ", line)


def test_what_you_see_is_what_the_report_prints_today(log):
    """Every title and table header the README's "What you see" shows is printed today, in that
    order (its numbers come from a demo run; the shapes from any report with a shift)."""
    section = README[README.index("\n## What you see\n") :]
    block = section[: section.index("\n\n", section.index("\n    ") + 1)]
    shown = [ln[4:] for ln in block.splitlines() if ln.startswith("    ")]
    wanted = [ln for ln in shown if not ln.lstrip().startswith(("│", "...", *TABLE_RULES)) and ln.strip()]
    assert len(wanted) >= 4, shown
    run = hopline("analyze", str(log))
    printed = [shape(ln) for ln in run.stdout.splitlines()]

    def where(line: str) -> int:
        """The printed line that is ``line`` (a title wrapped at its table's width: its first part)."""
        want = shape(line)
        hits = [i for i, p in enumerate(printed) if p and want.startswith(p) and len(p) >= 0.6 * len(want)]
        return hits[0] if hits else -1

    at = [where(w) for w in wanted]
    assert -1 not in at and at == sorted(at), dict(zip(wanted, at, strict=True))
