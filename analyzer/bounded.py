"""Analysing a log of any size in bounded memory: timelines one bucket of requests at a time,
statistics on the per-request table.

``timelines()`` reduces every event it is given at once; its memory grows with the events it holds
(≈ 130 bytes an event: 5M requests, 59M events, 7.6 GiB). Here the events are split into
buckets by a hash of ``request_id`` — every event of a request lands in the same bucket — and
each bucket's timelines are built alone. The statistics (``pipeline.analysis``, the same code as
for a small log) read all of them when the log holds at most ``sample_requests`` requests, else a
seeded sample of requests (a fixed hash of ``request_id`` below a threshold: the same requests
on every run), with the totals that are cheap to get exactly (requests, span, outcomes,
negative stages, missing hops) added up over every request (``statistics``: only the sample's
requests get the statistics' columns). ``build_table`` builds the whole table (every request,
written bucket by bucket to a Parquet table in a work folder past the budget).

Input already bucketed by request — files under folders named ``bucket=K`` whose writer put
every event of a request in one such folder (``bench/gen_large.py --buckets``) — is read a
bucket at a time as it is; any other input is bucketed in one streaming pass into the work
folder. A bucket larger than ``bucket_events`` is split again the same way. ``TRACE_RULE``
(a stand-in event takes its trace's only owner's request ID) is applied per input bucket
before any split, so every request's events meet in one bucket: on unbucketed input that is
the whole log, as in memory; on bucketed input, the writer must keep a trace's events in the
bucket of its request.
"""

from __future__ import annotations

import math
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
from hopline.analyzer.findings.model import iso_utc
from hopline.analyzer.io import Scanned
from hopline.analyzer.timelines import resolve_by_trace, timelines
from hopline.middleware.contract import units

BUCKET_FOLDER = re.compile(r"^bucket=(\d+)$")
BUCKET_SEED = 5  # the bucket key's hash seed
SPLIT_SEED = 6  # for splitting a bucket that is too large again
SAMPLE_SEED = 17
# Measured peaks (ru_maxrss, polars 2.1): timelines() on a bucket, Polars' in-memory engine,
# ≈ 420-500 bytes an event (5.9M events: 2.45 GiB; the streaming engine buffers the group-by's
# rows: 4.2 GiB for the same CPU); pipeline.analysis on a collected timelines frame ≈ 2.2 KB a
# request. Each kept within half the budget.
EVENT_BYTES = 500
REQUEST_BYTES = 2_200
DEFAULT_MAX_MEMORY = 6 * 1024**3


def max_memory(text: str) -> int:
    """``--max-memory``: ``6GiB``, ``512MB`` (the contract's one reading: ``contract.units``) -> bytes."""
    size = units.parse_size(text)
    if size <= 0:
        raise ValueError(f"--max-memory must be more than 0, got {text!r}")
    return size


@dataclass(frozen=True)
class Budget:
    """How much a run may hold at once: events in one bucket, requests in the statistics' frame."""

    bucket_events: int
    sample_requests: int

    @classmethod
    def of(cls, max_bytes: int = DEFAULT_MAX_MEMORY) -> Budget:
        return cls(max(1, max_bytes // 2 // EVENT_BYTES), max(1, max_bytes // 2 // REQUEST_BYTES))


@dataclass
class Table:
    """The per-request timelines: collected (a log that fits one bucket) or a lazy scan of the
    Parquet table the buckets were written to (removed with ``close``)."""

    frame: pl.LazyFrame
    requests: int
    folder: Path | None = None

    def close(self) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


def bucket_of(path: Path) -> int | None:
    """The ``bucket=K`` folder a file lies in, if any."""
    found = [int(m.group(1)) for part in path.parts if (m := BUCKET_FOLDER.match(part))]
    return found[-1] if found else None


def input_buckets(scanned: list[Scanned]) -> list[list[Scanned]]:
    """The input's files grouped by request bucket: per ``bucket=K`` when every file lies in
    one, else all files together (one group, bucketed here)."""
    keys = [bucket_of(s.path) for s in scanned]
    if not scanned or None in keys:
        return [scanned] if scanned else []
    groups: dict[int, list[Scanned]] = {}
    for key, item in zip(keys, scanned):
        groups.setdefault(key, []).append(item)  # type: ignore[arg-type]
    return [groups[k] for k in sorted(groups)]


def split(events: pl.LazyFrame, folder: Path, buckets: int, seed: int) -> list[pl.LazyFrame]:
    """``events`` written as ``buckets`` Parquet partitions by a hash of ``request_id`` in one
    streaming pass; each partition's events, lazily."""
    key = (pl.col("request_id").hash(seed) % buckets).alias("bucket")
    events.sink_parquet(pl.PartitionBy(folder, key=key, include_key=False), mkdir=True)
    parts = sorted((d for d in folder.iterdir() if BUCKET_FOLDER.match(d.name)), key=lambda d: int(d.name[7:]))
    return [pl.scan_parquet(sorted(d.glob("*.parquet"))) for d in parts]


def has_trace_ids(group: list[Scanned]) -> bool:
    """Whether any event of ``group`` carries a ``trace_id`` (else ``TRACE_RULE`` has nothing to
    resolve, and its join, which doubles the reading and stops streaming, is skipped). Parquet
    files are asked directly (one column, null in logs without traces), not through the checks."""
    for item in group:
        try:
            if _any_trace_id(pl.scan_parquet(item.path) if item.path.suffix == ".parquet" else item.events):
                return True
        except (pl.exceptions.PolarsError, OSError):  # a bad file: io reported it, its frame is empty
            if _any_trace_id(item.events):
                return True
    return False


def _any_trace_id(events: pl.LazyFrame) -> bool:
    if "trace_id" not in events.collect_schema():
        return False
    return bool(events.select(pl.col("trace_id").is_not_null().any()).collect().item())


def resolved(group: list[Scanned]) -> pl.LazyFrame:
    """The group's events, trace stand-ins given their request's ID (``resolve_by_trace``)."""
    events = pl.concat([s.events for s in group], how="vertical")
    return resolve_by_trace(events) if has_trace_ids(group) else events


def bucket_events(groups: list[list[Scanned]], work: Path, limit: int) -> Iterator[pl.LazyFrame]:
    """Each bucket's events (trace stand-ins resolved), at most about ``limit`` events each:
    an input group that holds more is split by a hash of ``request_id`` (into ``work``, removed
    once its buckets were read)."""
    for number in range(len(groups)):
        yield from (events for events, _ in _group_buckets(groups, number, work, limit))
        shutil.rmtree(work / f"events-{number:05d}", ignore_errors=True)


def _group_buckets(groups: list[list[Scanned]], number: int, work: Path, limit: int) -> list[tuple[pl.LazyFrame, int]]:
    """Input group ``number``'s buckets (``bucket_events``), each with about how many events it
    holds (the files' lines or rows; a split's from its Parquet metadata)."""
    group = groups[number]
    events = resolved(group)
    rows = sum(s.rows for s in group)
    if rows <= limit:
        return [(events, rows)]
    folder = work / f"events-{number:05d}"
    parts = split(events, folder, math.ceil(rows / limit), SPLIT_SEED if len(groups) > 1 else BUCKET_SEED)
    return [(part, part.select(pl.len()).collect().item()) for part in parts]


def build_table(
    scanned: list[Scanned],
    scopes: tuple[str, ...],
    budget: Budget,
    work_dir: Path | None = None,
    columns: tuple[str, ...] | None = None,
) -> Table:
    """The per-request timelines of ``scanned``: in memory when the log is one bucket, else
    written bucket by bucket to a Parquet table in a new folder under ``work_dir`` (the system's
    temporary folder by default). ``columns``: only these of the timelines' columns (Polars then
    computes only the aggregations they need: the 7 stages and ``replica`` cost a third of the
    whole table's CPU); all of them by default."""

    def built(events: pl.LazyFrame) -> pl.DataFrame:
        return timelines(events, scopes=scopes, resolve=False, columns=columns).collect(engine="in-memory")

    groups = input_buckets(scanned)
    if len(groups) <= 1 and sum(s.rows for s in scanned) <= budget.bucket_events:
        frame = built(resolved(scanned))
        return Table(frame.lazy(), frame.height)
    folder = Path(tempfile.mkdtemp(prefix="hopline-analyze-", dir=work_dir))
    try:
        parts = folder / "timelines"
        parts.mkdir()
        held = _built_parts(groups, folder, parts, budget, built)
        if held is not None:  # the whole table fits the statistics' share: never written
            shutil.rmtree(folder, ignore_errors=True)
            frame = pl.concat(held, how="vertical")  # bucket_events yields at least one bucket here
            return Table(frame.lazy(), frame.height)
        frame = pl.scan_parquet(sorted(parts.glob("*.parquet")))
        return Table(frame, frame.select(pl.len()).collect().item(), folder)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def _built_parts(
    groups: list[list[Scanned]],
    folder: Path,
    parts: Path,
    budget: Budget,
    built: Callable[[pl.LazyFrame], pl.DataFrame],
) -> list[pl.DataFrame] | None:
    """Each bucket's timelines (``built``), held in memory while all of them together have at
    most ``budget.sample_requests`` requests (the statistics' half of the budget, which would
    read them whole anyway; a bucket's build keeps within the other half); past that, written to
    ``parts`` as Parquet, and None. At 1M requests writing the table and reading it back cost
    ~4.5 of ~60 CPU-s."""
    held: list[pl.DataFrame] | None = []
    rows = 0
    for number, events in enumerate(bucket_events(groups, folder, budget.bucket_events)):
        frame = built(events)
        rows += frame.height
        if held is not None and rows > budget.sample_requests:
            for earlier, part in enumerate(held):
                part.write_parquet(parts / f"part-{earlier:05d}.parquet")
            held = None
        if held is not None:
            held.append(frame)
        else:
            frame.write_parquet(parts / f"part-{number:05d}.parquet")
    return held


def sample(table: Table, requests: int) -> pl.LazyFrame:
    """At most about ``requests`` of the table's requests, the same on every run: all of them
    when the table is that small, else those whose seeded hash of ``request_id`` falls below
    the sampled fraction of the hash range."""
    return table.frame.filter(sampled(requests, table.requests))


def sampled(requests: int, of: int) -> pl.Expr:
    """Whether a request (a row of the timelines, or any of its events) is in the seeded sample of
    about ``requests`` of ``of`` (``sample``)."""
    if of <= requests:
        return pl.lit(True)
    return pl.col("request_id").hash(SAMPLE_SEED) < pl.lit(int(requests / of * 2**64), dtype=pl.UInt64)


@dataclass(frozen=True)
class Statistics:
    """What the statistics read (``pipeline.analyze_files``): their frame (every request's
    timelines, or the seeded sample's), how many requests the log holds, and the exact totals
    over all of them (``exact_totals``) when the frame is a sample, else None."""

    frame: pl.DataFrame
    requests: int
    totals: dict | None


# Past the statistics' share, the sample of the buckets left is built for a guess of the log's
# requests (the events left times the requests an event so far) made this much smaller, i.e. ~11%
# more requests than the sample needs, so the guess is rarely too high (buckets by a hash of
# request_id are alike); when it is, the buckets are built again for the sample counted exactly.
GUESS_LOW = 0.9


def statistics(
    scanned: list[Scanned],
    scopes: tuple[str, ...],
    budget: Budget,
    work_dir: Path | None = None,
    columns: tuple[str, ...] | None = None,
) -> Statistics:
    """``build_table``'s table, ``sample``d to ``budget.sample_requests``, with the exact totals of
    a sampled one: the same frame and figures, without building the whole table. Buckets are built
    whole (as ``build_table`` holds them) until the requests so far, or the log's guessed from its
    events and theirs, pass the sample's share; then each bucket left is built twice over its
    events, filtered by request: the sample's requests (a guess's superset, ``GUESS_LOW``) with
    ``columns``, the others with only what the totals read (``TOTALS_COLUMNS``; a 5M-request
    store's bucket of 500k requests: 2.3 + 2.3 CPU-s, against 5.3 for all of them with the
    statistics' 69 columns and 0.8 to write those), their figures added up bucket by bucket
    (``Tally``). No table is written (a split input's buckets are, all of them before the first
    is built)."""
    groups = input_buckets(scanned)
    if len(groups) <= 1 and sum(s.rows for s in scanned) <= budget.bucket_events:
        table = build_table(scanned, scopes, budget, work_dir, columns)  # in memory
        totals = exact_totals(table) if table.requests > budget.sample_requests else None
        return Statistics(sample(table, budget.sample_requests).collect(), table.requests, totals)
    kept = None if columns is None else tuple(dict.fromkeys(("request_id", *columns, *TOTALS_COLUMNS)))

    def built(events: pl.LazyFrame, columns: tuple[str, ...] | None = kept) -> pl.DataFrame:
        return timelines(events, scopes=scopes, resolve=False, columns=columns).collect(engine="in-memory")

    folder = Path(tempfile.mkdtemp(prefix="hopline-analyze-", dir=work_dir))
    try:
        buckets = [b for number in range(len(groups)) for b in _group_buckets(groups, number, folder, budget.bucket_events)]
        held: list[pl.DataFrame] = []
        requests = rows = 0
        rows_left = sum(events_rows for _, events_rows in buckets)
        for number, (events, events_rows) in enumerate(buckets):
            held.append(built(events))
            requests += held[-1].height
            rows += events_rows
            rows_left -= events_rows
            guess = requests + rows_left * requests / max(rows, 1)  # the log's requests, from its events
            if max(requests, guess * GUESS_LOW) > budget.sample_requests:
                frame, requests, totals = _sampled(held, buckets, number + 1, guess, budget, built)
                break
        else:
            frame, totals = pl.concat(held, how="vertical"), None  # bucket_events gives at least one bucket
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return Statistics(frame if columns is None else frame.select(columns), requests, totals)


def _sampled(
    held: list[pl.DataFrame],
    buckets: list[tuple[pl.LazyFrame, int]],
    built_whole: int,
    guess: float,
    budget: Budget,
    built: Callable[..., pl.DataFrame],
) -> tuple[pl.DataFrame, int, dict | None]:
    """The sample (``statistics``) of ``buckets`` for a log of about ``guess`` requests: the first
    ``built_whole`` of them ``held``, the others still events."""
    tally = Tally()
    for frame in held:
        tally.add(frame.lazy())
    requests = sum(frame.height for frame in held)
    rest = buckets[built_whole:]
    low = max(1, int(guess * GUESS_LOW))
    wide = sampled(budget.sample_requests, low)  # holds every request the sample will hold, unless low > requests
    parts = [frame.filter(wide) for frame in held]
    held.clear()
    for events, _ in rest:
        inside = built(events.filter(wide))
        outside = built(events.filter(~wide), TOTALS_COLUMNS)
        tally.add(inside.lazy())
        tally.add(outside.lazy())
        requests += inside.height + outside.height
        parts.append(inside)
    chosen = sampled(budget.sample_requests, requests)
    if requests < low:  # guessed too many: the superset misses some of the sample
        parts = [built(events.filter(chosen)) for events, _ in buckets]
    frame = pl.concat([part.filter(chosen) for part in parts], how="vertical")
    return frame, requests, tally.totals(requests) if requests > budget.sample_requests else None


TOTALS_COLUMNS = ("start", "outcome", "negative", "missing")  # what ``exact_totals`` reads


@dataclass
class Tally:
    """``exact_totals``' figures, added up over parts of the table (``add``), then ordered
    (``totals``)."""

    start: float | None = None
    end: float | None = None
    negative: int = 0
    missing: int = 0
    counts: dict[str, Counter] = field(default_factory=lambda: {c: Counter() for c in TOTALS_COLUMNS[1:]})

    @classmethod
    def of(cls, frame: pl.LazyFrame) -> Tally:
        tally = cls()
        tally.add(frame)
        return tally

    def add(self, frame: pl.LazyFrame) -> None:
        """The figures of ``frame`` (``TOTALS_COLUMNS`` of some requests), with Polars' streaming
        engine: a few columns of every request, read in morsels (the in-memory engine held those
        columns whole: about 2 GiB more at 50M requests)."""
        row = frame.select(
            pl.col("start").min().alias("start"),
            pl.col("start").max().alias("end"),
            pl.col("negative").list.len().gt(0).sum().alias("negative"),
            pl.col("missing").list.len().gt(0).sum().alias("missing"),
        ).collect(engine="streaming").row(0, named=True)
        if row["start"] is not None:
            self.start = row["start"] if self.start is None else min(self.start, row["start"])
            self.end = row["end"] if self.end is None else max(self.end, row["end"])
        self.negative += int(row["negative"])
        self.missing += int(row["missing"])
        for column, counter in self.counts.items():
            counter.update(_counts(frame, column, explode=column != "outcome"))

    def totals(self, requests: int) -> dict:
        """What the findings object counts over every request (``report.Facts``' fields by name)."""
        start, end = self.start, self.end
        span = (end - start) if start is not None and end is not None else 0.0
        by = {column: _most_first(counter) for column, counter in self.counts.items()}
        return {
            "requests": requests,
            "span": {"start": start and iso_utc(start), "end": end and iso_utc(end), "seconds": round(span, 3)},
            "outcomes": by["outcome"],
            "negative_stages": {"requests": self.negative, "by_stage": by["negative"]},
            "missing_hops": {"requests": self.missing, "by_hop": by["missing"]},
        }


def _counts(frame: pl.LazyFrame, column: str, explode: bool = False) -> dict[str | None, int]:
    """Values of ``column`` (of its lists' items with ``explode``) and how often."""
    values = pl.col(column).explode().drop_nulls() if explode else pl.col(column).cast(pl.String)
    counted = frame.select(values.alias("value")).group_by("value").len()
    return dict(counted.collect(engine="streaming").iter_rows())


def _most_first(counter: Counter) -> dict[str, int]:
    """``counter`` most first, then by value (a null value, none in practice, first among its equals:
    Polars' order), as ``str``."""
    ordered = sorted(counter.items(), key=lambda kv: (-kv[1], kv[0] is not None, kv[0] or ""))
    return {str(value): int(n) for value, n in ordered}


def exact_totals(table: Table) -> dict:
    """What the findings object counts over every request (``report.Facts``' fields by name),
    from the whole table (``Tally``)."""
    return Tally.of(table.frame).totals(table.requests)
