"""Engines' own per-request records turned into hop events: one row per record format.

Where hopline cannot run inside an engine, the engine's per-request record says the same things.
``hopline analyze`` and the collector's ``--tail`` pass every NDJSON line through
``translate_lines``: a line that is a known record becomes ``engine.received`` / ``scheduled`` /
``first_token`` / ``last_token`` and ``engine.stats`` events (and the prefill leg's, ``prefill.*``,
where the record splits a disaggregated request); any other line is left as it is.

Each ``RecordFormat`` row below is the whole of one format: the bytes that mark its lines, the
file names ``hopline analyze`` reads as its records, which fields are timestamps of which hop,
which durations feed the stats events, and which counts are copied. Adding a format is a row
(read by the generic functions below) plus its fixture. A field path is dotted
(``perf_metrics.timing_metrics.arrival_time``); in a sum ``-`` in front subtracts, ``?`` in front
only requires the field and ``!`` its absence (neither adds anything); ``@json`` decodes a JSON
string on the way (SGLang keeps the request's parameters as one), ``@str`` turns a number into a
string (Dynamo's worker IDs as replica names).

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
not wall clock. ``hopline poll-trtllm`` (middleware/trtllm_poll.py, on the engine's host) adds
``hopline_clock_offset_s`` = wall - monotonic to each record it saves; a record without it cannot
be placed in time and is refused. The request ID is the executor's integer ``request_id``; a
streamed chat response's chunks carry ``id = chatcmpl-<that integer>`` (so hopline's
``normalize_request_id`` gives the same string), a non-streaming response a fresh
``chatcmpl-<uuid>``. TensorRT-LLM accepts no caller request ID: its records join hopline's client
and gateway hops only through the streamed response ``id``.

NVIDIA Dynamo (``DYN_REQUEST_TRACE=1``; ai-dynamo/dynamo @ 04daeb0eb425 for
lib/llm/src/request_trace/{record,integration,sink}.rs and types.rs, the RequestTracker of
lib/llm/src/protocols/common/timing.rs as stored at a later commit, which adds
``kv_transfer_estimated_latency_secs``). The frontend writes one ``request_end`` record per
finished request (``RequestTraceRecord``: ``schema`` = ``dynamo.request.trace.v1``,
``event_type``, ``event_time_unix_ms``, ``request``); its file sinks wrap each in
``{"timestamp": ms since the writer started, "event": record}`` (``DYN_REQUEST_TRACE_SINKS=file``,
jsonl or rotating ``<prefix>.NNNNNN.jsonl.gz``), its stderr sink writes it bare: both are read.
Other event types (``tool_*``; ``request_payload``, which holds the prompt and the answer) give no
events and are dropped whole. Clocks: ``request.request_received_ms`` is the frontend's wall clock
(epoch ms, whole ms) when its ``RequestTracker`` was made; every ``*_ms`` duration is measured from
it on the same tracker's monotonic clock, all in the frontend: ``prefill_wait_time_ms`` = until
the request was dispatched to the worker that runs its prefill (``queue``: preprocessing, routing,
the router's queue), ``prefill_time_ms`` = from there to the first output back at the frontend
(``prefill``: the worker's own queue, its prefill, the way there and back), ``ttft_ms`` their sum,
``total_time_ms`` until the last output. Under disaggregated prefill/decode,
``kv_transfer_estimated_latency_ms`` (an upper bound: the decode worker's first token minus the
prefill worker's result at the router: dispatch, network, the KV transfer and one decode forward)
is set, and ``ttft_ms`` is the prefill worker's result, a token the caller never sees: such a
record is read as the two legs of hopline's P/D contract (the prefill leg from arrival to that
result, the decode leg from there to its first token ``kv_transfer`` later, each leg's replica its
worker ID), so ``kv_transfer`` is its own stage and is not counted as network. Without it, one
engine. The request ID: ``request.x_request_id`` (the caller's ``X-Request-Id``; in the record
only when the request carried an agent context) else ``request.request_id``, Dynamo's own: the
``request-id`` (or deprecated ``x-dynamo-request-id``) header when that parses as a UUID (hopline's
32-hex IDs do), else a fresh UUID; the response ``id`` is ``chatcmpl-<it>``. Requests with
``n > 1``, ``best_of > 1``, multimodal input or prompt embeddings get no record.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from hopline.middleware.contract import LEGS, VERSION, normalize_request_id
from hopline.middleware.contract.errors import HoplineError


class RecordError(HoplineError, ValueError):
    """A line that is a known engine record but cannot be read; the message says which field."""


Sums = tuple[tuple[str, ...], ...]  # alternatives, the first whose terms all hold wins


@dataclass(frozen=True)
class RecordFormat:
    """How one engine's per-request record maps to hop events: everything about the format.

    ``marker``: bytes every record line holds (a line without any format's marker is passed on
    unparsed). ``files``: a regular expression for file names ``hopline analyze`` reads as this
    format's records when it walks a folder (None: the names are NDJSON's own, ``*.jsonl``...).
    ``detect``: fields that all exist only in this format. ``envelope``: a key the record may sit
    under (its fields are read there). ``only``: (field, value): records of the format whose field
    differs stand for no hop events and are dropped. ``request_id``: the fields that may hold the
    request ID, the first usable wins. ``clock``: a field added to every timestamp (None: the
    timestamps are already Unix epoch time). ``per_second``: units of the times and durations
    per second (1000: milliseconds). ``hops``: hop -> the alternatives for its time, each a sum of
    signed fields; a ``prefill.*`` (``decode.*``) hop is that P/D leg's, emitted as ``engine.*``
    with ``leg``. ``stats``: stats hop -> attribute -> alternatives (in the row's unit, saved as
    seconds). ``attrs``: (event attribute, field, hops that carry it). ``clock`` is in seconds. ``source``: the code the row was read from.
    """

    name: str
    marker: bytes
    detect: tuple[str, ...]
    request_id: tuple[str, ...]
    hops: Mapping[str, Sums]
    stats: Mapping[str, Mapping[str, Sums]]
    attrs: tuple[tuple[str, str, tuple[str, ...]], ...] = ()
    clock: str | None = None
    per_second: float = 1.0
    envelope: str | None = None
    only: tuple[str, Any] | None = None
    files: str | None = None
    source: str = ""
    _files: re.Pattern | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.files is not None:
            object.__setattr__(self, "_files", re.compile(self.files))

    def names_file(self, name: str) -> bool:
        """Whether a file called ``name`` holds this format's records by its name alone."""
        return self._files is not None and self._files.fullmatch(name) is not None


SGLANG = RecordFormat(
    name="sglang",
    source="sglang 0.5.23 (request_metrics_exporter.py, tokenizer_manager.py, req_time_stats.py)",
    marker=b'"request_received_ts"',
    files=r"sglang-request-metrics-[0-9_]+\.log",
    detect=("id", "request_received_ts", "e2e_latency"),
    request_id=("id",),
    hops={
        "engine.received": (("request_received_ts",),),
        "engine.scheduled": (("forward_entry_time",),),
        "engine.first_token": (("request_received_ts", "first_token_latency"),),
        "engine.last_token": (("request_received_ts", "e2e_latency"),),
    },
    stats={
        "engine.stats": {
            "queue_s": (("queue_time",),),
            "prefill_s": (("prefill_finished_time", "-forward_entry_time"),),
            "decode_s": (("e2e_latency", "-first_token_latency"),),
        },
    },
    attrs=(
        ("stream", "request_parameters.@json.stream", ("engine.received",)),
        ("max_tokens", "request_parameters.@json.sampling_params.max_new_tokens", ("engine.received",)),
        ("prompt_tokens", "prompt_tokens", ("engine.received", "engine.stats")),
        ("output_tokens", "completion_tokens", ("engine.last_token", "engine.stats")),
        ("cached_tokens", "cached_tokens", ("engine.last_token", "engine.stats")),
        ("finish_reason", "finish_reason.type", ("engine.last_token",)),
    ),
)

_TM = "perf_metrics.timing_metrics."
_KV = "perf_metrics.kv_cache_metrics."
TRTLLM = RecordFormat(
    name="tensorrt-llm",
    source="NVIDIA/TensorRT-LLM main @ e7f7345e31e5 (tensorrt_llm/serve/openai_server.py)",
    marker=b'"perf_metrics"',
    detect=("request_id", "perf_metrics.timing_metrics"),
    request_id=("request_id",),
    clock="hopline_clock_offset_s",
    hops={
        "engine.received": ((_TM + "server_arrival_time",), (_TM + "arrival_time",)),
        "engine.scheduled": ((_TM + "first_scheduled_time",),),
        "engine.first_token": ((_TM + "server_first_token_time",), (_TM + "first_token_time",)),
        "engine.last_token": ((_TM + "last_token_time",),),
    },
    stats={  # tensorrt_llm/metrics/perf_utils.py: queue, prefill, decode from the executor's times
        "engine.stats": {
            "queue_s": ((_TM + "first_scheduled_time", "-" + _TM + "arrival_time"),),
            "prefill_s": ((_TM + "first_token_time", "-" + _TM + "first_scheduled_time"),),
            "decode_s": ((_TM + "last_token_time", "-" + _TM + "first_token_time"),),
        },
    },
    attrs=(
        ("kv_blocks_allocated", _KV + "num_total_allocated_blocks", ("engine.stats",)),
        ("kv_blocks_new", _KV + "num_new_allocated_blocks", ("engine.stats",)),
        ("kv_blocks_reused", _KV + "num_reused_blocks", ("engine.stats",)),
        ("kv_blocks_missed", _KV + "num_missed_blocks", ("engine.stats",)),
    ),
)

_AT = "request.request_received_ms"
_WAIT = "request.prefill_wait_time_ms"
_PREFILL = "request.prefill_time_ms"
_TTFT = "request.ttft_ms"
_TOTAL = "request.total_time_ms"
_XFER = "request.kv_transfer_estimated_latency_ms"  # set: a disaggregated request, read as two legs
_ONE, _TWO = "!" + _XFER, "?" + _XFER
_ENGINE_HOPS = (
    "engine.received", "engine.scheduled", "engine.first_token", "engine.last_token", "engine.stats",
)  # fmt: skip
_DECODE_HOPS = ("decode.received", "decode.first_token", "decode.last_token", "decode.stats")
_PREFILL_HOPS = ("prefill.received", "prefill.last_token", "prefill.stats")
_STATS = ("engine.stats", "decode.stats")  # the engine's (aggregated) or the decode leg's
_LAST = ("engine.last_token", "decode.last_token")
DYNAMO = RecordFormat(
    name="dynamo",
    source="ai-dynamo/dynamo @ 04daeb0eb425 (lib/llm/src/request_trace/record.rs, types.rs, sink.rs)",
    marker=b'"dynamo.request.trace.v1"',
    detect=("schema", "event_type", "event_time_unix_ms"),
    envelope="event",
    only=("event_type", "request_end"),
    request_id=("request.x_request_id", "request.request_id"),
    per_second=1000.0,
    hops={
        # aggregated: one engine
        "engine.received": ((_AT, _ONE),),
        "engine.scheduled": ((_AT, _WAIT, _ONE),),
        "engine.first_token": ((_AT, _TTFT, _ONE),),
        "engine.last_token": ((_AT, _TOTAL, _ONE),),
        # disaggregated: the prefill leg, from arrival to the prefill worker's result at the router,
        # then the decode leg, from there to its first token (the KV-transfer estimate) and its end
        "prefill.received": ((_AT, _TWO),),
        "prefill.last_token": ((_AT, _TTFT, _TWO),),
        "decode.received": ((_AT, _TTFT, _TWO),),
        "decode.first_token": ((_AT, _TTFT, _XFER),),
        "decode.last_token": ((_AT, _TOTAL, _TWO),),
    },
    stats={
        "engine.stats": {
            "queue_s": ((_WAIT, _ONE),),
            "prefill_s": ((_PREFILL, _ONE),),
            "decode_s": ((_TOTAL, "-" + _TTFT, _ONE),),
        },
        "prefill.stats": {"queue_s": ((_WAIT, _TWO),), "prefill_s": ((_PREFILL, _TWO),)},
        "decode.stats": {"decode_s": ((_TOTAL, "-" + _TTFT, "-" + _XFER),), "kv_transfer_s": ((_XFER,),)},
    },
    attrs=(
        ("replica", "request.worker.decode_worker_id.@str", _ENGINE_HOPS + _DECODE_HOPS),
        ("replica", "request.worker.prefill_worker_id.@str", _PREFILL_HOPS),
        ("model", "request.model", _ENGINE_HOPS + _DECODE_HOPS + _PREFILL_HOPS),
        ("prompt_tokens", "request.input_tokens", _STATS + ("engine.received", "decode.received")),
        ("output_tokens", "request.output_tokens", _STATS + _LAST),
        ("cached_tokens", "request.cached_tokens", (*_STATS, "prefill.stats")),
        ("kv_hit_rate", "request.kv_hit_rate", _STATS),
        ("queue_depth", "request.queue_depth", _STATS),
        ("finish_reason", "request.finish_reason_metadata.finish_reason", _LAST),
    ),
)

FORMATS: tuple[RecordFormat, ...] = (SGLANG, TRTLLM, DYNAMO)
# A line without any of these bytes is no record: ``translate_lines`` leaves it untouched unparsed.
MARKERS: tuple[bytes, ...] = tuple(f.marker for f in FORMATS)
_MISSING = object()


def is_record_file(name: str) -> bool:
    """Whether a file called ``name`` holds some engine's records by its name (``hopline analyze``
    reads it as NDJSON when it walks a folder)."""
    return any(f.names_file(name) for f in FORMATS)


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
        if part == "@str":
            if isinstance(value, bool) or not isinstance(value, (int, str)):
                return _MISSING
            value = str(value)
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
        if term[0] in "?!":  # a guard: the field must be there (?) or not (!); it adds nothing
            if (_get(record, term[1:]) is _MISSING) == (term[0] == "?"):
                return None
            continue
        sign, path = (-1.0, term[1:]) if term.startswith("-") else (1.0, term)
        value = _number(record, path, fmt)
        if value is None:
            return None
        total += sign * value
    return total


def _first(record: Mapping[str, Any], alternatives: Sums, fmt: RecordFormat) -> float | None:
    for terms in alternatives:
        if (value := _sum(record, terms, fmt)) is not None:
            return value
    return None


def _inner(record: Mapping[str, Any], fmt: RecordFormat) -> Mapping[str, Any] | None:
    """The record itself, or the one under the format's envelope, when it has the format's fields."""
    candidates = [record]
    if fmt.envelope is not None and isinstance(record.get(fmt.envelope), Mapping):
        candidates.append(record[fmt.envelope])
    return next((r for r in candidates if all(_get(r, p) is not _MISSING for p in fmt.detect)), None)


def format_of(record: Any) -> RecordFormat | None:
    """The format a decoded line is a record of, or None (an ordinary hop event, or anything else)."""
    if not isinstance(record, Mapping) or "hop" in record:
        return None
    return next((f for f in FORMATS if _inner(record, f) is not None), None)


def _request_id(record: Mapping[str, Any], fmt: RecordFormat) -> str:
    for path in fmt.request_id:
        value = _get(record, path)
        if value is not _MISSING and (rid := normalize_request_id(str(value))) is not None:
            return rid
    raise RecordError(f"{fmt.name} record: {' / '.join(fmt.request_id)} holds no usable request ID")


def _emitted(read_name: str) -> tuple[str, dict[str, Any]]:
    """``prefill.received`` -> (``engine.received``, {leg: prefill}), ``decode.*`` likewise; an
    engine hop as it is."""
    kind, _, what = read_name.partition(".")
    return (f"engine.{what}", {"leg": kind}) if kind in LEGS else (read_name, {})


def record_events(record: Mapping[str, Any], fmt: RecordFormat) -> list[dict[str, Any]]:
    """The hop events one record of ``fmt`` stands for (RecordError when it cannot be read; none
    for a record of the format that is not of its ``only`` kind)."""
    inner = _inner(record, fmt)
    if inner is None:
        raise RecordError(f"{fmt.name} record: no {' / '.join(fmt.detect)}")
    record = inner
    if fmt.only is not None and _get(record, fmt.only[0]) != fmt.only[1]:
        return []
    rid = _request_id(record, fmt)
    offset = 0.0
    if fmt.clock is not None:
        found = _number(record, fmt.clock, fmt)
        if found is None:
            raise RecordError(
                f"{fmt.name} record {rid}: no {fmt.clock} (its times are a monotonic clock; save records "
                "with `hopline poll-trtllm`)"
            )
        offset = found
    events: dict[str, dict[str, Any]] = {}  # by the name the stage table reads (prefill.* for that leg)
    for hop, alternatives in fmt.hops.items():
        at = _first(record, alternatives, fmt)
        if at is None:
            continue
        ts = at / fmt.per_second + offset
        if not ts > 0:
            raise RecordError(f"{fmt.name} record {rid}: {hop} time {ts!r} is not epoch seconds")
        name, extra = _emitted(hop)
        events[hop] = {"v": VERSION, "ts": ts, "request_id": rid, "hop": name, "attempt": 0, **extra}
    if not events:
        raise RecordError(f"{fmt.name} record {rid}: none of its timestamps is present")
    targeted = {hop for _, _, hops in fmt.attrs for hop in hops}
    for stats_hop, table in fmt.stats.items():
        found = {attr: _first(record, alternatives, fmt) for attr, alternatives in table.items()}
        stats = {attr: value / fmt.per_second for attr, value in found.items() if value is not None}
        leg = stats_hop.partition(".")[0]
        mine = [e for h, e in events.items() if h.partition(".")[0] == leg]
        if not mine or not (stats or stats_hop in targeted):
            continue
        end = events.get(f"{leg}.last_token") or max(mine, key=lambda e: e["ts"])
        name, extra = _emitted(stats_hop)
        events[stats_hop] = {**end, "hop": name, **extra, **stats}
    for attr, path, hops in fmt.attrs:
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
    described in the returned list (``line N: reason``); a record of a kind that stands for no
    hop events (Dynamo's tool and payload records) is dropped silently.
    """
    if not any(marker in data for marker in MARKERS):
        return data, []
    out: list[bytes] = []
    errors: list[str] = []
    for number, line in enumerate(data.split(b"\n"), start=1):
        if not any(marker in line for marker in MARKERS):
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


if __name__ == "__main__":
    # ``python -m hopline.middleware.contract.records poll-trtllm URL --out FILE``, the spelling the
    # README gave before the poller became ``hopline poll-trtllm``: handed to that command as it is
    # (run, not imported: the vocabulary imports no host-side code)
    script = Path(sys.executable).with_name("hopline")
    argv = ["hopline", *sys.argv[1:]]
    try:
        os.execv(script, argv) if script.exists() else os.execvp("hopline", argv)
    except OSError as exc:
        sys.exit(f"hopline: cannot run the `hopline` command ({exc}); run `hopline {' '.join(sys.argv[1:])}`")
