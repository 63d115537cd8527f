"""``hopline timeline``: one request's waterfall from real event files, through the real command."""

from __future__ import annotations

import json

import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from click.testing import Result
from hopline.analyzer.waterfall import WATERFALL_ORDER, register, stage_bars
from hopline.middleware.contract import TIME_STAGES, TTFT_STAGES, dumps
from support.golden import GOLDEN
from typer.testing import CliRunner

CASES = {case["name"]: case["events"] for case in GOLDEN["cases"]}


@pytest.fixture(scope="module")
def events_file(tmp_path_factory) -> Path:
    """Every golden case in one NDJSON file, plus a copy of the complete request without its
    engine.first_token (a missing hop)."""
    path = tmp_path_factory.mktemp("events") / "events.ndjson"
    lines = [dumps(e) for events in CASES.values() for e in events]
    lines += [
        dumps({**e, "request_id": "no-first-token"})
        for e in CASES["complete_streaming"]
        if e["hop"] != "engine.first_token"
    ]
    path.write_bytes(b"".join(lines))
    return path


APP = typer.Typer()
register(APP)
APP.command("noop")(lambda: None)  # a second command, so that the app keeps its subcommand names


def timeline(*args: str) -> Result:
    """The real ``timeline`` command, in-process (the ``hopline`` entry point is tested by its owner)."""
    return CliRunner().invoke(APP, ["timeline", *args], env={"COLUMNS": "160", "NO_COLOR": "1"})


def rows(output: str) -> dict[str, list[str]]:
    """First word of each line -> the remaining words (stage rows and hop rows)."""
    table: dict[str, list[str]] = {}
    for line in output.splitlines():
        words = line.split()
        if words:
            table.setdefault(words[0], words[1:])
    return table


def test_complete_request_stages_and_hops(events_file: Path) -> None:
    run = timeline("gold-complete", str(events_file))
    assert run.exit_code == 0, run.output
    out = run.stdout
    assert "time axis from client.sent" in out
    stages = rows(out)
    # stages end to end (start, duration), worked by hand in the golden fixture:
    # connect 1+10+20 = 31 ms; network 450-31-10-300 = 109 ms; gateway 10; frontend 300-60-200 = 40
    assert stages["connect"][:4] == ["0.0", "ms", "31.0", "ms"]
    assert stages["network"][:4] == ["31.0", "ms", "109.0", "ms"]
    assert stages["gateway"][:4] == ["140.0", "ms", "10.0", "ms"]
    assert stages["frontend"][:4] == ["150.0", "ms", "40.0", "ms"]
    assert stages["queue"][:4] == ["190.0", "ms", "60.0", "ms"]
    assert stages["prefill"][:4] == ["250.0", "ms", "200.0", "ms"]
    assert stages["decode"][:4] == ["450.0", "ms", "8,000.0", "ms"]
    assert "client view: TTFT 450.0 ms, end-to-end 8,450.0 ms" in out
    # decode (8 s) dwarfs the TTFT (450 ms): a second axis zooms on the time to first token
    assert "0 … 450.0 ms (first token)" in out and "0 … 8,450.0 ms" in out
    # raw hops relative to each component's own first hop: the engine's clock is 5 s ahead,
    # which must not show (its first token is 300 ms after its own received)
    hop_rows = [line.split() for line in out.splitlines()]
    assert ["300.0", "engine.first_token", "0"] in [r[:3] for r in hop_rows]
    assert ["450.0", "client.first_token", "0"] in [r[:3] for r in hop_rows]
    assert ["10.0", "gateway.forwarded", "0", "upstream=r1"] in hop_rows
    assert "missing" not in out and "negative" not in out


def test_engine_prefix_is_stripped(events_file: Path) -> None:
    run = timeline("chatcmpl-gold-complete", str(events_file))
    assert run.exit_code == 0, run.output
    assert "request gold-complete" in run.stdout


def test_negative_stage_is_flagged_not_clamped(events_file: Path) -> None:
    run = timeline("gold-negative", str(events_file))
    assert run.exit_code == 0, run.output
    # stats claim 500 ms queue + 100 ms prefill inside a 300 ms engine TTFT: frontend = -300 ms
    assert "negative stage frontend = -300.0 ms" in run.stdout
    assert "(first token)" not in run.stdout  # decode is short here: one axis is enough
    assert rows(run.stdout)["frontend"][:4] == ["30.0", "ms", "-300.0", "ms"]


def test_missing_hop_and_absent_component_are_flagged(events_file: Path) -> None:
    run = timeline("no-first-token", str(events_file))
    assert run.exit_code == 0, run.output
    assert "missing hops: engine.first_token" in run.stdout
    hosted = timeline("gold-hosted", str(events_file))
    assert "no engine hops: upstream stands for everything beyond the gateway" in hosted.output
    assert "no gateway hops" in hosted.output


def test_failover_shows_each_engine_on_its_own_clock(events_file: Path) -> None:
    run = timeline("gold-failover", str(events_file))
    assert run.exit_code == 0, run.output
    out = run.stdout
    assert "engine.error on attempt 0" in out
    assert "engine r1 hops" in out and "engine r2 hops" in out
    hop_rows = [line.split()[:3] for line in out.splitlines()]
    # each replica's first hop is its own zero
    assert ["0.0", "engine.received", "0"] in hop_rows
    assert ["0.0", "engine.received", "1"] in hop_rows


def test_unknown_request_says_how_many_the_files_hold(events_file: Path) -> None:
    run = timeline("no-such-request", str(events_file))
    assert run.exit_code == 1
    message = " ".join(run.stderr.split())
    assert "request 'no-such-request' not found" in message
    requests = sum(len(case.get("requests") or [case]) for case in GOLDEN["cases"])  # a case may hold several
    assert f"hold {requests + 1} request(s)" in message  # the golden requests + no-first-token


def test_help_has_an_example() -> None:
    run = timeline("--help")
    assert run.exit_code == 0 and "hopline timeline 4f1c2a9e8b7d4c3a" in run.stdout


def test_bar_order_covers_every_time_stage() -> None:
    assert set(WATERFALL_ORDER) == set(TIME_STAGES)
    ttft_positions = [WATERFALL_ORDER.index(s) for s in TTFT_STAGES]
    assert ttft_positions == sorted(ttft_positions) and WATERFALL_ORDER[-1] == "decode"


def test_bars_are_laid_end_to_end() -> None:
    bars = stage_bars({"connect": 0.01, "network": 0.02, "frontend": -0.005, "queue": 0.1, "decode": 1.0})
    # a negative stage keeps its value but takes no width on the axis
    assert bars == [
        ("connect", 0.0, 0.01),
        ("network", 0.01, 0.02),
        ("frontend", 0.03, -0.005),
        ("queue", 0.03, 0.1),
        ("decode", pytest.approx(0.13), 1.0),
    ]


def test_without_engine_hops_the_client_view_stands_for_decode() -> None:
    bars = stage_bars({"connect": 0.07, "upstream": 0.43, "client_ttft": 0.5, "client_e2e": 2.5})
    assert bars[-1] == ("after first token (client)", 0.5, 2.0)


def _timeline_piped(*args: str) -> tuple[int, str]:
    """``hopline timeline ARGS…`` in a child process with its output on a pipe and no COLUMNS: what
    ``hopline timeline ID DIR | less`` shows (rich then lays out for 80 columns)."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    run = subprocess.run(
        [sys.executable, "-m", "hopline.middleware.cli", "timeline", *args],
        capture_output=True, text=True, timeout=120, env={**env, "NO_COLOR": "1"}, check=False,
    )  # fmt: skip
    return run.returncode, run.stdout + run.stderr


@pytest.mark.parametrize("how", ["COLUMNS=80", "piped"])
@pytest.mark.parametrize("request_id", ["gold-complete", "gold-hosted"])
def test_readable_at_80_columns_and_piped(events_file: Path, how: str, request_id: str) -> None:
    """Issue 24: at 80 columns the two charts kept their width and the stage names and times were
    cut to "co…", "39…". Every stage row keeps its name, start and duration whole; the charts get
    narrower (gold-complete: decode dwarfs the TTFT, two charts) or go below the numbers (the
    hosted request's "after first token (client)" leaves no room beside them); nothing is wider
    than 80 columns."""
    if how == "piped":
        code, out = _timeline_piped(request_id, str(events_file))
    else:
        run = CliRunner().invoke(
            APP, ["timeline", request_id, str(events_file)], env={"COLUMNS": "80", "NO_COLOR": "1"}
        )
        code, out = run.exit_code, run.output
    assert code == 0, out
    lines = out.splitlines()
    assert max(map(len, lines)) <= 80, out
    assert "…" not in out.replace("0 … ", ""), out  # nothing cut (the axes' titles are "0 … 450.0 ms")
    expected = {
        "gold-complete": {
            "connect": "0.0 ms 31.0 ms",
            "frontend": "150.0 ms 40.0 ms",
            "decode": "450.0 ms 8,000.0 ms",
        },
        "gold-hosted": {"after first token (client)": "500.0 ms 2,000.0 ms"},
    }[request_id]
    for name, numbers in expected.items():
        rows = [" ".join(line.split()) for line in lines]
        assert any(row == f"{name} {numbers}" or row.startswith(f"{name} {numbers} ") for row in rows), (
            name,
            out,
        )
    drawn = [line for line in lines if "█" in line]
    assert len(drawn) >= 3, out  # the charts are still there
    if request_id == "gold-complete":
        assert "(first" in out and "0 … 8,450.0 ms" in out  # both axes


def test_a_unique_prefix_of_an_id_is_enough(events_file: Path) -> None:
    """Issue 24: the HTML report's chart cut IDs to 18 characters and ``timeline`` answered "not
    found" for them. A prefix that starts one request's ID only draws that request."""
    run = timeline("9c4d1f2e3a5b6c7d8e", str(events_file))  # 18 of 32 characters
    assert run.exit_code == 0, run.output
    assert "request 9c4d1f2e3a5b6c7d8e9f0a1b2c3d4e5f " in run.stdout


def test_an_ambiguous_prefix_lists_what_it_matches(events_file: Path) -> None:
    """A prefix of several IDs is an error naming a few of them and how many there are; exit 1."""
    run = timeline("e1f2a3b4", str(events_file))
    assert run.exit_code == 1 and run.stdout == ""
    message = " ".join(run.stderr.split())
    assert "'e1f2a3b4' is the start of 3 request IDs (" in message, message
    for n in (1, 2, 3):
        assert f"e1f2a3b4c5d6e7f8a9b0c1d2e3f4a50{n}" in message
    many = " ".join(timeline("gold-", str(events_file)).stderr.split())  # the golden IDs start so: five shown
    golden = sorted({e["request_id"] for e in map(json.loads, events_file.read_text().splitlines()) if e["request_id"].startswith("gold-")})
    assert len(golden) > 5
    first = ", ".join(golden[:5])
    said = f"'gold-' is the start of {len(golden)} request IDs ({first}, … ({len(golden)} in all)); give more of the ID"
    assert said in many, many
