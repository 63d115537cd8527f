"""Gateway hops: ``GatewayMiddleware`` (pure ASGI) plus ``hops(request)`` for the gateway's own code.

    app.add_middleware(GatewayMiddleware)

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        h = hops(request)
        ...auth, rate limit...
        h.admitted()
        for replica in replicas:                      # failover: one call per upstream attempt
            headers = h.forwarded(replica.name)       # emits gateway.forwarded, returns the headers
            ...send the request upstream with headers...

The middleware emits ``gateway.received`` when the request line and headers arrive (with
``loop_lag_s``, how late the gateway's event loop ran lately: ``hopline.middleware.loop``; time a
request waited for a busy loop before the middleware saw it is the gateway's, not the network's),
``gateway.first_token`` / ``gateway.last_token`` from the response it relays (same SSE rule as the
client and the engine), ``gateway.rejected`` for 401/403/429, and ``gateway.error`` for other
4xx/5xx responses, an exception in the app (re-raised unchanged) or a client that went away.

It owns the request ID: a valid incoming ``X-Request-Id`` is kept, a missing or hostile one (over 64
characters, bad characters) is replaced by a fresh ID (the original is never logged). The handler
sees the ID in ``request.headers["x-request-id"]`` and the response echoes it.
"""

from __future__ import annotations

from typing import Any

from hopline.middleware.asgi import (
    ASGIApp,
    Exchange,
    Message,
    Receive,
    Scope,
    Send,
    adopt_request_id,
    echo_request_id,
    parse_attempt,
    read_request_headers,
    traceparent_in,
    resolve_emitter,
    with_request_id,
)
from hopline.middleware.contract.events import LEGS
from hopline.middleware.emit import Emitter, get_emitter
from hopline.middleware.log import logger
from hopline.middleware.loop import loop_lag

REJECTED_STATUSES = frozenset({401, 403, 429})
SKIP_PATHS = frozenset({"/health", "/healthz", "/ready", "/readyz", "/livez", "/metrics"})
STATE_KEY = "hopline"


class GatewayHops:
    """One request's gateway hops, as the gateway's handler marks them.

    ``request_id``: the request's ID (also in the scope's ``x-request-id`` header).
    ``attempt``: the current upstream attempt: the incoming ``X-Hopline-Attempt`` (or 0) until the
    first ``forwarded()``, then the attempt that call announced.
    """

    __slots__ = ("_base_attempt", "_exchange", "_forwards", "_legs", "_traceparent")

    def __init__(self, exchange: Exchange, traceparent: str | None = None) -> None:
        self._exchange = exchange
        self._traceparent = traceparent
        self._forwards = 0
        self._legs: dict[str, int] | None = None  # P/D: forwards per leg
        self._base_attempt = exchange.attempt

    @property
    def request_id(self) -> str:
        return self._exchange.request_id

    @property
    def attempt(self) -> int:
        return self._exchange.attempt

    def admitted(self) -> None:
        """Emit ``gateway.admitted``: authentication and rate limiting let the request through."""
        self._exchange.emit("gateway.admitted")

    def forwarded(self, upstream: str, leg: str | None = None) -> dict[str, str]:
        """Emit ``gateway.forwarded`` for the next upstream attempt; return the headers to send.

        Args:
            upstream: the engine replica's name (not its URL: it becomes a bounded label).
            leg: in a disaggregated prefill/decode proxy, the leg this call sends: ``"prefill"``
                (to the prefill instance), then ``"decode"`` (to the decode instance, which
                streams the answer). Both legs are one attempt; calling again for a leg (a retry
                of it) is the next attempt.

        The first call uses the incoming attempt (or 0); each later call (failover) adds one. The
        returned ``X-Request-Id`` and ``X-Hopline-Attempt`` headers (and ``X-Hopline-Leg``) let
        the engine's hops join.
        """
        exchange = self._exchange
        attrs = {"upstream": str(upstream)[:256]}
        if leg is None:
            exchange.attempt = self._base_attempt + self._forwards
            self._forwards += 1
        else:
            if leg not in LEGS:
                raise ValueError(f"leg must be one of {', '.join(LEGS)}, got {leg!r}")
            legs = self._legs = self._legs or {}
            exchange.attempt = self._base_attempt + legs.get(leg, 0)
            legs[leg] = legs.get(leg, 0) + 1
            attrs["leg"] = leg
        exchange.emit("gateway.forwarded", **attrs)
        headers = {"X-Request-Id": exchange.request_id, "X-Hopline-Attempt": str(exchange.attempt)}
        if leg is not None:
            headers["X-Hopline-Leg"] = leg
        if self._traceparent is not None:  # the engine's span stays in the caller's trace
            headers["traceparent"] = self._traceparent
        return headers


def hops(request: Any) -> GatewayHops:
    """The ``GatewayHops`` of a request: a Starlette ``Request`` or an ASGI scope.

    Without ``GatewayMiddleware`` in front (a wiring mistake), a detached ``GatewayHops`` is made
    from the request's headers so that the handler still works; it has no ``gateway.received``.
    """
    scope = getattr(request, "scope", request)
    state = scope.setdefault("state", {})
    found = state.get(STATE_KEY)
    if isinstance(found, GatewayHops):
        return found
    logger.warning("gateway_hops_without_middleware", hint="add GatewayMiddleware to the gateway app")
    raw_id, raw_attempt = read_request_headers(scope)
    exchange = Exchange(get_emitter(), "gateway", adopt_request_id(raw_id, "gateway"), parse_attempt(raw_attempt))
    found = state[STATE_KEY] = GatewayHops(exchange)
    return found


class GatewayExchange(Exchange):
    """The gateway's ``Exchange``: its ``send`` (inherited, given to the app as is) also echoes the
    request ID on the response's headers. A streamed chunk takes ``Exchange.send``'s per-chunk
    path directly, with no closure around it."""

    __slots__ = ()

    def on_start(self, message: Message, t: float) -> None:
        echo_request_id(message, self.request_id)
        super().on_start(message, t)


class GatewayMiddleware:
    """Pure ASGI middleware for an LLM gateway (see the module docstring).

    Args:
        app: the gateway's ASGI app.
        emitter: where events go; default ``get_emitter()`` (from ``HOPLINE_*``).
        rejected_statuses: response statuses reported as ``gateway.rejected``.
        skip_paths: paths passed straight through, unobserved (health checks and scrapes are
            not requests anyone waits for).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        emitter: Emitter | None = None,
        rejected_statuses: frozenset[int] = REJECTED_STATUSES,
        skip_paths: frozenset[str] = SKIP_PATHS,
    ) -> None:
        self.app = app
        self.emitter = resolve_emitter(emitter, "GatewayMiddleware")
        self.rejected_statuses = frozenset(rejected_statuses)
        self.skip_paths = frozenset(skip_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self.emitter is None or scope.get("path") in self.skip_paths:
            await self.app(scope, receive, send)
            return
        try:
            lag = loop_lag()  # read now, on the loop: the request waited for it before reaching us
            raw_id, raw_attempt = read_request_headers(scope)
            request_id = adopt_request_id(raw_id, "gateway")
            if raw_id is None or raw_id != request_id.encode():
                scope = with_request_id(scope, request_id)
            exchange = GatewayExchange(
                self.emitter,
                "gateway",
                request_id,
                parse_attempt(raw_attempt),
                rejected=self.rejected_statuses,
                downstream=send,
            )
            traceparent, exchange.trace_id = traceparent_in(scope)
            if lag is None:  # no asyncio loop (trio)
                exchange.emit("gateway.received")
            else:
                exchange.emit("gateway.received", loop_lag_s=lag)
            scope.setdefault("state", {})[STATE_KEY] = GatewayHops(exchange, traceparent)
        except Exception:
            self.emitter.errors += 1
            await self.app(scope, receive, send)
            return

        async def observed_receive() -> Message:
            message = await receive()
            if message.get("type") == "http.disconnect":
                exchange.on_disconnect()
            return message

        try:
            await self.app(scope, observed_receive, exchange.send)
        except BaseException as exc:
            exchange.finish(exc)
            raise
        exchange.finish(None)
