"""Engines' own per-request records turned into hop events: one mapping table per record format.

Where hopline cannot run inside an engine, the engine's per-request record says the same things.
``hopline analyze`` and the collector's ``--tail`` pass every NDJSON line through
``translate_lines``: a line that is a known record becomes ``engine.received`` / ``scheduled`` /
``first_token`` / ``last_token`` and ``engine.stats`` events; any other line is left as it is.

The tables below are the whole mapping (data, read by one generic function): which fields are
timestamps of which hop, which durations feed ``engine.stats``, and which counts are copied. A
field path is dotted (``perf_metrics.timing_metrics.arrival_time``); ``-`` in front subtracts;
``@json`` decodes a JSON string on the way (SGLang keeps the request's parameters as one).

SGLang (0.5.23: ``--enable-metrics --export-metrics-to-file --export-metrics-to-file-dir D``,
``FileRequestMetricsExporter`` in sglang/srt/observability/request_metrics_exporter.py writes
``D/sglang-request-metrics-YYYYMMDD_HH.log``: one JSON object per finished request, the
``meta_info`` of the final output plus ``request_parameters``). Clocks: every ``*_ts`` /
``*_time`` is wall-clock epoch seconds: SGLang stamps ``perf_counter`` and adds its process's
``time.time() - perf_counter()`` (``convert_time_to_realtime``, req_time_stats.py). The API
server stamps ``request_received_ts`` (``created_time``, when ``handle_request`` began) and
measures ``first_token_latency`` / ``e2e_latency`` from it; the scheduler stamps
``forward_entry_time`` (first forward: "scheduled") and ``prefill_finished_time`` and measures
``queue_time`` (s). Durations are taken within one process, never across the two. The request
ID is ``meta_info.id``, the ``rid``: SGLang takes it from the request body's ``rid`` field
(``ChatCompletionRequest.rid``; it ignores ``X-Request-Id``); with ``n > 1`` it becomes
``{rid}_{i}``. ``request_parameters`` holds the prompt: only ``stream`` and
``sampling_params.max_new_tokens`` are read from it, nothing else is kept.

TensorRT-LLM (``trtllm-serve`` with ``return_perf_metrics: true`` and ``perf_metrics_max_requests:
N``; ``OpenAIServer.get_perf_metrics`` / ``_extract_metrics`` in tensorrt_llm/serve/openai_server.py,
NVIDIA/TensorRT-LLM main at e7f7345e31e5). ``GET /perf_metrics`` returns and drains the records.
Clocks: every ``timing_metrics`` value is the C++ ``steady_clock`` in seconds
(``get_steady_clock_now_in_seconds``; CLOCK_MONOTONIC on Linux, Python's ``time.monotonic()``),
not wall clock. ``poll_trtllm`` (on the engine's host) adds ``hopline_clock_offset_s`` = wall -
monotonic to each record it saves; a record without it cannot be placed in time and is refused.
The request ID is the executor's integer ``request_id``; a streamed chat response's chunks carry
``id = chatcmpl-<that integer>`` (so hopline's ``normalize_request_id`` gives the same string), a
non-streaming response a fresh ``chatcmpl-<uuid>``. TensorRT-LLM accepts no caller request ID:
its records join hopline's client and gateway hops only through the streamed response ``id``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from hopline.middleware.contract.errors import HoplineError
from hopline.middleware.contract import VERSION, normalize_request_id


class RecordError(HoplineError, ValueError):
    """A line that is a known engine record but cannot be read; the message says which field."""


@dataclass(frozen=True)
class RecordFormat:
    """How one engine's per-request record maps to hop events.

    ``detect``: fields that all exist only in this format. ``clock``: a field added to every
    timestamp (None: the timestamps are already Unix epoch seconds). ``hops``: hop -> the
    alternatives for its time, each a sum of signed fields; the first alternative whose fields
    all exist wins. ``stats``: ``engine.stats`` attribute -> a sum of signed fields (seconds).
    ``attrs``: event attribute -> (field, hops that carry it).
    """

    name: str
    detect: tuple[str, ...]
    request_id: str
    clock: str | None
    hops: Mapping[str, tuple[tuple[str, ...], ...]]
    stats: Mapping[str, tuple[str, ...]]
    attrs: Mapping[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)


SGLANG = RecordFormat(
    name="sglang",
    detect=("id", "request_received_ts", "e2e_latency"),
    request_id="id",
    clock=None,
    hops={
        "engine.received": (("request_received_ts",),),
        "engine.scheduled": (("forward_entry_time",),),
        "engine.first_token": (("request_received_ts", "first_token_latency"),),
        "engine.last_token": (("request_received_ts", "e2e_latency"),),
    },
    stats={
        "queue_s": ("queue_time",),
        "prefill_s": ("prefill_finished_time", "-forward_entry_time"),
        "decode_s": ("e2e_latency", "-first_token_latency"),
    },
    attrs={
        "stream": ("request_parameters.@json.stream", ("engine.received",)),
        "max_tokens": ("request_parameters.@json.sampling_params.max_new_tokens", ("engine.received",)),
        "prompt_tokens": ("prompt_tokens", ("engine.received", "engine.stats")),
        "output_tokens": ("completion_tokens", ("engine.last_token", "engine.stats")),
        "cached_tokens": ("cached_tokens", ("engine.last_token", "engine.stats")),
        "finish_reason": ("finish_reason.type", ("engine.last_token",)),
    },
)

TRTLLM = RecordFormat(
    name="tensorrt-llm",
    detect=("request_id", "perf_metrics.timing_metrics"),
    request_id="request_id",
    clock="hopline_clock_offset_s",
    hops={
        "engine.received": (
            ("perf_metrics.timing_metrics.server_arrival_time",),
            ("perf_metrics.timing_metrics.arrival_time",),
        ),
        "engine.scheduled": (("perf_metrics.timing_metrics.first_scheduled_time",),),
        "engine.first_token": (
            ("perf_metrics.timing_metrics.server_first_token_time",),
            ("perf_metrics.timing_metrics.first_token_time",),
        ),
        "engine.last_token": (("perf_metrics.timing_metrics.last_token_time",),),
    },
    stats={  # tensorrt_llm/metrics/perf_utils.py: queue, prefill, decode from the executor's times
        "queue_s": (
            "perf_metrics.timing_metrics.first_scheduled_time",
            "-perf_metrics.timing_metrics.arrival_time",
        ),
        "prefill_s": (
            "perf_metrics.timing_metrics.first_token_time",
            "-perf_metrics.timing_metrics.first_scheduled_time",
        ),
        "decode_s": (
            "perf_metrics.timing_metrics.last_token_time",
            "-perf_metrics.timing_metrics.first_token_time",
        ),
    },
    attrs={
        "kv_blocks_allocated": (
            "perf_metrics.kv_cache_metrics.num_total_allocated_blocks",
            ("engine.stats",),
        ),
        "kv_blocks_new": ("perf_metrics.kv_cache_metrics.num_new_allocated_blocks", ("engine.stats",)),
        "kv_blocks_reused": ("perf_metrics.kv_cache_metrics.num_reused_blocks", ("engine.stats",)),
        "kv_blocks_missed": ("perf_metrics.kv_cache_metrics.num_missed_blocks", ("engine.stats",)),
    },
)

FORMATS: tuple[RecordFormat, ...] = (SGLANG, TRTLLM)
# A line without any of these bytes is no record: ``translate_lines`` leaves it untouched unparsed.
_MARKERS = (b'"request_received_ts"', b'"perf_metrics"')
_MISSING = object()


def _get(record: Mapping[str, Any], path: str) -> Any:
    value: Any = record
    for part in path.split("."):
        if part == "@json":
            if not isinstance(value, (str, bytes)):
                return _MISSING
            try:
                value = orjson.loads(value)
            except orjson.JSONDecodeError:
                return _MISSING
            continue
        if not isinstance(value, Mapping) or part not in value:
            return _MISSING
        value = value[part]
    return _MISSING if value is None else value


def _number(record: Mapping[str, Any], path: str, fmt: RecordFormat) -> float | None:
    value = _get(record, path)
    if value is _MISSING:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RecordError(f"{fmt.name} record: {path} must be a number, got {value!r:.40}")
    return float(value)


def _sum(record: Mapping[str, Any], terms: tuple[str, ...], fmt: RecordFormat) -> float | None:
    total = 0.0
    for term in terms:
        sign, path = (-1.0, term[1:]) if term.startswith("-") else (1.0, term)
        value = _number(record, path, fmt)
        if value is None:
            return None
        total += sign * value
    return total


def format_of(record: Any) -> RecordFormat | None:
    """The format a decoded line is a record of, or None (an ordinary hop event, or anything else)."""
    if not isinstance(record, Mapping) or "hop" in record:
        return None
    return next((f for f in FORMATS if all(_get(record, p) is not _MISSING for p in f.detect)), None)


def record_events(record: Mapping[str, Any], fmt: RecordFormat) -> list[dict[str, Any]]:
    """The hop events one record of ``fmt`` stands for (RecordError when it cannot be read)."""
    rid = normalize_request_id(str(_get(record, fmt.request_id)))
    if rid is None:
        raise RecordError(f"{fmt.name} record: {fmt.request_id} is not a usable request ID")
    offset = 0.0
    if fmt.clock is not None:
        found = _number(record, fmt.clock, fmt)
        if found is None:
            raise RecordError(
                f"{fmt.name} record {rid}: no {fmt.clock} (its times are a monotonic clock; save records "
                "with `python -m hopline.middleware.contract.records poll-trtllm`)"
            )
        offset = found
    events: dict[str, dict[str, Any]] = {}
    for hop, alternatives in fmt.hops.items():
        for terms in alternatives:
            ts = _sum(record, terms, fmt)
            if ts is not None:
                if not ts + offset > 0:
                    raise RecordError(
                        f"{fmt.name} record {rid}: {hop} time {ts + offset!r} is not epoch seconds"
                    )
                events[hop] = {"v": VERSION, "ts": ts + offset, "request_id": rid, "hop": hop, "attempt": 0}
                break
    if not events:
        raise RecordError(f"{fmt.name} record {rid}: none of its timestamps is present")
    stats = {
        name: value for name, terms in fmt.stats.items() if (value := _sum(record, terms, fmt)) is not None
    }
    end = events.get("engine.last_token") or max(events.values(), key=lambda e: e["ts"])
    if stats or any("engine.stats" in hops for _, hops in fmt.attrs.values()):
        events["engine.stats"] = {**end, "hop": "engine.stats", **stats}
    for attr, (path, hops) in fmt.attrs.items():
        value = _get(record, path)
        if value is _MISSING or isinstance(value, (dict, list)):
            continue
        for hop in hops:
            if hop in events:
                events[hop][attr] = value[:32] if isinstance(value, str) else value
    return sorted(events.values(), key=lambda e: e["ts"])


def translate_lines(data: bytes) -> tuple[bytes, list[str]]:
    """NDJSON with every engine record replaced by its hop events; and the records that failed.

    Lines that are not records (hop events, blank or broken lines) pass through unchanged, so
    whoever reads on validates them as before. A record that cannot be read is dropped and
    described in the returned list (``line N: reason``).
    """
    if not any(marker in data for marker in _MARKERS):
        return data, []
    out: list[bytes] = []
    errors: list[str] = []
    for number, line in enumerate(data.split(b"\n"), start=1):
        if not any(marker in line for marker in _MARKERS):
            out.append(line)
            continue
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            out.append(line)
            continue
        fmt = format_of(record)
        if fmt is None:
            out.append(line)
            continue
        try:
            out.extend(orjson.dumps(event) for event in record_events(record, fmt))
        except RecordError as exc:
            errors.append(f"line {number}: {exc}")
    return b"\n".join(out), errors


# --- TensorRT-LLM: fetch /perf_metrics and save the records with the clock offset ----------------


def poll_trtllm(url: str, out_path: str, *, interval_s: float = 5.0, rounds: int | None = None) -> int:
    """Fetch ``URL/perf_metrics`` every ``interval_s`` (it drains on read) and append each record,
    with ``hopline_clock_offset_s``, as one NDJSON line to ``out_path``; returns records saved.

    Run it on the engine's host: the offset is this host's wall clock minus its monotonic clock,
    which is TensorRT-LLM's steady clock. ``rounds`` None polls until interrupted.
    """
    import httpx

    saved = 0
    done = 0
    with httpx.Client(timeout=10) as client, open(out_path, "ab") as out:
        while rounds is None or done < rounds:
            done += 1
            records = client.get(url.rstrip("/") + "/perf_metrics").raise_for_status().json()
            offset = time.time() - time.monotonic()
            for record in records if isinstance(records, list) else ():
                if isinstance(record, dict):
                    out.write(orjson.dumps({**record, "hopline_clock_offset_s": offset}) + b"\n")
                    saved += 1
            out.flush()
            if rounds is None or done < rounds:
                time.sleep(interval_s)
    return saved


def main(argv: list[str] | None = None) -> int:
    """``python -m hopline.middleware.contract.records poll-trtllm http://engine:8000 --out records.ndjson``"""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m hopline.middleware.contract.records", description=main.__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    poll = sub.add_parser("poll-trtllm", help="save trtllm-serve's /perf_metrics records for hopline")
    poll.add_argument("url")
    poll.add_argument("--out", required=True, help="NDJSON file to append to (feed it to --tail or analyze)")
    poll.add_argument("--interval", type=float, default=5.0)
    args = parser.parse_args(argv)
    try:
        poll_trtllm(args.url, args.out, interval_s=args.interval)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
