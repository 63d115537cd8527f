"""A prefill/decode (P/D) disaggregation proxy with hopline's gateway middleware in it.

Its legs are those of vLLM's own P/D proxies (vllm-project/vllm,
``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py`` at 030ea52e and
``benchmarks/disagg_benchmarks/disagg_prefill_proxy_server.py`` at 03b32f5a): the client's request
goes to the prefill instance as a non-streaming call with ``max_tokens`` 1 (``stream_options``
dropped), is waited for, then goes unchanged to the decode instance, whose stream is relayed as
it comes. Both legs carry the same ``X-Request-Id``. With a KV connector on both instances the
decode instance loads the prompt's KV that the prefill instance computed instead of computing it
again (vLLM's ``ExampleConnector``: through files in a shared folder, keyed by the prompt's tokens).

hopline's part, as a gateway's handler does it: ``GatewayMiddleware`` around the app, and one
``hops(request).forwarded(replica, leg=...)`` per leg, whose headers go with that leg. With
``legs=False`` the proxy calls ``forwarded(replica)`` as a gateway without P/D support would: the
decode leg is then read as a second attempt of the request.
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from hopline.middleware.emit import Emitter
from hopline.middleware.gateway import GatewayHops, GatewayMiddleware, hops
from starlette.background import BackgroundTask


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    """The prefill leg's body: one output token, not streamed."""
    leg = {
        k: v for k, v in body.items() if k not in ("stream_options", "min_tokens", "min_completion_tokens")
    }
    leg.update(stream=False, max_tokens=1)
    if "max_completion_tokens" in leg:
        leg["max_completion_tokens"] = 1
    return leg


def pd_proxy_app(
    prefill: tuple[str, str], decode: tuple[str, str], emitter: Emitter, *, legs: bool = True
) -> FastAPI:
    """The proxy for one prefill and one decode instance, each ``(replica name, base URL)``."""
    app = FastAPI()
    app.add_middleware(GatewayMiddleware, emitter=emitter)
    upstream = httpx.AsyncClient(timeout=120)

    def forward(h: GatewayHops, replica: str, leg: str) -> dict[str, str]:
        return h.forwarded(replica, leg=leg) if legs else h.forwarded(replica)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        h = hops(request)
        h.admitted()
        body = orjson.loads(await request.body())
        (p_name, p_url), (d_name, d_url) = prefill, decode
        done = await upstream.post(
            p_url + "/v1/chat/completions", json=prefill_body(body), headers=forward(h, p_name, "prefill")
        )
        if done.status_code != 200:
            return JSONResponse(
                {"error": {"type": "prefill_failed", "status": done.status_code}}, status_code=502
            )
        req = upstream.build_request(
            "POST", d_url + "/v1/chat/completions", json=body, headers=forward(h, d_name, "decode")
        )
        answer = await upstream.send(req, stream=True)

        kind = answer.headers.get("content-type")
        return StreamingResponse(
            answer.aiter_raw(), answer.status_code, media_type=kind, background=BackgroundTask(answer.aclose)
        )

    return app
