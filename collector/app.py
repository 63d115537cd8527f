"""The collector service: ``create_app(config) -> FastAPI``.

Routes: ``POST /v1/events`` (ingest), ``GET /v1/requests/{id}`` (one request's joined
timeline), ``GET /v1/requests?since=…&until=…&slowest=N`` (recently finished requests in
brief: ID, TTFT, e2e, outcome, scope; ``recent.py``), ``GET /v1/windows?since=…&until=…``
(per-window, per-scope sketches of the stages, mergeable across collectors; ``windows.py``),
``GET /metrics`` (Prometheus text, or OpenMetrics with ``request_id`` exemplars when the
``Accept`` header asks for it, as Prometheus does with exemplar storage on), ``GET /healthz``
(200, or 503 with the reason while events cannot be stored: ``store.EventStore.failure``).
At start, before it answers, the collector reads its store back into the join and the window
summaries a restart lost (``restart.py``).

The handlers are ``routes.py``'s (and ``otlp.py``'s ``POST /v1/traces``), auth included; this
module wires the parts (``build_collector``), runs them (``lifespan``) and assembles the app.

One process, one event loop, which nothing may block: prometheus_client's multiprocess mode
would drop exemplars. Decompressing and parsing a body runs on a parse thread, the store's
writes on one writer thread (keeping batches in order), the /metrics exposition on a scrape
thread; no handler raises past ``NeverRaise`` (a 500 it answers keeps the connection usable),
and a client that goes away mid-body is one log line. The lifespan starts the housekeeping loop
(grace/TTL sweeps, interval fsync, compaction, retention) and the file tailer, and on shutdown (SIGTERM) stops them, waits for queued writes, fsyncs and
closes the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import orjson
from fastapi import FastAPI
from hopline.collector import otlp, routes
from hopline.collector.config import CollectorConfig
from hopline.collector.dedup import RecentKeys
from hopline.collector.emitter_stats import EmitterStats
from hopline.collector.ingest import Ingestor
from hopline.collector.join import Joiner
from hopline.collector.metrics import ExpositionRegistry, Recorder, build_metrics
from hopline.collector.restart import rebuild
from hopline.collector.store import EventStore, StoreError
from hopline.collector.tail import Tailer
from hopline.collector.windows import WindowSummaries
from hopline.middleware.http_limits import WHY, ConnectionLimits
from hopline.middleware.log import logger
from prometheus_client import CollectorRegistry
from starlette.types import ASGIApp, Message, Receive, Scope, Send

SWEEP_INTERVAL_S = 0.25
SWEEP_SLICE = 100  # requests finished (or expired) between two yields to the event loop (~5 ms)
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
    otlp: otlp.OtlpReceiver


def build_collector(config: CollectorConfig) -> Collector:
    """The collector's parts, wired (no threads or tasks started: the app's lifespan does that).
    Each part takes its settings from ``config`` (``from_config``)."""
    registry = ExpositionRegistry()
    recorder = Recorder.from_config(config, build_metrics(registry))
    store = EventStore.from_config(config)
    joiner = Joiner.from_config(config, recorder)
    if config.otlp_export:  # each finished request as a trace (otlp_export.py)
        from hopline.collector.otlp_export import finished_request_exporter

        joiner.on_finish = finished_request_exporter(config.otlp_export)
    dedup = RecentKeys.from_config(config)
    m = recorder.m
    if config.window > 0:  # GET /v1/windows
        overflowed = {by: m.window_scopes_overflowed.labels(by=by) for by in config.window_by}
        joiner.windows = windows = WindowSummaries.from_config(
            config, on_overflow=lambda by, count: overflowed[by].inc(count)
        )
        m.window_summary_bytes.set_function(windows.memory_bytes)
    m.open_requests.set_function(lambda: len(joiner.open))
    m.open_request_bytes.set_function(lambda: joiner.open_bytes)
    m.finished_request_bytes.set_function(lambda: joiner.finished_bytes)
    m.dedup_keys.set_function(lambda: len(dedup))
    for why in WHY:  # every reason shows from the start, at 0
        m.http_connections_closed.labels(why=why)
    scraper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hopline-scrape")
    ingestor = Ingestor.from_config(config, store, joiner, recorder, dedup, EmitterStats(registry))
    receiver = otlp.OtlpReceiver.from_config(config, ingestor, registry)
    return Collector(config, registry, recorder, store, joiner, ingestor, scraper, receiver)


def connection_limits(c: Collector) -> ConnectionLimits:
    """The HTTP server's bounds (``middleware/http_limits.py``: a connection cap, header and body
    timeouts), each connection they close counted in ``hopline_collector_http_connections_closed``."""
    closed = c.recorder.m.http_connections_closed
    return ConnectionLimits(
        max_connections=c.config.max_connections,
        header_timeout=c.config.header_timeout,
        body_timeout=c.config.body_timeout,
        on_close=lambda why: closed.labels(why=why).inc(),
    )


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
            while c.joiner.sweep(limit=SWEEP_SLICE):  # a backlog in slices, others in between
                await asyncio.sleep(0)
            if c.joiner.windows is not None:  # settled windows' rows into sketches (once a second)
                c.joiner.windows.fold()
            if time.monotonic() >= next_probe:  # /healthz follows the store without waiting for events
                next_probe = time.monotonic() + STORE_PROBE_INTERVAL_S
                await loop.run_in_executor(c.ingestor.writer, c.store.probe)
            if c.config.fsync == "interval":
                await loop.run_in_executor(c.ingestor.writer, lambda: c.store.sync(force=False))
            if time.monotonic() >= next_compaction:
                next_compaction = time.monotonic() + c.config.compact_interval
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
        for path in c.store.compact(c.config.compact_delay, on_quarantine=quarantined):
            logger.info("hour_compacted", path=str(path))
    except (OSError, StoreError) as exc:
        m.compaction_failures.inc()
        logger.warning("compaction_failed", error=str(exc))
    try:
        for path in c.store.expire(c.config.retention):
            logger.info("hour_expired", path=str(path))
    except OSError as exc:
        m.compaction_failures.inc()
        logger.warning("retention_failed", error=str(exc))


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


def tune_gc() -> None:
    """The collector process's garbage collector, set once at start."""
    # what exists now (modules, classes, the app) lives as long as the process: keep it out of
    # every full garbage collection, which holds the GIL, and so the event loop, while it scans
    gc.freeze()
    # ingest makes a few short-lived dicts per event: a young collection every 20,000 new
    # containers instead of 700 (1.0-1.6 µs less CPU per event, 6-9%, in 3 alternated pairs of
    # bench_collector.py --only ingest, 2026-12-03); what they hold is freed by reference counts
    gc.set_threshold(20_000, 10, 10)


async def _start(c: Collector) -> list[asyncio.Task]:
    """Open the store (failing to is not fatal: ingest answers 503 with the reason until it works);
    start the housekeeping loop and the file tailer."""
    tune_gc()
    try:
        c.store.open()
    except StoreError as exc:
        logger.error("store_unavailable", error=str(exc))
    try:  # before the first event is taken: what the store holds of the windows and requests in flight
        done = rebuild(c)
        logger.info(
            "collector_rebuilt", events=done.events, rebuilt=done.rebuilt, rejoined=done.rejoined,
            served_before=done.served_before, seconds=round(done.seconds, 3),
        )
    except Exception as exc:  # noqa: BLE001 - a store that cannot be read back must not stop the collector
        logger.error("rebuild_failed", error=f"{type(exc).__name__}: {exc}"[:300])
    tasks = [asyncio.create_task(_housekeeping(c), name="hopline-housekeeping")]
    config = c.config
    if config.tail:
        tailer = Tailer.from_config(config, lambda data: c.ingestor.ingest(data, "ndjson"))
        tasks.append(asyncio.create_task(tailer.run(), name="hopline-tail"))
        if 0 < config.grace < 2 * config.tail_interval:
            # two files written together can be read one poll apart: the second file's hops of a
            # request would come after its grace, stored but missing from its stages and metrics
            logger.warning(
                "grace_shorter_than_tail", grace=config.grace, tail_interval=config.tail_interval,
                message=f"--grace {config.grace:g}s is shorter than two tail polls "
                f"({2 * config.tail_interval:g}s): hops of one request in different tailed files may "
                "arrive after it finished and miss its stages; give --grace 2s or more",
            )
    logger.info("collector_started", data_dir=str(config.data_dir), fsync=config.fsync, tail=list(config.tail))
    return tasks


async def _stop(c: Collector, tasks: list[asyncio.Task]) -> None:
    """Stop the tasks, wait for queued writes, fsync and close the store, finish open requests."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.get_running_loop().run_in_executor(None, c.ingestor.close)
    c.scraper.shutdown(wait=False)
    c.joiner.finish_all()
    logger.info("collector_stopped", stored_bytes=c.store.appended_bytes)


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """The collector's tasks for as long as the app is served."""
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(min(switch_interval, SWITCH_INTERVAL_S))
    tasks = await _start(app.state.collector)
    try:
        yield
    finally:
        try:
            await _stop(app.state.collector, tasks)
        finally:
            sys.setswitchinterval(switch_interval)


def create_app(config: CollectorConfig) -> FastAPI:
    """The collector as an ASGI app (run it with uvicorn, one worker)."""
    # the schema is no secret, but an open door on a collector that asks for a token on every
    # other read is one to close: without open reads, no /openapi.json
    openapi = "/openapi.json" if not config.reads_token else None
    app = FastAPI(title="hopline collector", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=openapi)
    app.add_middleware(NeverRaise)
    app.state.collector = build_collector(config)
    app.include_router(routes.router)  # /v1/events, /v1/requests, /metrics, /healthz
    app.include_router(otlp.router)  # /v1/traces
    return app
