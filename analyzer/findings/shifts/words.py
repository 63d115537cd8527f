"""How a shift is said: "queue time tripled at 10:05 on replica r2 (p50 60 → 185 ms); prefill
and decode unchanged; arrivals on r2 up 45%" (the shift detector owns its wording)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from hopline.analyzer.findings.shifts.stats import ShiftConfig
from hopline.analyzer.findings.words import clock  # noqa: F401 (said here too)
from hopline.middleware.contract.events import printable
from hopline.middleware.contract.rules import LOOK, STAGE_ORDER

if TYPE_CHECKING:
    from hopline.analyzer.findings.shifts.incidents import Change

# How a stage is said in a sentence (the rule book's vocabulary), plus the part of ``connect``
# that is the client's own pool wait (see CONNECT_PARTS).
STAGE_WORDS = {name: LOOK[name].words for name in STAGE_ORDER} | {"pool_wait": "client pool wait"}


PART_MEANING = {"pool_wait": "the client waited for a connection from its pool"}


# name: (words, format of one value); a covariate is said as a percentage or as before → after.
COVARIATE_WORDS = {
    "arrivals_per_s": ("arrivals", "{:.1f}/s"),
    "concurrency": ("concurrency", "{:.1f}"),
    "prompt_tokens_p50": ("prompt length", "{:.0f} tokens"),
    "cache_hit_ratio": ("cache hits", "{:.0%}"),
    "spec_acceptance_length_p50": ("speculative decoding's acceptance length", "{:.1f} tokens"),
}


SPOKEN_FACTOR = 10.0  # beyond 10x either way a change reads better as its two values


PERCENT_RANGE = (0.5, 2.0)  # a co-mover's ratio said as a percentage; outside it, as two values


def ms(value: float) -> str:
    return f"{value:.0f}" if value >= 10 else f"{value:.1f}"


def headline_words(before_ms: float, after_ms: float, statistic: str) -> tuple[str, str]:
    """("tripled", "(p50 40 → 120 ms)"), or the two values when no factor reads well:
    ("rose from 0.3 to 115 ms", "(p50)") — a factor from a near-zero baseline says nothing."""
    direction = "rose" if after_ms > before_ms else "fell"
    if before_ms <= 0:
        return f"rose from zero to {ms(after_ms)} ms", f"({statistic})"
    factor = after_ms / before_ms
    if after_ms <= 0 or not 1 / SPOKEN_FACTOR <= factor <= SPOKEN_FACTOR:
        return f"{direction} from {ms(before_ms)} to {ms(after_ms)} ms", f"({statistic})"
    return _factor_words(factor), f"({statistic} {ms(before_ms)} → {ms(after_ms)} ms)"


def _factor_words(factor: float) -> str:
    for target, word in ((2, "doubled"), (3, "tripled"), (4, "quadrupled")):
        if abs(factor / target - 1) <= 0.08:
            return word
    if abs(factor * 2 - 1) <= 0.08:
        return "halved"
    return f"rose {factor:.1f}×" if factor > 1 else f"fell {1 / factor:.1f}×"


def change_words(before: float, after: float, show: Callable[[float], str]) -> str:
    """ "up 45%" while the ratio is within ``PERCENT_RANGE``, else "0.3 ms → 115 ms": a percentage
    from a near-zero baseline ("up 5372911%") tells a reader nothing."""
    if before > 0 and PERCENT_RANGE[0] <= after / before <= PERCENT_RANGE[1]:
        change = after / before - 1
        return f"up {change * 100:.0f}%" if change >= 0 else f"down {-change * 100:.0f}%"
    return f"{show(before)} → {show(after)}"


def ms_words(value: float) -> str:
    return f"{ms(value)} ms"


def short(name: str) -> str:
    return STAGE_WORDS.get(name, name).replace(" time", "")


def join(names: list[str]) -> str:
    words = [short(n) for n in names]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def scope_value(scope: dict[str, str]) -> str:
    return printable(", ".join(scope.values()))


def scope_words(scope: dict[str, str]) -> str:
    """``replica r2``; a cell of two attributes ``replica r2 for model m1``."""
    return printable(" for ".join(f"{k} {v}" for k, v in scope.items()))


# A disaggregated (P/D) pair: the prefill instance and the decode one (``replica`` is the decode
# instance where the request was disaggregated: the one that streamed the answer).
PAIR_FROM, PAIR_TO = "prefill_replica", ("decode_replica", "replica")


def place_words(scope: dict[str, str]) -> str:
    """Where, in a sentence: ``on replica r2``; a P/D pair ``between p1 and d2``."""
    to = next((scope[k] for k in PAIR_TO if k in scope), None)
    if PAIR_FROM in scope and to is not None and len(scope) == 2:
        return f"between {scope[PAIR_FROM]} and {to}"
    return f"on {scope_words(scope)}"


def label(shift: Change) -> str:
    """How the stage (or, for ``connect``, the part of it) that moved is said."""
    return STAGE_WORDS.get(shift.part or shift.stage, shift.stage)


def rise_meaning(shift: Change) -> str:
    """What a rise says where the stage's name alone does not: a client's pool wait (only a full
    pool's wait, at the source) or the rule book's ``meaning`` of the stage ("client-side delay":
    the calling process was busy, not its connection pool); nothing for a fall."""
    if not shift.after_ms > shift.before_ms:
        return ""
    if shift.part in PART_MEANING:
        return PART_MEANING[shift.part]
    look = LOOK.get(shift.stage)
    return look.meaning if look is not None and shift.part is None else ""


def mix_words(shift: Change) -> str:
    """What a change of the traffic is said as, after its headline: the new traffic that came
    with it (or the same traffic's longer prompts / answers), and the stage per unit of work."""
    per, new = shift.mix["per_unit"], shift.mix["new_traffic"]
    unit = per["unit"]
    if new is not None:
        rate = "" if new["requests_per_s"] is None else f", {new['requests_per_s']:.3g} req/s"
        size = "" if new["units_p50"] is None else f", {new['units_p50']:,.0f} {per.get('size', unit)}s p50"
        share = "" if new["share"] is None else f" makes up {new['share']:.0%} of its {label(shift)} since"
        since = new["since"][11:19]
        if new.get("elsewhere"):  # new here, not to the log: it ran on other replicas (say) before
            there = new["elsewhere"]
            where = scope_words({k: ", ".join(v) for k, v in there["where"].items()})
            text = (
                f", from traffic new here, not a slower engine: {scope_words(new['scope'])}, on {where} from "
                f"{there['since'][11:19]} (here from {since}{rate}{size}){share}"
            )
        else:
            text = f", from new traffic, not a slower engine: a new {scope_words(new['scope'])} (from {since}{rate}{size}){share}"
    else:
        longer = "longer prompts" if shift.stage == "prefill" else "longer answers"
        sizes = f"{per['units_before']:,.0f} → {per['units_after']:,.0f}"
        text = f", from {longer}, not a slower engine: {per.get('size', unit)}s p50 {sizes}"
    b, a = per["before_ms"], per["after_ms"]
    moved = "unchanged" if b > 0 and abs(a / b - 1) <= UNCHANGED else change_words(b, a, lambda v: f"{v:.3g} ms")
    statistic = per.get("statistic", shift.statistic)  # the windows' is the sums' mean
    return text + f"; {label(shift)} per {unit} {moved} ({b:.3g} → {a:.3g} ms, {statistic})"


UNCHANGED = ShiftConfig.unchanged_within  # a per-unit figure within this is said unchanged, as another stage


def summary(shift: Change) -> str:
    """The shift's one sentence: what moved, when, where, by how much, and what moved with it."""
    if shift.mix is not None:
        where = place_words(shift.scope) if shift.scope else ""
        change, values = headline_words(shift.before_ms, shift.after_ms, shift.statistic)
        return (
            f"{label(shift)} {change} at {clock(shift.at)}"
            f"{'' if shift.until is None else ' until ' + clock(shift.until)}"
            f"{' ' + where if where else ''} {values}{mix_words(shift)}"
        )
    where = place_words(shift.scope) if shift.scope else ""
    change, values = headline_words(shift.before_ms, shift.after_ms, shift.statistic)
    text = (
        f"{label(shift)} {change} at {clock(shift.at)}"
        f"{'' if shift.until is None else ' until ' + clock(shift.until)}"
        f"{' ' + where if where else ''} {values}"
    )
    meaning = rise_meaning(shift)
    if meaning:
        text += f": {meaning}"
    if shift.consequences:
        text += "; with it, " + ", ".join(
            f"{short(c.part or c.stage)} {c.statistic} {ms(c.before_ms)} → {ms(c.after_ms)} ms"
            for c in shift.consequences
        )
    unchanged = shift.context.get("unchanged", [])
    if unchanged:
        text += f"; {join(unchanged)} unchanged"
    for name, moved in shift.context.get("moved", {}).items():
        text += f"; {short(name)} {change_words(moved['before_ms'], moved['after_ms'], ms_words)}"
    before, after = shift.context.get("before", {}), shift.context.get("after", {})
    for name in shift.context.get("moved_with", {}):
        said, unit = COVARIATE_WORDS[name]
        on = f" on {scope_value(shift.scope)}" if shift.scope else ""
        text += f"; {said}{on} {change_words(before[name], after[name], unit.format)}"
    return text
