"""Where the live detector's events come from: a recorded log (replay) or a growing one (tail).

``replay`` reads event files as ``hopline analyze`` does (``io.scan_events``: NDJSON, Parquet,
the collector's store) and yields them in event-time order, one batch per detector step, as fast
as the detector takes them.

``Tail`` follows NDJSON files as they grow: the collector's store (``DIR/events/date=…/hour=…/
events.ndjson``, the open hour, written before the collector acknowledges an event) or a file
sink's output. Each ``poll`` returns the complete lines appended since the last one, through the
same contract validation as ``hopline analyze`` (``io.parse_ndjson``). A file that shrinks or is
replaced (a new inode) is read again from its start; one that disappears (the collector
compacted its hour into Parquet, after it was read) is forgotten. With ``sample`` < 1 the lines
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

MAX_READ = 64 << 20  # bytes read from one file per poll (a big backlog is read over several polls)
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
    inode: int
    offset: int = 0


@dataclass
class Tail:
    """Follows the NDJSON files under ``paths`` (files or folders, searched recursively)."""

    paths: list[Path]
    report: ScanReport = field(default_factory=ScanReport)
    files: dict[Path, _Followed] = field(default_factory=dict)
    sample: float = 1.0  # read only the lines of this fraction of the requests (``sampled_lines``)
    not_sampled: int = 0  # lines left unread for it

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

    def poll(self) -> pl.DataFrame:
        """The events appended since the last poll (``io.SCHEMA`` columns)."""
        frames = []
        present = self._candidates()
        for gone in set(self.files) - set(present):
            del self.files[gone]
        for path in present:
            data = self._new_lines(path)
            if data and self.sample < 1:
                data, errors = translate_lines(data)
                for error in errors:
                    self.report.bad(str(path), error)
                data, left = sampled_lines(data, self.sample)
                self.not_sampled += left
            if data:
                frames.append(io.parse_ndjson(data, str(path), self.report))
        if not frames:
            return pl.DataFrame(schema=SCHEMA)
        return pl.concat(frames, how="vertical").sort("ts")

    def _new_lines(self, path: Path) -> bytes:
        try:
            with open(path, "rb") as f:
                st = os.fstat(f.fileno())
                followed = self.files.get(path)
                if followed is None or followed.inode != st.st_ino or st.st_size < followed.offset:
                    followed = self.files[path] = _Followed(st.st_ino)
                f.seek(followed.offset)
                data = f.read(min(st.st_size - followed.offset, MAX_READ))
        except OSError:
            return b""
        end = data.rfind(b"\n") + 1  # complete lines only: the writer may be mid-line
        followed.offset += end
        return data[:end]
