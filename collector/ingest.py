"""The ingest path: body -> validated events -> dedup -> durable store -> join -> answer.

``Ingestor.ingest(body, kind, encoding)`` is what ``POST /v1/events`` and the file tailer call.
Decompression, parsing and validation run on a parse thread, never on the event loop, so no
body can stall ``/healthz`` or other requests; a body is bounded in decompressed bytes and in
lines (413 above either). Every line is validated with ``contract.validate_event``, and its
``ts`` may be at most ``max_future`` (``--max-future``) ahead of the collector's own clock: a
sender's clock gone wrong must not date events a year ahead (the contract takes any ``ts``
before 2100; one such event moves a live detector's event time). Valid lines of a mixed batch
are kept, invalid ones are reported by line number with the reason. What is
stored is the validated event re-serialized (``contract.dumps``), never the raw line, so a line
with a duplicated key cannot validate one value and store another.

Deduplication and the durable write happen together on the single writer thread, which keeps
batches in order: a batch's events whose key (``eid``, or ``contract.dedup_key``) was stored
before, or repeats within the batch, are dropped and counted; the rest is written (and fsynced,
per the policy) in one write, and only then are their keys remembered. So a key is remembered
only once its event is durably stored: a batch that fails anywhere (store error, a bug) leaves
no key behind, and the sender's retry is accepted. Then the events are joined and the batch
acknowledged.
"""

from __future__ import annotations

import asyncio
import hmac
import time
import zlib
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import orjson
from hopline.middleware.contract.errors import HoplineError
from hopline.collector.config import CollectorConfig
from hopline.collector.dedup import RecentKeys
from hopline.collector.emitter_stats import EmitterStats, split_reports
from hopline.collector.join import Joiner
from hopline.collector.metrics import Recorder
from hopline.collector.store import EventStore, StoreError
from hopline.middleware.contract import (
    EMITTER_STATS_HOP,
    ATTRIBUTE_TYPES,
    CORE_FIELDS,
    MAX_EVENT_BYTES,
    EventError,
    dedup_key,
    validate_event,
)
from hopline.middleware.contract.events import NDJSON_OPTIONS

if TYPE_CHECKING:
    from starlette.requests import Request

NDJSON_TYPES = frozenset(
    {"application/x-ndjson", "application/ndjson", "application/jsonl", "application/jsonlines"}
)
JSON_TYPES = frozenset({"application/json"})
_FIELDS = frozenset(CORE_FIELDS) | frozenset(ATTRIBUTE_TYPES)
MAX_REPORTED_ERRORS = 100  # rejected lines listed in one answer (all are counted)
DEFAULT_MAX_DECOMPRESSED = 64 * 1024 * 1024  # the tailer's chunks are never compressed; a caller's default
JOIN_SLICE = 500  # events joined between two yields to the event loop (~1.5 ms)


@dataclass
class IngestResult:
    accepted: int = 0
    duplicates: int = 0
    rejected: list[dict[str, Any]] = field(default_factory=list)
    rejected_count: int = 0
    reasons: Counter = field(default_factory=Counter)  # metric label -> rejected lines

    def answer(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "accepted": self.accepted,
            "duplicates": self.duplicates,
            "rejected": self.rejected,
        }
        if self.rejected_count > len(self.rejected):
            out["rejected_total"] = self.rejected_count
        return out


class IngestError(HoplineError):
    """The whole body is refused; ``status`` is the HTTP status, the message the reason, ``reason``
    its bounded metric label (hopline_collector_bodies_rejected_total)."""

    def __init__(
        self, status: int, message: str, result: IngestResult | None = None, *, reason: str = "other"
    ) -> None:
        super().__init__(message)
        self.status = status
        self.result = result
        self.reason = reason


def reject_reason(exc: EventError) -> str:
    """A bounded metric label for a validation error: ``invalid_<field>``, ``not_json``, ``too_deep``..."""
    if exc.reason is not None:
        return exc.reason
    message = str(exc)
    if message.startswith("not JSON"):
        return "not_json"
    if message.startswith("event must be"):
        return "not_object"
    if message.startswith("unsupported contract version"):
        return "invalid_v"
    if message.startswith("unknown hop"):
        return "invalid_hop"
    name = message.split(" ", 1)[0]
    return f"invalid_{name}" if name in _FIELDS else "invalid"


def future_error(ts: float, now: float, ahead_s: float) -> str:
    """Why an event dated ahead of the collector's clock is refused (one line, both times shown)."""
    return (
        f"ts {ts!r} ({iso_seconds(ts)}) is {ts - now:,.0f} s ahead of the collector's clock "
        f"({iso_seconds(now)}), more than --max-future ({ahead_s:g} s): the sender's clock is wrong"
    )


def iso_seconds(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


GUNZIP_STEP = 1024 * 1024  # decompressed bytes per zlib call (the thread yields the GIL between)


def gunzip(body: bytes, limit: int, max_lines: int | None = None) -> bytes:
    """Decompress a gzip body of one or more members (RFC 1952 allows several, and ``cat a.gz
    b.gz`` makes them), refusing (413) more than ``limit`` bytes of output (gzip bombs) or more
    than ``max_lines`` lines, as soon as the output shows it."""
    parts: list[bytes] = []
    size = lines = 0
    data = body
    while True:
        decomp = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            while True:
                out = decomp.decompress(data, GUNZIP_STEP)
                size += len(out)
                if size > limit:
                    raise IngestError(413, f"decompressed body exceeds {limit} bytes", reason="too_large")
                if max_lines is not None:
                    lines += out.count(b"\n")
                    if lines > max_lines:
                        raise IngestError(413, f"body has more than {max_lines} lines", reason="too_many_lines")
                parts.append(out)
                data = decomp.unconsumed_tail
                if decomp.eof or not (data or out):
                    break
        except zlib.error as exc:
            raise IngestError(400, f"body is not valid gzip: {exc}", reason="bad_gzip") from None
        if not decomp.eof:
            raise IngestError(400, "gzip body is truncated", reason="bad_gzip")
        data = decomp.unused_data
        if not data:
            return b"".join(parts)
        if not data.startswith(b"\x1f\x8b"):
            raise IngestError(400, f"body has {len(data)} bytes after its last gzip member", reason="bad_gzip")


@dataclass
class Parsed:
    """A body's valid events, their NDJSON lines and dedup keys, and what was rejected.

    The lines are back to back in one buffer (``data``; ``sizes`` splits it): each
    ``orjson.dumps`` result is copied in and freed at once, so its allocation is reused by the
    next line. Kept as 1,000 separate ``bytes`` instead, each result stays in its own
    page-sized allocation (orjson's initial buffer, shrunk in place): ~1 page fault and ~3 µs a
    line here, as much as validating it (bench/README.md, "collector ingest, session 4").
    """

    events: list[dict[str, Any]]
    data: bytearray
    keys: list
    sizes: list[int]  # bytes of each line
    result: IngestResult

    def lines(self) -> list[memoryview]:
        """Each event's NDJSON line (views into ``data``)."""
        view = memoryview(self.data)
        out, start = [], 0
        for size in self.sizes:
            out.append(view[start : start + size])
            start += size
        return out


class Ingestor:
    def __init__(
        self,
        store: EventStore,
        joiner: Joiner,
        recorder: Recorder,
        dedup: RecentKeys,
        emitter_stats: EmitterStats | None,
        *,
        max_future: float | None,
    ) -> None:
        self.store = store
        # seconds ahead of this clock an event's ts may be (--max-future); None: any the contract takes
        self.max_future = max_future
        self.joiner = joiner
        self.recorder = recorder
        self.dedup = dedup
        self.emitter_stats = emitter_stats  # None: emitter.stats reports are stored, not exposed
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hopline-store")
        # one parse thread: concurrent bodies queue (compressed) instead of multiplying memory
        self.parser = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hopline-parse")

    @classmethod
    def from_config(
        cls,
        config: CollectorConfig,
        store: EventStore,
        joiner: Joiner,
        recorder: Recorder,
        dedup: RecentKeys,
        emitter_stats: EmitterStats | None,
    ) -> Ingestor:
        return cls(store, joiner, recorder, dedup, emitter_stats, max_future=config.max_future)

    def decode(
        self,
        body: bytes,
        kind: str,
        encoding: str = "identity",
        max_decompressed: int | None = None,
        max_lines: int | None = None,
    ) -> Parsed:
        """Decompress (gzip), bound and parse a body (blocking: run on the parse thread)."""
        if encoding == "gzip":
            limit = max_decompressed if max_decompressed is not None else DEFAULT_MAX_DECOMPRESSED
            body = gunzip(body, limit, None if kind == "json" else max_lines)
        elif encoding not in ("identity", ""):
            raise IngestError(
                415, f"unsupported content encoding {encoding!r}: send gzip or identity", reason="unsupported_encoding"
            )
        if max_lines is not None and kind != "json" and body.count(b"\n") > max_lines:
            raise IngestError(413, f"body has more than {max_lines} lines", reason="too_many_lines")
        return self.parse(body, kind, max_lines)

    def parse(self, body: bytes, kind: str, max_lines: int | None = None) -> Parsed:
        """Validate a body and serialize its valid events (no dedup: that happens with the write)."""
        result = IngestResult()
        ndjson = kind != "json"
        if not ndjson:
            try:
                items = orjson.loads(body)
            except orjson.JSONDecodeError as exc:
                raise IngestError(400, f"body is not JSON: {exc}", reason="not_json") from None
            if not isinstance(items, list):
                raise IngestError(
                    400, f"application/json body must be an array of events, got {type(items).__name__}",
                    reason="not_json",
                )
            if max_lines is not None and len(items) > max_lines:
                raise IngestError(413, f"body has more than {max_lines} events", reason="too_many_lines")
        elif b"\r" in body:
            items = body.splitlines()
        else:  # the usual body: the same lines as splitlines (which tests each byte for \r too), by memchr
            items = body.split(b"\n")
            if items[-1] == b"":  # splitlines has no empty line after the last newline
                items.pop()
        events: list[dict[str, Any]] = []
        data = bytearray()
        keys: list = []
        sizes: list[int] = []
        rejected = result.rejected
        ahead_s = self.max_future
        now = time.time()
        latest = now + ahead_s if ahead_s is not None else float("inf")
        # locals: one lookup per batch instead of one per line on the hot path; orjson.dumps with
        # the contract's options is ``contract.dumps`` without its Python call
        loads, validate, serialize, options = orjson.loads, validate_event, orjson.dumps, NDJSON_OPTIONS
        max_bytes = MAX_EVENT_BYTES
        add_event, add_size, add_key = events.append, sizes.append, keys.append
        for number, item in enumerate(items, start=1):
            try:
                if ndjson:
                    if len(item) > max_bytes:
                        raise EventError(f"line exceeds {MAX_EVENT_BYTES} bytes", reason="too_large")
                    try:
                        obj = loads(item)
                    except orjson.JSONDecodeError as exc:
                        if not item.strip():
                            continue  # blank lines are skipped (and counted in line numbers)
                        raise EventError(f"not JSON: {exc}") from None
                else:
                    obj = item
                event = validate(obj, owned=True)  # just decoded: normalized in place, not copied
                if event["ts"] > latest:
                    raise EventError(future_error(event["ts"], now, ahead_s), reason="ts_in_future")
                try:
                    line = serialize(event, option=options)
                except orjson.JSONEncodeError as exc:  # validation bounds nesting; this is a backstop
                    raise EventError(f"event cannot be stored as JSON: {exc}", reason="unserializable") from None
                size = len(line)
                if size > max_bytes + 1:
                    raise EventError(f"event exceeds {MAX_EVENT_BYTES} bytes as NDJSON", reason="too_large")
            except EventError as exc:
                result.rejected_count += 1
                result.reasons[reject_reason(exc)] += 1
                if len(rejected) < MAX_REPORTED_ERRORS:
                    rejected.append({"line": number, "error": str(exc)})
                continue
            add_event(event)
            data += line
            add_size(size)
            # the dedup key: ``contract.dedup_key``, or the ``eid`` string itself instead of a tuple
            # holding it: ~100 bytes a key in the dedup set instead of ~155 (a string never equals a
            # tuple key)
            eid = event.get("eid")
            add_key(eid if type(eid) is str else dedup_key(event))
        return Parsed(events, data, keys, sizes, result)

    def store_new(self, parsed: Parsed) -> tuple[list[dict[str, Any]], list[int]]:
        """Drop duplicates, write the rest durably, then remember their keys (the writer thread).

        Returns the events stored and their line sizes; raises StoreError with nothing remembered.
        """
        dedup = self.dedup
        dedup.rotate_if_due()
        fresh = set(parsed.keys)
        if len(fresh) == len(parsed.keys) and dedup.none_of(fresh):  # the usual batch: all new
            events, data, sizes = parsed.events, parsed.data, parsed.sizes
        else:
            fresh = set()
            events, lines, sizes = [], [], []
            for event, line, key, size in zip(parsed.events, parsed.lines(), parsed.keys, parsed.sizes):
                if key in fresh or key in dedup:
                    continue
                fresh.add(key)
                events.append(event)
                lines.append(line)
                sizes.append(size)
            data = b"".join(lines)
        if data:
            self.store.append(data)
            dedup.update(fresh)
        return events, sizes

    async def ingest(
        self,
        body: bytes,
        kind: str = "ndjson",
        encoding: str = "identity",
        *,
        max_decompressed: int | None = None,
        max_lines: int | None = None,
    ) -> IngestResult:
        """Decode, validate, store durably, join. Raises IngestError (4xx) or StoreError (503)."""
        loop = asyncio.get_running_loop()
        parsed = await loop.run_in_executor(
            self.parser, self.decode, body, kind, encoding, max_decompressed, max_lines
        )
        result = parsed.result
        for reason, count in parsed.result.reasons.items():
            self.recorder.rejected(reason, count)
        if not parsed.events:
            if result.rejected_count:
                raise IngestError(400, "no valid event in the batch", result, reason="no_valid_event")
            raise IngestError(400, "empty batch: no events", result, reason="empty")
        try:
            events, sizes = await loop.run_in_executor(self.writer, self.store_new, parsed)
        except StoreError:
            self.recorder.store_failed()
            raise
        result.duplicates = len(parsed.events) - len(events)
        if result.duplicates:
            self.recorder.duplicates(result.duplicates)
        if events:
            per_hop = Counter(map(itemgetter("hop"), events))
            self.recorder.events(per_hop)
            # emitters' health reports are no requests (a batch without any is joined as it is)
            joined, reports = split_reports(events) if EMITTER_STATS_HOP in per_hop else (events, [])
            if reports:
                if self.emitter_stats is not None:
                    self.emitter_stats.observe(reports)
                sizes = [size for event, size in zip(events, sizes) if event["hop"] != EMITTER_STATS_HOP]
            # the join runs on the loop (it owns the open requests): in slices, letting other
            # requests in between (events may join in any order)
            for start in range(0, len(joined), JOIN_SLICE):
                if start:
                    await asyncio.sleep(0)
                self.joiner.add(joined[start : start + JOIN_SLICE], sizes[start : start + JOIN_SLICE])
        result.accepted = len(events)
        return result

    def close(self) -> None:
        """Wait for queued parses and writes, then close the store (SIGTERM path)."""
        self.parser.shutdown(wait=True)
        self.writer.shutdown(wait=True)
        self.store.sync()
        self.store.close()


def unauthorized(tokens: tuple[str, ...], header: str | None) -> bool:
    """True unless ``header`` is ``Bearer <one of tokens>`` (no tokens: nothing is required)."""
    if not tokens:
        return False
    scheme, _, given = (header or "").partition(" ")
    given_bytes = given.strip().encode()
    matches = [hmac.compare_digest(given_bytes, token.encode()) for token in tokens]  # no early exit
    return scheme.lower() != "bearer" or not any(matches)


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, 413 (``IngestError``) as soon as it passes ``limit`` bytes, declared or sent."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise IngestError(413, f"body exceeds {limit} bytes", reason="too_large")
    parts, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise IngestError(413, f"body exceeds {limit} bytes", reason="too_large")
        parts.append(chunk)
    return b"".join(parts)
