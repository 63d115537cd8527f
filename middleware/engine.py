"""Engine hops from inside an OpenAI-compatible server: ``engine.received`` / ``first_token`` / ``last_token`` / ``error``.

    vllm serve MODEL --middleware hopline.middleware.engine.EngineMiddleware

vLLM constructs the class with the app alone (``app.add_middleware(cls)``), so everything is
configured from the environment: ``HOPLINE_SINK``, ``HOPLINE_SERVICE``, ``HOPLINE_REPLICA``,
``HOPLINE_MODEL`` (see ``hopline.middleware.emit``) and ``HOPLINE_ENGINE_ROUTES`` (comma-separated
paths; default ``/v1/chat/completions,/v1/completions``). Every other route (``/health``,
``/metrics``) and every non-HTTP scope is passed through untouched.

On a generation route the middleware makes sure the request carries a valid ``X-Request-Id``
(inserting a fresh one into the scope when the caller sent none or an unusable one) *before* the
engine reads it, so vLLM's own ID is ``chatcmpl-<that ID>`` and the stat logger's events join ours.
It tees ``receive`` to read ``model``, ``stream``, ``n``, ``max_tokens`` from the first
``MAX_JSON_BYTES`` of the body (larger bodies: attributes unknown; the app always gets every byte)
and wraps ``send`` to time the first output chunk and the last body chunk. Messages are forwarded
as they come; nothing is buffered on the response path. A request that carries
``X-Hopline-Attempt`` > 0 (a gateway failover) or ``X-Hopline-Leg`` (a P/D proxy's leg: every event
of the request then carries ``leg``) is noted in the ``AttemptRegistry`` hopline's vLLM stat logger
reads (``hopline.middleware.attempts``), so its ``engine.stats`` event names the same attempt and leg.
``engine.received`` carries ``loop_lag_s``: how late the API server's event loop ran lately
(``hopline.middleware.loop``), read when the middleware is called. A request waits for a busy loop
before any middleware sees it; that time is the engine's, not the network's.

Per request this costs one ``EngineExchange`` (slotted; its bound ``receive``/``send`` replace
closures), one read of the loop's lag probe, three events, and per streamed chunk after the first
token one ``perf_counter`` and two list appends; the request body's attributes and the kept chunks are read on the emitter's worker
(``Emitter.emit_later``; see ``hopline.middleware.asgi``). ``bench/bench_vllm_pyspy.py`` measures
hopline's share of a real vLLM API server's CPU, ``bench/bench_asgi.py`` the cost against no
middleware and OpenTelemetry's; figures in bench/README.md.
"""

from __future__ import annotations

import os
from time import perf_counter
from typing import Any

from hopline.middleware import clock
from hopline.middleware.asgi import (
    ASGIApp,
    Exchange,
    Message,
    Receive,
    Scope,
    Send,
    adopt_request_id,
    echo_request_id,
    leg_of,
    parse_attempt,
    resolve_emitter,
    scan_request_headers,
    with_request_id,
)
from hopline.middleware.contract.events import new_request_id, trace_id_of
from hopline.middleware.attempts import ATTEMPTS, AttemptRegistry
from hopline.middleware.emit import Emitter
from hopline.middleware.cpu_wait import cpu_wait, cpu_wait_probe
from hopline.middleware.loop import loop_lag
from hopline.middleware.sse import MAX_JSON_BYTES, StreamReader, request_summary

DEFAULT_ROUTES = ("/v1/chat/completions", "/v1/completions")
ROUTES_ENV = "HOPLINE_ENGINE_ROUTES"
# Request bodies up to this size are read on the emitter's worker; larger ones at once (their
# parse is dominated by their size, and the emitter's buffer should not hold them)
MAX_DEFERRED_BODY = 64 << 10


def routes_from_env() -> frozenset[str]:
    """``HOPLINE_ENGINE_ROUTES`` as a set of paths (the default generation routes if unset)."""
    raw = os.environ.get(ROUTES_ENV, "")
    routes = [r.strip() for r in raw.split(",") if r.strip()]
    return frozenset(routes or DEFAULT_ROUTES)


class EngineExchange(Exchange):
    """One generation request inside the engine: an ``Exchange`` that also tees the request body.

    ``receive`` is the app's ``receive`` (reads the body's attributes, notices a disconnect) and
    ``send`` (inherited) its ``send``; both are bound methods of this one object, so a request
    costs one allocation here instead of a set of closures.
    """

    __slots__ = ("_body", "_body_size", "drop_model", "entered", "loop_lag", "received", "route", "upstream")

    def __init__(
        self,
        emitter: Emitter,
        request_id: str,
        attempt: int,
        receive: Receive,
        send: Send,
        entered: float,
        route: str,
    ) -> None:
        # Exchange's methods called directly here, not through super(): fewer instructions
        Exchange.__init__(self, emitter, "engine", request_id, attempt, downstream=send)
        self.upstream = receive
        self.entered = entered
        self.route = route
        self.drop_model = "model" in emitter.static  # the engine's own model name wins over the request's
        self.received = False
        self.loop_lag: float | None = None  # the server's event loop lateness when the request came
        self._body: bytes | list[bytes] | None = b""  # the body so far (None: over MAX_JSON_BYTES)
        self._body_size = 0

    def emit_received(self, body: bytes | None) -> None:
        """``engine.received``, its attributes read from the body on the emitter's worker
        (``received_event``); a body over ``MAX_DEFERRED_BODY`` is read here, so that what waits
        in the emitter's buffer stays small."""
        self.received = True
        if body is not None and len(body) > MAX_DEFERRED_BODY:
            hop, request_id, ts, attrs = self.received_event(body)
            self.emitter.emit_attrs(hop, request_id, ts, attrs)
        else:
            self.emitter.emit_later(self.received_event, body)

    def received_event(self, body: bytes | None) -> tuple[str, str, float, dict[str, Any]]:
        """The ``engine.received`` event of a request whose body (its first ``MAX_JSON_BYTES``) is ``body``."""
        attrs = request_summary(body) if body else {}
        if self.drop_model:
            attrs.pop("model", None)
        attrs["route"] = self.route
        attrs["attempt"] = self.attempt
        if self.loop_lag is not None:
            attrs["loop_lag_s"] = self.loop_lag
        if self.trace_id is not None:
            attrs["trace_id"] = self.trace_id
        if self.leg is not None:
            attrs["leg"] = self.leg
        return "engine.received", self.request_id, clock.OFFSET + self.entered, attrs

    async def receive(self) -> Message:
        message = await self.upstream()
        try:
            kind = message["type"]
            if kind == "http.request":
                if not self.received:
                    self._tee(message.get("body", b""))
                    if not message.get("more_body", False):
                        body = self._body
                        self.emit_received(b"".join(body) if isinstance(body, list) else body)
            elif kind == "http.disconnect":
                self.on_disconnect()
        except Exception:  # noqa: BLE001 - never into the host
            self.emitter.errors += 1
        return message

    def _tee(self, chunk: bytes) -> None:
        """Keep the body's first ``MAX_JSON_BYTES`` (one part as is; several in a list)."""
        body = self._body
        if body is None or not chunk:
            return
        self._body_size += len(chunk)
        if self._body_size > MAX_JSON_BYTES:
            self._body = None  # too big to parse: attributes stay unknown
        elif not body:
            self._body = chunk
        elif isinstance(body, list):
            body.append(chunk)
        else:
            self._body = [body, chunk]

    def on_start(self, message: Message, t: float) -> None:
        if not self.received:
            self.emit_received(None)
        echo_request_id(message, self.request_id)
        Exchange.on_start(self, message, t)

    def finish(self, exc: BaseException | None) -> None:
        if self.final and self.received:  # the usual end: nothing left to report
            return
        if not self.received:
            try:
                self.emit_received(None)
            except Exception:  # noqa: BLE001 - never into the host
                self.emitter.errors += 1
        Exchange.finish(self, exc)

    def _last_attrs(self, reader: StreamReader) -> dict[str, Any]:
        """(worker side) A stream's ``engine.last_token`` attributes, with ``cpu_wait``: how much of
        the CPU it asked for the engine got lately (``middleware.cpu_wait``; absent off Linux)."""
        attrs = Exchange._last_attrs(self, reader)
        wait = cpu_wait()
        if wait is not None:
            attrs["cpu_wait"] = wait
        return attrs


class EngineMiddleware:
    """Pure ASGI middleware that emits engine hops for generation routes.

    Args:
        app: the engine's ASGI app.
        emitter: where events go; default ``get_emitter()`` (from ``HOPLINE_*``).
        routes: paths to observe; default from ``HOPLINE_ENGINE_ROUTES``.
        attempts: where failover attempts are noted for the vLLM stat logger; default the
            process-wide ``ATTEMPTS`` (the stat logger's default too).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        emitter: Emitter | None = None,
        routes: frozenset[str] | None = None,
        attempts: AttemptRegistry | None = None,
    ) -> None:
        self.app = app
        self.emitter = resolve_emitter(emitter, "EngineMiddleware")
        self.routes = frozenset(routes) if routes is not None else routes_from_env()
        self.attempts = ATTEMPTS if attempts is None else attempts
        if self.emitter is not None:
            try:
                cpu_wait_probe()  # sampling from now, so that the first requests' share is there
            except Exception:  # noqa: BLE001 - never into the host
                self.emitter.errors += 1

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") not in self.routes or self.emitter is None:
            await self.app(scope, receive, send)
            return
        entered = perf_counter()
        try:
            lag = loop_lag()  # read now, on the loop: the request waited for it before reaching us
            # one pass over the headers; a fresh ID is added without filtering (none was there)
            raw_id, raw_attempt, raw_trace, raw_leg = scan_request_headers(scope)
            if raw_id is None:
                request_id = new_request_id()
                scope = with_request_id(scope, request_id, present=False)
            else:
                request_id = adopt_request_id(raw_id, "engine")
                if raw_id != request_id.encode():
                    scope = with_request_id(scope, request_id)
            attempt = 0 if raw_attempt is None else parse_attempt(raw_attempt)  # (the usual: none)
            exchange = EngineExchange(
                self.emitter, request_id, attempt, receive, send, entered, scope["path"]
            )
            exchange.loop_lag = lag
            if raw_trace is not None:
                exchange.trace_id = trace_id_of(raw_trace)
            if raw_leg is None:
                leg = None  # (EngineExchange starts with no leg)
            else:
                exchange.leg = leg = leg_of(raw_leg)
            if attempt or leg is not None:
                # so engine.stats names the failover attempt and the P/D leg
                self.attempts.note(request_id, attempt, leg)
        except Exception:  # noqa: BLE001 - never into the host
            self.emitter.errors += 1
            await self.app(scope, receive, send)
            return
        try:
            await self.app(scope, exchange.receive, exchange.send)
        except BaseException as exc:
            exchange.finish(exc)
            raise
        exchange.finish(None)
