"""What a request costs the engine middleware regardless of its length, in instructions under
callgrind (issue 39).

bench/asgi_instructions.py --per-request runs a raw ASGI app (no Starlette) streaming one content
chunk (role, content, finish, usage, ``[DONE]``), alone and in ``EngineMiddleware`` with the null
sink, for 100 and 600 requests, and takes the difference per request: the request path and the
emitter worker's deferred builds, eids and reading of the last chunks together. It was 297.5-297.9k
before the cuts of 2026-12-05 and is 252.3-254.8k since (bench/README.md, "asgi: the engine
middleware's per-request fixed cost, cut"); the bound leaves a tenth of margin and fails on the
code before.
"""

from __future__ import annotations

from support.callgrind import bench_figures

MAX_PER_REQUEST = 280_000


def test_a_request_costs_under_280k_instructions_whatever_its_length():
    figures = bench_figures("asgi_instructions.py", "--per-request")
    # the raw app's own cost per request (the fake server, asyncio): a sanity check of the harness
    assert 10_000 < figures["raw_per_request"] < 60_000, figures
    assert 0 < figures["hopline_per_request"] <= MAX_PER_REQUEST, figures
