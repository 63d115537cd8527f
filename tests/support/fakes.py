"""Fakes for the middleware tests: an engine that streams like vLLM, and a gateway that fails over.

* ``fake_engine_app()``: ``/v1/chat/completions`` + ``/v1/completions`` + ``/health``, streaming
  like vLLM (role chunk, N content chunks, finish chunk, usage chunk, ``[DONE]``); the
  ``x-fake-mode`` request header selects ``error_in_stream``, ``fail_once``, ``slow``, ``body_digest``.
* ``fake_gateway_app(upstreams, emitter, verify)``: a FastAPI gateway that authenticates, marks
  ``hops(request)``, fails over across upstreams and relays the engine's stream with httpx.
"""

from __future__ import annotations

import asyncio
import hashlib
import ssl
from typing import Any

import httpx
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from hopline.middleware.emit import Emitter
from hopline.middleware.gateway import GatewayMiddleware, hops

# --- a fake OpenAI-compatible engine -------------------------------------------------------------

PROMPT_TOKENS = 7


def _chunk(
    cid: str, model: str, delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any
) -> bytes:
    obj: dict[str, Any] = {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": model,
        "choices": []
        if delta is None
        else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
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
            return JSONResponse(
                {"size": len(raw), "sha256": hashlib.sha256(raw).hexdigest(), "request_id": rid}
            )
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
        usage = {
            "prompt_tokens": PROMPT_TOKENS,
            "completion_tokens": n_tokens,
            "total_tokens": PROMPT_TOKENS + n_tokens,
        }
        if not body.get("stream"):
            return JSONResponse(
                {
                    "id": cid,
                    "object": "chat.completion",
                    "model": model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "x " * n_tokens},
                            "finish_reason": "length",
                        }
                    ],
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
            req = upstream_client.build_request(
                "POST", base + "/v1/chat/completions", content=body, headers=headers
            )
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
