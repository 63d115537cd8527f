"""The ingest path: body -> validated events -> dedup -> durable store -> join -> answer.

``Ingestor.ingest(body, content_type)`` is what ``POST /v1/events`` and the file tailer call.
Every line is validated with ``contract.validate_event``; valid lines of a mixed batch are kept,
invalid ones are reported by line number. Duplicates (same ``eid``, or ``contract.dedup_key``)
are dropped and counted. The valid lines are written as they came (re-serialized only when
validation normalized the request ID) in one write per batch, on a single writer thread that
keeps batches in order and keeps the event loop free during write + fsync; only then are the
events joined and the batch acknowledged. When the store fails, nothing of the batch is
acknowledged and its keys are forgotten, so the sender's retry is accepted.
"""

from __future__ import annotations

import asyncio
import zlib
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import orjson
from hopline.collector.dedup import RecentKeys
from hopline.collector.emitter_stats import EmitterStats, split_reports
from hopline.collector.join import Joiner
from hopline.collector.metrics import Recorder
from hopline.collector.store import EventStore, StoreError
from hopline.middleware.contract import (
    ATTRIBUTE_TYPES,
    CORE_FIELDS,
    EventError,
    dedup_key,
    dumps,
    validate_event,
)

NDJSON_TYPES = frozenset(
    {"application/x-ndjson", "application/ndjson", "application/jsonl", "application/jsonlines"}
)
JSON_TYPES = frozenset({"application/json"})
_FIELDS = frozenset(CORE_FIELDS) | frozenset(ATTRIBUTE_TYPES)
MAX_REPORTED_ERRORS = 100  # rejected lines listed in one answer (all are counted)


@dataclass
class IngestResult:
    accepted: int = 0
    duplicates: int = 0
    rejected: list[dict[str, Any]] = field(default_factory=list)
    rejected_count: int = 0

    def answer(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "accepted": self.accepted,
            "duplicates": self.duplicates,
            "rejected": self.rejected,
        }
        if self.rejected_count > len(self.rejected):
            out["rejected_total"] = self.rejected_count
        return out


class IngestError(Exception):
    """The whole body is refused; ``status`` is the HTTP status, the message the reason."""

    def __init__(self, status: int, message: str, result: IngestResult | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.result = result


def reject_reason(message: str) -> str:
    """A bounded metric label for a validation error: ``invalid_<field>``, ``not_json``, ``not_object``."""
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


def media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def gunzip(body: bytes, limit: int) -> bytes:
    """Decompress a gzip body, refusing (413) more than ``limit`` bytes of output (gzip bombs)."""
    decomp = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = decomp.decompress(body, limit + 1)
    except zlib.error as exc:
        raise IngestError(400, f"body is not valid gzip: {exc}") from None
    if len(out) > limit or decomp.unconsumed_tail:
        raise IngestError(413, f"decompressed body exceeds {limit} bytes")
    if not decomp.eof:
        raise IngestError(400, "gzip body is truncated")
    return out


class Ingestor:
    def __init__(
        self,
        store: EventStore,
        joiner: Joiner,
        recorder: Recorder,
        dedup: RecentKeys,
        emitter_stats: EmitterStats | None = None,
    ) -> None:
        self.store = store
        self.joiner = joiner
        self.recorder = recorder
        self.dedup = dedup
        self.emitter_stats = emitter_stats  # None: emitter.stats reports are stored, not exposed
        self.writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hopline-store")

    def parse(self, body: bytes, kind: str) -> tuple[list[dict[str, Any]], list[bytes], list, IngestResult]:
        """Validate and dedup a body: (events, their NDJSON lines, their dedup keys, result so far)."""
        result = IngestResult()
        ndjson = kind != "json"
        if not ndjson:
            try:
                items = orjson.loads(body)
            except orjson.JSONDecodeError as exc:
                raise IngestError(400, f"body is not JSON: {exc}") from None
            if not isinstance(items, list):
                raise IngestError(
                    400, f"application/json body must be an array of events, got {type(items).__name__}"
                )
        else:
            items = body.splitlines()
        events: list[dict[str, Any]] = []
        lines: list[bytes] = []
        keys: list = []
        rejected = result.rejected
        self.dedup.rotate_if_due()
        remember = self.dedup.add
        loads = orjson.loads
        for number, item in enumerate(items, start=1):
            try:
                if ndjson:
                    try:
                        obj = loads(item)
                    except orjson.JSONDecodeError as exc:
                        if not item.strip():
                            continue  # blank lines are skipped (and counted in line numbers)
                        raise EventError(f"not JSON: {exc}") from None
                else:
                    obj = item
                event = validate_event(obj)
            except EventError as exc:
                message = str(exc)
                result.rejected_count += 1
                self.recorder.rejected(reject_reason(message))
                if len(rejected) < MAX_REPORTED_ERRORS:
                    rejected.append({"line": number, "error": message})
                continue
            key = dedup_key(event)
            if not remember(key):
                result.duplicates += 1
                continue
            keys.append(key)
            events.append(event)
            # stored as it came unless validation changed the request ID (or it came as JSON)
            lines.append(item if ndjson and event.get("request_id") == obj.get("request_id") else dumps(event)[:-1])
        return events, lines, keys, result

    async def ingest(self, body: bytes, kind: str = "ndjson") -> IngestResult:
        """Validate, store durably, join. Raises IngestError (400 nothing valid) or StoreError (503)."""
        events, lines, keys, result = self.parse(body, kind)
        if result.duplicates:
            self.recorder.duplicates(result.duplicates)
        if not events:
            if result.duplicates:
                return result
            if result.rejected_count:
                raise IngestError(400, "no valid event in the batch", result)
            raise IngestError(400, "empty batch: no events", result)
        data = b"\n".join(lines) + b"\n"
        try:
            await asyncio.get_running_loop().run_in_executor(self.writer, self.store.append, data)
        except StoreError:
            self.dedup.forget(keys)
            raise
        self.recorder.events(Counter(map(itemgetter("hop"), events)))
        hop_events, reports = split_reports(events)  # emitters' health reports are no requests
        if reports and self.emitter_stats is not None:
            self.emitter_stats.observe(reports)
        self.joiner.add(hop_events)
        result.accepted = len(events)
        return result

    def close(self) -> None:
        """Wait for queued writes, then close the store (SIGTERM path)."""
        self.writer.shutdown(wait=True)
        self.store.sync()
        self.store.close()
