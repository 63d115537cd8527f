"""Run by test_litellm_callback.py with the LiteLLM venv's Python: the callback fed hostile input.

Prints one JSON object: what each hook returned or raised, the events emitted, the error count.
"""

from __future__ import annotations

import asyncio
import json

from hopline.middleware.emit import Emitter
from hopline.middleware.litellm import MAX_OPEN, HoplineLogger
from hopline.middleware.sinks import MemorySink


class Weird(Exception):
    status_code = "not a number"


class Exploding(dict):
    """A mapping whose every lookup fails, as a LiteLLM internal change might hand over."""

    def get(self, *args, **kwargs):
        raise RuntimeError("boom")


async def stream(items):
    for item in items:
        yield item


async def main() -> dict:
    emitter = Emitter(MemorySink(), flush_interval=0.01)
    logger = HoplineLogger(emitter)
    raised = []
    calls = [
        ("pre_call", logger.async_pre_call_hook(None, None, Exploding(), "acompletion")),
        (
            "pre_call_bad_types",
            logger.async_pre_call_hook(
                None, None, {"proxy_server_request": "x", "metadata": 3, "litellm_call_id": 5}, "acompletion"
            ),
        ),
        ("deployment", logger.async_pre_call_deployment_hook(Exploding(), None)),
        ("success", logger.async_post_call_success_hook(Exploding(), None, object())),
        ("failure", logger.async_post_call_failure_hook({"litellm_call_id": "f1"}, Weird(), None)),
    ]
    results = {}
    for name, coro in calls:
        try:
            results[name] = repr(await coro)
        except Exception as exc:  # noqa: BLE001 - what the test checks never happens
            raised.append(f"{name}: {exc!r}")
    relayed = [
        item
        async for item in logger.async_post_call_streaming_iterator_hook(
            None, stream([1, None, "x"]), Exploding()
        )
    ]
    # the request table stays bounded whatever never finishes
    for i in range(MAX_OPEN + 50):
        await logger.async_pre_call_hook(None, None, {"litellm_call_id": f"open-{i}"}, "acompletion")
    emitter.flush()
    events = [
        e
        for e in emitter.sink.events
        if not e["request_id"].startswith("open-") or e["hop"] != "gateway.received"
    ]
    return {
        "raised": raised,
        "results": results,
        "relayed": relayed,
        "errors": emitter.errors,
        "open": len(logger._open),
        "events": events,
    }


print(json.dumps(asyncio.run(main()), default=str))
