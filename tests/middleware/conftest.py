"""Real servers for middleware tests: uvicorn on 127.0.0.1 in a thread, TLS from a local CA, a fake engine.

Reusable pieces (fixtures, and plain helpers other test modules call):

* ``running_server(app, tls=None)``: a context manager serving an ASGI app on a free port; yields
  its base URL (``https://`` when given a ``ServerTLS``).
* ``tls`` fixture: a ``ServerTLS`` (trustme CA, certificate for 127.0.0.1, client SSL context).
* ``fake_engine_app()``: an OpenAI-style ``/v1/chat/completions`` + ``/v1/completions`` + ``/health``
  app that streams like vLLM (role chunk, N content chunks, finish chunk, usage chunk, ``[DONE]``);
  the ``x-fake-mode`` request header selects ``error_in_stream``, ``fail_once``, ``slow``,
  ``body_digest``.
* ``fake_gateway_app(upstreams, emitter, verify)``: a FastAPI gateway that authenticates, marks
  ``hops(request)``, fails over across upstreams and relays the engine's stream with httpx.
* ``memory_emitter(**static)`` / ``wait_for(emitter, predicate)``: events collected in memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import orjson
import pytest
import trustme
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from hopline.middleware.emit import Emitter
from hopline.middleware.gateway import GatewayMiddleware, hops
from hopline.middleware.sinks import MemorySink


# --- servers ------------------------------------------------------------------------------------


@dataclass
class ServerTLS:
    """A certificate for 127.0.0.1 signed by a throwaway CA, and an SSL context trusting that CA."""

    certfile: str  # private key + certificate chain, PEM
    client_context: ssl.SSLContext


def make_server_tls(directory: Path) -> ServerTLS:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    path = directory / "server.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(path))
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return ServerTLS(str(path), context)


@pytest.fixture(scope="session")
def tls() -> Iterator[ServerTLS]:
    with tempfile.TemporaryDirectory() as tmp:
        yield make_server_tls(Path(tmp))


@contextlib.contextmanager
def running_server(app: Any, tls: ServerTLS | None = None) -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free 127.0.0.1 port in a thread; yield its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        log_level="warning",
        lifespan="off",
        ssl_certfile=tls.certfile if tls else None,
        timeout_graceful_shutdown=2,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def closed_port_url() -> str:
    """An http:// URL on which nothing listens (the port was just free)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# --- events -------------------------------------------------------------------------------------


def memory_emitter(**static: str) -> Emitter:
    return Emitter(MemorySink(), flush_interval=0.02, **static)


def events_of(emitter: Emitter) -> list[dict[str, Any]]:
    emitter.flush()
    return list(emitter.sink.events)  # type: ignore[attr-defined]


def wait_for(emitter: Emitter, predicate: Callable[[list[dict[str, Any]]], bool], timeout: float = 5.0) -> list[dict[str, Any]]:
    """The emitter's events once ``predicate`` holds for them (AssertionError after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        events = events_of(emitter)
        if predicate(events):
            return events
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met; events: {[(e['hop'], e.get('error')) for e in events]}")
        time.sleep(0.02)


def hops_of(events: list[dict[str, Any]], request_id: str | None = None) -> list[str]:
    """Hop names in timestamp order (of one request when ``request_id`` is given)."""
    chosen = [e for e in events if request_id is None or e["request_id"] == request_id]
    return [e["hop"] for e in sorted(chosen, key=lambda e: e["ts"])]


def one(events: list[dict[str, Any]], hop: str, **match: Any) -> dict[str, Any]:
    found = [e for e in events if e["hop"] == hop and all(e.get(k) == v for k, v in match.items())]
    assert len(found) == 1, f"expected one {hop} {match}, got {len(found)}: {[e['hop'] for e in events]}"
    return found[0]


# --- a fake OpenAI-compatible engine -------------------------------------------------------------

PROMPT_TOKENS = 7


def _chunk(cid: str, model: str, delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> bytes:
    obj: dict[str, Any] = {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": model,
        "choices": [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        **extra,
    }
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def fake_engine_app() -> FastAPI:
    """An engine that answers like vLLM; ``x-fake-mode`` picks a misbehaviour (see module doc)."""
    app = FastAPI()
    failed_once: set[str] = set()

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    async def generate(request: Request) -> Response:
        raw = await request.body()
        mode = request.headers.get("x-fake-mode", "")
        rid = request.headers.get("x-request-id", "none")
        if mode == "body_digest":
            return JSONResponse({"size": len(raw), "sha256": hashlib.sha256(raw).hexdigest(), "request_id": rid})
        body = orjson.loads(raw)
        if mode == "fail_once" and rid not in failed_once:
            failed_once.add(rid)
            return JSONResponse(
                {"error": {"message": "overloaded", "type": "InternalServerError", "code": 500}},
                status_code=500,
                headers={"retry-after-ms": "1"},
            )
        n_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or 5
        model = body.get("model", "tiny")
        cid = f"chatcmpl-{rid}"
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        usage = {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": n_tokens, "total_tokens": PROMPT_TOKENS + n_tokens}
        if not body.get("stream"):
            return JSONResponse(
                {
                    "id": cid,
                    "object": "chat.completion",
                    "model": model,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": "x " * n_tokens}, "finish_reason": "length"}],
                    "usage": usage,
                }
            )

        async def stream():
            yield _chunk(cid, model, {"role": "assistant", "content": ""})
            for i in range(n_tokens):
                if mode == "slow":
                    await asyncio.sleep(0.05)
                if mode == "error_in_stream" and i == 2:
                    err = {"error": {"message": "engine died", "type": "InternalServerError", "code": 500}}
                    yield b"data: " + orjson.dumps(err) + b"\n\n"
                    yield b"data: [DONE]\n\n"
                    return
                yield _chunk(cid, model, {"content": f"tok{i} "})
            yield _chunk(cid, model, {}, finish="length")
            if include_usage:
                yield _chunk(cid, model, None, usage=usage)
            yield b"data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    app.post("/v1/chat/completions")(generate)
    app.post("/v1/completions")(generate)
    return app


# --- a fake gateway -----------------------------------------------------------------------------

RELAYED_HEADERS = ("content-type", "x-fake-mode")


def fake_gateway_app(
    upstreams: list[tuple[str, str]], emitter: Emitter, verify: ssl.SSLContext | bool = True
) -> FastAPI:
    """A gateway: 401 for ``Bearer bad``, 429 for ``x-fake-limit``, then failover across ``upstreams``
    (replica name, base URL) and relay of the upstream response as it streams."""
    app = FastAPI()
    app.add_middleware(GatewayMiddleware, emitter=emitter)
    upstream_client = httpx.AsyncClient(verify=verify, timeout=10)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        h = hops(request)
        assert request.headers["x-request-id"] == h.request_id  # the handler sees the ID
        if request.headers.get("authorization") == "Bearer bad":
            return JSONResponse({"error": {"type": "auth"}}, status_code=401)
        if request.headers.get("x-fake-limit"):
            return JSONResponse({"error": {"type": "rate_limit"}}, status_code=429)
        h.admitted()
        body = await request.body()
        relayed = {k: v for k, v in request.headers.items() if k in RELAYED_HEADERS}
        for name, base in upstreams:
            headers = {**relayed, **h.forwarded(name)}
            req = upstream_client.build_request("POST", base + "/v1/chat/completions", content=body, headers=headers)
            try:
                upstream = await upstream_client.send(req, stream=True)
            except httpx.ConnectError:
                continue
            break
        else:
            return JSONResponse({"error": {"type": "no_upstream"}}, status_code=502)

        async def relay():
            try:
                async for chunk in upstream.aiter_raw():
                    yield chunk
            finally:
                await upstream.aclose()

        passed = {k: v for k, v in upstream.headers.items() if k == "retry-after-ms"}
        return StreamingResponse(
            relay(),
            status_code=upstream.status_code,
            media_type=upstream.headers.get("content-type"),
            headers=passed,
        )

    @app.post("/boom")
    async def boom(request: Request) -> Response:
        hops(request).admitted()
        raise RuntimeError("gateway bug")

    return app


@pytest.fixture(scope="session")
def mw() -> SimpleNamespace:
    """The helpers above for test modules (a conftest is not imported by name: several may exist)."""
    return SimpleNamespace(
        running_server=running_server,
        closed_port_url=closed_port_url,
        memory_emitter=memory_emitter,
        events_of=events_of,
        wait_for=wait_for,
        hops_of=hops_of,
        one=one,
        fake_engine_app=fake_engine_app,
        fake_gateway_app=fake_gateway_app,
        PROMPT_TOKENS=PROMPT_TOKENS,
    )
