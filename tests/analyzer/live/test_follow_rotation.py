"""``Tail`` (``hopline watch --follow``) follows files by (device, inode) and offset, not by name:
the file sink's rotation and a renamed store file are read once, a replaced or truncated file
from its start; a line too long for one read is skipped and reported, and following goes on."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from hopline.analyzer.live import feed
from hopline.analyzer.live.feed import Tail
from hopline.middleware.sinks import FileSink
from support.events import event, ndjson

T0 = 1767225600.0  # 2026-01-01T00:00:00Z


def batch(prefix: str, n: int) -> list[dict]:
    return [event("gateway.received", f"{prefix}-{i}", T0 + i, service="gw") for i in range(n)]


def drain(tail: Tail, polls: int = 5) -> list[str]:
    """The eids of what ``polls`` more polls read."""
    return [eid for _ in range(polls) for eid in tail.poll()["eid"].to_list()]


def assert_once(read: list[str], written: list[str]) -> None:
    assert len(read) == len(set(read)), f"{len(read) - len(set(read))} events read twice"
    assert sorted(read) == sorted(written)


def test_the_file_sinks_rotated_files_are_read_once(tmp_path):
    # 20,000 events (the adversarial run's count) in batches of 50 (~5.8 KB), files of at most
    # 16 KB: two batches a file, 199 rotations; a poll every 3 batches, so most polls find the
    # file they were reading renamed and a new one at its name. (A fixed hour: size rotations only.)
    live = tmp_path / "logs" / "events.ndjson"
    sink = FileSink(live, max_bytes=16_000, now=lambda: T0)
    tail = Tail([live.parent])
    written: list[str] = []
    read: list[str] = []
    for n in range(400):
        events = batch(f"b{n}", 50)
        assert sink.write(events) == 0
        written += [e["eid"] for e in events]
        if n % 3 == 0:
            read += tail.poll()["eid"].to_list()
    read += drain(tail)
    sink.close()
    assert len(list(live.parent.glob("events.ndjson.*"))) == 199  # it did rotate, 400 // 2 - 1 times
    assert_once(read, written)  # before (tracked by name, each rotated file read again): 29,950
    assert tail.report.bad_lines == 0


def test_rotation_by_a_writer_thread_while_polling_reads_every_event_once(tmp_path):
    # The same with the writer racing the follower: renames land between listing and opening.
    live = tmp_path / "logs" / "events.ndjson"
    sink = FileSink(live, max_bytes=8_000)
    written: list[str] = []

    def write() -> None:
        for n in range(200):
            events = batch(f"w{n}", 25)
            assert sink.write(events) == 0
            written.extend(e["eid"] for e in events)

    tail = Tail([live.parent])
    writer = threading.Thread(target=write)
    writer.start()
    read: list[str] = []
    while writer.is_alive():
        read += tail.poll()["eid"].to_list()
    writer.join()
    read += drain(tail)
    sink.close()
    assert_once(read, written)


def test_a_rename_between_listing_and_opening_is_not_taken_for_a_new_file(tmp_path, monkeypatch):
    # The listing names PATH; before it is opened the sink renames it and starts a new PATH.
    # The renamed file is missing from that poll, and must not be read from 0 in the next.
    live = tmp_path / "events.ndjson"
    sink = FileSink(live)
    tail = Tail([tmp_path])
    first = batch("a", 40)
    sink.write(first)
    read = tail.poll()["eid"].to_list()
    more, after = batch("b", 10), batch("c", 40)
    sink.write(more)  # appended to the file already being followed ...
    sink.max_bytes = live.stat().st_size
    sink.write(after)  # ... which this batch rotates away
    rotated = sorted(tmp_path.glob("events.ndjson.*"))
    assert len(rotated) == 1
    monkeypatch.setattr(Tail, "_candidates", lambda self: [live])  # the listing before the rename
    read += tail.poll()["eid"].to_list()
    monkeypatch.undo()
    read += drain(tail)
    assert_once(read, [e["eid"] for e in first + more + after])


def store_file(root: Path, hour: int = 0) -> Path:
    path = root / "events" / "date=2026-01-01" / f"hour={hour:02d}" / "events.ndjson"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def test_a_store_file_renamed_mid_follow_is_read_once(tmp_path):
    store = store_file(tmp_path)
    first, second, third = batch("a", 300), batch("b", 200), batch("c", 100)
    store.write_bytes(ndjson(first))
    tail = Tail([tmp_path])
    read = tail.poll()["eid"].to_list()
    renamed = store.with_name("events.ndjson.1")
    os.rename(store, renamed)
    with renamed.open("ab") as f:  # the writer still has it open: it goes on growing
        f.write(ndjson(second))
    read += tail.poll()["eid"].to_list()
    os.rename(renamed, store_file(tmp_path, hour=1))  # into another folder under the followed one
    with store_file(tmp_path, hour=1).open("ab") as f:
        f.write(ndjson(third))
    read += drain(tail)
    assert_once(read, [e["eid"] for e in first + second + third])  # before: 1,400 read of 600


def test_a_replaced_or_truncated_file_is_read_from_its_start_and_a_vanished_one_forgotten(tmp_path):
    store = store_file(tmp_path)
    old, new, rewritten, regrown = batch("old", 50), batch("new", 30), batch("rw", 80), batch("tr", 5)
    store.write_bytes(ndjson(old))
    tail = Tail([tmp_path])
    assert len(drain(tail, 1)) == 50
    # a new file at the same path (a new inode; the old one kept open, so its number is not reused)
    keep = store.open("rb")
    replacement = store.with_name("events.ndjson.tmp")
    replacement.write_bytes(ndjson(new))
    os.replace(replacement, store)
    assert sorted(drain(tail, 2)) == sorted(e["eid"] for e in new)
    keep.close()
    # the same inode rewritten in place with other lines, longer than what was read: its first bytes changed
    with store.open("r+b") as f:
        f.write(ndjson(rewritten))
    assert sorted(drain(tail, 2)) == sorted(e["eid"] for e in rewritten)
    # truncated, then a few lines
    with store.open("r+b") as f:
        f.truncate(0)
        f.write(ndjson(regrown))
    assert sorted(drain(tail, 2)) == sorted(e["eid"] for e in regrown)
    # gone: forgotten once missing from FORGET_AFTER polls; a later file there is read whole
    store.unlink()
    drain(tail, feed.FORGET_AFTER)
    assert tail.files == {}
    store.write_bytes(ndjson(old))
    assert sorted(drain(tail, 2)) == sorted(e["eid"] for e in old)
    assert tail.report.bad_lines == 0


def test_a_torn_line_does_not_swallow_the_next_complete_one(tmp_path):
    # A line still being written is left for the next poll; one that stays torn (the sink's write
    # failed mid-line) is ended by the sink's next batch, which starts with a newline: the torn
    # line is one bad line and the complete lines after it are all read.
    live = tmp_path / "events.ndjson"
    before, after = batch("a", 10), batch("b", 10)
    half = ndjson(batch("torn", 1))[:60]
    live.write_bytes(ndjson(before) + half)
    tail = Tail([live])
    assert sorted(drain(tail, 2)) == sorted(e["eid"] for e in before)
    assert tail.report.bad_lines == 0  # not read yet: its newline may still come
    with live.open("ab") as f:
        f.write(b"\n" + ndjson(after))
    assert sorted(drain(tail, 2)) == sorted(e["eid"] for e in after)
    assert tail.report.bad_lines == 1 and "events.ndjson:1: not JSON" in tail.report.errors[0]
    # a torn line left at the end of a rotated file is not joined to the new file's first line
    with live.open("ab") as f:
        f.write(half)
    os.rename(live, live.with_name("events.ndjson.2026010100.0000"))
    last = batch("c", 5)
    live.write_bytes(ndjson(last))
    fresh = Tail([tmp_path])
    assert sorted(drain(fresh, 2)) == sorted(e["eid"] for e in before + after + last)
    assert fresh.report.bad_lines == 1  # the first torn line; the last one never got its newline


def long_line_then_events(path: Path, length: int, events: list[dict]) -> int:
    """Three events, a line of ``length`` bytes, ``events``; where the long line starts."""
    with path.open("wb") as f:
        f.write(first := ndjson(batch("first", 3)))
        f.write(b'{"v":1,"request_id":"huge","x":"' + b"x" * (length - 40) + b'"}')  # no newline yet
        f.write(b"\n" + ndjson(events))
    return len(first)


def test_a_line_longer_than_one_read_is_skipped_reported_and_following_goes_on(tmp_path, monkeypatch):
    monkeypatch.setattr(feed, "MAX_READ", 64 << 10)
    log = tmp_path / "events.ndjson"
    events = batch("after", 20)
    offset = long_line_then_events(log, 5 * (64 << 10) + 123, events)  # five reads and a bit
    tail = Tail([log])
    read, polls = [], 0
    while len(read) < 23:
        read += tail.poll()["request_id"].to_list()
        polls += 1
        assert polls <= 8  # one read per poll: the first lines, five of the long one, the rest
    assert sorted(read) == sorted([f"first-{i}" for i in range(3)] + [e["request_id"] for e in events])
    assert tail.report.bad_lines == 1
    assert tail.report.errors == [
        f"{log} at byte {offset}: line longer than {64 << 10} bytes without a newline: skipped to its end"
    ]
    assert drain(tail, 2) == [] and tail.report.bad_lines == 1


def test_a_long_line_still_being_written_is_skipped_as_it_grows(tmp_path, monkeypatch):
    monkeypatch.setattr(feed, "MAX_READ", 4096)
    log = tmp_path / "events.ndjson"
    log.write_bytes(b'{"v":1,"x":"')
    tail = Tail([log])
    for _ in range(10):  # it grows 3 KB per poll, never a newline
        with log.open("ab") as f:
            f.write(b"y" * 3000)
        assert tail.poll().height == 0
    assert tail.report.bad_lines == 1  # reported once, when it outgrew one read
    events = batch("z", 5)
    with log.open("ab") as f:
        f.write(b'"}\n' + ndjson(events))
    assert sorted(drain(tail, 2)) == sorted(e["eid"] for e in events)
    assert tail.report.bad_lines == 1


def test_a_65_mib_line_at_the_real_read_size(tmp_path):
    assert feed.MAX_READ == 64 << 20
    log = tmp_path / "events.ndjson"
    events = batch("after", 50)
    offset = long_line_then_events(log, 65 << 20, events)
    tail = Tail([log])
    # poll 1: the 3 first lines (and 64 MiB read up to the long one); poll 2: 64 MiB of the long
    # one, no newline: reported, skipped; poll 3: its last 1 MiB, then the 50 events
    read = [rid for _ in range(3) for rid in tail.poll()["request_id"].to_list()]
    assert sorted(read) == sorted([f"first-{i}" for i in range(3)] + [e["request_id"] for e in events])
    assert tail.report.bad_lines == 1
    assert tail.report.errors[0].startswith(f"{log} at byte {offset}: line longer than 67108864 bytes")
