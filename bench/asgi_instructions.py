"""Instructions per request of ``bench_asgi.py``'s apps (callgrind), a figure the machine's load does not move.

    valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python bench/asgi_instructions.py hopline 200       # "Collected : <Ir>"
    (the same with 1200 requests; the difference / 1000 is the instructions per request without
    the process start, the imports and the warm-up; add PYTHONPATH=<dir holding an exported tree
    as hopline/> for another commit)

    python bench/asgi_instructions.py --per-chunk          # what hopline adds per streamed chunk

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


if __name__ == "__main__":
    if sys.argv[1:2] == ["--per-chunk"]:
        print(json.dumps(per_chunk()))
        sys.exit(0)
    if len(sys.argv) not in (3, 4):
        sys.exit("usage: asgi_instructions.py VARIANT REQUESTS [CONTENT_CHUNKS]")
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) == 4 else None)
