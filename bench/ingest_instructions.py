"""Instructions per ingested event (callgrind), a figure the machine's load does not move.

    python bench/ingest_instructions.py gen 1000 /tmp/ev-1000.ndjson     # the bench's 12-hop requests
    python bench/ingest_instructions.py gen 3000 /tmp/ev-3000.ndjson
    valgrind --tool=callgrind --callgrind-out-file=/dev/null \\
        python bench/ingest_instructions.py ingest /tmp/ev-1000.ndjson       # "Collected : <Ir>"
    (the same with /tmp/ev-3000.ndjson; add PYTHONPATH=<dir holding an exported tree as hopline/>
    for another commit)

``ingest`` reads the file, then ingests it as ``bench_collector.py --only ingest`` does (a fresh
collector, fsync=batch, bodies of 1,000 events through ``Ingestor.ingest``). The difference of
the two runs' instruction counts, divided by the 24,000 events between them, is the ingest's
instructions per event without the process start, the imports and the file read.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
import tempfile
from pathlib import Path

from bench_collector import batches_of, full_request
from hopline.collector.app import build_collector
from hopline.collector.config import CollectorConfig


def gen(requests: int, out: Path) -> None:
    t = 1_764_700_000.0  # fixed timestamps (the eids are random, always 16 characters)
    lines = [line for i in range(requests) for line in full_request(f"req-{i:09d}", t + i * 1e-3)]
    out.write_bytes(b"\n".join(lines) + b"\n")


def ingest(path: Path) -> None:
    lines = path.read_bytes().splitlines()
    batches = batches_of(lines)
    tmp = Path(tempfile.mkdtemp(prefix="hopline-ir-"))
    c = build_collector(CollectorConfig(data_dir=tmp, grace=0, fsync="batch"))
    c.store.open()

    async def run() -> None:
        for body in batches:
            await c.ingestor.ingest(body)

    asyncio.run(run())
    c.ingestor.close()
    assert c.joiner.counts["complete"] * 12 == len(lines), c.joiner.counts
    shutil.rmtree(tmp)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "gen":
        gen(int(sys.argv[2]), Path(sys.argv[3]))
    elif len(sys.argv) == 3 and sys.argv[1] == "ingest":
        ingest(Path(sys.argv[2]))
    else:
        sys.exit("usage: ingest_instructions.py gen REQUESTS FILE | ingest FILE")
