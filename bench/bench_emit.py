"""What ``Emitter.emit`` costs a request path, side by side with its floor and with structlog.

    python bench/bench_emit.py [--rounds 9] [--calls 100000]

Variants, one 6-field event each (v, ts, request_id, hop, service, stream):

  (a)  ``Emitter.emit``, hot path only: the worker is asleep (started, with an hour's interval),
       and the buffer is emptied between chunks of 1000 calls, outside the measurement;
  (a2) ``Emitter.emit`` plus the worker's share: after each chunk the worker drains it (eid,
       batching, orjson serialization) to a sink that discards the bytes, and the measurement
       covers both threads — hopline's whole in-process CPU per event;
  (b)  the floor: build the same dict + ``time.time()`` + ``deque.append``;
  (c)  structlog, orjson ``JSONRenderer``, ``BytesLogger`` writing to a file, cached logger:
       what logging each hop as a line would cost;
  (s1, s2) the worker's serialization of a 1000-event batch, per event: into one bytearray as
       the sinks do, against a list of orjson outputs joined afterwards;
  (r1, r2) the sharded sink's routing of a 1000-event batch over three collectors, per event
       (``ShardedHttpSink.shares``: rendezvous hash of the request ID, on the worker thread):
       r1 with six events per request, as a request's hops come; r2 with every event a new
       request ID (no help from the map of recent keys). Compared with s1, the serialization
       every sink does anyway.

The measure is the process's CPU time (``time.process_time``: all threads, user + system), not
wall time: on a machine shared with other busy processes, wall time mostly measures waiting for
a core. Each round runs every variant once (the order reversed on odd rounds); the per-round
figure is µs of CPU per call. The summary is median [min, max] over rounds, and the ratios a/b and
c/a are taken within each round before the median.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import structlog

from hopline.middleware.contract import dumps
from hopline.middleware.emit import Emitter
from hopline.middleware.sharded_sink import ShardedHttpSink
from hopline.middleware.sinks import Encoded

CHUNK = 1000
HOP, RID, SERVICE = "client.sent", "0f6c1a2b3c4d5e6f7a8b9c0d1e2f3a4b", "kite-chat"


class EncodeAndDiscard:
    """A sink doing a real sink's CPU work (serialization) without I/O."""

    def write(self, batch: list[dict[str, Any]]) -> int:
        Encoded(batch)
        return 0

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def per_call(total_seconds: float, calls: int) -> float:
    return total_seconds / (calls // CHUNK * CHUNK) * 1e6


# Each variant is its own loop (no lambda per call, which would add the same ~50 ns to all of
# them and flatten the ratios); chunks of CHUNK calls, with unmeasured resets between chunks.


def variants(log_path: Path) -> tuple[dict[str, Callable[[int], float]], list[Emitter], Any]:
    paused = Emitter(EncodeAndDiscard(), service=SERVICE, flush_interval=3600, batch_size=10**9, capacity=2 * CHUNK)
    paused.emit(HOP, RID)  # starts the (sleeping) worker now, outside the measurement
    live = Emitter(EncodeAndDiscard(), service=SERVICE, flush_interval=3600, batch_size=CHUNK, capacity=4 * CHUNK)
    live.emit(HOP, RID)
    live.flush()
    cpu = time.process_time

    def a(calls: int) -> float:
        emit, buffer, total = paused.emit, paused._buffer, 0.0
        for _ in range(calls // CHUNK):
            start = cpu()
            for _ in range(CHUNK):
                emit(HOP, RID, stream=True)
            total += cpu() - start
            buffer.clear()
        return per_call(total, calls)

    def a2(calls: int) -> float:
        emit, buffer = live.emit, live._buffer
        start = cpu()
        for _ in range(calls // CHUNK):
            for _ in range(CHUNK):
                emit(HOP, RID, stream=True)  # the CHUNK-th event wakes the worker
            while buffer:
                time.sleep(0.0002)
        return per_call(cpu() - start, calls)

    floor: deque[dict[str, Any]] = deque()

    def b(calls: int) -> float:
        append, now, total = floor.append, time.time, 0.0
        for _ in range(calls // CHUNK):
            start = cpu()
            for _ in range(CHUNK):
                append({"v": 1, "ts": now(), "request_id": RID, "hop": HOP, "service": SERVICE, "stream": True})
            total += cpu() - start
            floor.clear()
        return per_call(total, calls)

    log_file = log_path.open("wb")
    log = structlog.wrap_logger(
        structlog.BytesLogger(log_file),
        wrapper_class=structlog.make_filtering_bound_logger(20),
        processors=[structlog.processors.JSONRenderer(serializer=orjson.dumps)],
        context_class=dict,
        cache_logger_on_first_use=True,
    )

    def c(calls: int) -> float:
        info, now, total = log.info, time.time, 0.0
        for _ in range(calls // CHUNK):
            start = cpu()
            for _ in range(CHUNK):
                info(HOP, v=1, ts=now(), request_id=RID, service=SERVICE, stream=True)
            total += cpu() - start
        return per_call(total, calls)

    # Worker side: serializing a 1000-event batch, the sinks' way (one bytearray) against the
    # obvious way (a list of orjson outputs, then join), per event.
    batch = [
        {"v": 1, "ts": time.time(), "request_id": RID, "hop": HOP, "service": SERVICE, "stream": True,
         "eid": f"{i:016x}"}
        for i in range(CHUNK)
    ]

    def s1(calls: int) -> float:
        start = cpu()
        for _ in range(calls // CHUNK):
            Encoded(batch)
        return per_call(cpu() - start, calls)

    def s2(calls: int) -> float:
        start = cpu()
        for _ in range(calls // CHUNK):
            b"".join([dumps(event) for event in batch])
        return per_call(cpu() - start, calls)

    # Routing only: ``shares`` splits the batch; nothing is put in the targets' buffers (no threads,
    # no I/O: the URLs are never contacted).
    sharded = ShardedHttpSink(["http://10.0.0.1:4318", "http://10.0.0.2:4318", "http://10.0.0.3:4318"])
    fresh = iter(range(10**12))

    def routed(events_per_request: int) -> Callable[[int], float]:
        def run(calls: int) -> float:
            total = 0.0
            for _ in range(calls // CHUNK):
                # new request IDs every chunk, as traffic brings them (unmeasured)
                ids = [f"{next(fresh):032x}" for _ in range(CHUNK // events_per_request + 1)]
                for event, i in zip(batch, range(CHUNK)):
                    event["request_id"] = ids[i // events_per_request]
                start = cpu()
                sharded.shares(batch)
                total += cpu() - start
            return per_call(total, calls)

        return run

    return (
        {"a": a, "a2": a2, "b": b, "c": c, "s1": s1, "s2": s2, "r1": routed(6), "r2": routed(1)},
        [paused, live],
        log_file,
    )


def summary(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}, {max(values):.3f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=100_000, help="calls per variant per round")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        bench, emitters, log_file = variants(Path(tmp) / "structlog.ndjson")
        results: dict[str, list[float]] = {name: [] for name in bench}
        for name, run in bench.items():  # warm-up
            run(CHUNK * 5)
        for round_ in range(args.rounds):
            order = list(bench) if round_ % 2 == 0 else list(reversed(bench))
            for name in order:
                results[name].append(bench[name](args.calls))
        for emitter in emitters:
            emitter.close()
        log_file.close()
    a_over_b = [a / b for a, b in zip(results["a"], results["b"])]
    c_over_a = [c / a for c, a in zip(results["c"], results["a"])]
    a2_over_a = [a2 / a for a2, a in zip(results["a2"], results["a"])]
    labels = {
        "a": "(a) Emitter.emit, hot path (worker asleep)",
        "a2": "(a2) Emitter.emit + the worker's eid, batching and serialization",
        "b": "(b) floor: dict + time.time() + deque.append",
        "c": "(c) structlog orjson JSONRenderer -> file, cached",
        "s1": "(s1) worker: serialize a 1000-event batch into one bytearray (sinks.Encoded)",
        "s2": "(s2) worker: the same as a list of orjson lines, then join",
        "r1": "(r1) worker: route a batch over 3 collectors (sharded sink), 6 events per request",
        "r2": "(r2) worker: the same, every event a new request ID",
    }
    print(f"python {sys.version.split()[0]}, structlog {structlog.__version__}, orjson {orjson.__version__}; "
          f"{args.rounds} rounds x {args.calls} calls per variant; CPU µs per call, median [min, max] over rounds")
    print()
    print("| variant | CPU µs/event |")
    print("|---|---|")
    for name, label in labels.items():
        print(f"| {label} | {summary(results[name])} |")
    print()
    print("| ratio (per round) | median [min, max] |")
    print("|---|---|")
    print(f"| a/b (emit vs floor) | {summary(a_over_b)} |")
    print(f"| c/a (structlog line vs emit) | {summary(c_over_a)} |")
    print(f"| a2/a (with the worker's share) | {summary(a2_over_a)} |")
    print(f"| s2/s1 (list of lines vs one buffer) | {summary([x / y for x, y in zip(results['s2'], results['s1'])])} |")
    for name, what in (("r1", "6 events per request"), ("r2", "one event per request")):
        routing = summary([x / y for x, y in zip(results[name], results["s1"])])
        print(f"| {name}/s1 (routing vs serializing, {what}) | {routing} |")
    print()
    print(f"(a2) emitter after the run: {emitters[1].stats()}")


if __name__ == "__main__":
    main()
