"""Where the live detector's events come from: a recorded log (replay) or a growing one (tail).

``replay`` reads event files as ``hopline analyze`` does (``io.scan_events``: NDJSON, Parquet,
the collector's store) and yields them in event-time order, one batch per detector step, as fast
as the detector takes them.

``Tail`` follows NDJSON files as they grow: the collector's store (``DIR/events/date=…/hour=…/
events.ndjson``, the open hour, written before the collector acknowledges an event) or a file
sink's output. Each ``poll`` returns the complete lines appended since the last one, through the
same contract validation as ``hopline analyze`` (``io.parse_ndjson``). Files are followed by
identity, ``(device, inode)``, not by name (as ``collector/tail.py`` does): a file renamed within
the followed folders (the file sink's rotation, ``PATH`` -> ``PATH.YYYYMMDDHH.NNNN``) goes on
from its offset under its new name; a new file at a known path (a new inode), a file that shrank,
or one whose first bytes changed (an inode number reused by a new file) is read from its start;
one missing from ``FORGET_AFTER`` polls in a row (the collector compacted its hour into Parquet,
after it was read) is forgotten. A line with no newline in ``MAX_READ`` bytes is skipped to its
newline (one bad line in the report, at its file and byte offset) instead of stopping the file;
a line still being written waits for its newline. A listing or an open that fails otherwise than
"not found" (EMFILE: out of file descriptors) is counted (``failures``), logged once a minute
(``follow_failed``) and tried again at the next poll, never raised; no file is forgotten in a
poll that met one. With ``sample`` < 1 the lines
of requests outside the sample (``detector.in_sample``) are dropped before they are parsed and
validated (``sampled_lines``): reading, not only the analysis, is then paid for the sample.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
from hopline.analyzer import io
from hopline.analyzer.io import SCHEMA, ScanReport
from hopline.analyzer.live.detector import in_sample
from hopline.middleware.contract.records import translate_lines
from hopline.middleware.log import warn_throttled

MAX_READ = 64 << 20  # bytes read from one file per poll (a big backlog is read over several polls)
HEAD_BYTES = 256  # a followed file's first bytes, kept to tell it from a new file given its inode number
FORGET_AFTER = 2  # polls a file is missing from before it is forgotten (one may list it mid-rename)
REQUEST_ID = re.compile(rb'"request_id"\s*:\s*"([^"\\]*)"')  # a line's ID, found without parsing it


def sampled_lines(data: bytes, fraction: float) -> tuple[bytes, int]:
    """``data`` (complete NDJSON lines, engine records already translated) with the lines of
    requests outside the sample emptied (line numbers stay those of the file, for errors), and
    how many were. The ID is found by a pattern, not by parsing: a line it finds no ID in (none,
    an escaped one, a broken line) is kept and read as usual."""
    verdicts: dict[bytes, bool] = {}
    lines = data.split(b"\n")
    left = 0
    for number, line in enumerate(lines):
        found = REQUEST_ID.search(line)
        if found is None:
            continue
        rid = found.group(1)
        keep = verdicts.get(rid)
        if keep is None:
            keep = verdicts[rid] = in_sample(rid.decode("utf-8", "replace"), fraction)
        if not keep:
            lines[number] = b""
            left += 1
    return b"\n".join(lines), left


def replay(paths: list[Path], every_s: float, report: ScanReport | None = None) -> Iterator[pl.DataFrame]:
    """The events under ``paths``, sorted by ``ts``, in batches of ``every_s`` of event time."""
    events, scanned = io.scan_events(paths)
    if report is not None:
        report.__dict__.update(scanned.__dict__)
    frame = events.sort("ts").collect()
    if frame.height == 0:
        return
    slot = (pl.col("ts") / every_s).floor().alias("_slot")
    for part in frame.with_columns(slot).partition_by("_slot", maintain_order=True):
        yield part.drop("_slot")


@dataclass
class _Followed:
    path: Path  # the name it was last found under
    offset: int = 0  # where its next unread line starts
    head: bytes = b""  # its first bytes (up to ``HEAD_BYTES``), as first read
    skipping: bool = False  # inside a line longer than ``MAX_READ``: read on to its newline
    missing: int = 0  # polls in a row it was not found in


@dataclass
class Tail:
    """Follows the NDJSON files under ``paths`` (files or folders, searched recursively)."""

    paths: list[Path]
    report: ScanReport = field(default_factory=ScanReport)
    files: dict[tuple[int, int], _Followed] = field(default_factory=dict)  # by (st_dev, st_ino)
    sample: float = 1.0  # read only the lines of this fraction of the requests (``sampled_lines``)
    not_sampled: int = 0  # lines left unread for it
    failures: int = 0  # listings and opens that failed otherwise than "not found" (``_failed``)
    starved: bool = False  # the last poll met such a failure

    def _candidates(self) -> list[Path]:
        found: list[Path] = []
        for path in self.paths:
            if path.is_dir():
                found += sorted(
                    p
                    for p in path.rglob("*")
                    if p.is_file() and io.is_ndjson(p) and not p.name.endswith(".gz")
                )
            elif path.is_file():
                found.append(path)
        return [p for p in found if "quarantine" not in p.parts]

    def _failed(self, exc: OSError, path: Path | None = None) -> None:
        """A listing or an open that failed (EMFILE: the process is out of file descriptors):
        counted, logged (once a minute), and tried again on the next poll; meanwhile no file is
        taken for gone."""
        self.failures += 1
        self.starved = True
        error = f"{type(exc).__name__}: {exc}"
        warn_throttled("follow_failed", "follow_failed", path=str(path or self.paths[0]), error=error)

    def poll(self) -> pl.DataFrame:
        """The events appended since the last poll (``io.SCHEMA`` columns)."""
        frames = []
        seen: set[tuple[int, int]] = set()
        self.starved = False
        try:
            candidates = self._candidates()
        except OSError as exc:  # EMFILE; or a folder removed while listed (the collector's compaction)
            self._failed(exc)
            return pl.DataFrame(schema=SCHEMA)
        for path in candidates:
            data = self._new_lines(path, seen)
            if data and self.sample < 1:
                data, errors = translate_lines(data)
                for error in errors:
                    self.report.bad(str(path), error)
                data, left = sampled_lines(data, self.sample)
                self.not_sampled += left
            if data:
                frames.append(io.parse_ndjson(data, str(path), self.report))
        for identity, followed in list(self.files.items()):
            if identity not in seen and not self.starved:
                followed.missing += 1
                if followed.missing >= FORGET_AFTER:
                    del self.files[identity]
        if not frames:
            return pl.DataFrame(schema=SCHEMA)
        return pl.concat(frames, how="vertical").sort("ts")

    def _new_lines(self, path: Path, seen: set[tuple[int, int]]) -> bytes:
        """The complete lines of the file at ``path`` not read yet, under whatever name they were."""
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                identity = (st.st_dev, st.st_ino)
                if identity in seen:  # listed under two names (a hard link, a rename mid-listing)
                    return b""
                seen.add(identity)
                head = f.read(HEAD_BYTES)
                followed = self.files.get(identity)
                if followed is None or st.st_size < followed.offset or not head.startswith(followed.head):
                    followed = self.files[identity] = _Followed(path)
                followed.path, followed.missing = path, 0
                if len(head) > len(followed.head):
                    followed.head = head
                f.seek(followed.offset)
                data = f.read(min(st.st_size - followed.offset, MAX_READ))
        except FileNotFoundError:
            return b""  # gone since it was listed
        except OSError as exc:
            self._failed(exc, path)
            return b""
        if followed.skipping:  # the rest of an over-long line: drop it up to its newline
            newline = data.find(b"\n")
            if newline < 0:
                followed.offset += len(data)
                return b""
            followed.skipping = False
            followed.offset += newline + 1
            data = data[newline + 1 :]
        end = data.rfind(b"\n") + 1  # complete lines only: the writer may be mid-line
        if end == 0 and len(data) >= MAX_READ:  # no newline in a whole read: never parseable, skip it
            self.report.lines += 1
            self.report.bad(
                f"{path} at byte {followed.offset}",
                f"line longer than {MAX_READ} bytes without a newline: skipped to its end",
            )
            followed.offset += len(data)
            followed.skipping = True
            return b""
        followed.offset += end
        return data[:end]
