"""Instructions per request of ``bench_asgi.py``'s apps (callgrind), a figure the machine's load does not move.

    valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python bench/asgi_instructions.py hopline 200       # "Collected : <Ir>"
    (the same with 1200 requests; the difference / 1000 is the instructions per request without
    the process start, the imports and the warm-up; add PYTHONPATH=<dir holding an exported tree
    as hopline/> for another commit)

Drives the variant's app in-process as ``bench_asgi.py --in-process`` does (asyncio, fake
``receive``/``send``), then flushes its emitter, so the work the emitter's worker does for those
requests (deferred builds, serialization, the file sink's writes to /dev/null) is counted too: the
server bench's CPU counts every thread of the server process, and so does this.
"""

from __future__ import annotations

import asyncio
import os
import sys

import bench_asgi


def main(variant: str, requests: int, chunks: int | None = None) -> None:
    if chunks is not None:  # content chunks per response (default bench_asgi's 30)
        bench_asgi.CONTENT_CHUNKS = chunks
    app = bench_asgi.build_app(variant, os.devnull)
    asyncio.run(bench_asgi._in_process_requests(app, requests))
    emitter = getattr(app, "emitter", None)
    if emitter is not None:
        emitter.flush()
        stats = emitter.stats()
        assert stats["errors"] == 0 and stats["dropped"] == 0, stats


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit("usage: asgi_instructions.py VARIANT REQUESTS [CONTENT_CHUNKS]")
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) == 4 else None)
