"""The real LiteLLM proxy in a child process, in front of two hopline-instrumented engines on uvicorn.

The proxy comes from the separate venv ``.ci/litellm-setup.sh`` builds (``$HOPLINE_LITELLM_DIR``,
default ``<repo>/.litellm``; litellm[proxy] 1.106.12). It loads hopline's callback from this
checkout (editable install) and writes its events to a file sink; the engines and the client run
in the test process and write theirs to files beside it, so the analyzer joins all three.

The uvicorn runner and the OpenAI-style fake engine are the shared test helpers (``_shared_helpers``),
not copies.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import orjson
import pytest
from fastapi.responses import JSONResponse
from hopline.middleware.emit import Emitter
from hopline.middleware.engine import EngineMiddleware
from support import events, fakes, servers

REPO = Path(__file__).resolve().parents[2]
LITELLM_DIR = Path(os.environ.get("HOPLINE_LITELLM_DIR", REPO / ".litellm"))
LITELLM_BIN = LITELLM_DIR / "venv" / "bin" / "litellm"
LITELLM_VERSION = "1.106.12"  # the pin in pyproject.toml's `litellm` extra and .ci/litellm-setup.sh
MASTER_KEY = "sk-hopline-test"


# the uvicorn runner, fake engine / gateway and memory emitters every test folder shares
helpers = SimpleNamespace(
    running_server=servers.running_server,
    fake_engine_app=fakes.fake_engine_app,
    fake_gateway_app=fakes.fake_gateway_app,
    memory_emitter=events.memory_emitter,
    events_of=events.events_of,
    one=events.one,
)


class Switchable:
    """An engine app that answers HTTP 500 with an OpenAI error body while ``failing`` is set."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.failing = False
        self.body_rids: dict[str, object] = {}  # X-Request-Id -> the body's ``rid``, of each request

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].endswith("/completions"):
            receive = self._recording(dict(scope["headers"]).get(b"x-request-id", b"").decode(), receive)
        if scope["type"] == "http" and self.failing and scope["path"].endswith("/completions"):
            body = {"error": {"message": "engine down", "type": "InternalServerError", "code": 500}}
            await JSONResponse(body, status_code=500)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _recording(self, request_id: str, receive: Any) -> Any:
        parts: list[bytes] = []

        async def recorded() -> dict:
            message = await receive()
            parts.append(message.get("body", b""))
            if not message.get("more_body"):
                self.body_rids[request_id] = orjson.loads(b"".join(parts) or b"{}").get("rid")
            return message

        return recorded


FIXTURES = Path(__file__).parent / "fixtures"
VLLM_033_STREAM = FIXTURES / "vllm-0.33.0-chat-stream-per-request-metrics.sse"
VLLM_033_BODY = FIXTURES / "vllm-0.33.0-chat-per-request-metrics.json"


def vllm_033_replay_app() -> Any:
    """An engine answering ``/v1/chat/completions`` with vLLM 0.33's bytes (``--enable-per-request-metrics``):
    the fixture stream when the request streams, the fixture body otherwise. Nothing of hopline in it.

    It takes the time its metrics claim: queue + prefill before the first content, the decode
    time spread over the later content events (a faster replay would make ``upstream`` negative).
    """
    stream_bytes, body_bytes = VLLM_033_STREAM.read_bytes(), VLLM_033_BODY.read_bytes()
    events = stream_bytes.split(b"\n\n")[:-1]
    stream_metrics = orjson.loads(events[-2][len(b"data: ") :])["metrics"]
    body_metrics = orjson.loads(body_bytes)["metrics"]
    content = [i for i, e in enumerate(events) if b'"content":"' in e and b'"content":""' not in e]

    def seconds(metrics: dict, *names: str) -> float:
        return sum(metrics[name] for name in names) / 1000

    async def app(scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        streaming = b'"stream":true' in body.replace(b" ", b"")
        kind = b"text/event-stream" if streaming else b"application/json"
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", kind)]})
        if streaming:  # one SSE event per body message, as vLLM's StreamingResponse sends them
            for i, event in enumerate(events):
                if i == content[0]:
                    await asyncio.sleep(seconds(stream_metrics, "queue_time_ms", "time_to_first_token_ms"))
                elif i in content:
                    await asyncio.sleep(seconds(stream_metrics, "generation_time_ms") / (len(content) - 1))
                await send({"type": "http.response.body", "body": event + b"\n\n", "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        else:
            await asyncio.sleep(
                seconds(body_metrics, "queue_time_ms", "time_to_first_token_ms", "generation_time_ms")
            )
            await send({"type": "http.response.body", "body": body_bytes})

    return app


@dataclass
class Proxy:
    url: str
    events_dir: Path
    engines: dict[str, Switchable]
    emitters: list[Emitter]  # the in-process ones (client, engines), flushed before reading files


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(engine_urls: dict[str, str]) -> str:
    """Model ``tiny`` on two deployments: r1 first (order 1), r2 when r1 fails (order 2, LiteLLM's
    order-based fallback); ``tiny-limited`` on r1 at 1 request per minute (a deployment ID of its
    own: LiteLLM counts rpm per deployment ID)."""
    return f"""
model_list:
  - model_name: tiny
    litellm_params: {{model: openai/tiny, api_base: "{engine_urls["r1"]}/v1", api_key: none, order: 1}}
    model_info: {{id: r1}}
  - model_name: tiny
    litellm_params: {{model: openai/tiny, api_base: "{engine_urls["r2"]}/v1", api_key: none, order: 2}}
    model_info: {{id: r2}}
  - model_name: tiny-limited
    litellm_params: {{model: openai/tiny, api_base: "{engine_urls["r1"]}/v1", api_key: none, rpm: 1}}
    model_info: {{id: r1-limited}}
  - model_name: tiny-vllm-0.33
    litellm_params: {{model: openai/tiny, api_base: "{engine_urls["vllm"]}/v1", api_key: none}}
    model_info: {{id: v1}}
litellm_settings:
  callbacks: hopline.middleware.litellm.proxy_handler
router_settings:
  routing_strategy: usage-based-routing-v2
  num_retries: 0
  disable_cooldowns: true
general_settings:
  master_key: {MASTER_KEY}
"""


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"litellm exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url + "/health/liveliness", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"litellm did not become healthy in {timeout} s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="session")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxy]:
    """One proxy for the session (it takes ~20 s to start)."""
    with running_proxy(tmp_path_factory.mktemp("litellm")) as running:
        yield running


@contextlib.contextmanager
def running_proxy(root: Path) -> Iterator[Proxy]:
    """Engines r1, r2 (and the vLLM 0.33 replay) on uvicorn threads, the LiteLLM proxy in a child
    process; every component's events in ``root/events``."""
    assert LITELLM_BIN.exists(), (
        f"no LiteLLM proxy at {LITELLM_BIN}: run `bash .ci/setup` (or .ci/litellm-setup.sh)"
    )
    events = root / "events"
    events.mkdir()
    engines = {name: Switchable(helpers.fake_engine_app()) for name in ("r1", "r2")}
    emitters = [
        Emitter(
            f"file:{events}/engine-{name}.ndjson",
            service="engine",
            replica=name,
            model="tiny",
            flush_interval=0.02,
        )
        for name in engines
    ]
    with (
        helpers.running_server(EngineMiddleware(engines["r1"], emitter=emitters[0])) as r1,
        helpers.running_server(EngineMiddleware(engines["r2"], emitter=emitters[1])) as r2,
        helpers.running_server(vllm_033_replay_app()) as vllm,
    ):
        config = root / "config.yaml"
        config.write_text(_config({"r1": r1, "r2": r2, "vllm": vllm}))
        port = _free_port()
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("HOPLINE_")},
            "HOPLINE_SINK": f"file:{events}/litellm.ndjson",
            "HOPLINE_SERVICE": "litellm",
            "HOPLINE_REPLICA": "gw-0",
            "HOPLINE_REQUEST_ID_BODY_FIELD": "rid",  # the opt-in for engines like SGLang (body ``rid``)
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # the wheel's own cost map: no fetch from the internet
            "LITELLM_DETAILED_TIMING": "true",  # x-litellm-timing-*-ms headers (test_litellm_timing.py)
            "NO_PROXY": "127.0.0.1,localhost",
        }
        log = root / "litellm.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [str(LITELLM_BIN), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=root,
            )
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_healthy(url, proc, log)
            yield Proxy(url, events, engines, emitters)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    for emitter in emitters:
        emitter.close()
