"""The trace rule (``rules.TRACE_RULE``) for the collector's streaming join.

Events arrive in any order: a client span's stand-in (``trace:<trace>:<span>``) may come before
or after the engine span that owns its trace. ``TraceRouter`` remembers, per trace, the request
IDs that own it and the stand-ins still waiting; ``route`` says where an event joins and which
waiting stand-in requests must move into an owner that has just become the trace's only one.
Memory is bounded: at most ``max_traces`` traces are remembered (least recently seen dropped).

A stand-in that finished before its owner arrived stays a request of its own (the join never
re-opens a finished request): OTel SDKs export in batches (every 5 s by default, each process on
its own), so a collector fed by OTLP wants ``--grace`` above that delay.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from hopline.middleware.contract.rules import TRACE_RULE, is_stand_in


class TraceRouter:
    """Per trace: its owners (request IDs of their own) and the stand-in requests not yet placed."""

    def __init__(self, max_traces: int) -> None:
        self.max_traces = max_traces
        self._traces: OrderedDict[str, tuple[set[str], set[str]]] = OrderedDict()

    def _entry(self, trace_id: str) -> tuple[set[str], set[str]]:
        entry = self._traces.get(trace_id)
        if entry is None:
            entry = self._traces[trace_id] = (set(), set())
            if len(self._traces) > self.max_traces:
                self._traces.popitem(last=False)
        else:
            self._traces.move_to_end(trace_id)
        return entry

    def route(self, ev: Mapping[str, Any]) -> tuple[str, list[str]]:
        """The request ID ``ev`` joins, and the stand-in request IDs to move into it now."""
        rid, trace_id = ev["request_id"], ev.get("trace_id")
        if trace_id is None:
            return rid, []
        owners, waiting = self._entry(trace_id)
        if is_stand_in(rid, trace_id):
            if len(owners) == TRACE_RULE.owners:
                return next(iter(owners)), []
            waiting.add(rid)
            return rid, []
        owners.add(rid)
        if len(owners) == TRACE_RULE.owners and waiting:
            moved = sorted(waiting)
            waiting.clear()
            return rid, moved
        return rid, []
