"""What the findings mean together, decided once before any output: which finding another one
brought (a typed relation), what each costs users, which are minor, their order.

Relations come from the detectors' declarations. A pitfall whose detector has
``caused_by_rise_of = stage`` and that began (at the contract's one-second resolution) after
the onset of an up-shift of that stage, within its scope and before it ended (one window of
slack), is that shift's consequence: it moves into the shift's ``with_pitfalls``; so does a
pitfall without an onset whose time is spent in a stage that rose in the same scope. A change of
the traffic (``MixChange``: bigger requests, not a slower stage) brings no pitfall. A rise of a
stage that a detector ``brings_rise_of`` moves into the ``with_shifts`` of that detector's
finding whose scope ``Detector.brought`` names; its seconds add to the finding's (stages add up).

Order: the largest cost to users first among what the serving side and its callers did (a
stage that got slower, a pitfall); then the changes of the traffic (``MixChange``): bigger
requests took longer, which nothing is to be fixed for, as the live path pages none of them and
lets none outrank a finding that could page (a chance run of one tenant's long prompts on one
replica must not head a report whose incident is a client's new connection per request); last a
finding whose time is the calling process's own lateness (``lateness.explained``: a busy caller,
a load generator that measures itself): it says how the caller fared, not what the serving side did.

Minor: a finding is minor when the users' time it costs (|impact_s|) is under ``MINOR_SHARE`` of
the users' total time of the same kind: their waits for the first output (TTFT; a non-streaming
request's whole answer) for a finding about a TTFT part, their end-to-end time for one about
decode. 1% is below what any user can feel in a percentile and far below every incident the demo
injects (4-47% of the run's waits), yet above the residue of a healthy log: a new connection per
request on localhost "adding 0 ms", a five-second blip of a few requests.
"""

from __future__ import annotations

from dataclasses import replace

import polars as pl
from hopline.analyzer.attribution import e2e, ttft
from hopline.analyzer.findings import lateness
from hopline.analyzer.findings.detector import Context, Detector
from hopline.analyzer.findings.model import Finding, Findings, MixChange, Pitfall, Shift, to_second
from hopline.analyzer.findings.registry import REGISTRY, detect_all

MINOR_SHARE = 0.01


def users_time(frame: pl.DataFrame) -> dict[str, float]:
    """The users' total seconds a finding's cost is compared with: ``first_output`` and ``e2e``."""
    if frame.height == 0:
        return {"first_output": 0.0, "e2e": 0.0}
    first_output, total = frame.select(pl.coalesce(ttft(), e2e()).sum(), e2e().sum()).row(0)
    return {"first_output": float(first_output or 0.0), "e2e": float(total or 0.0)}


def share_of_users_time(finding: Finding, totals: dict[str, float]) -> float | None:
    """|impact_s| over the users' time of its kind (decode: e2e, a TTFT part: first output)."""
    return share_of(finding.cost_s, finding.spent_in, totals)


def share_of(cost_s: float, spent_in: str, totals: dict[str, float]) -> float | None:
    """``cost_s`` seconds spent in stage ``spent_in`` as a share of ``totals`` (``users_time``)."""
    total = totals["e2e" if spent_in == "decode" else "first_output"]
    return abs(cost_s) / total if total > 0 else None


def is_minor(finding: Finding) -> bool:
    """It costs users almost nothing: under ``MINOR_SHARE`` of their time (see above)."""
    share = finding.share_of_users_time
    return share is not None and share < MINOR_SHARE


def _began_within(pitfall: Pitfall, shift: Shift, window_s: float) -> bool:
    if pitfall.at is None or not all(pitfall.scope.get(k) == v for k, v in shift.scope.items()):
        return False
    at = to_second(pitfall.at)
    return at >= to_second(shift.at) - window_s and (shift.until is None or at <= to_second(shift.until))


def _spent_in_rise(pitfall: Pitfall, shift: Shift) -> bool:
    """A pitfall with no onset of its own (a standing condition over the log, such as users waiting
    far longer than the engine) whose time is spent in the stage that rose in its very scope: the
    rise is the change the data shows, the pitfall the users' view of it. Said once, from the
    rise (their seconds overlap: each is counted in one finding)."""
    return pitfall.at is None and shift.up and shift.stage == pitfall.spent_in and shift.scope == pitfall.scope


def caused_by_shifts(
    shifts: list[Shift], pitfalls: list[Pitfall], ctx: Context, registry: tuple[Detector, ...] = REGISTRY
) -> tuple[list[Shift], list[Pitfall]]:
    """Each pitfall of a ``caused_by_rise_of`` detector into the largest up-shift of that stage
    it began within (see the module docstring); the shifts with their ``with_pitfalls``, and the
    pitfalls no shift brought."""
    detectors = {d.name: d for d in registry}
    brought: dict[int, list[Pitfall]] = {}
    left = []
    largest_first = sorted(range(len(shifts)), key=lambda i: -abs(shifts[i].cost_s))
    for p in pitfalls:
        stage = getattr(detectors.get(p.name), "caused_by_rise_of", None)
        cause = next(
            (
                i
                for i in largest_first
                if not isinstance(shifts[i], MixChange)  # bigger requests are no regression
                and (
                    stage is not None
                    and shifts[i].stage == stage
                    and shifts[i].up
                    and _began_within(p, shifts[i], ctx.window_s)
                )
                or (not isinstance(shifts[i], MixChange) and _spent_in_rise(p, shifts[i]))
            ),
            None,
        )
        if cause is None:
            left.append(p)
        else:
            brought.setdefault(cause, []).append(p)
    return [replace(s, with_pitfalls=tuple(brought.get(i, ()))) for i, s in enumerate(shifts)], left


def brought_by_pitfalls(
    shifts: list[Shift],
    pitfalls: list[Pitfall],
    frame: pl.DataFrame,
    ctx: Context,
    registry: tuple[Detector, ...] = REGISTRY,
) -> tuple[list[Shift], list[Pitfall]]:
    """Each up-shift that a pitfall's detector says its finding brought (``brings_rise_of``,
    ``brought``) into that finding's ``with_shifts``; the shifts no pitfall brought, and the
    pitfalls with their ``with_shifts``."""
    detectors = {d.name: d for d in registry}
    rises: dict[int, list[Shift]] = {}
    left = []
    for shift in shifts:
        owner = None
        for name in dict.fromkeys(p.name for p in pitfalls):
            detector = detectors[name]
            if detector.brings_rise_of != shift.stage or not shift.up:
                continue
            scope = detector.brought(shift, frame, ctx)
            owner = next((i for i, p in enumerate(pitfalls) if p.name == name and p.scope == scope), None)
            if owner is not None:
                break
        if owner is None:
            left.append(shift)
        else:
            rises.setdefault(owner, []).append(shift)
    return left, [replace(p, with_shifts=tuple(rises.get(i, ()))) for i, p in enumerate(pitfalls)]


def _callers_own(finding: Finding, frame: pl.DataFrame) -> bool:
    """Its time is the calling process's own lateness (``lateness.explained``): it comes after
    what the serving side did, whatever its size (a busy load generator measures itself). A
    stage that is the caller's lateness by definition (``client_delay``) is the caller's whether
    it rose or fell: a caller that was busy at first and then kept time says nothing of the
    serving either."""
    if isinstance(finding, Shift) and lateness.OWN_LATENESS.get(finding.stage) == "client":
        return True
    return lateness.explained(finding, frame) == "client"


def decide(
    found: list[Finding], frame: pl.DataFrame, ctx: Context, registry: tuple[Detector, ...] = REGISTRY
) -> Findings:
    """``found`` (``detect_all``'s, on ``frame``) decided: relations, each top-level finding's
    ``share_of_users_time``, in the order above, the minor ones apart."""
    shifts = [f for f in found if isinstance(f, Shift)]
    pitfalls = sorted((f for f in found if isinstance(f, Pitfall)), key=lambda p: -p.impact_s)
    shifts, pitfalls = caused_by_shifts(shifts, pitfalls, ctx, registry)
    shifts, pitfalls = brought_by_pitfalls(shifts, pitfalls, frame, ctx, registry)
    ordered = sorted(
        [*shifts, *pitfalls], key=lambda f: (_callers_own(f, frame), isinstance(f, MixChange), -abs(f.cost_s))
    )
    totals = users_time(frame)
    ranked = []
    for f in ordered:
        share = share_of_users_time(f, totals)
        ranked.append(replace(f, share_of_users_time=None if share is None else round(share, 4)))
    return Findings(
        findings=tuple(f for f in ranked if not is_minor(f)), minor=tuple(f for f in ranked if is_minor(f))
    )


def find(frame: pl.DataFrame, ctx: Context, registry: tuple[Detector, ...] = REGISTRY) -> Findings:
    """Detect and decide: the findings of ``frame`` (collected per-request timelines)."""
    return decide(detect_all(frame, ctx, registry), frame, ctx, registry)
