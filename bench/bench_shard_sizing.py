"""The figures README "Sharding and sizing" is computed from: bytes per stored event and Prometheus
series per collector, measured on real stores fed by every emitter kind through a sharded sink.

    python bench/bench_shard_sizing.py [--requests 1200] [--collectors 3]

Three ``python -m hopline.collector`` processes; a client (httpx transport), a gateway and an
engine (ASGI middleware on real uvicorn servers, the test suite's fake gateway and engine) and
the vLLM stat logger, each emitter with a ``ShardedHttpSink`` over the three. Every request
streams 3 tokens with usage: 12 events (client 3, gateway 5, engine 3, ``engine.stats``).

Measured: the stores' NDJSON bytes per event (what an hour holds before compaction), the same
events compacted to Parquet (``collector.compaction.compact_hour``, what is kept after the
hour), the share of requests and events each collector got, and the series on each
collector's ``/metrics`` (all ``hopline_*`` samples, one service/model/replica scope, four
emitter instances).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import uuid
import time
from collections import Counter
from pathlib import Path
from tempfile import TemporaryDirectory
from types import SimpleNamespace

import httpx
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from hopline.collector.compaction import compact_hour  # noqa: E402
from hopline.middleware.client import instrument  # noqa: E402
from hopline.middleware.emit import Emitter  # noqa: E402
from hopline.middleware.engine import EngineMiddleware  # noqa: E402
from hopline.middleware.sharded_sink import ShardedHttpSink  # noqa: E402
from hopline.middleware.vllm_stats import HoplineStatLogger  # noqa: E402
from support.collector import collector_process, stored_lines  # noqa: E402
from support.fakes import fake_engine_app, fake_gateway_app  # noqa: E402
from support.servers import running_server  # noqa: E402

BODY = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 3,
        "stream_options": {"include_usage": True}}  # fmt: skip
THREADS = 4


def traffic(urls: list[str], requests: int) -> list[Emitter]:
    """Send ``requests`` through client -> gateway -> engine (+ engine.stats); the closed emitters."""

    def emitter(**static: str) -> Emitter:
        return Emitter(ShardedHttpSink(urls), **static)

    client, gateway = emitter(service="kite-chat"), emitter(service="gateway", replica="gw-0")
    engine = emitter(service="engine", replica="r1", model="tiny")
    vllm = emitter(service="engine", replica="r1")
    stat_logger = HoplineStatLogger(None, emitter=vllm)
    with running_server(EngineMiddleware(fake_engine_app(), emitter=engine)) as engine_url, \
            running_server(fake_gateway_app([("r1", engine_url)], gateway)) as gateway_url:  # fmt: skip

        def worker(index: int) -> None:
            with instrument(httpx.Client(timeout=30), emitter=client) as http:
                for i in range(index, requests, THREADS):
                    rid = uuid.uuid4().hex  # random, as the client makes them (compresses as badly)
                    url = gateway_url + "/v1/chat/completions"
                    answer = http.post(url, json=BODY, headers={"X-Request-Id": rid})
                    answer.raise_for_status()
                    stats = SimpleNamespace(
                        request_id=f"chatcmpl-{rid}", queued_time=0.001, prefill_time=0.002,
                        decode_time=0.003, num_prompt_tokens=5, num_generation_tokens=3,
                        num_cached_tokens=0, finish_reason="length", max_tokens_param=3,
                    )  # fmt: skip
                    stat_logger.record(None, SimpleNamespace(finished_requests=[stats]))

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    emitters = [client, gateway, engine, vllm]
    for em in emitters:
        em.close(timeout=30)
    return emitters


def series_on(url: str) -> tuple[int, int, int]:
    """``hopline_*`` samples on ``url``'s /metrics: (all, those of the request scope kite-chat/tiny/r1,
    those of the emitters' own health)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    families = [f for f in text_string_to_metric_families(text) if f.name.startswith("hopline_")]
    samples = [sample for family in families for sample in family.samples]
    emitters = [s for s in samples if s.name.startswith("hopline_emitter_")]
    scoped = [s for s in samples if s.labels.get("service") == "kite-chat" and s not in emitters]
    return len(samples), len(scoped), len(emitters)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1200)
    parser.add_argument("--collectors", type=int, default=3)
    args = parser.parse_args()
    with TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        dirs = [Path(tmp) / f"c{i}" for i in range(args.collectors)]
        urls = [stack.enter_context(collector_process(d, "--grace", "1s"))[1] for d in dirs]
        start = time.monotonic()
        emitters = traffic(urls, args.requests)
        elapsed = time.monotonic() - start
        time.sleep(2.0)  # the grace: the last requests finish and are counted
        series = [series_on(url) for url in urls]
        stack.close()  # collectors stop: their files are complete
        events = [stored_lines(d) for d in dirs]
        hops = [[e for e in store if e["hop"] != "emitter.stats"] for store in events]
        ndjson = [sum(p.stat().st_size for p in (d / "events").rglob("*.ndjson")) for d in dirs]
        hours = [h for d in dirs for h in (d / "events").glob("date=*/hour=*")]
        for hour in hours:
            compact_hour(hour)
        parquet = sum(p.stat().st_size for d in dirs for p in (d / "events").rglob("*.parquet"))
    total_events = sum(len(store) for store in events)
    total_hops = sum(len(h) for h in hops)
    requests = [len({e["request_id"] for e in h}) for h in hops]
    print(f"{args.requests} requests through {args.collectors} collectors in {elapsed:.1f} s "
          f"({sum(e.stats()['sent'] for e in emitters)} events sent, "
          f"{sum(e.stats()['dropped'] for e in emitters)} dropped)")  # fmt: skip
    print(f"stored events: {total_events} ({total_hops} hops, {total_events - total_hops} emitter.stats), "
          f"{total_hops / sum(requests):.2f} per request")  # fmt: skip
    print(f"requests per collector: {requests}; hops per collector: {[len(h) for h in hops]}")
    print(f"NDJSON: {sum(ndjson)} bytes, {sum(ndjson) / total_events:.1f} bytes/event")
    print(f"Parquet after compaction: {parquet} bytes, {parquet / total_events:.1f} bytes/event "
          f"({sum(ndjson) / parquet:.1f}x smaller)")  # fmt: skip
    print("hopline_* series on each collector's /metrics (all, request scope kite-chat/tiny/r1, emitters'): "
          f"{series}")  # fmt: skip
    counts = Counter(e["hop"] for h in hops for e in h)
    print(f"hops: {dict(sorted(counts.items()))}")


if __name__ == "__main__":
    main()
