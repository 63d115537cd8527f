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
as they come; nothing is buffered on the response path.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable
from time import perf_counter

from hopline.middleware.asgi import (
    ASGIApp,
    Exchange,
    Message,
    Receive,
    Scope,
    Send,
    adopt_request_id,
    parse_attempt,
    read_request_headers,
    resolve_emitter,
    with_request_id,
)
from hopline.middleware.emit import Emitter
from hopline.middleware.sse import MAX_JSON_BYTES, request_summary

DEFAULT_ROUTES = ("/v1/chat/completions", "/v1/completions")
ROUTES_ENV = "HOPLINE_ENGINE_ROUTES"


def routes_from_env() -> frozenset[str]:
    """``HOPLINE_ENGINE_ROUTES`` as a set of paths (the default generation routes if unset)."""
    raw = os.environ.get(ROUTES_ENV, "")
    routes = [r.strip() for r in raw.split(",") if r.strip()]
    return frozenset(routes or DEFAULT_ROUTES)


class EngineMiddleware:
    """Pure ASGI middleware that emits engine hops for generation routes.

    Args:
        app: the engine's ASGI app.
        emitter: where events go; default ``get_emitter()`` (from ``HOPLINE_*``).
        routes: paths to observe; default from ``HOPLINE_ENGINE_ROUTES``.
    """

    def __init__(self, app: ASGIApp, *, emitter: Emitter | None = None, routes: frozenset[str] | None = None) -> None:
        self.app = app
        self.emitter = resolve_emitter(emitter, "EngineMiddleware")
        self.routes = frozenset(routes) if routes is not None else routes_from_env()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") not in self.routes or self.emitter is None:
            await self.app(scope, receive, send)
            return
        entered = perf_counter()
        try:
            raw_id, raw_attempt = read_request_headers(scope)
            request_id = adopt_request_id(raw_id, "engine")
            if raw_id is None or raw_id != request_id.encode():
                scope = with_request_id(scope, request_id)
            exchange = Exchange(self.emitter, "engine", request_id, parse_attempt(raw_attempt))
        except Exception:
            self.emitter.errors += 1
            await self.app(scope, receive, send)
            return
        route = scope.get("path")
        engine_model = "model" in self.emitter.static
        body_parts: list[bytes] | None = []
        body_size = 0
        received = False

        def emit_received(body: bytes | None) -> None:
            nonlocal received
            received = True
            attrs = request_summary(body) if body else {}
            if engine_model:
                attrs.pop("model", None)  # the engine's own model name wins over the request's
            exchange.emit("engine.received", entered, route=route, **attrs)

        async def observed_receive() -> Message:
            nonlocal body_parts, body_size
            message = await receive()
            try:
                kind = message["type"]
                if kind == "http.request":
                    if not received:
                        chunk = message.get("body", b"")
                        if body_parts is not None and chunk:
                            body_size += len(chunk)
                            if body_size > MAX_JSON_BYTES:
                                body_parts = None  # too big to parse: attributes stay unknown
                            else:
                                body_parts.append(chunk)
                        if not message.get("more_body", False):
                            emit_received(b"".join(body_parts) if body_parts else None)
                elif kind == "http.disconnect":
                    exchange.on_disconnect()
            except Exception:
                exchange.emitter.errors += 1
            return message

        def observed_send(message: Message) -> Awaitable[None]:
            try:
                kind = message["type"]
                if kind == "http.response.body":
                    exchange.on_body(message, perf_counter())
                elif kind == "http.response.start":
                    if not received:
                        emit_received(None)
                    exchange.on_start(message, perf_counter())
            except Exception:
                exchange.emitter.errors += 1
            return send(message)

        def finish(exc: BaseException | None) -> None:
            if not received:
                try:
                    emit_received(None)
                except Exception:
                    exchange.emitter.errors += 1
            exchange.finish(exc)

        try:
            await self.app(scope, observed_receive, observed_send)
        except BaseException as exc:
            finish(exc)
            raise
        finish(None)
