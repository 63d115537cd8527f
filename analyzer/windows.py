"""Reads the collectors' window summaries (``GET /v1/windows``) and merges them: the same window,
scope value and measure from every collector (and every part of a window one collector folded
late) into one DDSketch, with exact counts and sums, arrivals and outcomes added.

A collector keeps, per window of finished requests' starts and per value of each scope
attribute (replica, model, service by default), a DDSketch of each stage and token count
(``collector/windows.py`` says which and why). DDSketch merges exactly (bin counts add), so
the quantiles of the merge are those of one sketch of all the collectors' requests: within the
sketches' relative accuracy (1%) of the exact quantiles, whatever the split.

    merged = read_windows(["http://c1:9400", "http://c2:9400"], since=t0, until=t1, token=TOKEN)
    merged.quantile(start, "replica", "r2", "queue", 0.99)   # seconds

This is what the live detector reads at fleet rates (issue 36); it runs no detector itself.
"""

from __future__ import annotations

import base64
import functools
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
from ddsketch import DDSketch, LogarithmicMapping
from ddsketch.pb.proto import pb
from hopline.middleware.contract.errors import HoplineError

QUANTILES = (0.5, 0.9, 0.99)
SKETCH_FORMAT = "ddsketch-protobuf-zlib-base64"  # what GET /v1/windows says in "sketch"
# a scope value's measures in GET /v1/windows, by kind (``lateness`` since issue 39's windows: each
# side's loop lateness and the engine host's CPU wait; a collector from before sends none)
KINDS = ("stages", "tokens", "lateness")


class WindowsError(HoplineError, RuntimeError):
    """A collector that cannot be read, or whose summaries do not merge with the others'."""


def decode(text: str, relative_accuracy: float) -> DDSketch:
    """A DDSketch from a collector's ``SKETCH_FORMAT`` (base64 of DDSketch's protobuf, deflated).
    ``DDSketchProto.from_proto`` adds the bins one by one from the lowest, which re-centres the
    store at every bin (quadratic); this adds the largest and the smallest first, then the others,
    through ``DDSketch.add`` (one call per bin)."""
    message = pb.DDSketch.FromString(zlib.decompress(base64.b64decode(text)))
    mapping = LogarithmicMapping(relative_accuracy)
    gamma = message.mapping.gamma
    if message.mapping.interpolation != pb.IndexMapping.NONE or abs(gamma - mapping.gamma) > 1e-12:
        raise WindowsError(f"a sketch with gamma {gamma}: expected {mapping.gamma} (logarithmic)")
    offset = message.mapping.indexOffset
    store = message.positiveValues
    bins = {store.contiguousBinIndexOffset + i: c for i, c in enumerate(store.contiguousBinCounts) if c}
    for key, count in store.binCounts.items():
        bins[key] = bins.get(key, 0.0) + count
    sketch = DDSketch(relative_accuracy)
    keys = sorted(bins)
    for key in keys[-1:] + keys[:-1]:  # the store takes its range at the first two bins
        sketch.add(mapping.value(key - offset), bins[key])
    if message.zeroCount:
        sketch.add(0.0, message.zeroCount)
    return sketch


@functools.lru_cache(maxsize=8)
def _gamma(relative_accuracy: float) -> float:
    return LogarithmicMapping(relative_accuracy).gamma


def decode_bins(text: str, relative_accuracy: float) -> tuple[int, np.ndarray, float]:
    """A collector's sketch as numpy, without a DDSketch: ``(key of the first bin, bin counts,
    zero count)``, keys as ``LogarithmicMapping.key`` (value of key k: gamma**k * 2 / (1 + gamma)).
    What the window shift detector reads (``findings/shifts/windows.py``): no Python call per bin."""
    message = pb.DDSketch.FromString(zlib.decompress(base64.b64decode(text)))
    gamma = _gamma(relative_accuracy)
    if message.mapping.interpolation != pb.IndexMapping.NONE or abs(message.mapping.gamma - gamma) > 1e-12:
        raise WindowsError(f"a sketch with gamma {message.mapping.gamma}: expected {gamma} (logarithmic)")
    store = message.positiveValues
    counts = np.asarray(store.contiguousBinCounts, dtype=float)
    first = store.contiguousBinIndexOffset - int(message.mapping.indexOffset)
    if store.binCounts:  # sparse bins (another DDSketch writer): made contiguous
        keys = sorted(store.binCounts)
        lo = min(keys[0], first) if len(counts) else keys[0]
        hi = max(keys[-1], first + len(counts) - 1) if len(counts) else keys[-1]
        dense = np.zeros(hi - lo + 1)
        if len(counts):
            dense[first - lo : first - lo + len(counts)] += counts
        for k in keys:
            dense[k - lo] += store.binCounts[k]
        counts, first = dense, lo - int(message.mapping.indexOffset)
    return int(first), counts, float(message.zeroCount)


@dataclass
class Measure:
    """One stage's (or token count's) values in one window and scope: exact count and sum, and
    the merged sketch for quantiles."""

    count: int
    sum: float
    sketch: DDSketch

    def quantile(self, q: float) -> float | None:
        return self.sketch.get_quantile_value(q)

    def merge(self, other: Measure) -> None:
        self.count += other.count
        self.sum += other.sum
        self.sketch.merge(other.sketch)


@dataclass
class ScopeWindow:
    """One window, one scope value (e.g. replica r2): arrivals, outcomes, stages, tokens, lateness."""

    arrivals: int = 0
    outcomes: Counter = field(default_factory=Counter)
    stages: dict[str, Measure] = field(default_factory=dict)
    tokens: dict[str, Measure] = field(default_factory=dict)
    lateness: dict[str, Measure] = field(default_factory=dict)  # loop lateness, the engine host's CPU wait

    def measure(self, name: str) -> Measure | None:
        """``name``'s measure, of whichever kind."""
        return self.stages.get(name) or self.tokens.get(name) or self.lateness.get(name)


@dataclass
class MergedWindows:
    """The merged windows: start (Unix seconds) -> scope attribute -> value -> ``ScopeWindow``."""

    width_s: float
    relative_accuracy: float
    by: tuple[str, ...]
    windows: dict[float, dict[str, dict[str, ScopeWindow]]] = field(default_factory=dict)
    requests: Counter = field(default_factory=Counter)  # start -> finished requests, all collectors
    late: Counter = field(default_factory=Counter)  # start -> requests folded after the window's first fold
    overflowed: Counter = field(default_factory=Counter)  # attribute -> requests summarized as other

    def measure(self, start: float, attribute: str, value: str, name: str) -> Measure | None:
        scope = self.windows.get(start, {}).get(attribute, {}).get(value)
        if scope is None:
            return None
        return scope.measure(name)

    def quantile(self, start: float, attribute: str, value: str, name: str, q: float) -> float | None:
        """The ``q`` quantile of ``name`` (a stage, ``ttft``, ``e2e`` or a token count) in the window
        starting at ``start`` for ``attribute`` = ``value``; None without values there."""
        found = self.measure(start, attribute, value, name)
        return None if found is None else found.quantile(q)

    def quantiles(self, name: str, qs: Sequence[float] = QUANTILES) -> dict[tuple[float, str, str], list]:
        """Every (window start, attribute, value) with values of ``name``: its quantiles ``qs``."""
        out = {}
        for start, attributes in sorted(self.windows.items()):
            for attribute, values in attributes.items():
                for value, scope in values.items():
                    found = scope.measure(name)
                    if found is not None:
                        out[(start, attribute, value)] = [found.quantile(q) for q in qs]
        return out

    def add(self, answer: Mapping[str, Any]) -> None:
        """Merge one collector's ``GET /v1/windows`` answer into these windows."""
        if answer.get("sketch") != SKETCH_FORMAT:
            raise WindowsError(f"sketches as {answer.get('sketch')!r}: this reader reads {SKETCH_FORMAT}")
        if answer["width_s"] != self.width_s or answer["relative_accuracy"] != self.relative_accuracy:
            raise WindowsError(
                f"windows of {answer['width_s']} s at {answer['relative_accuracy']} do not merge with "
                f"{self.width_s} s at {self.relative_accuracy}: give the collectors the same --window"
            )
        accuracy = self.relative_accuracy
        for window in answer["windows"]:
            start = window["start"]
            self.requests[start] += window["requests"]
            self.late[start] += window["late"]
            attributes = self.windows.setdefault(start, {})
            for part in window["parts"]:
                for attribute, count in part.get("overflowed", {}).items():
                    self.overflowed[attribute] += count
                for attribute, values in part["scopes"].items():
                    merged = attributes.setdefault(attribute, {})
                    for value, summary in values.items():
                        scope = merged.setdefault(value, ScopeWindow())
                        scope.arrivals += summary["arrivals"]
                        scope.outcomes.update(summary["outcomes"])
                        for kind in KINDS:
                            into = getattr(scope, kind)
                            for name, s in summary.get(kind, {}).items():  # older collectors: no lateness
                                measure = Measure(s["count"], s["sum"], decode(s["sketch"], accuracy))
                                if name in into:
                                    into[name].merge(measure)
                                else:
                                    into[name] = measure


def merge(answers: Iterable[Mapping[str, Any]]) -> MergedWindows:
    """The merge of several collectors' ``GET /v1/windows`` answers (at least one)."""
    merged = None
    for answer in answers:
        if merged is None:
            merged = MergedWindows(answer["width_s"], answer["relative_accuracy"], tuple(answer["by"]))
        merged.add(answer)
    if merged is None:
        raise WindowsError("no collector answered")
    return merged


def fetch(
    url: str,
    *,
    since: float | None = None,
    until: float | None = None,
    token: str | None = None,
    client: httpx.Client | None = None,
    timeout_s: float = 30.0,
) -> dict[str, Any]:
    """One collector's ``GET /v1/windows`` answer (``url``: its base URL)."""
    params = {k: repr(v) for k, v in (("since", since), ("until", until)) if v is not None}
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    own = client is None
    client = client or httpx.Client(timeout=timeout_s)
    try:
        response = client.get(url.rstrip("/") + "/v1/windows", params=params, headers=headers)
    except httpx.HTTPError as exc:
        raise WindowsError(f"{url}: {type(exc).__name__}: {exc}") from None
    finally:
        if own:
            client.close()
    if response.status_code != 200:
        raise WindowsError(f"{url}/v1/windows answered {response.status_code}: {response.text[:200]}")
    return response.json()


def read_windows(
    urls: Iterable[str],
    *,
    since: float | None = None,
    until: float | None = None,
    token: str | None = None,
    timeout_s: float = 30.0,
) -> MergedWindows:
    """The settled windows starting in [since, until] of every collector at ``urls``, merged."""
    with httpx.Client(timeout=timeout_s) as client:
        answers = [fetch(u, since=since, until=until, token=token, client=client) for u in urls]
    return merge(answers)
