"""The floor for any send wrapper inside vLLM's API server (``bench_vllm_pyspy.py --floor``).

A pure-ASGI middleware that only takes a ``perf_counter`` at the first and at the last body
chunk of every HTTP response and keeps them in locals: no parsing, no events. vLLM loads it with
``--middleware vllm_floor_middleware.FloorMiddleware`` (this folder on ``PYTHONPATH``), next to
hopline's; py-spy's samples in this file are what wrapping ``send`` costs at all.
"""

from __future__ import annotations

from time import perf_counter


class FloorMiddleware:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        marks = [None, None]

        def timed_send(message):
            if message["type"] == "http.response.body":
                if marks[0] is None:
                    marks[0] = perf_counter()
                if not message.get("more_body", False):
                    marks[1] = perf_counter()
            return send(message)

        await self.app(scope, receive, timed_send)
