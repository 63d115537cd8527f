"""Generate a large, globally shuffled hop-event log as Parquet (the collector's storage schema).

    python bench/gen_large.py --requests 5000000 --out /work/bench-data/events-5000000.parquet

Each request is a streaming chat call through client, gateway and engine (with the engine's
stats plugin): 12 hops (``engine.scheduled`` is left out: the stats carry queue and prefill).
3% of requests come from clients without hopline (gateway and engine hops only), 2% go to the
engine directly (no gateway hops). Every host has its own clock offset (up to ±2 s), so a
reader that subtracts across hosts gets visibly wrong stages. Replica r2's queue triples for
the last 40% of the span.

Events are written in a random global order, as a collector that receives batches from many
hosts would, with bounded memory: pass 1 generates ``--chunk`` requests at a time and scatters
their events into ~1M-event buckets on disk; pass 2 shuffles each bucket and appends it to the
output as one row group. Memory is one chunk plus one bucket, whatever ``--requests`` is.

With ``--buckets N`` the log is written as a store bucketed by request instead (the layout
``hopline.analyzer.bounded`` reads a bucket at a time): ``OUT/bucket=K/cCCCCC.parquet``, every
event of a request in the bucket of a hash of its ID, each chunk's share of a bucket written as
one file, in one pass (no scatter and gather, no shuffle: within a chunk, events come hop by hop,
so a request's 12 events lie a chunk's requests apart, as scattered for a reader's group-by as a
shuffle would leave them; pyarrow's writer, ~2x faster than Polars' here):

    python bench/gen_large.py --requests 50000000 --buckets 64 --out /work/bench-data/store-50000000
"""

from __future__ import annotations

import argparse
import math
import shutil
import time
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
from hopline.middleware.contract import STORAGE_COLUMNS

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
RATE_PER_S = 100.0  # requests per second: 5M requests span ~14 h
REPLICAS = [f"r{i}" for i in range(8)]
GATEWAYS = [f"gw-{i}" for i in range(4)]
SERVICES = ["kite-chat", "kite-search", "kite-agent", "kite-batch"]
MODELS = ["qwen3-30b-a3b", "llama-3.1-8b"]
EVENTS_PER_BUCKET = 1_000_000
_SCHEMA = {name: getattr(pl, dtype) for name, dtype in STORAGE_COLUMNS.items()}


def _hex_ids(rng: np.random.Generator, n: int, nbytes: int) -> pl.Series:
    raw = rng.integers(0, 256, size=(n, nbytes), dtype=np.uint8)
    return pl.Series(raw.view(f"S{nbytes}").ravel(), dtype=pl.Binary).bin.encode("hex")


def _lognormal(rng: np.random.Generator, median_s: float, sigma: float, n: int) -> np.ndarray:
    return rng.lognormal(math.log(median_s), sigma, n)


def requests_chunk(rng: np.random.Generator, first: int, n: int, total: int) -> pl.DataFrame:
    """One row per request: true times of every hop, hosts' clock offsets and attributes."""
    idx = np.arange(first, first + n)
    start = T0 + idx / RATE_PER_S + rng.uniform(0, 1 / RATE_PER_S, n)
    replica = rng.integers(0, len(REPLICAS), n)
    gateway = rng.integers(0, len(GATEWAYS), n)
    service = rng.integers(0, len(SERVICES), n)
    model = rng.integers(0, len(MODELS), n)
    reused = rng.random(n) < 0.8
    pool_wait = np.where(reused, 0.0, _lognormal(rng, 0.001, 0.5, n))
    connect_s = np.where(reused, 0.0, _lognormal(rng, 0.015, 0.4, n))
    tls_s = np.where(reused, 0.0, _lognormal(rng, 0.03, 0.4, n))
    legs = [_lognormal(rng, 0.008, 0.4, n) for _ in range(6)]  # c->gw, gw->e, e->gw, gw->c (first, last)
    admit = _lognormal(rng, 0.001, 0.3, n)
    route = _lognormal(rng, 0.003, 0.5, n)
    frontend = _lognormal(rng, 0.012, 0.3, n)
    incident = (replica == 2) & (idx >= 0.6 * total)
    queue = _lognormal(rng, 0.05, 0.8, n) * np.where(incident, 3.0, 1.0)
    prompt_tokens = np.clip(_lognormal(rng, 1500, 0.8, n), 10, 32000).astype(np.int64)
    output_tokens = np.clip(_lognormal(rng, 250, 0.7, n), 2, 4000).astype(np.int64)
    prefill = prompt_tokens * _lognormal(rng, 0.0001, 0.2, n)
    decode = (output_tokens - 1) * _lognormal(rng, 0.02, 0.15, n)
    mode = rng.random(n)  # < 0.03: no client hops; < 0.05: no gateway hops
    c_sent = start
    g_recv = c_sent + pool_wait + connect_s + tls_s + legs[0]
    g_adm = g_recv + admit
    g_fwd = g_adm + route
    e_recv = np.where(mode < 0.05, g_recv, g_fwd) + legs[1]
    e_first = e_recv + frontend + queue + prefill
    e_last = e_first + decode
    g_first, g_last = e_first + legs[2], e_last + legs[3]
    c_first, c_last = g_first + legs[4], g_last + legs[5]
    offsets = rng.uniform(-2, 2, len(SERVICES) + len(GATEWAYS) + len(REPLICAS))
    return pl.DataFrame(
        {
            "request_id": _hex_ids(rng, n, 16),
            "mode": mode,
            "service": np.array(SERVICES)[service],
            "gateway": np.array(GATEWAYS)[gateway],
            "replica": np.array(REPLICAS)[replica],
            "model": np.array(MODELS)[model],
            "c_off": offsets[service],
            "g_off": offsets[len(SERVICES) + gateway],
            "e_off": offsets[len(SERVICES) + len(GATEWAYS) + replica],
            "c_sent": c_sent,
            "c_first": c_first,
            "c_last": c_last,
            "g_recv": g_recv,
            "g_adm": g_adm,
            "g_fwd": g_fwd,
            "g_first": g_first,
            "g_last": g_last,
            "e_recv": e_recv,
            "e_first": e_first,
            "e_last": e_last,
            "e_stats": e_last + 0.0005,  # the stats logger reports just after the last token
            "pool_wait_s": pool_wait,
            "connect_s": connect_s,
            "tls_s": tls_s,
            "conn_reused": reused,
            "queue_s": queue,
            "prefill_s": prefill,
            "decode_s": decode,
            "prompt_tokens": prompt_tokens,
            "output_tokens": output_tokens,
        }
    )


def events_chunk(req: pl.DataFrame, rng: np.random.Generator) -> pl.DataFrame:
    """The requests' hop events, in the storage schema (all columns, nulls where absent)."""
    c, g, e = pl.col("c_off"), pl.col("g_off"), pl.col("e_off")
    has_client, has_gateway = pl.col("mode") >= 0.03, (pl.col("mode") < 0.03) | (pl.col("mode") >= 0.05)
    eng = [pl.col("replica"), pl.col("model").alias("model"), pl.lit("vllm").alias("service")]
    gw = [pl.col("gateway").alias("replica"), pl.lit("gateway").alias("service")]
    cl = [pl.col("service")]
    last = [pl.col("output_tokens"), pl.lit("stop").alias("finish_reason")]
    hops = [
        ("client.sent", "c_sent", c, has_client, cl + [pl.lit(True).alias("stream"), pl.col("model"), "pool_wait_s",
                                                       "connect_s", "tls_s", "conn_reused"]),
        ("client.first_token", "c_first", c, has_client, cl),
        ("client.last_token", "c_last", c, has_client, cl + last),
        ("gateway.received", "g_recv", g, has_gateway, gw),
        ("gateway.admitted", "g_adm", g, has_gateway, gw),
        ("gateway.forwarded", "g_fwd", g, has_gateway, gw + [pl.col("replica").alias("upstream")]),
        ("gateway.first_token", "g_first", g, has_gateway, gw),
        ("gateway.last_token", "g_last", g, has_gateway, gw + last),
        ("engine.received", "e_recv", e, pl.lit(True), eng + [pl.lit(True).alias("stream"), pl.lit(1).alias("n"),
                                                              pl.lit(1024).alias("max_tokens"),
                                                              pl.lit(True).alias("max_tokens_set")]),
        ("engine.first_token", "e_first", e, pl.lit(True), eng),
        ("engine.last_token", "e_last", e, pl.lit(True), eng + last),
        ("engine.stats", "e_stats", e, pl.lit(True), eng + ["queue_s", "prefill_s", "decode_s", "prompt_tokens",
                                                            "output_tokens"]),
    ]  # fmt: skip
    parts = []
    for hop, at, offset, present, columns in hops:
        frame = req.filter(present).select(
            "request_id",
            pl.lit(hop).alias("hop"),
            (pl.col(at) + offset).alias("ts"),
            *columns,
        )
        parts.append(frame)
    events = pl.concat(parts, how="diagonal_relaxed")
    return events.with_columns(
        v=pl.lit(1), attempt=pl.lit(0), eid=_hex_ids(rng, events.height, 8)
    ).select(
        pl.col(name).cast(dtype) if name in events.columns or name in ("v", "attempt", "eid")
        else pl.lit(None, dtype=dtype).alias(name)
        for name, dtype in _SCHEMA.items()
    )  # fmt: skip


def generate(requests: int, out: Path, chunk: int = 250_000, seed: int = 1) -> dict[str, float]:
    """Write ``out`` and return how long it took and how many events it holds."""
    began = time.perf_counter()
    rng = np.random.default_rng(seed)
    buckets = max(1, math.ceil(requests * 12 / EVENTS_PER_BUCKET))
    scratch = out.parent / f".{out.name}.parts"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    for number, first in enumerate(range(0, requests, chunk)):
        n = min(chunk, requests - first)
        events = events_chunk(requests_chunk(rng, first, n, requests), rng)
        events = events.with_columns(
            _bucket=pl.Series(rng.integers(0, buckets, events.height), dtype=pl.UInt32)
        )
        for (bucket,), part in events.partition_by("_bucket", as_dict=True).items():
            part.drop("_bucket").write_parquet(
                scratch / f"b{bucket:05d}-c{number:05d}.parquet", compression="lz4"
            )
    total = 0
    writer = None
    try:
        for bucket in range(buckets):
            files = sorted(scratch.glob(f"b{bucket:05d}-*.parquet"))
            if not files:
                continue
            part = pl.read_parquet(files)
            part = part.sample(fraction=1.0, shuffle=True, seed=seed + bucket)
            table = part.to_arrow(compat_level=pl.CompatLevel.oldest())
            if writer is None:
                writer = pq.ParquetWriter(out, table.schema, compression="zstd")
            writer.write_table(table, row_group_size=EVENTS_PER_BUCKET * 2)
            total += part.height
            for f in files:
                f.unlink()
    finally:
        if writer is not None:
            writer.close()
        shutil.rmtree(scratch, ignore_errors=True)
    return {"requests": requests, "events": total, "seconds": time.perf_counter() - began}


def generate_bucketed(
    requests: int, out: Path, buckets: int, chunk: int = 500_000, seed: int = 1
) -> dict[str, float]:
    """Write ``out/bucket=K/`` files (see the module's docstring); how long it took, how many events."""
    from hopline.analyzer.bounded import BUCKET_SEED

    began = time.perf_counter()
    rng = np.random.default_rng(seed)
    shutil.rmtree(out, ignore_errors=True)
    total = 0
    for number, first in enumerate(range(0, requests, chunk)):
        n = min(chunk, requests - first)
        events = events_chunk(requests_chunk(rng, first, n, requests), rng)
        events = events.with_columns(_bucket=pl.col("request_id").hash(BUCKET_SEED) % buckets)
        for (bucket,), part in events.partition_by("_bucket", as_dict=True).items():
            folder = out / f"bucket={bucket}"
            folder.mkdir(parents=True, exist_ok=True)
            part.drop("_bucket").write_parquet(folder / f"c{number:05d}.parquet", compression="zstd", use_pyarrow=True)
        total += events.height
    return {"requests": requests, "events": total, "seconds": time.perf_counter() - began}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=5_000_000)
    parser.add_argument("--out", type=Path, default=None, help="default: /work/bench-data/events-N.parquet")
    parser.add_argument("--chunk", type=int, default=0, help="requests generated at a time (default 250000; --buckets: 500000, ~3 GB)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--buckets", type=int, default=0, help="write a store bucketed by request (OUT is a folder)")
    args = parser.parse_args()
    name = f"store-{args.requests}" if args.buckets else f"events-{args.requests}.parquet"
    out = args.out or Path("/work/bench-data") / name
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.buckets:
        result = generate_bucketed(args.requests, out, args.buckets, args.chunk or 500_000, args.seed)
        size = sum(f.stat().st_size for f in out.rglob("*.parquet")) / 1e6
    else:
        result = generate(args.requests, out, args.chunk or 250_000, args.seed)
        size = out.stat().st_size / 1e6
    print(f"{out}: {result['requests']:,} requests, {result['events']:,} events, {size:,.0f} MB, "
          f"{result['seconds']:.1f} s")  # fmt: skip


if __name__ == "__main__":
    main()
