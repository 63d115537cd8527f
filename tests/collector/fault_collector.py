"""A real collector behind a fault injector: healthy, answering 500, or answering only after a delay.

Used by the sink-fault test (test_collector_sink_faults.py, in-process) and by
bench/bench_sink_faults.py (as a process: ``python tests/collector/fault_collector.py --port P
--data-dir D [--mode error]``). A collector that is *down* needs no injector: nothing listens.
``POST /_faults/{mode}`` (``ok``, ``error``, ``slow``) switches the mode of a running one.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

MODES = ("ok", "error", "slow")


class FaultInjector:
    """Pure ASGI: in ``error`` mode ``POST /v1/events`` is answered 500 without reaching the
    collector; in ``slow`` mode every ingest waits ``delay_s`` first; ``ok`` passes through."""

    def __init__(self, app: Any, mode: str = "ok", delay_s: float = 5.0) -> None:
        self.app = app
        self.mode = mode
        self.delay_s = delay_s

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            if path.startswith("/_faults/") and path.removeprefix("/_faults/") in MODES:
                self.mode = path.removeprefix("/_faults/")
                await _answer(send, 200, self.mode.encode())
                return
            if path == "/v1/events" and self.mode == "error":
                await _answer(send, 500, b"injected fault")
                return
            if path == "/v1/events" and self.mode == "slow":
                await asyncio.sleep(self.delay_s)
        await self.app(scope, receive, send)


async def _answer(send: Any, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    import uvicorn
    from hopline.collector.app import create_app
    from hopline.collector.config import CollectorConfig

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--mode", choices=MODES, default="ok")
    parser.add_argument("--delay", type=float, default=5.0)
    args = parser.parse_args()
    app = FaultInjector(create_app(CollectorConfig(data_dir=args.data_dir, grace=0.0)), args.mode, args.delay)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
