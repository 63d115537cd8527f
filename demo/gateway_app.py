"""The demo's API gateway: API keys, a token-bucket rate limit, conversation affinity, failover.

A request is admitted when its ``Authorization: Bearer`` key is known and the key's token bucket
has a token (else 401 / 429). It is then routed by conversation (the body's ``user`` field or an
``X-Conversation-Id`` header): to the replica that served that conversation before, whose prefix
cache still holds it, or, for a new conversation, to the conversation's home replica by
rendezvous hashing (stable, and even across replicas). If that replica fails (connection error or
a 5xx before any byte is relayed) the request fails over to the next one as a new attempt. The
response is relayed chunk by chunk with httpx, never buffered.

    python -m hopline.demo.gateway_app --upstream r1=http://127.0.0.1:8001 \\
        --upstream r2=http://127.0.0.1:8002 --keys '{"sk-demo": [50, 100]}' --port-file gw.port \\
        --certfile cert.pem --keyfile key.pem --sink http://127.0.0.1:9000
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from hopline.demo.wiring import gateway_hops
from starlette.background import BackgroundTask

RELAYED_HEADERS = ("content-type",)


def home_replica(conversation: str, replicas: list[str]) -> str:
    """Rendezvous hashing: the replica with the highest hash of (conversation, replica)."""
    return max(
        replicas,
        key=lambda name: hashlib.blake2b(f"{conversation}\x00{name}".encode(), digest_size=8).digest(),
    )


@dataclass
class TokenBucket:
    """``rate`` requests per second on average, bursts of up to ``burst``."""

    rate: float
    burst: float
    tokens: float = field(init=False)
    stamp: float = field(init=False, default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.tokens = self.burst

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


class Router:
    """Orders replicas for a conversation: the one that served it last, then the others."""

    def __init__(self, replicas: list[str], capacity: int = 100_000) -> None:
        self.replicas = replicas
        self.capacity = capacity
        self.affinity: OrderedDict[str, str] = OrderedDict()

    def order(self, conversation: str) -> list[str]:
        first = self.affinity.get(conversation) or home_replica(conversation, self.replicas)
        return [first] + [name for name in self.replicas if name != first]

    def served(self, conversation: str, replica: str) -> None:
        self.affinity[conversation] = replica
        self.affinity.move_to_end(conversation)
        if len(self.affinity) > self.capacity:
            self.affinity.popitem(last=False)


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)


def create_app(upstreams: Mapping[str, str], keys: Mapping[str, tuple[float, float]]) -> FastAPI:
    """The gateway app (hopline's gateway middleware is added by ``main``).

    ``upstreams``: replica name -> base URL. ``keys``: API key -> (rate per second, burst).
    """
    router = Router(list(upstreams))
    buckets = {key: TokenBucket(rate, burst) for key, (rate, burst) in keys.items()}
    client = httpx.AsyncClient(
        timeout=httpx.Timeout(120.0, connect=2.0),
        limits=httpx.Limits(max_connections=500, max_keepalive_connections=200),
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await client.aclose()

    app = FastAPI(title="hopline demo gateway", lifespan=lifespan)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        h = gateway_hops(request)
        auth = request.headers.get("authorization", "")
        bucket = buckets.get(auth.removeprefix("Bearer ").strip())
        if bucket is None:
            return _error(401, "unknown API key", "authentication_error")
        if not bucket.take():
            return _error(429, "rate limit exceeded for this API key", "rate_limit_error")
        h.admitted()
        body = await request.body()
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError:
            return _error(400, "body is not JSON", "invalid_request_error")
        conversation = str(request.headers.get("x-conversation-id") or payload.get("user") or h.request_id)
        failure = "no replica configured"
        for replica in router.order(conversation):
            headers = {"content-type": "application/json", **h.forwarded(replica)}
            upstream = client.build_request(
                "POST", f"{upstreams[replica]}/v1/chat/completions", content=body, headers=headers
            )
            try:
                response = await client.send(upstream, stream=True)
            except httpx.TransportError as exc:
                failure = f"{replica}: {type(exc).__name__}"
                continue
            if response.status_code >= 500:
                failure = f"{replica}: HTTP {response.status_code}"
                await response.aclose()
                continue
            router.served(conversation, replica)
            return StreamingResponse(
                response.aiter_raw(),
                status_code=response.status_code,
                headers={k: v for k in RELAYED_HEADERS if (v := response.headers.get(k))},
                background=BackgroundTask(response.aclose),
            )
        return _error(502, f"no engine replica answered ({failure})", "upstream_error")

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"replicas": router.replicas, "conversations": len(router.affinity)}

    return app


def main(argv: list[str] | None = None) -> None:
    from hopline.demo.process import announce_port, listening_socket, watch_parent
    from hopline.demo.wiring import gateway_middleware, make_emitter, serve

    parser = argparse.ArgumentParser(description="hopline demo gateway.")
    parser.add_argument("--upstream", action="append", required=True, help="NAME=URL of an engine replica")
    parser.add_argument("--keys", required=True, help='API keys as JSON: {"key": [rate_per_s, burst]}')
    parser.add_argument("--sink", help="hopline event sink, e.g. http://127.0.0.1:9000")
    parser.add_argument("--port-file", type=Path, required=True)
    parser.add_argument("--certfile")
    parser.add_argument("--keyfile")
    args = parser.parse_args(argv)
    watch_parent()
    upstreams = dict(item.split("=", 1) for item in args.upstream)
    keys = {key: (float(rate), float(burst)) for key, (rate, burst) in orjson.loads(args.keys).items()}
    emitter = make_emitter(args.sink, service="gateway", replica="gw-0")
    app = create_app(upstreams, keys)
    observed = gateway_middleware(app, emitter)

    async def health_unobserved(scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Health checks (the clients' pool warm-up, load balancers) are not LLM requests: no hops."""
        await (app if scope["type"] == "http" and scope["path"] == "/health" else observed)(
            scope, receive, send
        )

    sock = listening_socket()
    announce_port(args.port_file, sock.getsockname()[1])
    serve(health_unobserved, sock, certfile=args.certfile, keyfile=args.keyfile)


if __name__ == "__main__":
    main()
