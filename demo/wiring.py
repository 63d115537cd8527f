"""Where the demo's simulated services meet hopline: the only module that imports its middleware.

Each demo component is instrumented exactly as a user would instrument a real one: an
``Emitter`` with an HTTP sink pointing at the collector, the engine and gateway ASGI middleware
around the apps, and hopline's httpx transport under the OpenAI SDK's client.
"""

from __future__ import annotations

import socket
from typing import Any

import httpx
import uvicorn
from hopline.middleware.emit import Emitter

ASGIApp = Any


# The demo's warm-up requests (before the measured run: caches and connections warm up) carry
# request IDs with this prefix, and no demo component records them: the stored events are the
# run itself, so ``hopline analyze OUT`` sees exactly what the demo analysed.
WARMUP_PREFIX = "warmup-"


class DemoEmitter(Emitter):
    """hopline's emitter, minus the events of the demo's warm-up requests: at its two funnels,
    ``emit_attrs`` (``emit`` and the middlewares' events) and ``_built`` (``emit_later``'s
    events, built on the worker)."""

    def emit_attrs(self, hop: str, request_id: str, ts: float | None, attrs: dict[str, Any]) -> None:
        if not request_id.startswith(WARMUP_PREFIX):
            super().emit_attrs(hop, request_id, ts, attrs)

    def _built(self, item: tuple[Any, ...]) -> dict[str, Any] | None:
        event = super()._built(item)
        return None if event is None or event["request_id"].startswith(WARMUP_PREFIX) else event


def make_emitter(
    sink: str | None, *, service: str, replica: str | None = None, model: str | None = None
) -> Emitter:
    """An emitter for one demo component (``sink`` None: events are kept in memory)."""
    return DemoEmitter(sink or "memory", service=service, replica=replica, model=model)


def engine_middleware(app: ASGIApp, emitter: Emitter) -> ASGIApp:
    from hopline.middleware.engine import EngineMiddleware

    return EngineMiddleware(app, emitter=emitter)


def gateway_middleware(app: ASGIApp, emitter: Emitter) -> ASGIApp:
    from hopline.middleware.gateway import GatewayMiddleware

    return GatewayMiddleware(app, emitter=emitter)


def gateway_hops(request: Any) -> Any:
    """The per-request hop recorder the gateway middleware attached (``admitted``, ``forwarded``)."""
    from hopline.middleware.gateway import hops

    return hops(request)


def instrument_client(client: httpx.AsyncClient, *, emitter: Emitter, service: str) -> httpx.AsyncClient:
    """Put hopline's client transport under ``client`` (what ``openai.AsyncOpenAI(http_client=…)`` gets)."""
    from hopline.middleware.client import instrument

    return instrument(client, emitter=emitter, service=service)


def serve(
    app: ASGIApp, sock: socket.socket, *, certfile: str | None = None, keyfile: str | None = None
) -> None:
    """Run ``app`` with uvicorn on an already listening socket until SIGTERM / SIGINT."""
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="on",
        ssl_certfile=certfile,
        ssl_keyfile=keyfile,
        timeout_graceful_shutdown=3,
        timeout_keep_alive=75,  # as nginx: clients' idle pooled connections stay usable
    )
    uvicorn.Server(config).run(sockets=[sock])
