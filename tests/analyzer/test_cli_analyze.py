"""``hopline analyze`` as a user runs it: a real process on real files."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from support.cli import hopline
from support.synth import ColdConnections, StageShift, generate, on_localhost, write_ndjson

INCIDENTS = [StageShift("queue", 3.0, at_s=120, scope={"replica": "r2"}), ColdConnections("search-assist")]


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("logs")
    events = generate(4000, seed=51, incidents=INCIDENTS, engine_id_prefix=True)
    # two files, as two hosts would write them (one rotated)
    write_ndjson(
        events.filter(events["hop"].str.starts_with("engine")),
        folder / "engine" / "events.ndjson.2026010510.1",
    )
    path = write_ndjson(events.filter(~events["hop"].str.starts_with("engine")), folder / "edge.ndjson")
    with path.open("ab") as f:
        f.write(b'{"ts": "yesterday", "request_id": "x", "hop": "client.sent"}\n')
    return folder


def test_json_is_the_findings_contract(log_dir):
    proc = hopline("analyze", str(log_dir), "--json", "--slo", "ttft=400ms,itl=50ms")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)  # nothing but the object on stdout
    assert result["requests"] == 4000
    assert result["window_s"] == 1.0  # 200 s of logs: one-second windows
    assert set(result["stages"]["queue"]) >= {"p50_ms", "p90_ms", "p99_ms", "share_of_ttft"}
    kinds = [(f["kind"], f.get("stage") or f.get("name"), f["scope"]) for f in result["findings"]]
    assert ("shift", "queue", {"replica": "r2"}) in kinds
    assert ("pitfall", "new_connection_per_request", {"service": "search-assist"}) in kinds
    shift = next(f for f in result["findings"] if f["kind"] == "shift")
    assert shift["at"] == "2026-01-05T10:02:00Z"
    assert result["scan"]["bad_lines"] == 1
    assert "edge.ndjson" in result["scan"]["errors"][0] and "ts must be" in result["scan"]["errors"][0]
    assert result["goodput"]["good"] <= result["requests"]
    impacts = [abs(f["impact_s"]) for f in result["findings"]]
    assert impacts == sorted(impacts, reverse=True)


def test_terminal_report_and_html(log_dir, tmp_path):
    html = tmp_path / "report.html"
    proc = hopline("analyze", str(log_dir), "--html", str(html), "--by", "replica")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "queue time tripled at 10:02 on replica r2" in out
    assert "Where the time goes" in out and "By replica" in out and "By service" not in out
    assert "1 bad line" in out and "1 bad lines" not in out
    assert html.stat().st_size > 1000 and "<html" in html.read_text().lower()


def test_time_range(log_dir):
    proc = hopline(
        "analyze",
        str(log_dir),
        "--json",
        "--since",
        "2026-01-05T10:01:00Z",
        "--until",
        "2026-01-05T10:02:00Z",
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert 0 < result["requests"] < 4000
    assert result["span"]["start"] >= "2026-01-05T10:01:00Z"


def test_bad_input_is_a_clear_error(tmp_path):
    proc = hopline("analyze", str(tmp_path / "missing"))
    assert proc.returncode == 2 and "no such file or folder" in proc.stderr
    proc = hopline("analyze", str(tmp_path))
    assert proc.returncode == 2 and "no event files" in proc.stderr
    proc = hopline("analyze", str(tmp_path), "--slo", "speed=1s")
    assert proc.returncode == 2 and "bad SLO" in proc.stderr


def test_help_has_an_example():
    proc = hopline("analyze", "--help")
    assert proc.returncode == 0
    assert "Example" in proc.stdout and "hopline analyze" in proc.stdout


def test_time_and_window_options_are_checked_in_one_line(tmp_path):
    hour = tmp_path / "store" / "events" / "date=2026-01-05" / "hour=10"
    hour.mkdir(parents=True)
    write_ndjson(generate(40, seed=2), hour / "part-0.ndjson")
    cases = [
        (("--window", "0s"), "--window must be longer than 0, got '0s'"),
        (("--since", "2026-02-01T00:00", "--until", "2026-01-01T00:00"), "--since 2026-02-01T00:00 is after --until"),
        (("--since", "2026-02-01T00:00"), "all 1 event files under"),  # not "no event files"
    ]
    for args, message in cases:
        proc = hopline("analyze", str(tmp_path / "store"), *args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "Traceback" not in proc.stderr


# --- hostile input: bad files reported, the rest analysed, never a traceback -------------------


def _hostile_folder(folder: Path) -> int:
    """A store with good requests and one of every file that used to end the run in a traceback;
    returns the number of good requests."""
    import gzip

    import polars as pl

    events = generate(300, seed=7)
    write_ndjson(events, folder / "events" / "date=2026-01-05" / "hour=10" / "good.ndjson")
    hostile = folder / "events" / "date=2026-01-05" / "hour=11"
    hostile.mkdir(parents=True)
    t = 1767607200.0
    (hostile / "stored.ndjson").write_bytes(
        b'{"ts": %r, "request_id": "deep", "hop": "client.sent", "stream": true, "a": ' % t
        + b'{"x": ' * 300 + b"{}" + b"}" * 300 + b"}\n"
        + b'{"ts": %r, "request_id": "huge", "hop": "client.sent", "n": 9223372036854775808}\n' % t
        + b'{"ts": 1e308, "request_id": "far", "hop": "client.sent"}\n'
    )
    (hostile / "corrupt.ndjson.gz").write_bytes(gzip.compress(b'{"ts": 1}\n' * 1000)[:40] + b"\xff" * 200)
    (hostile / "garbage.parquet").write_bytes(b"PAR1" + b"\x13" * 300)
    pl.DataFrame({"ts": ["noon"], "request_id": ["x"], "hop": ["client.sent"]}).write_parquet(hostile / "types.parquet")
    pl.DataFrame({"foo": [1]}).write_parquet(hostile / "columns.parquet")
    return events["request_id"].n_unique()


def test_hostile_files_are_reported_and_the_rest_is_analysed(tmp_path):
    good = _hostile_folder(tmp_path)
    html = tmp_path / "report.html"
    proc = hopline("analyze", str(tmp_path), "--json", "--html", str(html))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    result = json.loads(proc.stdout)
    assert result["requests"] == good  # nothing valid lost
    bad = "\n".join(result["scan"]["bad_files"])
    for name, reason in (
        ("corrupt.ndjson.gz", "corrupt gzip stream"),
        ("garbage.parquet", "not a readable Parquet file"),
        ("types.parquet", "wrong column types: ts is String"),
        ("columns.parquet", "not hop events: missing column ts, request_id, hop"),
    ):
        assert f"{name}: {reason}" in bad, bad
    assert result["scan"]["bad_lines"] == 3  # deep, huge and far in stored.ndjson
    assert html.stat().st_size > 1000


def test_html_on_a_parquet_without_optional_columns(tmp_path):
    import polars as pl

    events = generate(50, seed=3).select("ts", "request_id", "hop")  # no stream, no attributes
    events.write_parquet(tmp_path / "lean.parquet")
    proc = hopline("analyze", str(tmp_path / "lean.parquet"), "--html", str(tmp_path / "r.html"))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert (tmp_path / "r.html").stat().st_size > 1000
    assert "miss hops" not in proc.stdout  # absent attempt means 0: every hop counts
    assert pl.read_parquet(tmp_path / "lean.parquet").height == events.height


@pytest.mark.parametrize(
    "content",
    [b"", b"hello\nworld\n", b'{"a": 1}\n[1, 2]\n', b'{"ts": 1700000000, "hop": "emitter.stats"}\n'],
    ids=["empty", "garbage", "json-not-events", "no-request-events"],
)
def test_input_without_hop_events_is_one_line_and_exit_1(tmp_path, content):
    path = tmp_path / "events.ndjson"
    path.write_bytes(content)
    proc = hopline("analyze", str(path))
    assert proc.returncode == 1 and proc.stdout == ""
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"hopline analyze: no hop events in {path}")


def test_minor_findings_are_one_line_and_all_lists_them(tmp_path):
    """A client opening a connection per request on localhost (adding 0 ms) beside a real incident:
    the report names the incident, says "1 minor finding" with the command that lists it, and
    ``--all`` lists it (terminal and HTML)."""
    events = generate(duration_s=300, seed=6, incidents=[*INCIDENTS[:1], ColdConnections("search-assist")])
    log = write_ndjson(on_localhost(events), tmp_path / "logs" / "events.ndjson")
    proc = hopline("analyze", str(log.parent), "--html", str(tmp_path / "r.html"))
    assert proc.returncode == 0, proc.stderr
    out = " ".join(proc.stdout.split())
    assert f"1 minor finding (each under 1% of users' time), see `hopline analyze {log.parent} --all`" in out
    assert "opens a new connection" not in out and "queue time tripled" in out
    assert "see `hopline analyze" in (tmp_path / "r.html").read_text()
    proc = hopline("analyze", str(log.parent), "--all", "--html", str(tmp_path / "all.html"))
    assert proc.returncode == 0, proc.stderr
    out = " ".join(proc.stdout.split())
    assert "Minor findings" in out and "opens a new connection for 100% of requests, adding 0 ms" in out
    assert "adding 0 ms" in (tmp_path / "all.html").read_text()


@pytest.mark.parametrize("bounds", [("--since", "2030-01-01"), ("--until", "2020-01-01T00:00")])
def test_a_range_that_leaves_no_request_says_what_it_excluded(log_dir, bounds):
    """Issue 24: ``--since 2030-01-01`` on a file printed "0 requests from None to None", an empty
    table, and exited 0. Now one line says how many events and requests lie outside the range and
    the time the data covers, exit 1 (as for input without hop events)."""
    proc = hopline("analyze", str(log_dir), *bounds)
    assert proc.returncode == 1 and proc.stdout == "", proc.stdout
    [line] = proc.stderr.splitlines()
    written = generate(4000, seed=51, incidents=INCIDENTS, engine_id_prefix=True)  # what log_dir holds
    n = written.height  # every event (the "yesterday" line is no event)
    span = (written["ts"].min(), written["ts"].max())
    first, last = (datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S") for t in span)
    assert line == (
        f"hopline analyze: no requests with {' '.join(bounds)}: {n:,} of {n:,} events (4,000 request IDs) "
        f"are outside it; the data covers {first} to {last} UTC"
    ), line


def test_a_mixed_folder_names_every_bad_file_and_counts_the_lines_not_listed(tmp_path):
    """Issue 24: 28 bad lines and a bad Parquet file beside good events: the terminal listed 10
    bad lines, said nothing of the other 18, and never named the Parquet file (only --json did).
    Now: the first 10 lines, "… and 18 more bad lines", then every bad file with its reason."""
    write_ndjson(generate(40, seed=5), tmp_path / "good.ndjson")
    (tmp_path / "bad.ndjson").write_text("".join(f"not json {i}\n" for i in range(28)))
    (tmp_path / "broken.parquet").write_bytes(b"PAR1" + b"\x13" * 100)
    proc = hopline("analyze", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    tail = proc.stdout[proc.stdout.index("Read 3 files") :].splitlines()
    assert "28 bad lines" in tail[0]
    bad = "  " + str(tmp_path / "bad.ndjson")
    assert [line.split(":")[:2] for line in tail[1:11]] == [[bad, str(i)] for i in range(1, 11)]
    assert tail[11] == "  … and 18 more bad lines"
    assert tail[12].startswith(f"  {tmp_path / 'broken.parquet'}: not a readable Parquet file"), tail
    as_json = json.loads(hopline("analyze", str(tmp_path), "--json").stdout)["scan"]
    assert len(as_json["errors"]) == 10 and as_json["bad_lines"] == 28  # the JSON keeps the reader's lists


def test_a_range_that_leaves_no_request_of_a_timelines_table_says_so(tmp_path):
    """The same for ``--timelines`` (a per-request table; the range applies to each request's start)."""
    from hopline.analyzer.timelines import timelines

    table = timelines(generate(200, seed=3).lazy()).collect()
    table.write_parquet(tmp_path / "timelines.parquet")
    proc = hopline("analyze", "--timelines", str(tmp_path / "timelines.parquet"), "--since", "2030-01-01")
    assert proc.returncode == 1 and proc.stdout == "", proc.stdout
    starts = (table["start"].min(), table["start"].max())
    first, last = (datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S") for t in starts)
    assert proc.stderr == (
        "hopline analyze: no requests with --since 2030-01-01: all 200 requests of the table start outside it, "
        f"from {first} to {last} UTC\n"
    )
