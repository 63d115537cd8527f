"""hopline's share of a real vLLM API server's CPU, measured with py-spy inside one process.

    HOPLINE_VLLM_DIR=$PWD/.vllm python bench/bench_vllm_pyspy.py              # 16 streams x 96 tokens, 320 requests
    python bench/bench_vllm_pyspy.py --requests 480 --rate 250 --keep /tmp/profile.txt

Starts ``vllm serve`` (the CPU build and tiny model of ``.ci/vllm-setup.sh``, with
tests/engines/test_vllm.py's helpers) with ``--middleware hopline.middleware.engine.EngineMiddleware``,
the stat logger plugin and ``HOPLINE_SINK=file:...``; warms it up; then ``py-spy record`` samples the
API-server process (all its threads: the event loop and hopline's emitter thread alike) while
``--streams`` concurrent streaming chat requests of ``--tokens`` tokens each (``ignore_eos``, usage
on) run until ``--requests`` have finished. A/B throughput between two vLLM starts is useless on a
shared 2-core machine (identical servers differ 0.8-3.5x in tokens/s), so the measure is the share
inside one process:

* a sample is one thread's stack at one instant, as py-spy records it (raw, collapsed format);
* busy samples: those py-spy records without ``--idle`` (it leaves out threads the OS reports as
  not running), minus any whose innermost frame is a known blocking wait (``IDLE_LEAVES``: a
  selector's ``select``, ``threading``'s ``wait``... — counted and printed, normally 0);
* hopline's samples: busy samples whose innermost Python frame's file is under hopline's package
  directories (as the vLLM venv imports them). That is hopline's self time, C calls it makes
  included (orjson, ``perf_counter``, list appends show no frame of their own);
* hopline's share = hopline's samples / busy samples. Printed with the counts, a binomial standard
  error, the top hopline functions, and a second, wider figure: also samples whose innermost
  frames are Python standard library code called from a hopline frame (``threading``'s ``Event.set``
  from ``emit``, ...).

The bench also checks what the middleware wrote: one ``engine.received``, ``engine.first_token``
and ``engine.last_token`` per request, each ``last_token`` with ``output_tokens`` = ``--tokens``,
``finish_reason`` ``length`` and ``output_chunks`` = ``--tokens`` (vLLM sends one SSE event per
token here), and one ``engine.stats`` per request from the stat logger.

``--variant`` measures vLLM's own per-request observability the same way instead of hopline (issue
39): the ``venv-nohop`` vLLM (hopline not installed: no stat logger plugin, no middleware), with

* ``otlp``: ``--otlp-traces-endpoint`` to a ``hopline collector`` the bench starts (as
  bench_vllm_variants.py does: ``http/protobuf``, ``OTEL_BSP_SCHEDULE_DELAY=200``; the collector is
  another process, not sampled). Its code, ``TRACING``: frames whose file is under the vLLM venv's
  ``site-packages/opentelemetry/`` (the SDK's span, its batch processor's thread, the OTLP
  exporter) or ``site-packages/vllm/tracing/`` (``init_tracer``, ``instrument_manual``,
  ``extract_trace_context``, ``contains_trace_headers``), and the function ``do_tracing`` of
  ``vllm/v1/engine/output_processor.py`` (the span's attributes, once per finished request);
* ``per-request-metrics``: ``--enable-per-request-metrics``. Its code, ``PER_REQUEST_METRICS``: the
  function ``build_per_request_timing_metrics`` of ``vllm/entrypoints/generate/base/serving.py``
  (called from the chat stream generator for the final usage chunk; it reads the request's
  ``RequestStateStats``, which vLLM keeps with or without the flag, and builds the pydantic
  ``PerRequestMetrics``). The serializing of the ``metrics`` field inside the usage chunk's
  ``model_dump_json`` runs in pydantic-core's C code under the generator's own frame and cannot be
  told apart: not counted.

For these, besides the self share (innermost Python frame in their code, as for hopline), the
report gives the inclusive share: busy samples with a frame of their code anywhere on the stack,
which adds everything they call (the exporter's ``requests``/``urllib3``/protobuf, pydantic). For
hopline the inclusive figure means nothing (its middleware's frame is under every request's whole
handling), hence the narrower "stdlib callees" figure there. The checks: ``otlp``, every sampled
request's engine hops from vLLM's span in the collector (bench_vllm_variants.spans_check);
``per-request-metrics``, one more request's usage chunk carries the timings (metrics_check).

``--native`` adds native frames to the samples, so the time in CPython's cyclic garbage collector
(``gc_collect_*``) is seen. A collection runs inside whatever Python frame made the allocation
that triggered it, and a full one of vLLM's large heap lasts long: a frame that allocates (an
exchange object, a bound method) then holds hundreds of samples on one line in one round. The
report gives those samples apart: GC's share of all busy samples, GC samples inside hopline's
frames, and hopline's share without GC (hopline's other samples / busy samples without GC).
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "tests" / "engines"), str(REPO / "tests")]  # the vLLM tests' server helpers

from test_vllm import MODEL, start_server, stop_server, wait_ready

FLOOR = Path(__file__).resolve().parent / "vllm_floor_middleware.py"

# Innermost frames that mean "waiting", should py-spy count such a thread as running.
IDLE_LEAVES = {
    ("select", "selectors.py"),
    ("wait", "threading.py"),
    ("_wait_for_tstate_lock", "threading.py"),
    ("get", "queue.py"),
    ("_worker", "thread.py"),
    ("run_forever", "base_events.py"),
}

GC_FRAMES = ("gc_collect",)  # CPython's collector: gc_collect_main, gc_collect_with_callback, ...

# vLLM's own per-request observability (--variant), by file and function, as the docstring says
TRACING_DIRS = ("/site-packages/opentelemetry/", "/site-packages/vllm/tracing/")
TRACING_FUNCTIONS = {("do_tracing", "vllm/v1/engine/output_processor.py")}
PER_REQUEST_METRICS_FUNCTIONS = {
    ("build_per_request_timing_metrics", "vllm/entrypoints/generate/base/serving.py"),
}
VARIANT_FLAGS = {"otlp": "--otlp-traces-endpoint", "per-request-metrics": "--enable-per-request-metrics"}
OTEL_ENV = {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_BSP_SCHEDULE_DELAY": "200",
            "OTEL_SERVICE_NAME": "vllm", "OTEL_RESOURCE_ATTRIBUTES": "service.instance.id=r1"}  # fmt: skip


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm-dir", default=os.environ.get("HOPLINE_VLLM_DIR", str(REPO / ".vllm")),
                        help="venv/ and tiny/ from .ci/vllm-setup.sh (default $HOPLINE_VLLM_DIR, else ./.vllm)")
    parser.add_argument("--streams", type=int, default=16, help="concurrent streaming requests")
    parser.add_argument("--tokens", type=int, default=96, help="max_tokens of each request (ignore_eos)")
    parser.add_argument("--requests", type=int, default=320, help="requests sampled (after the warm-up)")
    parser.add_argument("--warmup", type=int, default=32, help="requests before sampling starts")
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--py-spy", default=shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy"))
    parser.add_argument("--keep", help="copy each run's raw py-spy profile to PREFIX.<current|baseline>.<time>")
    parser.add_argument("--baseline", help="also run the hopline package found in this directory (DIR/hopline/...), "
                        "e.g. an exported older commit: before/after in one run")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each (alternating order with --baseline)")
    parser.add_argument("--floor", action="store_true", help="also load bench/vllm_floor_middleware.py (a bare "
                        "send wrapper, outermost) and report its share too: what wrapping send costs at all")
    parser.add_argument("--native", action="store_true", help="py-spy --native: also count the samples in "
                        "CPython's garbage collector, and hopline's share without them")
    parser.add_argument("--variant", choices=("hopline", *VARIANT_FLAGS), default="hopline",
                        help="otlp / per-request-metrics: vLLM without hopline, with --otlp-traces-endpoint "
                        "(to a hopline collector) or --enable-per-request-metrics; the share of that code")
    args = parser.parse_args()
    if args.variant != "hopline" and (args.baseline or args.floor):
        parser.error("--baseline and --floor measure hopline: not with --variant otlp / per-request-metrics")
    return args


async def sse_lines(response: httpx.Response) -> AsyncIterator[bytes]:
    """The response's lines as SSE ends them (LF, CRLF or CR). Not ``aiter_lines``: it splits
    like ``str.splitlines``, also at U+2028, U+0085 and the like, which the random model's text has
    (a JSON event cut in two)."""
    rest = b""
    async for data in response.aiter_bytes():
        lines = (rest + data).replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        rest = lines.pop()
        for line in lines:
            yield line
    if rest:
        yield rest


async def one_stream(client: httpx.AsyncClient, port: int, request_id: str, tokens: int) -> tuple[int, int]:
    """One streaming chat request; (completion tokens from usage, SSE events carrying output)."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"Hello world, tell me about latency {request_id}"}],
        "stream": True, "max_tokens": tokens, "ignore_eos": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    usage, outputs = None, 0
    headers = {"X-Request-Id": request_id}
    async with client.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body, headers=headers) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{request_id}: HTTP {r.status_code} {await r.aread()!r}")
        async for line in sse_lines(r):
            if not line.startswith(b"data: {"):
                continue
            chunk = orjson.loads(line[6:])
            usage = chunk.get("usage") or usage
            outputs += any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or ())
    if usage is None or usage["completion_tokens"] != tokens:
        raise RuntimeError(f"{request_id}: usage {usage}")
    return usage["completion_tokens"], outputs


async def load(port: int, prefix: str, requests: int, streams: int, tokens: int) -> tuple[float, int, dict[str, int]]:
    """``requests`` streams, ``streams`` at a time; (wall seconds, completion tokens, output events per request)."""
    next_index = iter(range(requests))
    outputs: dict[str, int] = {}
    done = 0

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal done
        for i in next_index:
            request_id = f"{prefix}-{i}"
            completion, outputs[request_id] = await one_stream(client, port, request_id, tokens)
            done += completion

    limits = httpx.Limits(max_connections=streams, max_keepalive_connections=streams)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(streams)))
        return time.perf_counter() - t0, done, outputs


def hopline_dirs(root: Path, baseline: str | None) -> list[str]:
    """The directories the vLLM server imports hopline's subpackages from, as its frames name
    them (an editable install: this checkout's top-level folders; ``baseline``: DIR/hopline/...)."""
    if baseline:
        return [os.path.join(os.path.abspath(baseline), "hopline") + os.sep]
    code = "import hopline.middleware as m, os; print(os.path.dirname(m.__file__))"
    out = subprocess.run([str(root / "venv" / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True)
    parent = os.path.dirname(out.stdout.strip().splitlines()[-1])
    return [os.path.join(parent, name) + os.sep for name in ("middleware", "collector", "analyzer", "dashboards")]


def split_frame(frame: str) -> tuple[str, str]:
    """py-spy's ``function (path:line)`` as (function, path)."""
    name, _, rest = frame.partition(" (")
    return name, rest.rsplit(":", 1)[0] if rest else ""


Owner = Callable[[str, str], bool]  # (function as py-spy names it, path) -> the code measured


def under(dirs: list[str]) -> Owner:
    """Frames in files under ``dirs`` (hopline's package directories, the floor's file)."""
    prefixes = tuple(dirs)
    return lambda name, path: path.startswith(prefixes)


def functions_or_dirs(functions: set[tuple[str, str]], dirs: tuple[str, ...] = ()) -> Owner:
    """Frames of the named functions (unqualified name, path ending) or in files under ``dirs``
    (path fragments)."""

    def owns(name: str, path: str) -> bool:
        if any(d in path for d in dirs):
            return True
        short = name.rpartition(".")[2]
        return any(short == f and path.endswith(tail) for f, tail in functions)

    return owns


def variant_owner(variant: str, root: Path, baseline: str | None) -> Owner:
    if variant == "otlp":
        return functions_or_dirs(TRACING_FUNCTIONS, TRACING_DIRS)
    if variant == "per-request-metrics":
        return functions_or_dirs(PER_REQUEST_METRICS_FUNCTIONS)
    return under(hopline_dirs(root, baseline))


def share_of(profile: Path, owner: Owner, stdlib: str) -> dict:
    """Count busy samples and those of ``owner``'s code in a py-spy raw (collapsed) profile: self
    (innermost frame), wide (+ stdlib callees), inclusive (a frame anywhere); see the module docstring."""
    busy = idle = mine = wide = inclusive = gc = gc_mine = 0
    functions: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    for line in profile.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = stack.split(";")
        thread = frames[0] if frames[0].startswith(("thread", "process")) else "?"
        in_gc = any(f.startswith(GC_FRAMES) for f in frames)  # only with --native
        # Python frames: "name (path:line)"; native ones (--native) are "name (lib.so)"
        frames = [f for f in frames if ":" in f.partition(" (")[2] and not f.startswith(("thread (", "process "))]
        if not frames:
            continue
        name, path = split_frame(frames[-1])
        if (name.rpartition(".")[2], os.path.basename(path)) in IDLE_LEAVES:
            idle += n
            continue
        busy += n
        gc += n * in_gc
        threads[thread] += n
        inclusive += n * any(owner(*split_frame(f)) for f in frames)
        if owner(name, path):
            mine += n
            gc_mine += n * in_gc
            wide += n
            functions[f"{name} ({os.path.basename(os.path.dirname(path))}/{os.path.basename(path)})"] += n
            continue
        # wider figure: innermost frames in the standard library, called from a frame of the code measured
        for frame in reversed(frames):
            f, p = split_frame(frame)
            if owner(f, p):
                wide += n
                break
            if not p.startswith(stdlib) or "site-packages" in p:
                break
    return {
        "busy": busy, "idle": idle, "hopline": mine, "wide": wide, "inclusive": inclusive, "gc": gc,
        "gc_hopline": gc_mine,
        "functions": functions, "threads": threads,
    }  # fmt: skip


def check_events(sink: Path, outputs: dict[str, int], tokens: int) -> str:
    """Every sampled request's engine hops and stats against what its client saw: a one-line verdict.

    ``output_chunks`` must equal the SSE events with content the client counted (vLLM merges tokens
    into one event when its API server lags, so it is not ``tokens``).
    """
    by_request: dict[str, dict[str, dict]] = defaultdict(dict)
    for name in sorted(glob.glob(f"{sink}*")):
        for line in Path(name).read_bytes().splitlines():
            event = orjson.loads(line)
            if event.get("request_id") in outputs:
                by_request[event["request_id"]][event["hop"]] = event
    bad = []
    for request_id, seen in outputs.items():
        hops = by_request.get(request_id, {})
        last = hops.get("engine.last_token", {})
        got = (last.get("output_tokens"), last.get("output_chunks"), last.get("finish_reason"))
        ok = (
            set(hops) == {"engine.received", "engine.first_token", "engine.last_token", "engine.stats"}
            and got == (tokens, seen, "length")
            and (seen < 2 or last.get("max_gap_s", -1) >= 0)
        )
        if not ok:
            bad.append((request_id, sorted(hops), got, seen))
    if bad:
        return f"EVENTS WRONG for {len(bad)} of {len(outputs)} requests, e.g. {bad[:3]}"
    return (
        f"events checked: {len(outputs)} requests x (received, first_token, last_token, stats); last_token's "
        f"output_tokens, finish_reason and output_chunks (= the client's count, {min(outputs.values())}-"
        f"{max(outputs.values())}) exact"
    )


def measure(args: argparse.Namespace, root: Path, baseline: str | None) -> dict:
    """One vLLM start, warm-up, sampled load; the share figures of that run.

    ``baseline``: a directory whose ``hopline/`` package the server imports instead of this
    checkout's (put first on its ``PYTHONPATH``), for a before/after comparison.
    """
    tmp = Path(tempfile.mkdtemp(prefix="hopline-pyspy-"))
    sink, log, profile = tmp / "events.ndjson", tmp / "serve.log", tmp / "profile.txt"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = ([baseline] if baseline else []) + ([str(FLOOR.parent)] if args.floor else [])
    os.environ["PYTHONPATH"] = os.pathsep.join(path)  # start_server passes it on to vllm serve
    extra: tuple[str, ...] = ("--middleware", "vllm_floor_middleware.FloorMiddleware") if args.floor else ()
    server = {"venv": "venv", "middleware": True}
    for key in OTEL_ENV:
        os.environ.pop(key, None)
    if args.variant != "hopline":  # vLLM without hopline: no middleware, no stat logger plugin
        server = {"venv": "venv-nohop", "middleware": False}
        extra = (VARIANT_FLAGS[args.variant],)
    if args.variant == "otlp":
        extra += (args.collector + "/v1/traces",)
        os.environ.update(OTEL_ENV)  # start_server passes the bench's environment on
    proc = start_server(root, port, sink, log, max_num_seqs=args.max_num_seqs, extra_args=extra, **server)
    try:
        ready = wait_ready(proc, port, log)
        asyncio.run(load(port, "warm", args.warmup, args.streams, args.tokens))
        spy = subprocess.Popen(
            [args.py_spy, "record", "--pid", str(proc.pid), "--rate", str(args.rate), "--format", "raw",
             "--full-filenames", "--threads", "--gil", "--output", str(profile), *(["--native"] if args.native else [])],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        time.sleep(1.0)  # py-spy attached
        wall, tokens, outputs = asyncio.run(load(port, "bench", args.requests, args.streams, args.tokens))
        spy.send_signal(signal.SIGINT)
        _, spy_err = spy.communicate(timeout=60)
        if args.variant == "per-request-metrics":
            from bench_vllm_variants import metrics_check  # it imports this module

            verdict = metrics_check(port, args.tokens)
    finally:
        stop_server(proc)
    if not profile.exists():
        sys.exit(f"py-spy wrote no profile: {spy_err.decode(errors='replace')[-2000:]}")
    if args.variant == "hopline":
        verdict = check_events(sink, outputs, args.tokens)
    elif args.variant == "otlp":
        from bench_vllm_variants import spans_check

        verdict = spans_check(args.collector, outputs, args.tokens)
    stdlib = os.path.dirname(os.__file__)
    result = share_of(profile, variant_owner(args.variant, root, baseline), stdlib)
    result["floor"] = share_of(profile, under([str(FLOOR)]), stdlib)["hopline"] if args.floor else None
    result.update(ready=ready, wall=wall, tokens=tokens, verdict=verdict)
    if args.keep:
        shutil.copy(profile, f"{args.keep}.{label_of(args, baseline)}.{int(time.time())}")
    shutil.rmtree(tmp, ignore_errors=True)
    return result


def label_of(args: argparse.Namespace, baseline: str | None) -> str:
    return args.variant if args.variant != "hopline" else "baseline" if baseline else "current"


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The binomial 95% interval (Wilson's) of a share of k in n, as fractions."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def share_line(k: int, n: int) -> str:
    lo, hi = wilson(k, n)
    return f"{k} of {n} = {100 * k / max(n, 1):.2f}% [95%: {100 * lo:.2f}, {100 * hi:.2f}]"


def report(label: str, args: argparse.Namespace, result: dict) -> None:
    busy, mine, wide = result["busy"], result["hopline"], result["wide"]
    p = mine / busy if busy else 0.0
    se = math.sqrt(p * (1 - p) / busy) if busy else 0.0
    code = {"otlp": "vLLM tracing", "per-request-metrics": "vLLM per-request metrics"}.get(args.variant)
    code = code or "hopline"
    print(f"== {label}: vLLM ready after {result['ready']:.0f} s; {args.requests} requests x {args.tokens} tokens, "
          f"{args.streams} streams: {result['wall']:.1f} s, {result['tokens'] / result['wall']:.0f} tok/s; "
          f"py-spy {args.rate} Hz")
    print(result["verdict"])
    print(f"busy samples: {busy} (idle leaves left out: {result['idle']})")
    print(f"{code} self samples: {mine} -> share {100 * p:.2f}% (+- {100 * se:.2f}% s.e.); "
          f"{share_line(mine, busy)}")
    print(f"{code} + stdlib callees: {wide} -> {100 * wide / max(busy, 1):.2f}%")
    if args.variant != "hopline":
        print(f"{code} inclusive (a frame anywhere on the stack): {share_line(result['inclusive'], busy)}")
    if args.native:
        gc, gc_mine = result["gc"], result["gc_hopline"]
        print(f"garbage collection: {gc} samples ({100 * gc / max(busy, 1):.2f}% of busy), {gc_mine} of them in "
              f"hopline's frames; hopline without GC: {mine - gc_mine} of {busy - gc} -> "
              f"{100 * (mine - gc_mine) / max(busy - gc, 1):.2f}%")
    if result["floor"] is not None:
        print(f"floor send wrapper (bench/vllm_floor_middleware.py) self samples: {result['floor']} -> "
              f"{100 * result['floor'] / max(busy, 1):.2f}%")
    print("busy samples by thread: " + ", ".join(f"{t} {n}" for t, n in result["threads"].most_common(6)))
    print(f"top {code} functions (self samples):")
    for name, n in result["functions"].most_common(12):
        print(f"  {n:6d}  {name}")


def main() -> None:
    args = parse_args()
    root = Path(args.vllm_dir)
    venv = "venv" if args.variant == "hopline" else "venv-nohop"
    for need in (root / venv / "bin" / "python", root / "tiny" / "config.json", Path(args.py_spy)):
        if not need.exists():
            sys.exit(f"{need} is missing (vLLM: HOPLINE_VLLM_DIR={root} bash .ci/vllm-setup.sh; py-spy: pip install py-spy)")
    runs = [None] if args.baseline is None else [args.baseline, None]
    pooled: dict[str, list[int]] = defaultdict(lambda: [0] * 5)  # self, busy, gc, gc in self, inclusive
    collector = None
    if args.variant == "otlp":
        from test_vllm import free_port
        from test_vllm_otlp import start_collector

        ctmp = Path(tempfile.mkdtemp(prefix="hopline-pyspy-collector-"))
        cport = free_port()
        collector = start_collector(ctmp / "data", cport, ctmp / "collector.log")
        args.collector = f"http://127.0.0.1:{cport}"
    try:
        run_rounds(args, root, runs, pooled)
    finally:
        if collector is not None:
            stop_server(collector)
            shutil.rmtree(ctmp, ignore_errors=True)
    print("== pooled over rounds:")
    for label, (mine, busy, gc, gc_mine, inclusive) in pooled.items():
        p = mine / busy if busy else 0.0
        se = math.sqrt(p * (1 - p) / busy) if busy else 0.0
        print(f"{label}: self {share_line(mine, busy)} (+- {100 * se:.2f}% s.e.)")
        if args.variant != "hopline":
            print(f"{label}: inclusive {share_line(inclusive, busy)}")
        if args.native:
            print(f"{label}: without GC, self {mine - gc_mine} of {busy - gc} = "
                  f"{100 * (mine - gc_mine) / max(busy - gc, 1):.2f}%; GC {gc} samples, {gc_mine} in its own")


def run_rounds(args: argparse.Namespace, root: Path, runs: list[str | None], 
               pooled: dict[str, list[int]]) -> None:
    for rnd in range(args.rounds):
        for baseline in runs if rnd % 2 == 0 else runs[::-1]:
            label = label_of(args, baseline)
            for attempt in range(3):  # on this shared machine a server is sometimes stopped from outside
                try:
                    result = measure(args, root, baseline)
                    break
                except (httpx.HTTPError, RuntimeError) as exc:
                    print(f"== round {rnd + 1}, {label}: run failed ({exc!r}); server log kept in /tmp; again")
            else:
                sys.exit("three failed runs in a row")
            report(f"round {rnd + 1}, {label}", args, result)
            for i, key in enumerate(("hopline", "busy", "gc", "gc_hopline", "inclusive")):
                pooled[label][i] += result[key]


if __name__ == "__main__":
    main()
