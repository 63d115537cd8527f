"""The collector service: ``create_app(config) -> FastAPI``.

Routes: ``POST /v1/events`` (ingest), ``GET /v1/requests/{id}`` (one request's joined
timeline), ``GET /metrics`` (Prometheus text, or OpenMetrics with ``request_id`` exemplars when
the ``Accept`` header asks for it, as Prometheus does with exemplar storage on), ``GET /healthz``.

One process, one event loop: prometheus_client's multiprocess mode would drop exemplars. Blocking
file work runs on threads (one writer thread for the store, keeping batches in order); the
lifespan starts the housekeeping loop (grace/TTL sweeps, interval fsync, compaction, retention)
and the file tailer, and on shutdown (SIGTERM) stops them, waits for queued writes, fsyncs and
closes the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from hopline.collector.config import CollectorConfig
from hopline.collector.dedup import RecentKeys
from hopline.collector.ingest import JSON_TYPES, NDJSON_TYPES, IngestError, Ingestor, gunzip, media_type
from hopline.collector.join import Joiner
from hopline.collector.metrics import Recorder, build_metrics
from hopline.collector.otlp import install as install_otlp
from hopline.collector.store import EventStore, StoreError
from hopline.collector.tail import Tailer
from hopline.middleware.log import logger
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

SWEEP_INTERVAL_S = 0.25


@dataclass
class Collector:
    """Everything one collector holds; ``app.state.collector`` in the app."""

    config: CollectorConfig
    registry: CollectorRegistry
    recorder: Recorder
    store: EventStore
    joiner: Joiner
    ingestor: Ingestor


def build_collector(config: CollectorConfig) -> Collector:
    """The collector's parts, wired (no threads or tasks started: the app's lifespan does that)."""
    registry = CollectorRegistry()
    recorder = Recorder(build_metrics(registry), label_cap=config.label_cap)
    store = EventStore(config.data_dir, fsync=config.fsync, fsync_interval_s=config.fsync_interval_s)
    joiner = Joiner(
        recorder,
        grace_s=config.grace_s,
        ttl_s=config.ttl_s,
        max_open=config.max_open_requests,
        finished_cache=config.completed_cache,
        kv_bytes_per_token=config.kv_bytes_per_token,
    )
    recorder.m.open_requests.set_function(lambda: len(joiner.open))
    if config.otlp_export:  # each finished request as a trace (otlp_export.py)
        from hopline.collector.otlp_export import finished_request_exporter

        joiner.on_finish = finished_request_exporter(config.otlp_export)
    dedup = RecentKeys(config.dedup_capacity, config.dedup_window_s)
    return Collector(config, registry, recorder, store, joiner, Ingestor(store, joiner, recorder, dedup))


async def _housekeeping(c: Collector) -> None:
    """Grace and TTL sweeps; the interval fsync; compaction and retention on a thread."""
    loop = asyncio.get_running_loop()
    next_compaction = 0.0
    while True:
        await asyncio.sleep(SWEEP_INTERVAL_S)
        try:
            c.joiner.sweep()
            if c.config.fsync == "interval":
                await loop.run_in_executor(c.ingestor.writer, lambda: c.store.sync(force=False))
            if time.monotonic() >= next_compaction:
                next_compaction = time.monotonic() + c.config.compact_interval_s
                await loop.run_in_executor(None, _compact_and_expire, c)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - housekeeping must keep running
            logger.warning("housekeeping_failed", error=str(exc))


def _compact_and_expire(c: Collector) -> None:
    try:
        for path in c.store.compact(c.config.compact_delay_s):
            logger.info("hour_compacted", path=str(path))
        for path in c.store.expire(c.config.retention_s):
            logger.info("hour_expired", path=str(path))
    except (OSError, StoreError) as exc:
        logger.warning("compaction_failed", error=str(exc))


def _unauthorized(token: str | None, header: str | None) -> bool:
    if token is None:
        return False
    scheme, _, given = (header or "").partition(" ")
    return scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode())


def _error(status: int, message: str, **extra: object) -> JSONResponse:
    headers = (
        {"WWW-Authenticate": "Bearer"} if status == 401 else {"Retry-After": "1"} if status == 503 else None
    )
    return JSONResponse({"error": message, **extra}, status_code=status, headers=headers)


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise IngestError(413, f"body exceeds {limit} bytes")
    parts, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise IngestError(413, f"body exceeds {limit} bytes")
        parts.append(chunk)
    return b"".join(parts)


def create_app(config: CollectorConfig) -> FastAPI:
    """The collector as an ASGI app (run it with uvicorn, one worker)."""
    c = build_collector(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            c.store.open()
        except StoreError as exc:  # keep serving: ingest answers 503 with the reason until it works
            logger.error("store_unavailable", error=str(exc))
        tasks = [asyncio.create_task(_housekeeping(c), name="hopline-housekeeping")]
        if config.tail:
            tailer = Tailer(
                config.tail,
                config.data_dir / "tail-state.json",
                lambda data: c.ingestor.ingest(data, "ndjson"),
                interval_s=config.tail_interval_s,
            )
            tasks.append(asyncio.create_task(tailer.run(), name="hopline-tail"))
        logger.info(
            "collector_started", data_dir=str(config.data_dir), fsync=config.fsync, tail=list(config.tail)
        )
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.get_running_loop().run_in_executor(None, c.ingestor.close)
            c.joiner.finish_all()
            logger.info("collector_stopped", stored_bytes=c.store.appended_bytes)

    app = FastAPI(title="hopline collector", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.collector = c

    @app.post("/v1/events")
    async def post_events(request: Request) -> Response:
        headers = request.headers
        if _unauthorized(config.token, headers.get("authorization")):
            return _error(401, "missing or wrong bearer token")
        kind = media_type(headers.get("content-type"))
        if kind not in NDJSON_TYPES and kind not in JSON_TYPES:
            return _error(
                415, f"unsupported content type {kind!r}: send application/x-ndjson or application/json"
            )
        try:
            body = await _read_body(request, config.max_body_bytes)
            encoding = headers.get("content-encoding", "identity").strip().lower()
            if encoding == "gzip":
                body = gunzip(body, config.max_decompressed_bytes)
            elif encoding not in ("identity", ""):
                return _error(415, f"unsupported content encoding {encoding!r}: send gzip or identity")
            result = await c.ingestor.ingest(body, "json" if kind in JSON_TYPES else "ndjson")
        except IngestError as exc:
            extra = exc.result.answer() if exc.result is not None else {}
            return _error(exc.status, str(exc), **extra)
        except StoreError as exc:
            logger.error("store_failed", error=str(exc))
            return _error(503, f"events not stored: {exc}")
        return JSONResponse(result.answer())

    install_otlp(app, c)  # POST /v1/traces (otlp.py)

    @app.get("/v1/requests/{request_id}")
    async def get_request(request_id: str) -> Response:
        found = c.joiner.lookup(request_id)
        if found is None:
            return _error(404, f"request {request_id!r} is neither open nor recently finished")
        return JSONResponse(found)

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        encoder, content_type = choose_encoder(request.headers.get("accept"))
        return Response(encoder(c.registry), media_type=content_type)

    @app.get("/healthz")
    async def healthz() -> dict:
        return {"open_requests": len(c.joiner.open), **c.joiner.counts}

    return app
