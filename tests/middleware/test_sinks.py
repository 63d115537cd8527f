"""Sinks against real files and a real uvicorn collector stand-in on 127.0.0.1."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from hopline.middleware import log as hopline_log
from hopline.middleware.contract import iter_ndjson
from hopline.middleware.emit import Emitter
from hopline.middleware.sinks import (
    FileSink,
    HttpSink,
    MemorySink,
    NullSink,
    StdoutSink,
    events_url,
    hour_label,
    make_sink,
    rotated_name,
)

HOUR = 3600.0
T0 = datetime(2026, 3, 1, 10, 15, tzinfo=timezone.utc).timestamp()  # 10:15 UTC


def events(n: int, start: int = 0, **extra: Any) -> list[dict[str, Any]]:
    return [
        {"v": 1, "eid": f"{i:016x}", "ts": T0 + i, "request_id": f"req-{i}", "hop": "client.sent", "stream": True,
         **extra}
        for i in range(start, start + n)
    ]


def read_lines(path: Path) -> list[dict[str, Any]]:
    parsed = list(iter_ndjson(path.read_bytes()))
    assert all(error is None for _, _, error in parsed), parsed
    return [event for _, event, _ in parsed]


@pytest.fixture(autouse=True)
def fresh_throttle(monkeypatch) -> None:
    """Each test sees hopline's throttled warnings afresh (the throttle is process-wide)."""
    monkeypatch.setattr(hopline_log, "_throttle", hopline_log.Throttle())


# --- make_sink -----------------------------------------------------------------------------------


def test_make_sink_understands_every_documented_spec(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HOPLINE_TOKEN", "s3cret")
    assert isinstance(make_sink(None), StdoutSink)
    assert isinstance(make_sink("stdout"), StdoutSink)
    assert isinstance(make_sink("memory"), MemorySink)
    assert isinstance(make_sink("null"), NullSink)
    sink = make_sink(f"file:{tmp_path}/a.ndjson")
    assert isinstance(sink, FileSink) and sink.path == f"{tmp_path}/a.ndjson"
    assert make_sink(f"file://{tmp_path}/b.ndjson").path == f"{tmp_path}/b.ndjson"
    http = make_sink("http://127.0.0.1:8080")
    assert isinstance(http, HttpSink) and http.url == "http://127.0.0.1:8080/v1/events"
    assert http._headers["Authorization"] == "Bearer s3cret"  # HOPLINE_TOKEN by default
    assert "s3cret" not in repr(http)
    assert make_sink("https://collector.internal/v1/events", token="t")._headers["Authorization"] == "Bearer t"


def test_events_url_accepts_host_port_or_full_url_and_names_what_is_wrong() -> None:
    assert events_url("http://h:1") == "http://h:1/v1/events"
    assert events_url("http://h:1/") == "http://h:1/v1/events"
    assert events_url("https://h/prefix/v1/events") == "https://h/prefix/v1/events"
    with pytest.raises(ValueError, match="ftp://h"):
        events_url("ftp://h")
    with pytest.raises(ValueError, match="/ingest"):
        events_url("http://h:1/ingest")


def test_make_sink_rejects_an_unknown_spec_naming_it() -> None:
    with pytest.raises(ValueError, match="'kafka://x'.*stdout, file:PATH, http"):
        make_sink("kafka://x")
    with pytest.raises(ValueError, match="file:PATH"):
        make_sink("file:")


def test_stdout_sink_writes_ndjson(capfd) -> None:
    assert StdoutSink().write(events(3)) == 0
    lines = capfd.readouterr().out.splitlines()
    assert [orjson.loads(line)["request_id"] for line in lines] == ["req-0", "req-1", "req-2"]


# --- file sink -------------------------------------------------------------------------------------


def test_file_sink_appends_valid_ndjson(tmp_path) -> None:
    path = tmp_path / "logs" / "events.ndjson"  # the directory is created on first write
    sink = FileSink(path)
    assert sink.write(events(3)) == 0
    assert sink.write(events(2, start=3)) == 0
    sink.close()
    assert [e["request_id"] for e in read_lines(path)] == [f"req-{i}" for i in range(5)]


def test_file_sink_rotates_by_size_into_sortable_names_without_splitting_batches(tmp_path) -> None:
    path = tmp_path / "events.ndjson"
    line = len(orjson.dumps(events(1)[0])) + 1
    sink = FileSink(path, max_bytes=3 * line, now=lambda: T0)  # three events per file
    for start in range(0, 10, 2):  # five batches of two: each file holds exactly one batch
        assert sink.write(events(2, start=start)) == 0
    sink.close()
    rotated = sorted(tmp_path.glob("events.ndjson.*"))
    assert [p.name for p in rotated] == [f"events.ndjson.2026030110.{n:04d}" for n in range(4)]
    files = rotated + [path]  # the documented reading order: rotated names sorted, then the live file
    assert all(p.stat().st_size <= 3 * line for p in files)
    assert [len(read_lines(p)) for p in files] == [2, 2, 2, 2, 2]
    assert [e["request_id"] for p in files for e in read_lines(p)] == [f"req-{i}" for i in range(10)]


def test_a_batch_larger_than_max_bytes_goes_alone_into_a_fresh_file(tmp_path) -> None:
    path = tmp_path / "events.ndjson"
    sink = FileSink(path, max_bytes=100, now=lambda: T0)
    sink.write(events(1))
    sink.write(events(5, start=1))  # > 100 bytes: rotates first, then written whole
    sink.close()
    assert len(read_lines(tmp_path / "events.ndjson.2026030110.0000")) == 1
    assert len(read_lines(path)) == 5


def test_file_sink_rotates_at_the_first_write_of_a_new_hour(tmp_path) -> None:
    path = tmp_path / "events.ndjson"
    clock = {"now": T0}
    sink = FileSink(path, now=lambda: clock["now"])
    sink.write(events(2))
    clock["now"] = T0 + 30 * 60  # 10:45: same hour, same file
    sink.write(events(1, start=2))
    clock["now"] = T0 + HOUR  # 11:15: rotate, labelled with the hour the file was started in
    sink.write(events(1, start=3))
    clock["now"] = T0 + 3 * HOUR  # 13:15 (a quiet hour in between produced no file)
    sink.write(events(1, start=4))
    sink.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "events.ndjson",
        "events.ndjson.2026030110.0000",
        "events.ndjson.2026030111.0000",
    ]
    assert len(read_lines(tmp_path / "events.ndjson.2026030110.0000")) == 3
    assert [e["request_id"] for e in read_lines(tmp_path / "events.ndjson.2026030111.0000")] == ["req-3"]
    assert [e["request_id"] for e in read_lines(path)] == ["req-4"]


def test_rotation_never_replaces_an_existing_file_and_restarts_continue_the_live_file(tmp_path) -> None:
    path = tmp_path / "events.ndjson"
    taken = Path(rotated_name(str(path), "2026030110", 0))
    taken.write_bytes(b"closed earlier\n")
    first = FileSink(path, now=lambda: T0)
    first.write(events(1))
    first.close()
    os.utime(path, (T0, T0))  # the live file was last written at 10:15 (the injected clock's time)
    # The process restarts within the hour: the live file is continued.
    second = FileSink(path, now=lambda: T0 + 60)
    second.write(events(1, start=1))
    second.close()
    assert len(read_lines(path)) == 2
    # It restarts again two hours later: the live file, last written at 10:xx, is rotated under
    # its own hour, next to (not over) the file already there.
    os.utime(path, (T0, T0))
    third = FileSink(path, now=lambda: T0 + 2 * HOUR)
    third.write(events(1, start=2))
    third.close()
    assert taken.read_bytes() == b"closed earlier\n"
    assert len(read_lines(tmp_path / "events.ndjson.2026030110.0001")) == 2
    assert [e["request_id"] for e in read_lines(path)] == ["req-2"]


def test_hour_label_is_utc() -> None:
    assert hour_label(T0) == "2026030110"
    assert hour_label(T0 + 50 * 60) == "2026030111"


def test_an_unwritable_path_drops_and_counts_then_recovers(tmp_path, capfd) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where a directory should be")
    sink = FileSink(blocker / "events.ndjson")
    assert sink.write(events(4)) == 4  # dropped, no exception
    assert sink.write(events(1)) == 1
    err = capfd.readouterr().err
    assert err.count('"event":"sink_write_failed"') == 1  # throttled: one line, not one per batch
    blocker.unlink()
    assert sink.write(events(2, start=10)) == 0  # the path became writable: the next batch goes out
    sink.close()
    assert [e["request_id"] for e in read_lines(blocker / "events.ndjson")] == ["req-10", "req-11"]


def test_an_unserializable_event_costs_only_itself(tmp_path) -> None:
    path = tmp_path / "events.ndjson"
    sink = FileSink(path)
    batch = events(3)
    batch[1]["oops"] = object()  # a middleware bug
    assert sink.write(batch) == 1
    sink.close()
    assert [e["request_id"] for e in read_lines(path)] == ["req-0", "req-2"]


def test_pid_in_the_path_gives_each_process_its_own_file(tmp_path) -> None:
    sink = FileSink(tmp_path / "events.{pid}.ndjson")
    sink.write(events(1))
    sink.close()
    assert (tmp_path / f"events.{os.getpid()}.ndjson").exists()


# --- http sink against a real server ---------------------------------------------------------------


@dataclass
class Collector:
    """A collector stand-in: records every POST and answers what ``policy`` says."""

    url: str = ""
    posts: list[dict[str, Any]] = field(default_factory=list)
    policy: Callable[[list[dict[str, Any]], int], tuple[int, dict[str, Any] | None, dict[str, str]]] | None = None

    def bodies(self, status: int | None = None) -> list[list[dict[str, Any]]]:
        return [p["events"] for p in self.posts if status is None or p["status"] == status]


def _accept(batch: list[dict[str, Any]], _: int) -> tuple[int, dict[str, Any], dict[str, str]]:
    return 200, {"accepted": len(batch), "duplicates": 0, "rejected": []}, {}


def _app(collector: Collector) -> Starlette:
    async def ingest(request: Request) -> Response:
        body = await request.body()
        batch = [orjson.loads(line) for line in body.splitlines() if line.strip()]
        status, answer, headers = (collector.policy or _accept)(batch, len(collector.posts))
        collector.posts.append({"headers": dict(request.headers), "events": batch, "status": status})
        if answer is None:
            return Response(status_code=status, headers=headers)
        return JSONResponse(answer, status_code=status, headers=headers)

    return Starlette(routes=[Route("/v1/events", ingest, methods=["POST"])])


@pytest.fixture
def collector(mw) -> Iterator[Collector]:
    c = Collector()
    with mw.running_server(_app(c)) as url:
        c.url = url
        yield c


def fast_sink(url: str, **kwargs: Any) -> HttpSink:
    kwargs.setdefault("retry_budget", 5.0)
    return HttpSink(url, backoff=(0.01, 0.05), **kwargs)


def test_http_sink_posts_ndjson_with_the_bearer_token(collector) -> None:
    sink = fast_sink(collector.url, token="tok-123")
    batch = events(5)
    assert sink.write(batch) == 0
    sink.close()
    [post] = collector.posts
    assert post["headers"]["content-type"] == "application/x-ndjson"
    assert post["headers"]["authorization"] == "Bearer tok-123"
    assert post["events"] == batch


def test_http_sink_without_token_sends_no_authorization(collector) -> None:
    sink = fast_sink(collector.url + "/v1/events")
    assert sink.write(events(1)) == 0
    assert "authorization" not in collector.posts[0]["headers"]


@pytest.mark.parametrize("status", [500, 502, 503, 429])
def test_http_sink_retries_then_succeeds_resending_the_same_events(collector, status) -> None:
    collector.policy = lambda batch, n: (status, None, {}) if n < 2 else _accept(batch, n)
    sink = fast_sink(collector.url)
    assert sink.write(events(4)) == 0
    assert [p["status"] for p in collector.posts] == [status, status, 200]
    eids = [[e["eid"] for e in body] for body in collector.bodies()]
    assert eids[0] == eids[1] == eids[2]


def test_http_sink_honours_retry_after(collector) -> None:
    collector.policy = lambda batch, n: (429, None, {"Retry-After": "0"}) if n == 0 else _accept(batch, n)
    assert fast_sink(collector.url).write(events(1)) == 0
    assert [p["status"] for p in collector.posts] == [429, 200]


@pytest.mark.parametrize("status", [400, 401, 403, 415])
def test_http_sink_does_not_retry_what_retrying_cannot_fix(collector, status, capfd) -> None:
    collector.policy = lambda batch, n: (status, {"detail": "no"}, {})
    assert fast_sink(collector.url, token="tok-secret").write(events(3)) == 3
    assert len(collector.posts) == 1
    err = capfd.readouterr().err
    assert f'"status":{status}' in err and "tok-secret" not in err


def test_http_sink_splits_a_batch_answered_413_and_drops_a_single_oversized_event(collector) -> None:
    # The collector takes at most 3 events per request, and never the event marked huge.
    def policy(batch, n):
        if len(batch) > 3 or any(e.get("huge") for e in batch):
            return 413, None, {}
        return _accept(batch, n)

    collector.policy = policy
    batch = events(10)
    batch[7]["huge"] = True
    sink = fast_sink(collector.url)
    assert sink.write(batch) == 1
    accepted = [e["request_id"] for body in collector.bodies(200) for e in body]
    assert accepted == [f"req-{i}" for i in range(10) if i != 7]  # each once, in order
    assert all(len(body) <= 3 for body in collector.bodies(200))


def test_http_sink_counts_rejected_lines_and_logs_them_once(collector, capfd) -> None:
    def policy(batch, n):
        return 200, {"accepted": len(batch) - 2, "duplicates": 0,
                     "rejected": [{"line": 2, "error": "unknown hop 'x'"}, {"line": 3, "error": "ts must be"}]}, {}

    collector.policy = policy
    sink = fast_sink(collector.url)
    assert sink.write(events(5)) == 2
    assert sink.write(events(5, start=5)) == 2
    err = capfd.readouterr().err
    assert err.count("collector_rejected_events") == 1
    assert "unknown hop 'x'" in err


def test_http_sink_counts_rejected_lines_beyond_those_the_collector_listed(collector) -> None:
    # The collector lists the first rejections only and gives the full count as rejected_total.
    collector.policy = lambda batch, n: (200, {"accepted": 0, "duplicates": 0, "rejected_total": 150,
                                               "rejected": [{"line": i, "error": "bad"} for i in range(1, 101)]}, {})
    assert fast_sink(collector.url).write(events(150)) == 150


def test_http_sink_against_a_closed_port_gives_up_within_its_budget(mw, capfd) -> None:
    sink = fast_sink(mw.closed_port_url(), retry_budget=0.3)
    assert sink.write(events(7)) == 7
    assert "collector_unreachable_batch_dropped" in capfd.readouterr().err


def test_http_sink_gives_up_on_a_collector_that_keeps_failing(collector) -> None:
    collector.policy = lambda batch, n: (503, None, {})
    assert fast_sink(collector.url, retry_budget=1.0).write(events(2)) == 2
    assert len(collector.posts) > 1  # it did retry
    assert len({tuple(e["eid"] for e in body) for body in collector.bodies()}) == 1


def test_emitter_eids_are_stable_across_retries(collector) -> None:
    collector.policy = lambda batch, n: (500, None, {}) if n == 0 else _accept(batch, n)
    emitter = Emitter(fast_sink(collector.url), service="svc", flush_interval=60, stats_interval=0)
    for i in range(3):
        emitter.emit("gateway.received", f"req-{i}")
    emitter.close()
    first, second = collector.bodies()
    assert [e["eid"] for e in first] == [e["eid"] for e in second]
    assert len({e["eid"] for e in first}) == 3 and all(len(e["eid"]) == 16 for e in first)
    assert emitter.stats()["sent"] == 3 and emitter.stats()["dropped"] == 0


def test_http_sink_keeps_httpx_out_of_the_host_logs(collector) -> None:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    root = logging.getLogger()
    handler, level = Keep(), root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        assert fast_sink(collector.url).write(events(2)) == 0
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    assert collector.posts and not records


def test_https_sink_with_a_private_ca(mw, tls) -> None:
    c = Collector()
    with mw.running_server(_app(c), tls) as url:
        assert fast_sink(url, verify=tls.client_context, token="t").write(events(2)) == 0
        assert fast_sink(url, retry_budget=0.1).write(events(1)) == 1  # unknown CA: dropped, no raise
    assert [e["request_id"] for e in c.posts[0]["events"]] == ["req-0", "req-1"]
    assert c.posts[0]["headers"]["authorization"] == "Bearer t"
    assert len(c.posts) == 1


def test_stdout_sink_survives_a_closed_stdout(monkeypatch) -> None:
    closed = io.TextIOWrapper(io.BytesIO())
    closed.close()
    monkeypatch.setattr(sys, "stdout", closed)
    assert StdoutSink().write(events(2)) == 2


def test_a_write_cut_short_by_the_disk_keeps_complete_lines_and_isolates_the_torn_one(tmp_path) -> None:
    # RLIMIT_FSIZE makes the kernel cut a write short exactly as a full disk would.
    path = tmp_path / "events.ndjson"
    script = f"""
import resource, signal, orjson
from hopline.middleware.sinks import FileSink
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
events = [{{"v": 1, "ts": 1e9 + i, "request_id": f"req-{{i}}", "hop": "client.sent"}} for i in range(40)]
line = len(orjson.dumps(events[0])) + 1
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (int(line * 10.5), hard))
sink = FileSink({str(path)!r})
print(sink.write(events[:20]))  # 10 complete lines fit, the 11th is torn
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
print(sink.write(events[20:22]))
sink.close()
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["10", "0"]
    parsed = list(iter_ndjson(path.read_bytes()))
    good = [event["request_id"] for _, event, error in parsed if error is None]
    assert good == [f"req-{i}" for i in range(10)] + ["req-20", "req-21"]
    assert [number for number, _, error in parsed if error is not None] == [11]  # the torn line alone


def test_a_token_an_http_header_cannot_carry_is_refused_at_configuration_without_echoing_it() -> None:
    for bad in ("s\u00e9cret", "two words", "line\nbreak"):
        with pytest.raises(ValueError, match="HOPLINE_TOKEN must be printable ASCII") as raised:
            make_sink("http://127.0.0.1:9400", token=bad)
        assert bad not in str(raised.value)  # a token is a credential
    assert make_sink("http://127.0.0.1:9400", token="abc-DEF_123.~+/=")  # every base64 / URL-safe char
