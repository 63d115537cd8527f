"""The collector service: ``create_app(config) -> FastAPI``.

Routes: ``POST /v1/events`` (ingest), ``GET /v1/requests/{id}`` (one request's joined
timeline), ``GET /v1/requests?since=…&until=…&slowest=N`` (recently finished requests in
brief: ID, TTFT, e2e, outcome, scope; ``recent.py``), ``GET /metrics`` (Prometheus text, or
OpenMetrics with ``request_id`` exemplars when the ``Accept`` header asks for it, as Prometheus
does with exemplar storage on), ``GET /healthz`` (200, or 503 with the reason while events
cannot be stored: ``store.EventStore.failure``).

Auth: ``POST /v1/events`` needs ``token`` when set; the read endpoints (``/metrics``,
``/v1/requests…``) need ``read_token`` or ``token`` (unless ``open_reads``), since a timeline
names a request's service, model, replica and timings; ``/healthz`` is always open.

One process, one event loop, which nothing may block: prometheus_client's multiprocess mode
would drop exemplars. Decompressing and parsing a body runs on a parse thread, the store's
writes on one writer thread (keeping batches in order), the /metrics exposition on a scrape
thread; no handler raises past ``NeverRaise`` (a 500 it answers keeps the connection usable),
and a client that goes away mid-body is one log line. The lifespan starts the housekeeping loop (grace/TTL sweeps, interval fsync, compaction, retention)
and the file tailer, and on shutdown (SIGTERM) stops them, waits for queued writes, fsyncs and
closes the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import sys
import time
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from hopline.collector.config import CollectorConfig
from hopline.collector.dedup import RecentKeys
from hopline.collector.emitter_stats import EmitterStats
from hopline.collector.ingest import (
    JSON_TYPES,
    NDJSON_TYPES,
    IngestError,
    Ingestor,
    media_type,
    read_body,
    unauthorized,
)
from hopline.collector.join import Joiner
from hopline.collector.metrics import ExpositionRegistry, Recorder, build_metrics
from hopline.collector.otlp import install as install_otlp
from hopline.collector.recent import MAX_LIMIT, QueryError, select
from hopline.collector.store import EventStore, StoreError
from hopline.collector.tail import Tailer
from hopline.middleware.log import logger
from hopline.middleware.contract.times import to_epoch
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

SWEEP_INTERVAL_S = 0.25
# The parse thread is CPU-bound Python; the event loop needs the GIL back for every callback of a
# request, and CPython hands it over only every switch interval (5 ms by default), so one /healthz
# could wait hundreds of handovers behind a large body. 0.5 ms keeps it answering promptly.
SWITCH_INTERVAL_S = 0.0005
STORE_PROBE_INTERVAL_S = 1.0  # how soon /healthz sees the store fail (or work again) with no events
LAG_WINDOW_S = 10.0  # the event-loop lag gauge shows the largest delay of the last two windows


@dataclass
class Collector:
    """Everything one collector holds; ``app.state.collector`` in the app."""

    config: CollectorConfig
    registry: CollectorRegistry
    recorder: Recorder
    store: EventStore
    joiner: Joiner
    ingestor: Ingestor
    scraper: ThreadPoolExecutor


def build_collector(config: CollectorConfig) -> Collector:
    """The collector's parts, wired (no threads or tasks started: the app's lifespan does that)."""
    registry = ExpositionRegistry()
    recorder = Recorder(build_metrics(registry), label_cap=config.label_cap, scope_cap=config.scope_cap)
    store = EventStore(config.data_dir, fsync=config.fsync, fsync_interval_s=config.fsync_interval_s)
    joiner = Joiner(
        recorder,
        grace_s=config.grace_s,
        ttl_s=config.ttl_s,
        max_open=config.max_open_requests,
        finished_cache=config.completed_cache,
        kv_bytes_per_token=config.kv_bytes_per_token,
        max_open_bytes=config.max_open_bytes,
        max_finished_bytes=config.max_finished_bytes,
        max_events=config.max_events_per_request,
        recent=config.recent_requests,
    )
    if config.otlp_export:  # each finished request as a trace (otlp_export.py)
        from hopline.collector.otlp_export import finished_request_exporter

        joiner.on_finish = finished_request_exporter(config.otlp_export)
    dedup = RecentKeys(config.dedup_capacity, config.dedup_window_s)
    m = recorder.m
    m.open_requests.set_function(lambda: len(joiner.open))
    m.open_request_bytes.set_function(lambda: joiner.open_bytes)
    m.finished_request_bytes.set_function(lambda: joiner.finished_bytes)
    m.dedup_keys.set_function(lambda: len(dedup))
    scraper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hopline-scrape")
    ingestor = Ingestor(store, joiner, recorder, dedup, EmitterStats(registry))
    return Collector(config, registry, recorder, store, joiner, ingestor, scraper)


async def _housekeeping(c: Collector) -> None:
    """Grace and TTL sweeps; the store probe and the interval fsync on the writer thread; compaction
    and retention on a thread."""
    loop = asyncio.get_running_loop()
    next_compaction = 0.0
    lag = LoopLag(c.recorder.m.event_loop_lag.set)
    next_probe = 0.0
    while True:
        before = time.monotonic()
        await asyncio.sleep(SWEEP_INTERVAL_S)
        lag.observe(time.monotonic() - before - SWEEP_INTERVAL_S)
        try:
            c.joiner.sweep()
            if time.monotonic() >= next_probe:  # /healthz follows the store without waiting for events
                next_probe = time.monotonic() + STORE_PROBE_INTERVAL_S
                await loop.run_in_executor(c.ingestor.writer, c.store.probe)
            if c.config.fsync == "interval":
                await loop.run_in_executor(c.ingestor.writer, lambda: c.store.sync(force=False))
            if time.monotonic() >= next_compaction:
                next_compaction = time.monotonic() + c.config.compact_interval_s
                await loop.run_in_executor(None, _compact_and_expire, c)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - housekeeping must keep running
            logger.warning("housekeeping_failed", error=str(exc))


class LoopLag:
    """The event loop's delay (how late a timer fired), published as the largest of the current
    and the previous ``LAG_WINDOW_S`` window, so a stall shows whenever Prometheus scrapes."""

    def __init__(self, publish) -> None:
        self.publish = publish
        self.previous = self.current = 0.0
        self.window_start = time.monotonic()

    def observe(self, lag: float) -> None:
        self.current = max(self.current, lag, 0.0)
        if time.monotonic() - self.window_start >= LAG_WINDOW_S:
            self.previous, self.current = self.current, 0.0
            self.window_start = time.monotonic()
        self.publish(max(self.previous, self.current))


def _compact_and_expire(c: Collector) -> None:
    """Compaction, then retention: each goes on whatever the other met."""
    m = c.recorder.m

    def quarantined(path, reason: str) -> None:
        m.quarantined_parts.inc()
        logger.error("part_quarantined", path=str(path), reason=reason)

    try:
        for path in c.store.compact(c.config.compact_delay_s, on_quarantine=quarantined):
            logger.info("hour_compacted", path=str(path))
    except (OSError, StoreError) as exc:
        m.compaction_failures.inc()
        logger.warning("compaction_failed", error=str(exc))
    try:
        for path in c.store.expire(c.config.retention_s):
            logger.info("hour_expired", path=str(path))
    except OSError as exc:
        m.compaction_failures.inc()
        logger.warning("retention_failed", error=str(exc))


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """orjson: non-finite floats become null instead of failing the answer (never a 500 on read)."""
    return Response(orjson.dumps(body), status_code=status, headers=headers, media_type="application/json")


def _error(status: int, message: str, **extra: object) -> Response:
    headers = (
        {"WWW-Authenticate": "Bearer"} if status == 401 else {"Retry-After": "1"} if status == 503 else None
    )
    return _json({"error": message, **extra}, status, headers)


class NeverRaise:
    """Pure ASGI: an exception in a handler is one log line and a JSON 500, never a traceback or a
    closed keep-alive connection (uvicorn closes the connection of an app that raised after
    Starlette's error middleware answered)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:  # noqa: BLE001 - the collector answers, whatever happened
            logger.error("request_failed", path=scope.get("path"), error=f"{type(exc).__name__}: {exc}"[:300])
            if not started:
                body = orjson.dumps({"error": f"internal error: {type(exc).__name__}"})
                await send(
                    {
                        "type": "http.response.start",
                        "status": 500,
                        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
                    }
                )
                await send({"type": "http.response.body", "body": body})


def create_app(config: CollectorConfig) -> FastAPI:
    """The collector as an ASGI app (run it with uvicorn, one worker)."""
    c = build_collector(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        switch_interval = sys.getswitchinterval()
        sys.setswitchinterval(min(switch_interval, SWITCH_INTERVAL_S))
        # what exists now (modules, classes, the app) lives as long as the process: keep it out of
        # every full garbage collection, which holds the GIL, and so the event loop, while it scans
        gc.freeze()
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
            c.scraper.shutdown(wait=False)
            sys.setswitchinterval(switch_interval)
            c.joiner.finish_all()
            logger.info("collector_stopped", stored_bytes=c.store.appended_bytes)

    app = FastAPI(title="hopline collector", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.add_middleware(NeverRaise)
    app.state.collector = c
    write_tokens = (config.token,) if config.token is not None else ()
    read_tokens = config.reads_token
    rejected = c.recorder.body_rejected

    @app.post("/v1/events")
    async def post_events(request: Request) -> Response:
        headers = request.headers
        if unauthorized(write_tokens, headers.get("authorization")):
            rejected("unauthorized")
            return _error(401, "missing or wrong bearer token")
        kind = media_type(headers.get("content-type"))
        if kind not in NDJSON_TYPES and kind not in JSON_TYPES:
            rejected("unsupported_type")
            return _error(
                415, f"unsupported content type {kind!r}: send application/x-ndjson or application/json"
            )
        try:
            body = await read_body(request, config.max_body_bytes)
            result = await c.ingestor.ingest(
                body,
                "json" if kind in JSON_TYPES else "ndjson",
                headers.get("content-encoding", "identity").strip().lower(),
                max_decompressed=config.max_decompressed_bytes,
                max_lines=config.max_lines_per_body,
            )
        except ClientDisconnect:
            rejected("disconnected")
            logger.info("client_disconnected", client=_peer(request), during="body")
            return _error(400, "client disconnected before the body was complete")
        except IngestError as exc:
            rejected(exc.reason)
            extra = exc.result.answer() if exc.result is not None else {}
            return _error(exc.status, str(exc), **extra)
        except StoreError as exc:
            logger.error("store_failed", error=str(exc))
            return _error(503, f"events not stored: {exc}")
        return _json(result.answer())

    install_otlp(app, c)  # POST /v1/traces (otlp.py)

    @app.get("/v1/requests")
    async def list_requests(request: Request) -> Response:
        """Recently finished requests that started in [since, until]: the slowest N, or the newest."""
        if unauthorized(read_tokens, request.headers.get("authorization")):
            return _error(401, "missing or wrong bearer token (read token or token)")
        try:
            query = requests_query(request.query_params)
        except QueryError as exc:
            return _error(400, str(exc))
        snapshot = c.joiner.recent.snapshot()
        try:  # on the scrape thread: filtering 100,000 summaries must not hold up ingest
            answer = await asyncio.get_running_loop().run_in_executor(
                c.scraper, functools.partial(select, snapshot, **query)
            )
        except QueryError as exc:
            return _error(400, str(exc))
        return _json({"capacity": c.joiner.recent.capacity, **answer})

    @app.get("/v1/requests/{request_id}")
    async def get_request(request: Request, request_id: str) -> Response:
        if unauthorized(read_tokens, request.headers.get("authorization")):
            return _error(401, "missing or wrong bearer token (read token or token)")
        found = c.joiner.lookup(request_id)
        if found is None:
            return _error(404, f"request {request_id!r} is neither open nor recently finished")
        return _json(found)

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        if unauthorized(read_tokens, request.headers.get("authorization")):
            return _error(401, "missing or wrong bearer token (read token or token)")
        encoder, content_type = choose_encoder(request.headers.get("accept"))
        # on the scrape thread: a large exposition must not hold up ingest on the loop
        data = await asyncio.get_running_loop().run_in_executor(c.scraper, encoder, c.registry)
        return Response(data, media_type=content_type)

    @app.get("/healthz")
    async def healthz() -> Response:
        """200 while events can be stored; 503 with the reason while they cannot (``store``)."""
        failure = c.store.failure
        body = {
            "status": "ok" if failure is None else "unavailable",
            "store": "ok" if failure is None else f"events cannot be stored: {failure}",
            "open_requests": len(c.joiner.open),
            **c.joiner.counts,
        }
        return _json(body, 200, None) if failure is None else _json(body, 503, {"Retry-After": "1"})

    return app


QUERY_PARAMETERS = ("since", "until", "slowest", "by", "limit")


def requests_query(params: Mapping[str, str]) -> dict[str, Any]:
    """``GET /v1/requests``'s parameters as ``recent.select`` takes them; ``QueryError`` naming the
    one that is wrong (an unknown one too: a misspelt ``slowest`` must not list the newest)."""
    unknown = sorted(set(params) - set(QUERY_PARAMETERS))
    if unknown:
        raise QueryError(f"unknown parameter {unknown[0]!r}: give {', '.join(QUERY_PARAMETERS)}")
    query: dict[str, Any] = {}
    for name in ("since", "until"):
        if name in params:
            try:
                query[name] = to_epoch(params[name])
            except ValueError as exc:
                raise QueryError(f"{name}: {exc}") from None
    for name in ("slowest", "limit"):
        if name in params:
            text = params[name].strip()
            if not text.isdigit() or not 1 <= int(text) <= MAX_LIMIT:
                raise QueryError(f"{name} must be a whole number from 1 to {MAX_LIMIT}, got {params[name]!r}")
            query[name] = int(text)
    if "slowest" in query and "limit" in query:
        raise QueryError("give slowest (the N slowest) or limit (the N newest), not both")
    if "by" in params:
        query["by"] = params["by"]
    return query


def _peer(request: Request) -> str | None:
    return f"{request.client.host}:{request.client.port}" if request.client else None
