"""``hopline demo --scenario NAME`` end to end: the first finding names the injected incident (its
kind, stage or pitfall name, scope and size), no process is left behind, and for the default
scenario hopline's stages agree with the simulator's true intervals.

Every scenario runs beside a busy-loop process (``HOPLINE_TEST_CPU_HOGS=N`` for another count):
a user's machine is rarely idle (issue 11). A run the demo itself says cannot be trusted (its
load generator's event loop ran more than 50 ms late, p99: the machine was far busier than one
hog makes it) is run again, at most twice; the last run's findings must name the incident.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from hopline.demo.analysis import analyze_run
from hopline.demo.orchestrate import TRUSTED_LAG_MS
from hopline.demo.scenarios import SCENARIOS, matches
from hopline.demo.wiring import WARMUP_PREFIX
from support.cli import hopline
from support.demo import PITFALL_SECONDS, SHIFT_SECONDS, first_finding, processes_of, run_demo

UNTRUSTED_RERUNS = 2
RERUN_PAUSE_S = 5.0
TOLERANCE_S = 0.025  # engine hops are stamped on the response path, the truth in the scheduler


@dataclass(frozen=True)
class Expected:
    """What the first finding of a scenario's run must say."""

    scenario: str
    kind: str  # "shift" or "pitfall"
    what: str  # the shift's stage or the pitfall's name
    scope: dict[str, str] = field(default_factory=dict)  # the scope a shift names
    min_factor: float | None = None  # a shift's size: after / before at least this
    seconds: int = SHIFT_SECONDS

    def fields(self) -> dict[str, Any]:
        key = "stage" if self.kind == "shift" else "name"
        return {"kind": self.kind, key: self.what, **({"scope": self.scope} if self.scope else {})}


EXPECTED = (
    # the burst saturates r2: its queue goes from a few ms to about a second (a ramp in steps is
    # one finding from its onset, see analyzer/findings/shifts/)
    Expected("queue-burst", "shift", "queue", {"replica": "r2"}, min_factor=3),
    Expected("prefill-regression", "shift", "prefill", {"replica": "r2"}),
    Expected("slow-network", "shift", "network", {"service": "kite-chat"}),
    Expected("huge-prompt", "pitfall", "long_prefill_stall", seconds=PITFALL_SECONDS),
    Expected("cold-connections", "pitfall", "new_connection_per_request", seconds=PITFALL_SECONDS),
    Expected("no-max-tokens", "pitfall", "no_max_tokens", seconds=PITFALL_SECONDS),
)


@pytest.fixture(scope="module")
def cpu_hogs() -> Iterator[list[subprocess.Popen]]:
    """``HOPLINE_TEST_CPU_HOGS`` busy loops (one by default) while the module's demos run."""
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(int(os.environ.get("HOPLINE_TEST_CPU_HOGS", "1")))
    ]
    try:
        yield hogs
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


@pytest.fixture(scope="module")
def demo_run(
    tmp_path_factory: pytest.TempPathFactory, cpu_hogs: list[subprocess.Popen]
) -> Callable[[Expected], tuple[Path, dict]]:
    """Run each scenario once per module, beside the CPU hog, and again (at most
    ``UNTRUSTED_RERUNS`` times) while the demo says its run cannot be trusted: (the last run's
    output folder, its findings JSON). What a run must show is asserted by the tests, whatever
    the machine: a busy machine only earns a scenario another run."""
    runs: dict[str, tuple[Path, dict]] = {}

    def run(expected: Expected) -> tuple[Path, dict]:
        if expected.scenario not in runs:
            lags = []
            for attempt in range(UNTRUSTED_RERUNS + 1):
                if attempt:
                    time.sleep(RERUN_PAUSE_S)  # the last run's processes gone, a burst of load maybe past
                out = tmp_path_factory.mktemp(expected.scenario)
                report = run_demo(out, expected.scenario, expected.seconds)
                assert all(hog.poll() is None for hog in cpu_hogs), "a CPU hog stopped before the run ended"
                facts = report["demo"]
                assert facts["scenario"] == expected.scenario
                assert facts["trusted"] == (facts["loop_lag_p99_ms"] <= TRUSTED_LAG_MS)
                lags.append(facts["loop_lag_p99_ms"])
                if facts["trusted"]:
                    break
            print(f"{expected.scenario}: load generator's loop lag p99 {lags} ms")
            report["demo"]["lags_of_runs_ms"] = lags
            runs[expected.scenario] = out, report
        return runs[expected.scenario]

    return run


def test_every_scenario_is_expected_as_the_scenario_states_it() -> None:
    assert {e.scenario for e in EXPECTED} == set(SCENARIOS)
    for expected in EXPECTED:
        assert SCENARIOS[expected.scenario].expect == expected.fields(), expected.scenario


@pytest.mark.parametrize("expected", EXPECTED, ids=lambda e: e.scenario)
def test_first_finding_names_the_incident(expected: Expected, demo_run) -> None:
    out, report = demo_run(expected)
    finding = first_finding(report)
    lags = report["demo"]["lags_of_runs_ms"]
    said = (f"loop lag p99 of the runs {lags} ms", finding, report["findings"][1:3])
    assert matches(finding, expected.fields()), said
    if expected.min_factor is not None:
        assert finding["factor"] >= expected.min_factor, finding
    assert processes_of(out) == []


def test_stages_agree_with_the_simulators_true_intervals(demo_run) -> None:
    out, _ = demo_run(EXPECTED[0])
    truth = pl.concat([pl.read_ndjson(p) for p in sorted(out.glob("simulator/truth-*.log"))])
    # the warm-up's requests are in the simulator's log, and deliberately in no hop event
    warmup = truth["request_id"].str.starts_with(WARMUP_PREFIX)
    assert warmup.sum() > 10
    truth = truth.filter(~warmup)
    frame = analyze_run(out)[1].join(truth, on="request_id", how="inner", suffix="_truth")
    # every request the engines finished was joined by hopline, on the replica that served it
    assert frame.height == truth.height > 100
    assert (frame["replica"] == frame["replica_truth"]).all()
    # queue and prefill come from engine.stats (the vLLM plugin's way): the engine's own numbers
    assert (frame["queue"] - frame["queue_s"]).abs().max() < 1e-6
    assert (frame["prefill"] - frame["prefill_s"]).abs().max() < 1e-6
    # decode and the engine's TTFT come from the middleware's hops: measured independently
    # (each within the tolerance plus however late the simulator's chunk with the first token,
    # and its stream's end, left after that token's pass ended: a busy host's delay on the
    # response path, which hopline rightly sees; engine.last_token is the stream's end)
    streamed = frame.filter(pl.col("stream_truth"))
    first_late, last_late = streamed["first_sent_late_s"], streamed["last_sent_late_s"]
    end_late = streamed["end_sent_late_s"]
    # never early, but for the simulator's loop waking from its sleep a fraction of a ms before the
    # pass's end (measured: 0.5 ms)
    assert first_late.min() > -0.002 and last_late.min() > -0.002 and end_late.min() > -0.002
    assert (end_late >= last_late).all()  # the stream ends after its last token's chunk
    first_late, last_late = first_late.clip(lower_bound=0), last_late.clip(lower_bound=0)
    decode_off = (streamed["decode"] - streamed["decode_s"]).abs() - first_late - end_late.clip(lower_bound=0)
    assert decode_off.max() < TOLERANCE_S, streamed.filter(decode_off == decode_off.max()).row(0, named=True)
    engine_ttft_truth = streamed["first_token"] - streamed["received"]
    ttft_off = (streamed["engine_ttft"] - engine_ttft_truth).abs() - first_late
    assert ttft_off.max() < TOLERANCE_S, streamed.filter(ttft_off == ttft_off.max()).row(0, named=True)
    assert (first_late + end_late).median() < TOLERANCE_S / 5  # a late loop is the exception, not the rule
    assert frame["output_tokens"].to_list() == frame["output_tokens_truth"].to_list()


def test_the_kept_folder_analyses_to_the_demos_own_report(demo_run) -> None:
    """``hopline analyze OUT`` reads only hop events (the simulator's logs are not), with no bad
    line, and prints the very report the demo printed."""
    out, report = demo_run(EXPECTED[0])
    proc = hopline("analyze", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    again = json.loads(proc.stdout)
    assert again["scan"]["bad_lines"] == 0 and report["scan"]["bad_lines"] == 0
    assert again["requests"] == report["requests"]
    assert again["findings"] == report["findings"]
    assert again["stages"] == report["stages"]
