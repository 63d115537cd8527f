"""Instructions per ingested event (callgrind), a figure the machine's load does not move.

    python bench/ingest_instructions.py gen 1000 /tmp/ev-1000.ndjson     # the bench's 12-hop requests
    python bench/ingest_instructions.py gen 3000 /tmp/ev-3000.ndjson
    valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python bench/ingest_instructions.py ingest /tmp/ev-1000.ndjson       # "Collected : <Ir>"
    (the same with /tmp/ev-3000.ndjson; add PYTHONPATH=<dir holding an exported tree as hopline/>
    for another commit)

``ingest`` reads the file, then ingests it as ``bench_collector.py --only ingest`` does (a fresh
collector, fsync=batch, bodies of 1,000 events through ``Ingestor.ingest``), folds its window
summaries (what the server does once a second) and scrapes its metrics once. The difference of
the two runs' instruction counts, divided by the 24,000 events between them, is the ingest's
instructions per event without the process start, the imports and the file read.

    python bench/ingest_instructions.py --validate-per-event     # JSON: {"validate_per_event": ...}

runs valgrind itself, twice, on 1,000 requests' events (12,000): decoded only, then decoded and
each passed to ``contract.validate_event`` (owned, as the ingest does); the difference divided by
12,000 is validation's instructions per event (tests/collector/test_ingest_cost.py bounds it).

    python bench/ingest_instructions.py --ingest-per-event     # JSON: {"ingest_per_event": ...}

runs ``ingest`` under valgrind on 500 and on 1,500 requests' events (``PYTHONHASHSEED=0``, so
dicts and sets are laid out the same in both runs) and divides the difference by the 12,000
events between them: the whole ingest's instructions per event, the figure above on half the
events (tests/collector/test_ingest_cost.py bounds it too).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# The collector's modules are imported where they are used: under callgrind, importing them
# (FastAPI, Prometheus' client, ...) takes ~45 s of the ~50 a ``decode`` run would take else.


def gen(requests: int, out: Path) -> None:
    from bench_collector import full_request

    t = 1_764_700_000.0  # fixed timestamps (the eids are random, always 16 characters)
    lines = [line for i in range(requests) for line in full_request(f"req-{i:09d}", t + i * 1e-3)]
    out.write_bytes(b"\n".join(lines) + b"\n")


def ingest(path: Path) -> None:
    from bench_collector import batches_of, fold_windows
    from prometheus_client import generate_latest
    from hopline.collector.app import build_collector
    from hopline.collector.config import CollectorConfig

    lines = path.read_bytes().splitlines()
    batches = batches_of(lines)
    tmp = Path(tempfile.mkdtemp(prefix="hopline-ir-"))
    c = build_collector(CollectorConfig(data_dir=tmp, grace=0, fsync="batch"))
    c.store.open()

    async def run() -> None:
        for body in batches:
            await c.ingestor.ingest(body)

    asyncio.run(run())
    folded = fold_windows(c)
    c.ingestor.close()
    assert c.joiner.counts["complete"] * 12 == len(lines), c.joiner.counts
    assert folded in (None, c.joiner.counts["complete"]), folded
    # one scrape, as Prometheus would make: the histograms count their rows then (histogram.Rows);
    # its fixed cost cancels out in the difference of two runs, the counting per row does not
    generate_latest(c.registry)
    shutil.rmtree(tmp)


def decode(path: Path, validate: bool) -> None:
    """Decode every line of ``path``; with ``validate``, validate each event too (under callgrind)."""
    import orjson
    from hopline.middleware.contract import validate_event

    objs = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    if validate:
        for obj in objs:
            validate_event(obj, owned=True)


def instructions(*args: str, env: dict[str, str] | None = None) -> int:
    """Instructions callgrind counts for this script run with ``args`` (``env``: added to ours)."""
    run = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__, *args],
        capture_output=True, text=True, check=True, env={**os.environ, **(env or {})},
    )  # fmt: skip
    return int(re.findall(r"Collected : (\d+)", run.stderr)[-1])


def validate_per_event() -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix="hopline-ir-"))
    try:
        path = tmp / "ev.ndjson"
        gen(1000, path)
        events = len(path.read_bytes().splitlines())
        with ThreadPoolExecutor(2) as pool:  # two processes, one per core: the counts do not depend on it
            bare, validated = pool.map(lambda mode: instructions(mode, str(path)), ("decode", "validate"))
    finally:
        shutil.rmtree(tmp)
    return {"events": events, "validate_per_event": (validated - bare) / events}


def ingest_per_event(small: int = 500, large: int = 1500) -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix="hopline-ir-"))
    try:
        paths = {requests: tmp / f"ev-{requests}.ndjson" for requests in (small, large)}
        for requests, path in paths.items():
            gen(requests, path)

        def count(requests: int) -> tuple[int, int]:
            path = paths[requests]
            return len(path.read_bytes().splitlines()), instructions("ingest", str(path), env={"PYTHONHASHSEED": "0"})

        with ThreadPoolExecutor(2) as pool:  # two processes, one per core: the counts do not depend on it
            counts = dict(zip(paths, pool.map(count, paths)))
    finally:
        shutil.rmtree(tmp)
    events = counts[large][0] - counts[small][0]
    return {"events": events, "ingest_per_event": (counts[large][1] - counts[small][1]) / events}


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1] == "--validate-per-event":
        print(json.dumps(validate_per_event()))
    elif len(sys.argv) == 2 and sys.argv[1] == "--ingest-per-event":
        print(json.dumps(ingest_per_event()))
    elif len(sys.argv) == 3 and sys.argv[1] in ("decode", "validate"):
        decode(Path(sys.argv[2]), sys.argv[1] == "validate")
    elif len(sys.argv) == 4 and sys.argv[1] == "gen":
        gen(int(sys.argv[2]), Path(sys.argv[3]))
    elif len(sys.argv) == 3 and sys.argv[1] == "ingest":
        ingest(Path(sys.argv[2]))
    else:
        sys.exit(
            "usage: ingest_instructions.py gen REQUESTS FILE | ingest FILE | --validate-per-event | --ingest-per-event"
        )
