"""Instructions per request of ``bench_asgi.py``'s apps (callgrind), a figure the machine's load does not move.

    valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python bench/asgi_instructions.py hopline 200       # "Collected : <Ir>"
    (the same with 1200 requests; the difference / 1000 is the instructions per request without
    the process start, the imports and the warm-up; add PYTHONPATH=<dir holding an exported tree
    as hopline/> for another commit)

    python bench/asgi_instructions.py --per-chunk          # what hopline adds per streamed chunk
    python bench/asgi_instructions.py --per-request        # raw_hopline_null's and raw's, 1 chunk

Variants: bench_asgi.py's (``bare``, ``hopline``, ...), and ``raw`` / ``raw_hopline_null`` /
``raw_hopline`` (``raw_app``: no Starlette; null sink, file sink to /dev/null): ``raw_hopline_null
100 1`` and ``600 1`` give hopline's fixed cost per request.

``--per-chunk`` runs the four of them itself (``bare`` and ``hopline``, 100 requests each, of 30
and of 130 content chunks, ``PYTHONHASHSEED=0``) and prints, as JSON, the instructions hopline
adds per content chunk after the first token: ``((hopline_130 - hopline_30) - (bare_130 -
bare_30)) / (100 x 100)``, the send wrapper and the worker's reading of the kept chunks together.

Drives the variant's app in-process as ``bench_asgi.py --in-process`` does (asyncio, fake
``receive``/``send``), then flushes its emitter, so the work the emitter's worker does for those
requests (deferred builds, serialization, the file sink's writes to /dev/null) is counted too: the
server bench's CPU counts every thread of the server process, and so does this.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import bench_asgi


def raw_app(variant: str):
    """``raw`` (no Starlette, no middleware) or ``raw_hopline_null`` (that app in ``EngineMiddleware``,
    null sink): the same 34 SSE chunks as bench_asgi's app, sent straight to ``send``, so that what
    hopline adds is the bulk of the count (its fixed cost per request: ``raw_hopline_null`` with 1
    content chunk)."""
    import orjson

    def chunk(delta: dict | None, finish: str | None = None, **extra: object) -> bytes:
        choices = (
            [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
        )
        obj = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1, "model": "tiny",
               "choices": choices, **extra}  # fmt: skip
        return b"data: " + orjson.dumps(obj) + b"\n\n"

    parts = [
        chunk({"role": "assistant", "content": ""}),
        *(chunk({"content": f" word{i}"}) for i in range(bench_asgi.CONTENT_CHUNKS)),
        chunk({}, "length"),
        chunk(None, usage={"prompt_tokens": 9, "completion_tokens": 30, "total_tokens": 39}),
        b"data: [DONE]\n\n",
    ]
    start = {"type": "http.response.start", "status": 200,
             "headers": [(b"content-type", b"text/event-stream; charset=utf-8")]}  # fmt: skip

    async def app(scope, receive, send):
        while (await receive()).get("more_body"):
            pass
        await send(dict(start))
        for part in parts:
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    if variant == "raw":
        return app
    from hopline.middleware.emit import Emitter
    from hopline.middleware.engine import EngineMiddleware

    sink = "null" if variant == "raw_hopline_null" else f"file:{os.devnull}"
    return EngineMiddleware(app, emitter=Emitter(sink, replica="r1"))


def main(variant: str, requests: int, chunks: int | None = None) -> None:
    if chunks is not None:  # content chunks per response (default bench_asgi's 30)
        bench_asgi.CONTENT_CHUNKS = chunks
    app = raw_app(variant) if variant.startswith("raw") else bench_asgi.build_app(variant, os.devnull)
    asyncio.run(bench_asgi._in_process_requests(app, requests))
    emitter = getattr(app, "emitter", None)
    if emitter is not None:
        emitter.flush()
        stats = emitter.stats()
        null = variant.endswith("_null")  # the null sink counts every event as dropped_sink
        assert stats["errors"] == 0 and stats["dropped"] == (stats["dropped_sink"] if null else 0), stats


def instructions(variant: str, requests: int, chunks: int) -> int:
    """Callgrind's instruction count of one run of this script (the whole process)."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise RuntimeError("valgrind is not installed (Debian: apt-get install valgrind)")
    run = subprocess.run(
        [valgrind, "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__,
         variant, str(requests), str(chunks)],
        capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"}, check=True,
    )  # fmt: skip
    found = re.search(r"Collected : (\d+)", run.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count in callgrind's output: {run.stderr[-500:]}")
    return int(found.group(1))


def per_chunk(requests: int = 100, short: int = 30, long: int = 130) -> dict[str, float]:
    """What hopline adds per streamed content chunk, and what the bare app spends on one."""
    runs = [(v, c) for v in ("bare", "hopline") for c in (short, long)]
    with ThreadPoolExecutor(2) as pool:
        counts = dict(zip(runs, pool.map(lambda run: instructions(run[0], requests, run[1]), runs)))
    chunks = requests * (long - short)
    bare = (counts["bare", long] - counts["bare", short]) / chunks
    hopline = (counts["hopline", long] - counts["hopline", short]) / chunks
    return {"hopline_adds_per_chunk": round(hopline - bare), "bare_per_chunk": round(bare)}


def per_request(short: int = 100, long: int = 600) -> dict[str, float]:
    """Hopline's fixed cost per request: ``raw_hopline_null`` with 1 content chunk, and the raw app
    alone, ``(I_long - I_short) / (long - short)`` each."""
    runs = [(v, n) for v in ("raw", "raw_hopline_null") for n in (short, long)]
    with ThreadPoolExecutor(2) as pool:
        counts = dict(zip(runs, pool.map(lambda run: instructions(run[0], run[1], 1), runs)))
    raw = (counts["raw", long] - counts["raw", short]) / (long - short)
    hopline = (counts["raw_hopline_null", long] - counts["raw_hopline_null", short]) / (long - short)
    return {"hopline_per_request": round(hopline), "raw_per_request": round(raw)}


if __name__ == "__main__":
    if sys.argv[1:2] == ["--per-chunk"]:
        print(json.dumps(per_chunk()))
        sys.exit(0)
    if sys.argv[1:2] == ["--per-request"]:
        print(json.dumps(per_request()))
        sys.exit(0)
    if len(sys.argv) not in (3, 4):
        sys.exit("usage: asgi_instructions.py VARIANT REQUESTS [CONTENT_CHUNKS]")
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) == 4 else None)
