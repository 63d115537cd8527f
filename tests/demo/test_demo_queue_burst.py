"""``hopline demo`` (default scenario) end to end: the finding, hopline's stages against the
simulator's true intervals, and no process left behind."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from demo_testing import SHIFT_SECONDS, first_finding, processes_of, run_demo
from hopline.analyzer.demo.analysis import load_timelines
from hopline.analyzer.demo.scenarios import SCENARIOS, matches

TOLERANCE_S = 0.025  # engine hops are stamped on the response path, the truth in the scheduler


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("queue-burst")
    return out, run_demo(out, "queue-burst", SHIFT_SECONDS)


def test_first_finding_is_the_queue_on_the_burst_replica(run) -> None:
    _, report = run
    finding = first_finding(report)
    assert matches(finding, SCENARIOS["queue-burst"].expect), finding
    # the burst saturates r2: its queue goes from a few ms to about a second (a ramp in steps is
    # one finding from its onset, see analyzer/shifts.py)
    assert finding["factor"] >= 3, finding


def test_stages_agree_with_the_simulators_true_intervals(run) -> None:
    out, _ = run
    truth = pl.concat([pl.read_ndjson(p) for p in sorted(out.glob("truth-*.jsonl"))])
    frame = load_timelines(out)[0].join(truth, on="request_id", how="inner", suffix="_truth")
    # every request the engines finished was joined by hopline, on the replica that served it
    assert frame.height == truth.height > 100
    assert (frame["replica"] == frame["replica_truth"]).all()
    # queue and prefill come from engine.stats (the vLLM plugin's way): the engine's own numbers
    assert (frame["queue"] - frame["queue_s"]).abs().max() < 1e-6
    assert (frame["prefill"] - frame["prefill_s"]).abs().max() < 1e-6
    # decode and the engine's TTFT come from the middleware's hops: measured independently
    streamed = frame.filter(pl.col("stream_truth"))
    assert (streamed["decode"] - streamed["decode_s"]).abs().max() < TOLERANCE_S
    engine_ttft_truth = streamed["first_token"] - streamed["received"]
    assert (streamed["engine_ttft"] - engine_ttft_truth).abs().max() < TOLERANCE_S
    assert frame["output_tokens"].to_list() == frame["output_tokens_truth"].to_list()


def test_no_process_is_left_running(run) -> None:
    out, _ = run
    assert processes_of(out) == []
