"""The durable event store: every accepted event is on disk before it is acknowledged.

Layout (hive partitions by *ingest* time, UTC; the analyzer reads the same)::

    DIR/events/date=YYYY-MM-DD/hour=HH/events.ndjson    the open hour: contract NDJSON lines
    DIR/events/date=YYYY-MM-DD/hour=HH/events.parquet   a compacted hour (STORAGE_COLUMNS)

A closed hour holds one or the other (briefly both after a crash during compaction; then the
Parquet file is complete and the NDJSON file is removed on the next compaction pass). Readers
take ``*.parquet`` and ``*.ndjson`` of every hour and only complete lines of an NDJSON file.

Partitioning by ingest time, with the writer's hour never moving backwards (not even when the
wall clock steps back, nor across restarts: it starts after the newest compacted hour), means a
late or far-future event can never land in an hour that was already compacted.

Durability (``fsync``): ``batch`` writes and fsyncs each batch before it is acknowledged
(survives power loss); ``interval`` writes each batch before acknowledging and fsyncs at most
every ``fsync_interval`` seconds (survives a killed process: written data lives in the kernel's page
cache); ``none`` writes and leaves flushing to the OS. A write that fails (disk full, read-only,
permissions) is rolled back to the previous end of file and raises ``StoreError``: nothing that
was not stored is acknowledged. A torn last line left by a crash mid-write (never acknowledged)
is cut off when the file is opened again.

Health (``failure``): the reason the last write or probe failed, or that the file system has less
room than ``healthz_min_free`` (checked after each write and in each probe), None while storing works; the
app's ``/healthz`` answers 503 with it. A write refused for want of space is rolled back, which can
leave room for a small probe file but not for the next batch: the free-space check, not the probe
file, keeps health at 503 until space really returns.

Before each write, and in ``probe`` (the housekeeping loop
calls it every second, so health comes back without waiting for a sender), the open event file is
checked to still be the file at its path: a data directory that was moved, deleted or replaced
under a running collector would otherwise take acknowledged events into a file nobody reads.
A stale file is closed and the path opened anew (recreating the directories), or the write fails.

An hour that cannot be compacted never blocks the others nor retention: lines that are not
valid events (compaction validates each line when Polars' reader fails) and, when compaction
fails for any other reason than I/O, the hour's NDJSON files are moved aside to
``DIR/quarantine/date=…/hour=…/`` (same layout, kept for the same retention, never read by the
analyzer), reported through ``on_quarantine`` (the app logs the path and counts it); an I/O
failure (disk full) leaves the hour to the next pass.
"""

from __future__ import annotations

import calendar
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import polars as pl
from hopline.middleware.contract.errors import HoplineError
from hopline.collector.compaction import PARQUET_NAME, compact_hour, fsync_dir, trim_partial_line
from hopline.collector.config import CollectorConfig, settings_of

NDJSON_NAME = "events.ndjson"
PROBE_NAME = ".write-probe"
QUARANTINE_DIR = "quarantine"
HOUR = 3600


class StoreError(HoplineError):
    """The events could not be stored; the message is the reason given to the sender (503)."""


def hour_dir(root: Path, hour_start: int) -> Path:
    """``root/date=YYYY-MM-DD/hour=HH`` for the UTC hour starting at ``hour_start``."""
    t = time.gmtime(hour_start)
    return root / f"date={t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}" / f"hour={t.tm_hour:02d}"


def parse_hour_dir(path: Path) -> int | None:
    """The hour start of a ``date=…/hour=…`` directory, or None for anything else."""
    try:
        date = path.parent.name.removeprefix("date=")
        hour = int(path.name.removeprefix("hour="))
        if not 0 <= hour < 24:
            return None
        return calendar.timegm(time.strptime(date, "%Y-%m-%d")) + hour * HOUR
    except ValueError:
        return None


class EventStore:
    """Appends batches of NDJSON bytes to the current hour's file; compacts and expires old hours.

    ``append`` is blocking (write + fsync): call it from one writer thread, which keeps batches
    in order. ``compact`` and ``expire`` may run in another thread.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        fsync: str,
        fsync_interval: float,
        healthz_min_free: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.root = Path(data_dir) / "events"
        self.quarantine_root = Path(data_dir) / QUARANTINE_DIR
        self.fsync = fsync
        self.fsync_interval = fsync_interval
        self.clock = clock
        self._lock = threading.Lock()
        self._opened = False
        self._fd: int | None = None
        self._path: Path | None = None  # the open event file's path (to see it replaced)
        self._size = 0
        self._hour = 0
        self._dirty = False
        self._last_sync = time.monotonic()
        self.appended_bytes = 0
        self.healthz_min_free = healthz_min_free  # bytes the file system must have free for health to say ok
        self._write_failure: str | None = None  # why the last write or probe failed
        self._space_failure: str | None = None  # too little room left (healthz_min_free)

    @classmethod
    def from_config(cls, config: CollectorConfig, *, clock: Callable[[], float] = time.time) -> EventStore:
        return cls(config.data_dir, **settings_of(cls, config), clock=clock)

    @property
    def failure(self) -> str | None:
        """Why storing does not work now (None: it does)."""
        return self._write_failure or self._space_failure

    # -- writing --------------------------------------------------------------------------------

    def open(self) -> None:
        """Create the store (raises StoreError when the directory is unusable)."""
        try:
            self._usable_root()
        except StoreError as exc:
            self._write_failure = str(exc)
            raise
        compacted = [h for h in self._hours() if (hour_dir(self.root, h) / PARQUET_NAME).exists()]
        self._hour = max(compacted, default=0) + HOUR if compacted else 0
        self._opened = True

    def _usable_root(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create {self.root}: {exc.strerror}") from None
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise StoreError(f"data directory {self.root} is not writable")

    def _hours(self, root: Path | None = None) -> list[int]:
        root = self.root if root is None else root
        hours = (parse_hour_dir(p) for p in root.glob("date=*/hour=*") if p.is_dir())
        return sorted(h for h in hours if h is not None)

    def _current_fd(self) -> int:
        hour = max(int(self.clock()) // HOUR * HOUR, self._hour)
        if self._fd is not None and hour == self._hour and not self._stale():
            return self._fd
        self._close_fd()
        directory = hour_dir(self.root, hour)
        created = not directory.exists()
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / NDJSON_NAME
        if path.exists():
            trim_partial_line(path)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._fd, self._path, self._hour, self._size = fd, path, hour, os.fstat(fd).st_size
        if created and self.fsync != "none":
            for d in (directory, directory.parent, self.root):
                fsync_dir(d)
        return fd

    def append(self, data: bytes) -> None:
        """Write ``data`` (complete NDJSON lines) durably per the fsync policy, or raise StoreError."""
        if not data:
            return
        with self._lock:
            try:
                self._append(data)
            except StoreError as exc:
                self._write_failure = str(exc)
                raise
            self._write_failure = None
            self._check_space()

    def _append(self, data: bytes) -> None:
        """``append`` under the lock: the write, rolled back when it fails."""
        if not self._opened:
            self.open()
        try:
            fd = self._current_fd()
        except OSError as exc:
            where = f" {exc.filename}" if exc.filename else ""
            raise StoreError(f"cannot open the event file{where}: {exc.strerror or exc}") from None
        before = self._size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if self.fsync == "batch":
                os.fdatasync(fd)
            elif self.fsync == "interval":
                self._dirty = True
                if time.monotonic() - self._last_sync >= self.fsync_interval:
                    self._sync()
        except OSError as exc:
            try:
                os.ftruncate(fd, before)
            except OSError:
                pass
            raise StoreError(f"cannot write events: {exc.strerror or exc}") from None
        self._size = before + len(data)
        self.appended_bytes += len(data)

    def _stale(self) -> bool:
        """True when the open event file is no longer the file at its path (moved, deleted, replaced)."""
        try:
            at_path = os.stat(self._path)
        except OSError:
            return True
        opened = os.fstat(self._fd)
        return (at_path.st_dev, at_path.st_ino) != (opened.st_dev, opened.st_ino)

    def probe(self) -> str | None:
        """Whether storing works now, without an event to store: returns (and keeps in ``failure``)
        the reason it does not, or None. Closes a stale event file; after a failure, or when the
        directory looks wrong, a small file is created, fsynced and removed in the data directory
        (blocking: call it from the writer thread)."""
        with self._lock:
            try:
                if self._fd is not None and self._stale():
                    self._close_quietly()
                    self._write_failure = f"the event file {self._path} was moved, deleted or replaced"
                looks_wrong = not self.root.is_dir() or not os.access(self.root, os.W_OK)
                if self._write_failure is not None or looks_wrong:
                    self._write_probe()
            except StoreError as exc:
                self._write_failure = str(exc)
            else:
                self._write_failure = None
            self._check_space()
            return self.failure

    def _check_space(self) -> None:
        """Set or clear ``_space_failure`` from the file system's free bytes (``healthz_min_free``)."""
        if self.healthz_min_free <= 0:
            return
        try:
            st = os.statvfs(self.root)
        except OSError:
            return  # a missing directory is the probe file's finding
        free = st.f_bavail * st.f_frsize
        self._space_failure = (
            None
            if free >= self.healthz_min_free
            else f"{free / 2**20:.1f} MiB free on {self.root}, less than --healthz-min-free "
            f"({self.healthz_min_free / 2**20:.1f} MiB)"
        )

    def _write_probe(self) -> None:
        self._usable_root()
        path = self.root / PROBE_NAME
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, b"probe\n")
                os.fsync(fd)
            finally:
                os.close(fd)
            os.unlink(path)
        except OSError as exc:
            raise StoreError(f"cannot write to {self.root}: {exc.strerror or exc}") from None

    def _close_quietly(self) -> None:
        try:
            self._close_fd()
        except OSError:
            self._fd = None

    def _sync(self) -> None:
        if self._fd is not None and self._dirty:
            os.fdatasync(self._fd)
        self._dirty = False
        self._last_sync = time.monotonic()

    def sync(self, *, force: bool = True) -> None:
        """fsync what was written: always (shutdown), or when ``fsync_interval`` has passed (timer)."""
        with self._lock:
            if not force and time.monotonic() - self._last_sync < self.fsync_interval:
                return
            try:
                self._sync()
            except OSError:
                pass

    def _close_fd(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                if self.fsync != "none":
                    os.fdatasync(fd)
            finally:
                os.close(fd)

    def close(self) -> None:
        with self._lock:
            self._close_fd()

    # -- housekeeping ---------------------------------------------------------------------------

    def compact(
        self, delay_s: float = 60.0, on_quarantine: Callable[[Path, str], None] | None = None
    ) -> list[Path]:
        """Compact every hour that closed at least ``delay_s`` ago; returns the Parquet files written.

        What cannot be compacted is quarantined (``on_quarantine(path, reason)``) and the other
        hours go on; hours that failed on I/O are retried next time (StoreError once all were tried).
        """
        report = on_quarantine or (lambda path, reason: None)
        now = self.clock()
        with self._lock:  # roll the writer forward, so a quiet collector's last hour closes too
            if self._fd is not None and int(now) // HOUR * HOUR > self._hour:
                self._close_fd()
            current = self._hour if self._fd is not None else max(int(now) // HOUR * HOUR, self._hour)
            self._hour = current
        written, failed = [], []
        for hour in self._hours():
            if not (hour < current and hour + HOUR + delay_s <= now):
                continue
            directory = hour_dir(self.root, hour)

            def quarantine(lines: list[bytes], hour: int = hour) -> None:
                path = self._quarantine_lines(hour, lines)
                report(path, f"{len(lines)} lines are not valid events")

            try:
                path = compact_hour(directory, quarantine)
            except OSError as exc:
                failed.append(f"{directory}: {exc.strerror or exc}")
                continue
            except (Exception, pl.exceptions.PanicException) as exc:  # noqa: BLE001 - never stop on one hour
                for moved in self._quarantine_files(hour):
                    report(moved, f"cannot be compacted: {type(exc).__name__}: {exc}"[:300])
                continue
            if path is not None:
                written.append(path)
        if failed:
            raise StoreError(f"compaction failed for {len(failed)} hours: {'; '.join(failed)}"[:1000])
        return written

    def _quarantine_dir(self, hour: int) -> Path:
        directory = hour_dir(self.quarantine_root, hour)
        directory.mkdir(parents=True, exist_ok=True)
        return directory

    def _free_name(self, directory: Path) -> Path:
        n = 0
        while (directory / f"events-{n}.ndjson").exists():
            n += 1
        return directory / f"events-{n}.ndjson"

    def _quarantine_lines(self, hour: int, lines: list[bytes]) -> Path:
        """Write lines to a new file of the hour's quarantine directory, durably."""
        directory = self._quarantine_dir(hour)
        path = self._free_name(directory)
        with open(path, "wb") as f:
            f.write(b"\n".join(lines) + b"\n")
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(directory)
        return path

    def _quarantine_files(self, hour: int) -> list[Path]:
        """Move the hour's NDJSON files to its quarantine directory (a rename: same file system)."""
        source = hour_dir(self.root, hour)
        directory = self._quarantine_dir(hour)
        moved = []
        for path in sorted(source.glob("*.ndjson")):
            target = self._free_name(directory)
            os.replace(path, target)
            moved.append(target)
        fsync_dir(directory)
        fsync_dir(source)
        return moved

    def expire(self, retention: float) -> list[Path]:
        """Delete hours that ended more than ``retention`` seconds ago; returns the directories removed."""
        cutoff = self.clock() - retention
        removed = []
        expired = [(self.root, h) for h in self._hours()] + [
            (self.quarantine_root, h) for h in self._hours(self.quarantine_root)
        ]
        for root, hour in expired:
            if hour + HOUR <= cutoff and hour < self._hour:
                directory = hour_dir(root, hour)
                shutil.rmtree(directory, ignore_errors=True)
                removed.append(directory)
                try:
                    directory.parent.rmdir()  # the date directory, once its last hour is gone
                except OSError:
                    pass
        return removed
