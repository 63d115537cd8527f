"""One incident per onset (step 6 of the method in ``findings.shifts``): the change that
explains the users' time heads it, the others are its consequences; a reversal never outranks
the change it undoes."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hopline.analyzer.findings.lateness import OWN_LATENESS
from hopline.analyzer.findings.model import Consequence, MixChange, Shift
from hopline.middleware.contract.rules import side_of
from hopline.analyzer.findings.shifts.stats import SHIFT_STAGES, Detection
from hopline.analyzer.findings.shifts.words import summary

# Stages a connection is held for once taken from the pool: when one of them rose at the same
# moment, a pool wait is their consequence (connections busy = calls x time each is held).
HELD_STAGES = tuple(s for s in SHIFT_STAGES if s != "connect")


@dataclass
class Change:
    stage: str
    scope: dict[str, str]
    at: float  # Unix seconds: the first window boundary after the change
    statistic: str
    before_ms: float
    after_ms: float
    z: float
    requests_after: int
    context: dict = field(default_factory=dict)
    until: float | None = None  # Unix seconds: where the change reverted, if it did
    part: str | None = None  # for ``connect``: which of its parts moved (``CONNECT_PARTS``)
    consequences: list[Change] = field(default_factory=list)  # shifts that started with this one
    impact_cap_s: float | None = None  # this change undoes part of an earlier one: never more
    excess_s: float | None = None  # users' seconds its requests spent beyond the baseline (stats.excess_s)
    mix: dict | None = None  # a change of the traffic, not the component (``mix.mix_of``): per_unit, new_traffic

    @property
    def factor(self) -> float:
        return self.after_ms / self.before_ms if self.before_ms > 0 else math.inf

    @property
    def up(self) -> bool:
        return self.after_ms > self.before_ms

    @property
    def own_impact_s(self) -> float:
        """Users' time this stage's change added (or saved): the affected requests' excess over
        the baseline before it (``excess_s``), else (after - before) x requests it affected."""
        if self.excess_s is not None:
            return self.excess_s
        return (self.after_ms - self.before_ms) / 1e3 * self.requests_after

    @property
    def impact_s(self) -> float:
        """Users' time the incident cost: this change and its consequences (stages add up)."""
        total = self.own_impact_s + sum(c.own_impact_s for c in self.consequences)
        if self.impact_cap_s is not None and abs(total) > self.impact_cap_s:
            total = math.copysign(self.impact_cap_s, total)
        return total

    def summary(self) -> str:
        """Its sentence (``words.summary``)."""
        return summary(self)

    def finding(self) -> Shift:
        """The typed finding, said in its own words: a ``MixChange`` when the traffic changed,
        scoped to the new traffic it came with (``mix.mix_of``)."""
        fields = dict(
            summary=self.summary(),
            stage=self.stage,
            scope=self.scope,
            at=self.at,
            statistic=self.statistic,
            before_ms=self.before_ms,
            after_ms=self.after_ms,
            z=self.z,
            affected_requests=self.requests_after,
            impact_s=self.impact_s,
            factor=self.factor if math.isfinite(self.factor) else None,
            part=self.part,
            until=self.until,
            with_=tuple(
                Consequence(c.stage, c.part, c.at, c.statistic, c.before_ms, c.after_ms, c.own_impact_s)
                for c in self.consequences
            ),
            context=self.context,
        )
        if self.mix is None:
            return Shift(**fields)
        new = self.mix["new_traffic"]
        scope = self.scope if new is None else {**self.scope, **new["scope"]}
        return MixChange(**(fields | {"scope": scope}), per_unit=self.mix["per_unit"], new_traffic=new)


def _holds_connections(shift: Change, others: list[Change]) -> bool:
    """A pool wait that rose while a stage a connection is held for rose too: its consequence."""
    return (
        shift.part == "pool_wait"
        and shift.up
        and any(o.stage in HELD_STAGES and o.up for o in others if o is not shift)
    )


def _lateness_behind(shift: Change, others: list[Change]) -> bool:
    """A side's own lateness that rose while a stage another side owns rose too: it follows."""
    side = OWN_LATENESS.get(shift.stage)
    return side is not None and any(side_of(o.stage) != side for o in others if o is not shift)


def incidents(shifts: list[Change], within_s: float) -> list[Change]:
    """Shifts of one scope starting within ``within_s`` of each other are one incident, said from
    the change that explains the users' time: the largest one, except that a client's pool
    wait follows from the stages its connections are held for, and a side's own lateness (the
    caller's ``client_delay``: its process busy, as it is when it sends more at once) from the
    stages that moved with it. The others are its consequences
    (``with``), no longer stages that merely moved or stayed put in its context."""
    groups: list[list[Change]] = []
    for shift in sorted(shifts, key=lambda s: s.at):
        group = next(
            (g for g in groups if g[0].scope == shift.scope and shift.at - g[0].at <= within_s), None
        )
        if group is None:
            groups.append([shift])
        else:
            group.append(shift)
    leads = []
    for group in _pool_waits_joined(groups, within_s):
        lead = min(
            group,
            key=lambda s: (
                _holds_connections(s, group), _lateness_behind(s, group), part_explains(s, group), -abs(s.own_impact_s)
            ),
        )  # fmt: skip
        lead.consequences = sorted((s for s in group if s is not lead), key=lambda s: -abs(s.own_impact_s))
        said = {s.stage for s in lead.consequences}
        lead.context["unchanged"] = [s for s in lead.context.get("unchanged", []) if s not in said]
        lead.context["moved"] = {k: v for k, v in lead.context.get("moved", {}).items() if k not in said}
        leads.append(lead)
    return leads


# A stage that holds another (decode holds a thinking model's reasoning, from its first token to
# its first content token): when the part rose with it by at least half as much, the part leads.
PARTS = {"decode": "reasoning"}


def part_explains(shift: Change, others: list[Change], within_s: float = 0.0) -> bool:
    """Whether a part of ``shift``'s stage rose with it (in its scope, an onset within
    ``within_s``; in its incident group when 0) and accounts for half its rise or more:
    "reasoning took 3x longer", with decode its consequence, not "decode doubled"."""
    part = PARTS.get(shift.stage)
    rise = shift.after_ms - shift.before_ms
    return part is not None and shift.up and any(
        o.stage == part
        and o.up
        and (o.after_ms - o.before_ms) >= 0.5 * rise
        and (within_s == 0.0 or (o.scope == shift.scope and abs(o.at - shift.at) <= within_s))
        for o in others
        if o is not shift
    )


def _pool_waits_joined(groups: list[list[Change]], within_s: float) -> list[list[Change]]:
    """A group of only client pool-wait rises joins a group of a narrower scope (the whole traffic's
    pool wait with one service's network rise) where a stage connections are held for rose within
    ``within_s``: the pool is shared, so its wait shows in a wider scope than the rise behind it."""
    kept = []
    for group in groups:
        if all(s.part == "pool_wait" and s.up for s in group):
            host = next(
                (
                    g
                    for g in groups
                    if g is not group
                    and group[0].scope.items() <= g[0].scope.items()
                    and any(s.stage in HELD_STAGES and s.up and abs(s.at - group[0].at) <= within_s for s in g)
                ),
                None,
            )
            if host is not None:
                host.extend(group)
                continue
        kept.append(group)
    return kept


def cap_reversals(shifts: list[Change]) -> None:
    """A change that undoes part of an earlier one in the same stage and scope (a burst's end that
    did not come all the way back: it moves the other way, and no further than the earlier one
    moved) never outranks the change it undoes."""
    for shift in sorted(shifts, key=lambda s: s.at):
        undone = [
            s
            for s in shifts
            if s.stage == shift.stage
            and s.scope == shift.scope
            and s.at < shift.at
            and s.up != shift.up
            and abs(shift.after_ms - shift.before_ms) <= abs(s.after_ms - s.before_ms)
        ]
        if undone:
            shift.impact_cap_s = abs(max(undone, key=lambda s: s.at).impact_s)


def clusters(dets: list[Detection], within_s: float) -> list[list[Detection]]:
    """Detections of one stage grouped by time: one change seen from several scopes."""
    groups: list[list[Detection]] = []
    for det in sorted(dets, key=lambda d: d.at):
        if groups and det.at - groups[-1][0].at <= within_s:
            groups[-1].append(det)
        else:
            groups.append([det])
    return groups
