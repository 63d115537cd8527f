"""What EngineMiddleware costs a streaming ASGI server, next to no middleware and OpenTelemetry's.

    python bench/bench_asgi.py                    # 8 rounds x 2000 requests per variant
    python bench/bench_asgi.py --rounds 4 --requests 1000 --concurrency 16
    python bench/bench_asgi.py --in-process        # no server: where the middleware's µs go

One small Starlette app streams an OpenAI-style SSE response (34 chunks: role, 30 content, finish,
usage, [DONE]; no sleeps). Each variant runs in its own uvicorn process (uvloop + httptools),
started once, pinned to CPU0; the load generator (raw asyncio sockets on keep-alive connections,
so that the server and not the client is the bottleneck) is pinned to CPU1:

* ``bare``: the app alone;
* ``mw``: the floor for any send wrapper (perf-anchors §1 "mw"): a pure-ASGI middleware that only
  timestamps the first and the last body chunk and emits three events to the null sink;
* ``hopline``: ``EngineMiddleware`` emitting every hop to a file sink (the background writer
  thread runs in the server process, so its CPU is counted);
* ``hopline_null``: the same with the null sink (events built and queued, then discarded): the
  middleware's own cost without serialization and I/O;
* ``otel``: ``OpenTelemetryMiddleware`` with a ``TracerProvider`` and a ``BatchSpanProcessor``
  exporting to a no-op exporter (defaults: one span per send/receive);
* ``otel_lean``: the same with ``exclude_spans=["receive", "send"]``;
* ``hopline_base`` (with ``--baseline DIR``): ``hopline`` run from the hopline package in DIR
  (``DIR/hopline/...``, e.g. an exported older commit, first on the server's ``PYTHONPATH``): before
  and after side by side in one run.

Rounds alternate the variant order (reversed on odd rounds). Per round and variant we measure
server CPU per request (utime + stime from ``/proc/<pid>/stat``) and requests per second; ratios
vs ``bare`` are taken within a round, and we print their median [min, max] over rounds.

``--in-process`` drives the same apps without a server (asyncio, fake ``receive``/``send``, this
thread's CPU time), best of ``--rounds`` runs of ``--requests`` requests per variant: the
middleware's own cost without the server's and the load generator's noise (profile it there).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VARIANTS = ("bare", "mw", "hopline", "hopline_null", "otel", "otel_lean")
PATH = "/v1/chat/completions"
CONTENT_CHUNKS = 30
REQUEST_BODY = (
    b'{"model":"tiny","messages":[{"role":"user","content":"Tell me a story about a lighthouse."}],'
    b'"stream":true,"max_tokens":30,"stream_options":{"include_usage":true}}'
)
TICKS = os.sysconf("SC_CLK_TCK")


# --- server side (runs in the child process) ------------------------------------------------------


def build_app(variant: str, events_path: str):
    import orjson
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    def chunk(delta: dict | None, finish: str | None = None, **extra: object) -> bytes:
        choices = (
            [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
        )
        obj = {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "tiny",
            "choices": choices,
            **extra,
        }
        return b"data: " + orjson.dumps(obj) + b"\n\n"

    role = chunk({"role": "assistant", "content": ""})
    words = [chunk({"content": f" word{i}"}) for i in range(CONTENT_CHUNKS)]
    tail = [
        chunk({}, "length"),
        chunk(None, usage={"prompt_tokens": 9, "completion_tokens": 30, "total_tokens": 39}),
        b"data: [DONE]\n\n",
    ]

    async def generate(request: Request) -> StreamingResponse:
        await request.body()

        async def stream():
            yield role
            for word in words:
                yield word
            for part in tail:
                yield part

        return StreamingResponse(stream(), media_type="text/event-stream")

    app = Starlette(routes=[Route(PATH, generate, methods=["POST"])])
    if variant == "mw":
        from hopline.middleware.emit import Emitter

        return minimal_middleware(app, Emitter("null", replica="r1"))
    if variant.startswith("hopline"):  # hopline_base: the same, imported from --baseline
        from hopline.middleware.emit import Emitter
        from hopline.middleware.engine import EngineMiddleware

        sink = "null" if variant == "hopline_null" else f"file:{events_path}"
        return EngineMiddleware(app, emitter=Emitter(sink, replica="r1"))
    if variant.startswith("otel"):
        from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

        class NoopExporter(SpanExporter):
            def export(self, spans):
                return SpanExportResult.SUCCESS

        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(NoopExporter()))
        exclude = ["receive", "send"] if variant == "otel_lean" else None
        return OpenTelemetryMiddleware(app, tracer_provider=provider, exclude_spans=exclude)
    return app


def minimal_middleware(app, emitter):
    """A send wrapper that timestamps the first and the last body chunk: what any such wrapper costs."""
    from time import perf_counter

    async def middleware(scope, receive, send):
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        emitter.emit("engine.received", "rid")
        first = None

        def observed_send(message):
            nonlocal first
            if message["type"] == "http.response.body":
                if first is None:
                    first = perf_counter()
                    emitter.emit("engine.first_token", "rid")
                if not message.get("more_body", False):
                    emitter.emit("engine.last_token", "rid")
            return send(message)

        await app(scope, receive, observed_send)

    return middleware


def serve(variant: str, port: int, events_path: str) -> None:
    import uvicorn

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    uvicorn.run(
        build_app(variant, events_path),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        loop="uvloop",
        http="httptools",
        lifespan="off",
        timeout_keep_alive=60,
    )


# --- load side ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


async def _worker(port: int, count: list[int], stop_at: int, resets: list[int]) -> None:
    request = (
        f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(REQUEST_BODY)}\r\n\r\n"
    ).encode() + REQUEST_BODY
    while count[0] < stop_at:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while count[0] < stop_at:
                count[0] += 1
                writer.write(request)
                buf = b""
                while not buf.endswith(b"\r\n0\r\n\r\n"):  # end of the chunked body
                    data = await reader.read(65536)
                    if not data:
                        raise ConnectionResetError("server closed the connection")
                    buf = buf[-16:] + data
        except ConnectionError:  # e.g. a keep-alive timeout on a starved machine: reconnect
            count[0] -= 1
            resets[0] += 1
        finally:
            writer.close()


async def _load(port: int, requests: int, concurrency: int) -> float:
    count, resets = [0], [0]
    start = time.perf_counter()
    await asyncio.gather(*(_worker(port, count, requests, resets) for _ in range(concurrency)))
    if resets[0]:
        print(f"(reconnected {resets[0]} times)", file=sys.stderr)
    return time.perf_counter() - start


def run_load(port: int, requests: int, concurrency: int) -> float:
    try:
        import uvloop

        return uvloop.run(_load(port, requests, concurrency))
    except ImportError:
        return asyncio.run(_load(port, requests, concurrency))


def wait_listening(port: int, proc: subprocess.Popen, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("server did not start")


def summarize(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}, {max(values):.3f}]"


async def _in_process_requests(app, requests: int) -> float:
    """This thread's CPU seconds per request, ``app`` driven with fake receive/send."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": PATH,
        "raw_path": PATH.encode(),
        "query_string": b"",
        "root_path": "",
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
        "headers": [
            (b"host", b"127.0.0.1"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(REQUEST_BODY)).encode()),
        ],
    }
    request = {"type": "http.request", "body": REQUEST_BODY, "more_body": False}
    never = asyncio.Event()

    async def send(message):
        pass

    def receiver():
        pending = [request]

        async def receive():
            if pending:
                return pending.pop()
            await never.wait()  # the disconnect listener: cancelled when the response ends

        return receive

    start = time.thread_time()
    for _ in range(requests):
        await app(dict(scope), receiver(), send)
    return (time.thread_time() - start) / requests


def in_process(variants: list[str], rounds: int, requests: int) -> None:
    apps = {variant: build_app(variant, os.devnull) for variant in variants}
    best = {variant: float("inf") for variant in variants}

    async def run() -> None:
        for variant in variants:  # warm-up
            await _in_process_requests(apps[variant], requests // 4)
        for rnd in range(rounds):
            for variant in variants if rnd % 2 == 0 else variants[::-1]:
                best[variant] = min(best[variant], await _in_process_requests(apps[variant], requests))

    asyncio.run(run())
    print(f"in-process, best of {rounds} x {requests} requests (thread CPU):")
    print("| variant | µs/req | added vs bare |")
    print("|---|---|---|")
    for variant in variants:
        print(f"| {variant} | {best[variant] * 1e6:.1f} | {(best[variant] - best['bare']) * 1e6:+.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--requests", type=int, default=2000, help="requests per variant per round")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--in-process", action="store_true", help="no server: the middleware's own cost")
    parser.add_argument("--baseline", help="add variant hopline_base: hopline imported from DIR/hopline (before/after)")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--events", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port, args.events)
        return

    variants = args.variants.split(",")
    if args.baseline and args.in_process:
        parser.error("--baseline needs the server mode (each variant its own process)")
    if args.baseline and "hopline_base" not in variants:
        variants.append("hopline_base")
    if args.in_process:
        in_process(variants, args.rounds, args.requests)
        return
    tmp = tempfile.mkdtemp(prefix="hopline-bench-")
    servers: dict[str, tuple[subprocess.Popen, int]] = {}
    try:
        for variant in variants:
            port = free_port()
            env = dict(os.environ)
            if variant == "hopline_base":
                env["PYTHONPATH"] = os.path.abspath(args.baseline)
            proc = subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--serve",
                    variant,
                    "--port",
                    str(port),
                    "--events",
                    os.path.join(tmp, f"{variant}.ndjson"),
                ],
                env=env,
            )
            servers[variant] = (proc, port)
        for variant, (proc, port) in servers.items():
            wait_listening(port, proc)
        if hasattr(os, "sched_setaffinity") and os.cpu_count() and os.cpu_count() > 1:
            os.sched_setaffinity(0, {1})
        for proc, port in servers.values():  # warm-up
            run_load(port, args.requests // 4, args.concurrency)

        cpu: dict[str, list[float]] = {v: [] for v in variants}
        rps: dict[str, list[float]] = {v: [] for v in variants}
        for rnd in range(args.rounds):
            order = variants if rnd % 2 == 0 else variants[::-1]
            for variant in order:
                proc, port = servers[variant]
                before = cpu_seconds(proc.pid)
                wall = run_load(port, args.requests, args.concurrency)
                cpu[variant].append((cpu_seconds(proc.pid) - before) / args.requests)
                rps[variant].append(args.requests / wall)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
        for proc, _ in servers.values():
            proc.wait(timeout=10)

    for variant in ("hopline", "hopline_base"):
        if variant in variants:
            # the file sink rotates by size and hour: count the rotated files too
            lines = sum(path.read_bytes().count(b"\n") for path in Path(tmp).glob(f"{variant}.ndjson*"))
            expected = 3 * (args.requests // 4 + args.rounds * args.requests)  # warm-up + rounds, 3 hops each
            print(f"{variant} events written: {lines} of {expected}")
    shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"{args.rounds} rounds x {args.requests} requests, concurrency {args.concurrency}, "
        f"{CONTENT_CHUNKS + 4} SSE chunks per response"
    )
    print("| variant | req/s | srv CPU µs/req | req/s ratio vs bare | CPU ratio vs bare |")
    print("|---|---|---|---|---|")
    for variant in variants:
        rps_ratio = [r / b for r, b in zip(rps[variant], rps["bare"])]
        cpu_ratio = [c / b for c, b in zip(cpu[variant], cpu["bare"])]
        print(
            f"| {variant} | {statistics.median(rps[variant]):.0f} | {statistics.median(cpu[variant]) * 1e6:.0f} "
            f"| {summarize(rps_ratio)} | {summarize(cpu_ratio)} |"
        )


if __name__ == "__main__":
    main()
