"""The stage table compiled to straight-line Python, for the collector's per-request hot path.

``contract.compute_stages`` interprets ``INPUTS``, ``ATTRIBUTE_SOURCES``, ``STAGES`` and
``RATIOS`` (loops over dataclasses, formulas and terms), which made it the largest single item
of the collector's join (bench/README.md, "collector", has the figures). ``compile_inputs``
and ``compile_evaluate`` turn the very same objects into the source of one function each, with
the same operations in the same order (``0.0 + s1 * a + s2 * b ...``, first formula that yields
a value wins, ``when_null`` and ``stream`` conditions), so the results are identical, bit for
bit; ``tests/collector/test_collector_stages.py`` checks that against the contract's functions.
The generated source is registered with ``linecache`` under its ``<hopline …>`` file name, so
tracebacks and ``inspect.getsource`` show the generated lines.
"""

from __future__ import annotations

import linecache
from collections.abc import Callable, Iterable, Mapping
from itertools import islice
from typing import Any

from hopline.middleware.contract import (
    ATTRIBUTE_SOURCES,
    INPUTS,
    LEG_HOPS,
    PREFILL_LEG,
    RATIOS,
    STAGE_NAMES,
    STAGES,
    Ratio,
    Stage,
)
from hopline.middleware.contract import negative_stages as negative_any


def _sum(terms: Iterable[tuple[int, str]], start: str) -> str:
    """``start + s1 * v_a + s2 * v_b`` (left to right, as ``evaluate`` adds them)."""
    return "(" + " + ".join([start, *(f"{sign} * v_{name}" for sign, name in terms)]) + ")"


def _stage_lines(stage: Stage) -> list[str]:
    lines = [f"v_{stage.name} = None"]
    branch = "if"
    for formula in stage.formulas:
        conds = []
        if formula.stream is not None:
            conds.append(f"stream is {formula.stream}")
        conds += [f"v_{name} is None" for name in formula.when_null]
        conds += [f"v_{name} is not None" for name in formula.when_set]
        conds += [f"v_{name} is not None" for _, name in formula.terms]
        lines.append(f"{branch} {' and '.join(conds) or 'True'}:")
        lines.append(f"    v_{stage.name} = {_sum(formula.terms, '0.0')}")
        branch = "elif"
    lines.append(f"values[{stage.name!r}] = v_{stage.name}")
    return lines


def _ratio_lines(ratio: Ratio) -> list[str]:
    defined = " and ".join(f"v_{name} is not None" for _, name in ratio.numerator)
    return [
        f"values[{ratio.name!r}] = (",
        f"    {_sum(ratio.numerator, '0')} / (out_tokens - 1)",
        f"    if per_token and {defined} else None",
        ")",
    ]


def _define(source: str, filename: str, name: str, namespace: dict[str, Any]) -> Callable[..., Any]:
    """Compile ``source``, register it with ``linecache`` as ``filename``, run it; return ``name``.

    A ``linecache`` entry whose modification time is None is never checked against a file, so it
    stays for the life of the process (as the function does).
    """
    code = compile(source, filename, "exec")
    linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
    exec(code, namespace)  # noqa: S102 (our own table)
    return namespace[name]


def _names() -> list[str]:
    """Every value a formula or ratio reads (inputs, attributes, earlier stages)."""
    names = {name for s in STAGES for f in s.formulas for _, name in f.terms}
    names |= {name for s in STAGES for f in s.formulas for name in f.when_null}
    names |= {name for s in STAGES for f in s.formulas for name in f.when_set}
    names |= {name for r in RATIOS for _, name in r.numerator}
    return sorted(names - {s.name for s in STAGES})


def compile_evaluate() -> Callable[[dict[str, Any]], dict[str, Any]]:
    """``contract.evaluate`` for ``STAGES`` and ``RATIOS`` as they are now, as one function."""
    body = ["get = values.get", 'stream = get("stream")']
    body += [f"v_{name} = get({name!r})" for name in _names()]
    for stage in STAGES:
        body += _stage_lines(stage)
    body += [
        'out_tokens, n = get("output_tokens"), get("n")',
        "per_token = out_tokens is not None and out_tokens >= 2 and (n is None or n == 1)",
    ]
    for ratio in RATIOS:
        body += _ratio_lines(ratio)
    body.append("return values")
    source = "def evaluate(values):\n" + "".join(f"    {line}\n" for line in body)
    return _define(source, "<hopline stage table>", "evaluate", {})


def pick(events: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """For each hop, the event of the highest attempt, earliest ts on a tie (``contract._pick``
    for validated events, which always carry ``attempt``); a P/D prefill leg's engine hop is read
    as its ``prefill.*`` name (``contract.LEG_HOPS``)."""
    chosen: dict[str, Mapping[str, Any]] = {}
    for ev in events:
        hop = ev["hop"]
        if hop in LEG_HOPS and ev.get("leg") == PREFILL_LEG:
            hop = LEG_HOPS[hop]
        cur = chosen.get(hop)
        if cur is None:
            chosen[hop] = ev
        else:
            attempt, current = ev["attempt"], cur["attempt"]
            if attempt > current or (attempt == current and ev["ts"] < cur["ts"]):
                chosen[hop] = ev
    return chosen


def _var(hop: str) -> str:
    return "e_" + hop.replace(".", "_")


def _read_lines(target: Callable[[str], str]) -> list[str]:
    """The lines that read ``INPUTS`` and ``ATTRIBUTE_SOURCES`` from a request's events into
    ``target(name)`` (a dict item, or a local)."""
    hops = sorted({i.hop for i in INPUTS} | {h for hs in ATTRIBUTE_SOURCES.values() for h in hs})
    body = ["by_hop = pick(events)", *(f"{_var(h)} = by_hop.get({h!r})" for h in hops)]
    for inp in INPUTS:
        ev = _var(inp.hop)
        if inp.attr is None:
            value = f'{ev}["ts"]'
        else:
            value = f"{inp.default!r} if (x := {ev}.get({inp.attr!r})) is None else x"
        body.append(f"{target(inp.name)} = None if {ev} is None else ({value})")
    for name, sources in ATTRIBUTE_SOURCES.items():
        body.append("x = None")
        for hop in sources:
            body.append(f"if x is None and {_var(hop)} is not None:")
            body.append(f"    x = {_var(hop)}.get({name!r})")
        body.append(f"{target(name)} = x")
    return body


def compile_inputs() -> Callable[[Iterable[Mapping[str, Any]]], dict[str, Any]]:
    """``contract.request_inputs`` for ``INPUTS`` and ``ATTRIBUTE_SOURCES``, as one function."""
    body = ["values = {}", *_read_lines(lambda name: f"values[{name!r}]"), "return values"]
    source = "def request_inputs(events):\n" + "".join(f"    {line}\n" for line in body)
    return _define(source, "<hopline stage inputs>", "request_inputs", {"pick": pick})


def _keys() -> list[str]:
    """The keys of ``compute_stages``' dict, in order: each where the contract's dict first gets it
    (inputs, attributes, stages, ratios), with the value it gets last: the ``upstream`` attribute
    is overwritten by the ``upstream`` stage there, in place."""
    inputs, stages, ratios = [i.name for i in INPUTS], [s.name for s in STAGES], [r.name for r in RATIOS]
    return list(dict.fromkeys([*inputs, *ATTRIBUTE_SOURCES, *stages, *ratios]))


def compile_compute() -> Callable[[Iterable[Mapping[str, Any]]], dict[str, Any]]:
    """``contract.compute_stages`` as one function: ``compile_inputs``' reads and
    ``compile_evaluate``'s formulas on local variables (no dict written, then read back), the
    values dict built once at the end with the same keys in the same order (inputs, attributes,
    stages, ratios) and the same values."""
    inputs, attributes = [i.name for i in INPUTS], list(ATTRIBUTE_SOURCES)
    keys = _keys()
    body = _read_lines(lambda name: f"v_{name}")
    # what evaluate reads that no input or attribute gives is None there (values.get)
    body += [f"v_{name} = None" for name in _names() if name not in inputs and name not in attributes]
    body.append(f"stream = {'v_stream' if 'stream' in attributes else 'None'}")
    for stage in STAGES:
        body += [line for line in _stage_lines(stage) if not line.startswith("values[")]
    body += [
        "out_tokens = {}".format("v_output_tokens" if "output_tokens" in attributes else "None"),
        "n = {}".format("v_n" if "n" in attributes else "None"),
        "per_token = out_tokens is not None and out_tokens >= 2 and (n is None or n == 1)",
    ]
    for ratio in RATIOS:
        lines = _ratio_lines(ratio)
        body += [f"v_{ratio.name} = (", *lines[1:]]
    body.append("return {")
    body += [f"    {name!r}: v_{name}," for name in keys]
    body.append("}")
    source = "def compute_stages(events):\n" + "".join(f"    {line}\n" for line in body)
    return _define(source, "<hopline stages>", "compute_stages", {"pick": pick})


evaluate = compile_evaluate()
request_inputs = compile_inputs()
# ``contract.compute_stages`` of a request's validated events (``evaluate(request_inputs(events))``,
# the same dict), the compiled table in one function: what the join calls per finished request
compute_stages = compile_compute()


def _stage_slots() -> tuple[int, int, tuple[str, ...]]:
    """Where ``compute_stages``' dict holds the stages, counted from its end (the ratios follow
    them): the slice of its values read backwards that is the stages alone (``STAGE_NAMES`` but
    those with an input's or attribute's slot), and those others."""
    keys = _keys()[::-1]
    last = len(keys) - len(INPUTS) - len(ATTRIBUTE_SOURCES)  # the first input's or attribute's, backwards
    own = [name for name in STAGE_NAMES if keys.index(name) < last]
    start = min(map(keys.index, own))
    if sorted(own, key=keys.index) != keys[start : start + len(own)]:
        raise RuntimeError(f"the stages' slots in compute_stages' dict are not one run: {own}")
    return start, start + len(own), tuple(name for name in STAGE_NAMES if name not in own)


_STAGES_FROM, _STAGES_TO, _STAGES_IN_PLACE = _stage_slots()
NEGATIVE_TOLERANCE = 1e-9  # contract.negative_stages' default


def negative_stages(values: dict[str, Any]) -> list[str]:
    """``contract.negative_stages`` of a ``compute_stages`` dict (what the join calls per finished
    request). The usual request has none: the lowest set value of the stages' run of slots, found by
    C loops without a lookup a stage (``_stage_slots``; from the dict's end, the nearer), and the
    stages in other slots (``upstream``) say so; else (a NaN first makes the lowest NaN too) the
    contract's function lists them. Callgrind: 12.0k instructions a request against 15.8k."""
    lowest = min(filter(None, islice(reversed(values.values()), _STAGES_FROM, _STAGES_TO)), default=0.0)
    if lowest >= -NEGATIVE_TOLERANCE:
        for name in _STAGES_IN_PLACE:
            value = values[name]
            if value is not None and value < -NEGATIVE_TOLERANCE:
                break
        else:
            return []
    return negative_any(values, NEGATIVE_TOLERANCE)
