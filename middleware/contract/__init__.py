"""The shared vocabulary: what every part of hopline agrees on, apart from the code that runs
inside a user's process.

- ``events``: the hop event contract (hops, fields, validation, request and trace IDs, NDJSON),
  all an emitter loads.
- ``stages``: the stage table (``INPUTS``, ``STAGES``, ``RATIOS``) and its evaluation, which
  only the readers need.
- ``rules``: the rule book: the join by trace, outcomes, scopes, expected hops, the stage
  vocabulary (how each stage is named and drawn).
- ``spans``: OTLP span → hop event mapping; ``records``: engine-record readers;
  ``trace_export``: timelines → OTLP spans.
- ``kv``: KV-cache arithmetic; ``units``: the one reading of sizes, durations and instants.
- ``errors``: ``HoplineError``, the base of every error hopline raises for a caller to catch.
- ``docs``: docs/contract.md, generated from the above.

The names of ``events`` and ``stages`` are re-exported here (``__all__``), so
``hopline.middleware.contract`` is the contract's import path for a reader. The stage table's
names are loaded on first use: importing this package (as every emitter does, through
``contract.events``) does not load ``stages``.

Nothing here imports the host-side modules (client, gateway, engine, emit, sinks).
"""

import importlib as _importlib
import typing as _typing

from hopline.middleware.contract.events import (
    ALL_HOPS,
    ATTEMPT_MAX,
    ATTRIBUTE_TYPES,
    CLIENT_HOPS,
    CONTROL_CHARACTERS,
    CORE_FIELDS,
    DECODE_LEG,
    EMITTER_COUNT_MAX,
    EMITTER_DROP_REASONS,
    EMITTER_STATS_COUNTS,
    EMITTER_STATS_HOP,
    EMITTER_TARGET_COUNTS,
    EMITTER_TARGETS_MAX,
    ENGINE_HOPS,
    ENGINE_ID_PREFIXES,
    ERROR_HOPS,
    FINAL_HOPS,
    GATEWAY_HOPS,
    HOP_SET,
    HOPS,
    INT_RANGES,
    INVALID_TRACE_ID,
    LEG_HOPS,
    LEGS,
    MAX_DURATION_S,
    MAX_EVENT_BYTES,
    MAX_NESTING,
    PREFILL_HOPS,
    PREFILL_LEG,
    REQUEST_ID_MAX,
    STORAGE_COLUMNS,
    TIMESTAMP_ATTRIBUTES,
    TS_MAX,
    VERSION,
    EventError,
    component,
    dedup_key,
    dumps,
    is_valid_trace_id,
    iter_ndjson,
    new_eid,
    new_request_id,
    normalize_request_id,
    printable,
    read_hop,
    trace_id_of,
    validate_emitter_stats,
    validate_event,
)

if _typing.TYPE_CHECKING:
    from hopline.middleware.contract.stages import (
        ATTRIBUTE_SOURCES,
        INPUTS,
        RATIOS,
        STAGE_NAMES,
        STAGES,
        TIME_STAGES,
        TTFT_STAGES,
        VIEWS,
        Formula,
        Input,
        Ratio,
        Stage,
        compute_stages,
        evaluate,
        negative_stages,
        request_inputs,
    )

# the stage table's public names, loaded from ``stages`` on first use (``__getattr__``)
_STAGE_TABLE = (
    "ATTRIBUTE_SOURCES", "INPUTS", "RATIOS", "STAGE_NAMES", "STAGES", "TIME_STAGES", "TTFT_STAGES", "VIEWS",
    "Formula", "Input", "Ratio", "Stage", "compute_stages", "evaluate", "negative_stages", "request_inputs",
)  # fmt: skip

__all__ = [
    "ALL_HOPS", "ATTEMPT_MAX", "ATTRIBUTE_TYPES", "CLIENT_HOPS", "CONTROL_CHARACTERS", "CORE_FIELDS",
    "DECODE_LEG", "EMITTER_COUNT_MAX", "EMITTER_DROP_REASONS", "EMITTER_STATS_COUNTS", "EMITTER_STATS_HOP",
    "EMITTER_TARGET_COUNTS", "EMITTER_TARGETS_MAX", "ENGINE_HOPS", "ENGINE_ID_PREFIXES", "ERROR_HOPS",
    "FINAL_HOPS", "GATEWAY_HOPS", "HOP_SET", "HOPS", "INT_RANGES", "INVALID_TRACE_ID", "LEG_HOPS", "LEGS",
    "MAX_DURATION_S", "MAX_EVENT_BYTES", "MAX_NESTING", "PREFILL_HOPS", "PREFILL_LEG", "REQUEST_ID_MAX",
    "STORAGE_COLUMNS", "TIMESTAMP_ATTRIBUTES", "TS_MAX", "VERSION", "EventError", "component", "dedup_key",
    "dumps", "is_valid_trace_id", "iter_ndjson", "new_eid", "new_request_id", "normalize_request_id",
    "printable", "read_hop", "trace_id_of", "validate_emitter_stats", "validate_event",
    *_STAGE_TABLE,
]  # fmt: skip


def __getattr__(name: str) -> _typing.Any:
    """The stage table's names, from ``contract.stages`` (imported on the first such name)."""
    if name in _STAGE_TABLE:
        value = getattr(_importlib.import_module("hopline.middleware.contract.stages"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
