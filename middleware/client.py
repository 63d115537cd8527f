"""Client hops from an httpx transport wrapper: ``client.sent`` / ``first_token`` / ``last_token`` / ``error``.

    import httpx, openai
    from hopline.middleware.client import instrument

    client = openai.OpenAI(http_client=instrument(httpx.Client()))          # or AsyncOpenAI + AsyncClient

``instrument(client)`` wraps the client's transport (and its per-mount transports) in a
``HoplineTransport`` / ``AsyncHoplineTransport``; nothing is monkeypatched, and a transport can also
be wrapped directly: ``httpx.Client(transport=HoplineTransport(httpx.HTTPTransport()))``. The
``httpx2`` fork (what ``openai.DefaultHttpxClient`` is built on since openai 3) works the same way:
both share one API, and the wrappers subclass the base classes of each one installed.

Per request the transport:

* sets ``X-Request-Id`` (a fresh ID unless the caller set a valid one), ``X-Hopline-Attempt`` and a
  W3C ``traceparent`` when absent;
* counts retries of one logical call as ``attempt`` and keeps its request ID: the OpenAI SDK (and
  other Stainless SDKs) rebuilds the request for each retry and sends ``x-stainless-retry-count``;
  a retry is matched to its first try by the caller (asyncio task or thread, told apart by a
  token kept in a ``contextvars.ContextVar``), method, URL and body;
* stamps ``client.sent`` when the request enters the transport, i.e. before pool wait, connect and
  TLS, whose durations come from httpcore's ``trace`` extension (``connect_tcp`` / ``start_tls``
  events appear only on a new connection, hence ``conn_reused``);
* tells a full pool from a busy caller: the time from entering the transport to httpcore's first
  trace event is ``pool_wait_s`` only while the pool had no free connection (``pool_full``: the
  requests this transport holds had reached its pool's ``max_connections``, ``pool_limit``) and
  until one was freed; the rest is ``client_delay_s``, the calling process catching up (a busy
  event loop, the GIL). Where an asyncio loop runs, its lag probe (``hopline.middleware.loop``:
  one callback per loop measuring its own lateness) adds ``loop_lag_s``, the loop's recent
  largest lateness (on ``client.first_token`` too: how late the loop was to read the first token);
  the sync transport adds the process's thread lateness instead (``thread_probe``: how late a
  sleeping thread wakes, what a blocking read waits for on a busy host);
* wraps the response stream (the shape of httpx's ``BoundSyncStream``) to time the first SSE event
  carrying output and the end of the body; a stream closed before its end is ``cancelled``.

Events never carry text: from the request body only ``model``, ``stream``, ``n`` and ``max_tokens``
are read (bounded); from the response only counts, usage and ``finish_reason``.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterator
from contextvars import ContextVar
from typing import Any, TypeVar

import httpx

try:  # the fork openai >= 3 builds its default clients on; same API as httpx
    import httpx2
except ImportError:  # pragma: no cover - depends on what is installed
    httpx2 = None

from hopline.middleware import clock
from hopline.middleware.asgi import parse_attempt
from hopline.middleware.contract.events import (
    is_valid_trace_id,
    new_eid,
    new_request_id,
    normalize_request_id,
    trace_id_of,
)
from hopline.middleware.emit import Emitter, get_emitter
from hopline.middleware.log import logger
from hopline.middleware.loop import LagProbe, ThreadProbe, lag_probe, thread_probe
from hopline.middleware.sse import (
    MAX_JSON_BYTES,
    StreamReader,
    error_summary,
    reported_gateway_timing,
    request_summary,
    response_summary,
)

REQUEST_ID_HEADER = "x-request-id"
ATTEMPT_HEADER = "x-hopline-attempt"
SDK_RETRY_HEADER = "x-stainless-retry-count"
TRACEPARENT_HEADER = "traceparent"
_FLAVOURS = (httpx,) if httpx2 is None else (httpx, httpx2)
_SYNC_CLIENTS = tuple(m.Client for m in _FLAVOURS)
_ASYNC_CLIENTS = tuple(m.AsyncClient for m in _FLAVOURS)


class _LogicalCalls:
    """Request IDs of recent logical calls, so that a retry (attempt > 0) reuses its call's ID."""

    def __init__(self, capacity: int = 4096) -> None:
        self._ids: OrderedDict[Hashable, str] = OrderedDict()
        self._capacity = capacity
        self._lock = threading.Lock()

    def request_id(self, key: Hashable, attempt: int) -> str:
        with self._lock:
            if attempt > 0:
                found = self._ids.get(key)
                if found is not None:
                    self._ids.move_to_end(key)
                    return found
            rid = self._ids[key] = new_request_id()
            self._ids.move_to_end(key)
            if len(self._ids) > self._capacity:
                self._ids.popitem(last=False)
            return rid


def _attempt_of(headers: httpx.Headers) -> int:
    """The caller's ``X-Hopline-Attempt``, else the SDK's retry count, else 0."""
    raw = headers.get(ATTEMPT_HEADER)
    return parse_attempt(raw if raw is not None else headers.get(SDK_RETRY_HEADER))


def _traceparent(request_id: str) -> str:
    """A W3C traceparent; the trace ID is the request ID when that is 32 lowercase hex digits."""
    trace_id = request_id if is_valid_trace_id(request_id) else new_request_id()
    return f"00-{trace_id}-{new_eid()}-01"


def _body_of(request: httpx.Request) -> bytes | None:
    try:
        return request.content
    except RuntimeError:  # RequestNotRead: a streamed upload, attributes unknown
        return None


def pool_limit_of(transport: object) -> int | None:
    """The connection limit of an httpx transport's httpcore pool, when it bounds requests.

    ``httpx.HTTPTransport`` / ``AsyncHTTPTransport`` (and their ``httpx2`` twins) keep an httpcore
    ``ConnectionPool`` (or a proxy, its subclass) as ``_pool``, whose ``_max_connections`` is the
    limit (``sys.maxsize`` for ``max_connections=None``). An HTTP/1.1 connection carries one request
    at a time, so that many requests in flight fill the pool; an HTTP/2 one multiplexes, so there
    the limit says nothing about a full pool (None), nor does any other transport.
    """
    pool = getattr(transport, "_pool", None)
    limit = getattr(pool, "_max_connections", None)
    if type(limit) is not int or limit < 1 or getattr(pool, "_http2", True) is not False:
        return None
    return limit


class _Slots:
    """A transport's requests against its pool's limit, so that a request knows it met a full pool.

    A request holds a slot from entering the transport until its response is closed (or it
    failed): exactly while httpcore's pool holds it. One that enters with every slot held waits;
    its pool wait ends at the last moment a slot was given back before it got its connection (its
    first trace event). Which waiter a freed connection goes to is httpcore's business (not
    strictly first come, first served), so it is read from what happened, not predicted.

    Threads race between counting themselves here and entering httpcore's pool: a request
    counted as meeting a full pool may get a connection with no slot given back since it came,
    because it overtook one counted ahead of it that has not started yet. The two then swap
    places (the latest such one is the one that waits).
    """

    __slots__ = ("limit", "held", "waiting", "pending", "freed_at", "lock")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self.waiting: set[_Call] = set()  # met a full pool, no connection yet
        self.pending: list[_Call] = []  # found room, not started yet
        self.freed_at = 0.0  # perf_counter when a slot was last given back
        self.lock = threading.Lock()

    def enter(self, call: _Call) -> None:
        with self.lock:
            call.pool_full = self.held >= self.limit
            self.held += 1
            if call.pool_full:
                self.waiting.add(call)
            else:
                self.pending.append(call)

    def started(self, call: _Call) -> None:
        """``call`` got its connection: its first trace event."""
        with self.lock:
            if call in self.pending:
                self.pending.remove(call)
            elif call in self.waiting:
                self.waiting.discard(call)
                if self.freed_at > call.entered:
                    call.slot_at = self.freed_at
                elif self.pending:  # nothing was given back: it overtook one counted ahead of it
                    call.pool_full = False
                    overtaken = self.pending.pop()
                    overtaken.pool_full = True
                    self.waiting.add(overtaken)

    def releases(self) -> None:
        """A response is being closed: its connection goes back to the pool now."""
        with self.lock:
            self.freed_at = time.perf_counter()

    def leave(self, call: _Call, released: bool) -> None:
        """``call`` left the pool; ``released``: its slot was given back at ``releases()``."""
        with self.lock:
            self.held -= 1
            if call in self.pending:
                self.pending.remove(call)
            if call in self.waiting:
                self.waiting.discard(call)  # it never had a connection: nothing freed
            elif not released:
                self.freed_at = time.perf_counter()


_HOLDING, _CLOSING, _LEFT = range(3)


class _Call:
    """One attempt as the transport sees it: connection timings, then the response body."""

    __slots__ = (
        "emitter",
        "request_id",
        "attempt",
        "extra",
        "sent_attrs",
        "entered",
        "first_trace",
        "headers_sent",
        "connect",
        "tls",
        "new_connection",
        "reader",
        "json",
        "json_size",
        "final",
        "status",
        "slots",
        "pool_full",
        "slot_at",
        "held",
        "probe",
        "gateway_timing",
    )

    def __init__(self, emitter: Emitter, request_id: str, attempt: int, extra: dict[str, Any], sent_attrs: dict[str, Any]) -> None:
        self.emitter = emitter
        self.request_id = request_id
        self.attempt = attempt
        self.extra = extra
        self.sent_attrs = sent_attrs
        self.entered = time.perf_counter()
        self.first_trace: float | None = None
        self.headers_sent: float | None = None
        self.connect: list[float] = []  # [started, complete]
        self.tls: list[float] = []
        self.new_connection = False
        self.reader: StreamReader | None = None
        self.json: list[bytes] | None = None
        self.json_size = 0
        self.final = False
        self.status: int | None = None
        self.slots: _Slots | None = None
        self.pool_full: bool | None = None  # None: the pool's state is unknown
        self.slot_at: float | None = None  # when a full pool freed a connection for it
        self.held = _HOLDING  # its place in the pool: holding, closing its response, left
        self.probe: LagProbe | ThreadProbe | None = None
        # a gateway's own per-phase timing from the response's headers (LiteLLM's detailed timing)
        self.gateway_timing: dict[str, float] = {}

    def hold(self, slots: _Slots | None, probe: LagProbe | ThreadProbe | None) -> None:
        """Count this request against its transport's pool (and note its loop's lag probe)."""
        self.probe = probe
        if slots is not None:
            self.slots = slots
            slots.enter(self)

    def closing(self) -> None:
        """Its response is about to be closed (the pool gets the connection back in there)."""
        if self.slots is not None and self.held == _HOLDING:
            self.held = _CLOSING
            self.slots.releases()

    def release(self) -> None:
        """The pool has the request's connection back (its response closed, or it failed)."""
        if self.slots is not None and self.held != _LEFT:
            closing, self.held = self.held == _CLOSING, _LEFT
            self.slots.leave(self, closing)

    def emit(self, hop: str, ts: float | None = None, **attrs: Any) -> None:
        if self.extra:
            attrs.update(self.extra)
        self.emitter.emit(hop, self.request_id, ts, attempt=self.attempt, **attrs)

    def on_trace(self, name: str) -> None:
        """httpcore trace events (``connection.connect_tcp.started``, ``proxy.start_tls.complete``...)."""
        t = time.perf_counter()
        if self.first_trace is None:
            self.first_trace = t
            if self.slots is not None:
                self.slots.started(self)
        if self.headers_sent is not None:
            return
        if name.endswith((".connect_tcp.started", ".connect_unix_socket.started")):
            self.new_connection = True
            self.connect = [t]
        elif name.endswith((".connect_tcp.complete", ".connect_unix_socket.complete")):
            self.connect.append(t)
        elif name.endswith(".start_tls.started"):
            self.tls = [t]
        elif name.endswith(".start_tls.complete"):
            self.tls.append(t)
        elif name.endswith(".send_request_headers.started"):
            self.headers_sent = t

    def emit_sent(self) -> None:
        attrs = self.sent_attrs
        first = self.first_trace
        if first is not None:  # an httpcore-backed transport told us about the connection
            # a full pool's wait lasts until a connection was freed for this request; the rest of
            # the time to the first transport step is the caller's own delay
            freed = self.entered
            if self.pool_full:
                freed = first if self.slot_at is None else min(max(self.slot_at, self.entered), first)
            attrs["pool_wait_s"] = freed - self.entered
            attrs["client_delay_s"] = max(0.0, first - freed)
            attrs["conn_reused"] = not self.new_connection
            if len(self.connect) == 2:
                attrs["connect_s"] = self.connect[1] - self.connect[0]
            if len(self.tls) == 2:
                attrs["tls_s"] = self.tls[1] - self.tls[0]
        if self.pool_full is not None:
            attrs["pool_full"] = self.pool_full
            limit = self.slots.limit  # type: ignore[union-attr]
            if limit < sys.maxsize:  # max_connections=None: no limit
                attrs["pool_limit"] = limit
        if self.probe is not None:
            attrs["loop_lag_s"] = self.probe.lag()
        self.emit("client.sent", clock.from_perf(self.entered), **attrs)

    def fail(self, error: str, status: int | None = None) -> None:
        if self.final:
            return
        self.final = True
        if status is None:
            status = self.status
        if status is None:
            self.emit("client.error", error=error)
        else:
            self.emit("client.error", error=error, status=status)

    def on_response(self, response: httpx.Response) -> bool:
        """Headers arrived. True when the body is worth watching (a 2xx/3xx response)."""
        status = self.status = response.status_code
        if status >= 400:
            self.fail(f"http_{status}", status)
            return False
        self.gateway_timing = reported_gateway_timing(response.headers)
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            self.reader = StreamReader()
        else:
            self.json = []
        return True

    def on_chunk(self, chunk: bytes) -> None:
        if self.final:
            return
        ts = clock.now()
        reader = self.reader
        if reader is not None:
            if reader.feed(chunk, ts):
                if self.probe is not None:
                    self.emit("client.first_token", ts, loop_lag_s=self.probe.lag())
                else:
                    self.emit("client.first_token", ts)
            if reader.error is not None:
                self.fail(reader.error, reader.error_status)
            elif reader.done:
                self.final = True
                self.emit("client.last_token", ts, **reader.summary(), **self.gateway_timing)
            return
        parts = self.json
        if parts is not None and chunk:
            self.json_size += len(chunk)
            if self.json_size > MAX_JSON_BYTES:
                self.json = None
            else:
                parts.append(chunk)

    def on_end(self) -> None:
        """The body was read to its end."""
        if self.final:
            return
        if self.reader is not None:
            self.final = True
            self.emit("client.last_token", **self.reader.summary(), **self.gateway_timing)
            return
        body = b"".join(self.json) if self.json else b""
        error = error_summary(body)
        if error is not None:
            self.fail(error)
            return
        self.final = True
        self.emit("client.last_token", **response_summary(body), **self.gateway_timing)

    def on_close(self) -> None:
        """The response was closed: before its end, that is a cancelled stream."""
        self.fail("cancelled")

    def on_error(self, exc: BaseException) -> None:
        self.fail(type(exc).__name__[:64])


def _guarded(emitter: Emitter, action: Callable[[], None]) -> None:
    try:
        action()
    except Exception:
        emitter.errors += 1


class _ObservedSyncStream(*(m.SyncByteStream for m in _FLAVOURS)):  # type: ignore[misc]
    """The response body, passed through chunk by chunk while ``_Call`` watches it."""

    def __init__(self, stream: httpx.SyncByteStream, call: _Call) -> None:
        self._stream = stream
        self._call = call

    def __iter__(self) -> Iterator[bytes]:
        call = self._call
        try:
            for chunk in self._stream:
                _guarded(call.emitter, lambda: call.on_chunk(chunk))
                yield chunk
        except Exception as exc:
            _guarded(call.emitter, lambda: call.on_error(exc))
            raise
        _guarded(call.emitter, call.on_end)

    def close(self) -> None:
        call = self._call
        _guarded(call.emitter, call.on_close)
        _guarded(call.emitter, call.closing)
        try:
            self._stream.close()
        finally:
            _guarded(call.emitter, call.release)


class _ObservedAsyncStream(*(m.AsyncByteStream for m in _FLAVOURS)):  # type: ignore[misc]
    """The async twin of ``_ObservedSyncStream`` (shape of httpx's ``BoundAsyncStream``)."""

    def __init__(self, stream: httpx.AsyncByteStream, call: _Call) -> None:
        self._stream = stream
        self._call = call

    async def __aiter__(self) -> AsyncIterator[bytes]:
        call = self._call
        try:
            async for chunk in self._stream:
                _guarded(call.emitter, lambda: call.on_chunk(chunk))
                yield chunk
        except Exception as exc:
            _guarded(call.emitter, lambda: call.on_error(exc))
            raise
        _guarded(call.emitter, call.on_end)

    async def aclose(self) -> None:
        call = self._call
        _guarded(call.emitter, call.on_close)
        _guarded(call.emitter, call.closing)
        try:
            await self._stream.aclose()
        finally:
            _guarded(call.emitter, call.release)


class _Instrumentation:
    """What both transports share: the emitter, extra attributes and the logical-call memory."""

    def __init__(self, emitter: Emitter | None, service: str | None, transport: object) -> None:
        self.emitter = emitter if emitter is not None else get_emitter()
        self.extra = {"service": service} if service else {}
        self.calls = _LogicalCalls()
        limit = pool_limit_of(transport)
        self.slots = _Slots(limit) if limit is not None else None

    def begin(self, request: httpx.Request, caller: Hashable) -> _Call | None:
        """Set the hopline headers on ``request`` and start its ``_Call`` (None if that failed)."""
        try:
            headers = request.headers
            attempt = _attempt_of(headers)
            body = _body_of(request)
            raw_id = headers.get(REQUEST_ID_HEADER)
            request_id = normalize_request_id(raw_id) if raw_id is not None else None
            if raw_id is not None and request_id is None:
                logger.warning("request_id_replaced", where="client", reason="invalid", length=len(raw_id))
            if request_id is None:
                key = (caller, request.method, str(request.url), hash(body) if body is not None else None)
                request_id = self.calls.request_id(key, attempt)
            headers[REQUEST_ID_HEADER] = request_id
            headers[ATTEMPT_HEADER] = str(attempt)
            if TRACEPARENT_HEADER not in headers:
                headers[TRACEPARENT_HEADER] = _traceparent(request_id)
            trace_id = trace_id_of(headers[TRACEPARENT_HEADER])
            extra = {**self.extra, "trace_id": trace_id} if trace_id is not None else self.extra
            sent_attrs = request_summary(body) if body else {}
            sent_attrs.setdefault("stream", False)
            return _Call(self.emitter, request_id, attempt, extra, sent_attrs)
        except Exception:
            self.emitter.errors += 1
            return None


def _add_trace(request: httpx.Request, make: Callable[[Any, _Call], Callable[..., Any]], call: _Call) -> None:
    """Give the request our httpcore ``trace`` callback; it calls the caller's own one, if any."""
    request.extensions = {**request.extensions, "trace": make(request.extensions.get("trace"), call)}


def _sync_trace(previous: Callable[[str, dict], None] | None, call: _Call) -> Callable[[str, dict], None]:
    def trace(name: str, info: dict) -> None:
        call.on_trace(name)
        if previous is not None:
            previous(name, info)

    return trace


def _async_trace(
    previous: Callable[[str, dict], Awaitable[None]] | None, call: _Call
) -> Callable[[str, dict], Awaitable[None]]:
    async def trace(name: str, info: dict) -> None:
        call.on_trace(name)
        if previous is not None:
            await previous(name, info)

    return trace


class HoplineTransport(*(m.BaseTransport for m in _FLAVOURS)):  # type: ignore[misc]
    """Wraps a sync httpx transport and emits client hops for every request through it."""

    def __init__(self, transport: httpx.BaseTransport, *, emitter: Emitter | None = None, service: str | None = None) -> None:
        self.transport = transport
        self._hopline = _Instrumentation(emitter, service, transport)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        hopline = self._hopline
        call = hopline.begin(request, _caller())
        if call is None:
            return self.transport.handle_request(request)
        _guarded(hopline.emitter, lambda: _add_trace(request, _sync_trace, call))
        _guarded(hopline.emitter, lambda: call.hold(hopline.slots, thread_probe()))
        try:
            response = self.transport.handle_request(request)
        except BaseException as exc:
            _guarded(hopline.emitter, call.release)
            if isinstance(exc, Exception):
                _guarded(hopline.emitter, call.emit_sent)
                _guarded(hopline.emitter, lambda: call.on_error(exc))
            raise
        _guarded(hopline.emitter, call.emit_sent)
        try:
            call.on_response(response)
            # every response is watched until closed: that is when the pool has its connection back
            response.stream = _ObservedSyncStream(response.stream, call)  # type: ignore[arg-type]
        except Exception:
            hopline.emitter.errors += 1
        return response

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> HoplineTransport:
        self.transport.__enter__()
        return self

    def __exit__(self, *args: Any) -> None:
        self.transport.__exit__(*args)


class AsyncHoplineTransport(*(m.AsyncBaseTransport for m in _FLAVOURS)):  # type: ignore[misc]
    """Wraps an async httpx transport and emits client hops for every request through it."""

    def __init__(
        self, transport: httpx.AsyncBaseTransport, *, emitter: Emitter | None = None, service: str | None = None
    ) -> None:
        self.transport = transport
        self._hopline = _Instrumentation(emitter, service, transport)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        hopline = self._hopline
        call = hopline.begin(request, _caller())
        if call is None:
            return await self.transport.handle_async_request(request)
        _guarded(hopline.emitter, lambda: _add_trace(request, _async_trace, call))
        _guarded(hopline.emitter, lambda: call.hold(hopline.slots, lag_probe()))
        try:
            response = await self.transport.handle_async_request(request)
        except BaseException as exc:
            _guarded(hopline.emitter, call.release)
            if isinstance(exc, Exception):
                _guarded(hopline.emitter, call.emit_sent)
                _guarded(hopline.emitter, lambda: call.on_error(exc))
            raise
        _guarded(hopline.emitter, call.emit_sent)
        try:
            call.on_response(response)
            # every response is watched until closed: that is when the pool has its connection back
            response.stream = _ObservedAsyncStream(response.stream, call)  # type: ignore[arg-type]
        except Exception:
            hopline.emitter.errors += 1
        return response

    async def aclose(self) -> None:
        await self.transport.aclose()

    async def __aenter__(self) -> AsyncHoplineTransport:
        await self.transport.__aenter__()
        return self

    async def __aexit__(self, *args: Any) -> None:
        await self.transport.__aexit__(*args)


# (the task or thread it was made for, weakly; its token). An asyncio task starts with a copy of
# its parent's context, so the owner tells a child's inherited value from its own.
_CALLER: ContextVar[tuple[weakref.ref[Any], object] | None] = ContextVar("hopline_client_caller", default=None)


def _caller() -> object:
    """A token for the calling asyncio task (else thread), held in a context variable.

    The token lives as long as the logical-call memory refers to it, so a new task never gets
    the token of a finished one (``id(task)`` is reused as soon as a task is freed).
    """
    try:
        owner: Any = asyncio.current_task()
    except RuntimeError:  # trio or no running loop: the thread
        owner = None
    if owner is None:
        owner = threading.current_thread()
    held = _CALLER.get()
    if held is not None and held[0]() is owner:
        return held[1]
    token = object()
    _CALLER.set((weakref.ref(owner), token))
    return token


_C = TypeVar("_C")


def instrument(client: _C, *, emitter: Emitter | None = None, service: str | None = None) -> _C:
    """Wrap ``client``'s transport and per-mount transports so that every request emits client hops.

    Args:
        client: an ``httpx.Client`` or ``httpx.AsyncClient`` (or their ``httpx2`` twins, such as
            ``openai.DefaultHttpxClient()``), e.g. the one passed to
            ``openai.OpenAI(http_client=...)``; returned, instrumented in place.
        emitter: where events go; default ``get_emitter()`` (from ``HOPLINE_*``).
        service: the calling service's name on every event (else the emitter's ``service``).

    Instrumenting twice is harmless (already wrapped transports are kept). If hopline cannot be
    configured, the error is logged and the client is returned untouched.

    Raises:
        TypeError: ``client`` is not an httpx client.
    """
    if isinstance(client, _ASYNC_CLIENTS):
        wrap_class: type = AsyncHoplineTransport
    elif isinstance(client, _SYNC_CLIENTS):
        wrap_class = HoplineTransport
    else:
        raise TypeError(f"instrument() needs an httpx.Client or httpx.AsyncClient, got {type(client).__name__}")
    try:
        emitter = emitter if emitter is not None else get_emitter()
    except Exception as exc:
        logger.error("hopline_disabled", where="client", error=str(exc))
        return client

    def wrap(transport: Any) -> Any:
        if transport is None or isinstance(transport, wrap_class):
            return transport
        return wrap_class(transport, emitter=emitter, service=service)

    # httpx has no public setter for these: the transport is fixed at construction time.
    client._transport = wrap(client._transport)
    client._mounts = {pattern: wrap(transport) for pattern, transport in client._mounts.items()}
    return client


def request_id_of(response: Any) -> str | None:
    """The hopline request ID of a call, from what it returned: an ``httpx.Response``, its
    ``httpx.Request``, or an OpenAI SDK raw / streaming response (``.http_response``).

    hopline's client puts the ID on every request it sends, so this works against any server;
    ``hopline timeline ID`` then shows where that call's time went. (Behind hopline's gateway or
    engine middleware the response also echoes it, so the OpenAI SDK's own ``completion._request_id``
    is the same ID.)
    """
    raw = getattr(response, "http_response", response)
    request = raw if isinstance(raw, httpx.Request) else getattr(raw, "request", None)
    if not isinstance(request, httpx.Request):
        return None
    return request.headers.get(REQUEST_ID_HEADER)
