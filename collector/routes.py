"""The collector's HTTP routes as named handlers on one router (``app.py`` includes it once).

Each handler finds the collector at ``request.app.state.collector``. Auth: ``POST /v1/events``
needs ``token`` when set; the read endpoints (``/metrics``, ``/v1/requests…``, ``/v1/windows``)
need ``read_token`` or ``token`` (unless ``open_reads``), since a timeline names a request's
service, model, replica and timings; ``/healthz`` is always open. ``POST /v1/traces`` is ``otlp.py``'s.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from hopline.collector.ingest import JSON_TYPES, NDJSON_TYPES, IngestError, media_type, read_body, unauthorized
from hopline.collector.recent import MAX_LIMIT, QueryError, select
from hopline.collector.store import StoreError
from hopline.middleware.contract.units import to_epoch
from hopline.middleware.log import logger
from prometheus_client.exposition import choose_encoder
from starlette.requests import ClientDisconnect

if TYPE_CHECKING:
    from hopline.collector.app import Collector

router = APIRouter()
QUERY_PARAMETERS = ("since", "until", "slowest", "by", "limit")
WINDOW_PARAMETERS = ("since", "until")
READ_REFUSED = "missing or wrong bearer token (read token or token)"


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """orjson: non-finite floats become null instead of failing the answer (never a 500 on read)."""
    return Response(orjson.dumps(body), status_code=status, headers=headers, media_type="application/json")


def _error(status: int, message: str, **extra: object) -> Response:
    headers = (
        {"WWW-Authenticate": "Bearer"} if status == 401 else {"Retry-After": "1"} if status == 503 else None
    )
    return _json({"error": message, **extra}, status, headers)


def _collector(request: Request) -> Collector:
    return request.app.state.collector


def _reads_refused(request: Request) -> bool:
    return unauthorized(_collector(request).config.reads_token, request.headers.get("authorization"))


@router.post("/v1/events")
async def post_events(request: Request) -> Response:
    """Hop events as NDJSON or a JSON array: stored durably, joined, then acknowledged."""
    c, headers = _collector(request), request.headers
    rejected = c.recorder.body_rejected
    if unauthorized(c.config.writes_token, headers.get("authorization")):
        rejected("unauthorized")
        return _error(401, "missing or wrong bearer token")
    kind = media_type(headers.get("content-type"))
    if kind not in NDJSON_TYPES and kind not in JSON_TYPES:
        rejected("unsupported_type")
        return _error(415, f"unsupported content type {kind!r}: send application/x-ndjson or application/json")
    try:
        body = await read_body(request, c.config.max_body)
        result = await c.ingestor.ingest(
            body,
            "json" if kind in JSON_TYPES else "ndjson",
            headers.get("content-encoding", "identity").strip().lower(),
            max_decompressed=c.config.max_decompressed_bytes,
            max_lines=c.config.max_lines_per_body,
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


@router.get("/v1/requests")
async def list_requests(request: Request) -> Response:
    """Recently finished requests that started in [since, until]: the slowest N, or the newest."""
    if _reads_refused(request):
        return _error(401, READ_REFUSED)
    c = _collector(request)
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


@router.get("/v1/windows")
async def list_windows(request: Request) -> Response:
    """Settled windows that start in [since, until]: per scope value, each stage's sketch, count and
    sum, arrivals and outcomes (``windows.py``); 404 when the collector keeps none (``--window 0s``)."""
    if _reads_refused(request):
        return _error(401, READ_REFUSED)
    windows = _collector(request).joiner.windows
    try:
        query = windows_query(request.query_params)
    except QueryError as exc:
        return _error(400, str(exc))
    if windows is None:
        return _error(404, "this collector keeps no window summaries (--window 0s)")
    answer = windows.answer(**query)  # on the loop: folds what is pending, lists the folded parts
    loop = asyncio.get_running_loop()
    # encoding on the scrape thread: the parts are never changed once made
    return Response(await loop.run_in_executor(_collector(request).scraper, orjson.dumps, answer),
                    media_type="application/json")


@router.get("/v1/requests/{request_id}")
async def get_request(request: Request, request_id: str) -> Response:
    """One request's joined timeline, open or recently finished."""
    if _reads_refused(request):
        return _error(401, READ_REFUSED)
    found = _collector(request).joiner.lookup(request_id)
    if found is None:
        return _error(404, f"request {request_id!r} is neither open nor recently finished")
    return _json(found)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """Prometheus text, or OpenMetrics with ``request_id`` exemplars when ``Accept`` asks for it."""
    if _reads_refused(request):
        return _error(401, READ_REFUSED)
    c = _collector(request)
    encoder, content_type = choose_encoder(request.headers.get("accept"))
    # on the scrape thread: a large exposition must not hold up ingest on the loop
    data = await asyncio.get_running_loop().run_in_executor(c.scraper, encoder, c.registry)
    return Response(data, media_type=content_type)


@router.get("/healthz")
async def healthz(request: Request) -> Response:
    """200 while events can be stored; 503 with the reason while they cannot (``store``)."""
    c = _collector(request)
    failure = c.store.failure
    body = {
        "status": "ok" if failure is None else "unavailable",
        "store": "ok" if failure is None else f"events cannot be stored: {failure}",
        "open_requests": len(c.joiner.open),
        **c.joiner.counts,
    }
    return _json(body, 200, None) if failure is None else _json(body, 503, {"Retry-After": "1"})


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


def windows_query(params: Mapping[str, str]) -> dict[str, float]:
    """``GET /v1/windows``'s parameters (Unix seconds or ISO-8601); ``QueryError`` naming the one
    that is wrong, or an unknown one."""
    unknown = sorted(set(params) - set(WINDOW_PARAMETERS))
    if unknown:
        raise QueryError(f"unknown parameter {unknown[0]!r}: give {', '.join(WINDOW_PARAMETERS)}")
    query: dict[str, float] = {}
    for name in WINDOW_PARAMETERS:
        if name in params:
            try:
                query[name] = to_epoch(params[name])
            except ValueError as exc:
                raise QueryError(f"{name}: {exc}") from None
    if query.get("since", float("-inf")) > query.get("until", float("inf")):
        raise QueryError(f"since ({params['since']}) is after until ({params['until']})")
    return query


def _peer(request: Request) -> str | None:
    return f"{request.client.host}:{request.client.port}" if request.client else None
