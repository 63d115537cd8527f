"""docs/findings.md and docs/findings.schema.json, generated from the findings' types and the
detector registry so they cannot drift.

``python -m hopline.analyzer.findings.docs [DIR]`` writes both into DIR (``docs``); a test
regenerates them and fails when a file differs, and checks that every key the analyzer's JSON
holds is documented here. A finding's keys and their meanings are the types' (``model``), the
pitfall names, what each reads and its thresholds are the registry's; only the top-level keys'
sentences are written here (the rest of the JSON is the report's, not a finding's).
"""

from __future__ import annotations

import json
import sys
from dataclasses import fields, is_dataclass
from pathlib import Path

from hopline.analyzer.findings.detector import Detector
from hopline.analyzer.findings.model import Consequence, MixChange, Pitfall, Shift, schema
from hopline.analyzer.findings.rank import MINOR_SHARE
from hopline.analyzer.findings.registry import REGISTRY

# The analyzer's JSON (``hopline analyze --json``): every key it prints, and what it means.
FINDINGS_TOP = {
    "requests": "requests in the log (after --since / --until)",
    "window_s": "the window width used for shifts and series",
    "stages": "stage name -> statistics over all requests that have the stage (below)",
    "split_requests": "requests whose TTFT parts add up to their TTFT: the common set of every share_of_ttft",
    "findings": "shifts and pitfalls, the largest effect on users' time first (minor ones excluded); "
    "changes of the traffic (mix_change) after them, then what is the calling process's own lateness",
    "minor": f"findings that cost users under {MINOR_SHARE:.0%} of their time (share_of_users_time < "
    f"{MINOR_SHARE:g}), same order and shape; the terminal and HTML reports list them with --all",
    "dominant": "the TTFT part with the largest share, null when fewer than 20 requests have a complete split",
    "span": "start, end (ISO-8601 UTC) and seconds of the log",
    "outcomes": "outcome -> requests (the rule book's outcomes)",
    "negative_stages": "requests with a stage below zero, and counts by stage (a clock or instrumentation problem)",
    "missing_hops": "requests missing an expected hop, and counts by hop",
    "by_scope": "scope attribute -> one entry per value: requests, split_requests, dominant, stages",
    "windows": "per window: request count and p50 / p90 / p99 of each stage, TTFT and e2e",
    "goodput": "with --slo: requests meeting every target, per second, and the culprit stage of the misses",
    "scan": "files and lines read, bad lines and why",
}
FINDINGS_STAGE = {
    "p50_ms": "median, ms", "p90_ms": "90th percentile, ms", "p99_ms": "99th percentile, ms",
    "share_of_ttft": "share of TTFT over the complete splits (TTFT parts only)",
    "share_of_e2e": "mean stage over mean end-to-end time of the same requests",
    "mean_ms": "mean, ms", "count": "requests with a value",
}  # fmt: skip


# What each detector compares, so that a change in the traffic is not said as a slowdown.
NORMALIZES = {
    "stage_shift": "a stage's per-request seconds, ranked, in each scope; a prefill rise is then judged per "
    "computed prompt token (prompt less cached tokens) and a decode rise per output token: a rise that the "
    "per-unit figure does not show (under half of it, in log terms) while the requests grew is a `mix_change`, "
    "scoped to the new traffic that began with it",
    "user_vs_engine_gap": "the same requests' TTFT as the user and the engine saw it; the gap's owner by "
    "each side's measured loop lateness",
    "new_connection_per_request": "a caller's requests that opened a connection against those that reused one",
    "long_prefill_stall": "stalls that began when a long prefill began on the instance that decoded them (the "
    "prefill instance's own clock in P/D), against how many would by chance (a Poisson test)",
    "no_max_tokens": "the output lengths of requests sent without max_tokens against the long-output quantile",
    "verbose_outputs": "a caller's answer lengths against its own history, in groups of requests that asked "
    "for the same max_tokens: a caller asking for longer answers is a mix, not a finding; where the engine "
    "counts a reasoning model's reasoning tokens (`reasoning_tokens`, from its usage), the reasoning and the "
    "content (`output_tokens - reasoning_tokens`) are judged apart and the evidence says both "
    "(`reasoning_tokens_p50_before` / `_after`, `content_tokens_p50_before` / `_after`, `reasoning_ratio`, "
    "`content_ratio`, `longer`: `reasoning`, `content`, both, or `output` where the count is unknown): "
    "reasoning alone is the model thinking longer, not an answer that ran on",
    "failover": "first attempts by the replica that failed them (not the replica that served the retry)",
    "prefix_cache_miss": "each request's cache-hit share (cached over prompt tokens) per replica, ranked before "
    "and after a split",
}


def pitfall_names() -> list[str]:
    return [d.name for d in REGISTRY if d.kind == "pitfall"]


def keys(kind: type) -> dict[str, str]:
    """A finding type's JSON keys, in their order, with their meanings (from the type)."""
    props = findings_schema()["$defs"][kind.__name__]["properties"]
    return {key: prop["description"] for key, prop in props.items()}


def findings_schema() -> dict:
    """The findings' JSON schema, with the registry's pitfall names as ``name``'s values."""
    out = schema()
    out["title"] = "hopline analyze --json: findings and minor"
    out["$defs"]["Pitfall"]["properties"]["name"]["enum"] = pitfall_names()
    return out


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows] + [""]


def _meanings(table: dict[str, str]) -> list[str]:
    return _table(("key", "meaning"), [(f"`{k}`", v) for k, v in table.items()])


def _what(detector: Detector) -> str:
    """The first paragraph of the detector's module: what it finds, in its own words."""
    text = (sys.modules[type(detector).__module__].__doc__ or "").strip().split("\n\n")[0]
    return text.removeprefix(f"``{detector.name}``: ").replace("``", "`")


def _thresholds(detector: Detector) -> str:
    """Its thresholds (its dataclass fields; a config dataclass's fields in its place)."""
    values: list[tuple[str, object]] = []
    for f in fields(detector):  # type: ignore[arg-type]  # every registered detector is a dataclass
        value = getattr(detector, f.name)
        values += [(g.name, getattr(value, g.name)) for g in fields(value)] if is_dataclass(value) else [(f.name, value)]
    return ", ".join(f"`{name}` {value:g}" if isinstance(value, float) else f"`{name}` {value}" for name, value in values)


def render() -> str:
    out = [
        "# The findings JSON (`hopline analyze --json`)",
        "",
        "Generated from `analyzer/findings/` (the findings' types and the detector registry) by "
        "`python -m hopline.analyzer.findings.docs`; do not edit by hand (a test regenerates it). "
        "Its JSON schema: [findings.schema.json](findings.schema.json). The events and stages it is "
        "computed from: [contract.md](contract.md).",
        "",
    ]
    out += _meanings(FINDINGS_TOP)
    out += ["Each entry of `stages`:", ""]
    out += _meanings(FINDINGS_STAGE)
    out += ["A shift finding:", ""]
    out += _meanings(keys(Shift))
    out += ["Each entry of a shift's `with`:", ""]
    out += _meanings(keys(Consequence))
    out += [
        "A mix change (`kind` `mix_change`): a stage's time rose because the traffic changed, not the "
        "component (per unit of work it held while the requests got bigger: a new tenant's long prompts, "
        "a batch asking longer answers). The keys of a shift, its `scope` the new traffic it came with "
        "when there is one, and:",
        "",
    ]
    out += _meanings({k: v for k, v in keys(MixChange).items() if k not in keys(Shift)})
    out += ["A pitfall finding (`name` one of " + ", ".join(f"`{n}`" for n in pitfall_names()) + "):", ""]
    out += _meanings(keys(Pitfall))
    out += ["## Like with like", "", "How each detector normalizes before it compares:", ""]
    out += _table(("detector", "compares"), [(f"`{name}`", text) for name, text in NORMALIZES.items()])
    out += ["## Detectors", "", "In the order they run (`analyzer/findings/registry.py`).", ""]
    out += _table(
        ("name", "kind", "finds", "reads", "thresholds"),
        [
            (f"`{d.name}`", d.kind, _what(d), ", ".join(f"`{c}`" for c in d.needs), _thresholds(d))
            for d in REGISTRY
        ],
    )
    return "\n".join(out).rstrip() + "\n"


def schema_text() -> str:
    return json.dumps(findings_schema(), indent=2, ensure_ascii=False) + "\n"


def write(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    pages = {folder / "findings.md": render(), folder / "findings.schema.json": schema_text()}
    for path, text in pages.items():
        path.write_text(text)
    return list(pages)


if __name__ == "__main__":
    for written in write(Path(sys.argv[1] if len(sys.argv) > 1 else "docs")):
        print(written)
