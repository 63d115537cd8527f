"""What a streamed chunk costs the engine middleware, in instructions under callgrind (issue 39).

A figure the machine's load does not move: bench/asgi_instructions.py --per-chunk runs
bench_asgi.py's Starlette app in-process under valgrind, bare and with ``EngineMiddleware``, with
30 and with 130 content chunks per response, and takes what hopline adds per content chunk (the
send wrapper on the request path and the emitter worker's exact reading of the kept chunks). It
was 6.6k before issue 39 and is 4.6-5.0k since (bench/README.md, "asgi: a streamed chunk"); the
bound leaves a quarter of margin and fails on the code before.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
MAX_PER_CHUNK = 6_000


def test_a_streamed_chunk_costs_under_six_thousand_instructions():
    run = subprocess.run(
        [sys.executable, str(BENCH / "asgi_instructions.py"), "--per-chunk"],
        cwd=BENCH, capture_output=True, text=True, timeout=900, check=True,
    )  # fmt: skip
    figures = json.loads(run.stdout)
    # the bare app's own cost per chunk (Starlette + the fake server): a sanity check of the harness
    assert 4_000 < figures["bare_per_chunk"] < 20_000, figures
    assert 0 < figures["hopline_adds_per_chunk"] <= MAX_PER_CHUNK, figures
