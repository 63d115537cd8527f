"""Findings as typed values: a ``Shift`` (a stage's time changed), a ``Pitfall`` (a known way
serving goes wrong), and the relations between them as fields.

A detector makes them (``findings.registry``), ``findings.rank`` decides once which one explains
another (a ``Shift``'s ``with_pitfalls``, a ``Pitfall``'s ``with_shifts``), what each costs users
(``share_of_users_time``) and their order; every output reads them and none edits them. Times
are Unix seconds here and ISO-8601 UTC to the second in the JSON (``to_json``), which is the
findings contract of DESIGN.md; its schema (``schema``) is generated from these types.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, ConfigDict, Field, PlainSerializer, TypeAdapter, with_config


def iso_utc(ts: float) -> str:
    """Unix seconds as ISO-8601 UTC to the second (the findings contract's time format)."""
    return datetime.fromtimestamp(round(ts), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def to_second(ts: float) -> float:
    """``ts`` at the contract's resolution (what ``iso_utc`` says of it)."""
    return float(round(ts))


def _epoch(value: Any) -> Any:
    """An ISO-8601 time of the JSON back to Unix seconds (validating a serialised finding)."""
    if isinstance(value, str):
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return value


# A time: Unix seconds in Python, ISO-8601 UTC to the second in the JSON (and its schema).
Time = Annotated[float, BeforeValidator(_epoch), PlainSerializer(iso_utc, return_type=str)]
Scope = dict[str, str]


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


@with_config(ConfigDict(extra="forbid"))
@dataclass(frozen=True)
class Consequence:
    """A shift of the same scope that began with a ``Shift``: said as its consequence (``with``)."""

    stage: str
    part: str | None
    at: Time
    statistic: str
    before_ms: float
    after_ms: float
    impact_s: float  # its own users' seconds

    def to_json(self) -> dict:
        return {
            "stage": self.stage,
            "part": self.part,
            "at": iso_utc(self.at),
            "statistic": self.statistic,
            "before_ms": round(self.before_ms, 3),
            "after_ms": round(self.after_ms, 3),
            "impact_s": round(self.impact_s, 3),
        }


def _with(phrase: str, other: str) -> str:
    """``; with it, <the other finding's first clause> (<what it is>)``: how a relation is said."""
    return f"; with it, {phrase.split('; ')[0]} ({other})"


@with_config(ConfigDict(extra="forbid"))
@dataclass(frozen=True)
class Shift:
    """A stage's statistic moved at ``at`` (until ``until``, when it came back) in ``scope``."""

    summary: str  # the shift detector's own sentence (``sentence`` adds its relations)
    stage: str
    scope: Scope
    at: Time  # the first window boundary after the change
    statistic: str  # p50, else p90
    before_ms: float
    after_ms: float
    z: float
    affected_requests: int
    impact_s: float  # users' seconds its incident cost (it and its ``with``)
    factor: float | None  # after / before; None from a zero baseline
    part: str | None = None  # for ``connect``: which of its parts moved
    until: Time | None = None
    with_: Annotated[tuple[Consequence, ...], Field(alias="with")] = ()
    context: dict[str, Any] = field(default_factory=dict)  # what moved with it
    with_pitfalls: tuple[Pitfall, ...] = ()  # pitfalls this rise brought (``rank``)
    share_of_users_time: float | None = None  # decided by ``rank``, for top-level findings
    kind: Literal["shift"] = "shift"

    @property
    def up(self) -> bool:
        return self.after_ms > self.before_ms

    @property
    def cost_s(self) -> float:
        """Users' seconds at stake, as the JSON says it (``impact_s``)."""
        return round(self.impact_s, 3)

    @property
    def spent_in(self) -> str:
        return self.stage

    @property
    def sentence(self) -> str:
        """Its summary with the pitfalls it brought: one sentence for every output."""
        return self.summary + "".join(_with(p.sentence, p.name) for p in self.with_pitfalls)

    def to_json(self, nested: bool = False) -> dict:
        """The finding as the contract prints it; ``nested`` (inside another finding's
        relation) without ``share_of_users_time``, which only a ranked finding has."""
        out = {
            "kind": "shift",
            "summary": self.sentence,
            "stage": self.stage,
            "part": self.part,
            "at": iso_utc(self.at),
            "until": None if self.until is None else iso_utc(self.until),
            "scope": self.scope,
            "statistic": self.statistic,
            "before_ms": round(self.before_ms, 3),
            "after_ms": round(self.after_ms, 3),
            "factor": _round(self.factor, 3),
            "z": round(self.z, 2),
            "affected_requests": self.affected_requests,
            "impact_s": self.cost_s,
            "with": [c.to_json() for c in self.with_],
            "with_pitfalls": [p.to_json(nested=True) for p in self.with_pitfalls],
            "context": self.context,
        }
        if not nested:
            out["share_of_users_time"] = self.share_of_users_time
        return out


Evidence = dict[str, float | int | str | None]


@with_config(ConfigDict(extra="forbid"))
@dataclass(frozen=True)
class Pitfall:
    """A known way serving goes wrong, seen in ``scope``, with the numbers behind it."""

    name: str  # the detector's name
    summary: str  # the detector's own sentence (``sentence`` adds its relations)
    scope: Scope
    affected_requests: int
    evidence: Evidence
    impact_s: float  # its own users' seconds at stake, rounded to the ms
    spent_in: str  # the stage those seconds are spent in (decode, connect, network or gateway)
    at: Time | None = None  # when it began, for the pitfalls that know
    with_shifts: tuple[Shift, ...] = ()  # rises this pitfall brought (``rank``)
    share_of_users_time: float | None = None  # decided by ``rank``, for top-level findings
    kind: Literal["pitfall"] = "pitfall"

    @property
    def cost_s(self) -> float:
        """Users' seconds at stake, as the JSON says it: its own and its rises' (stages add up)."""
        total = self.impact_s
        for shift in self.with_shifts:
            total = round(total + shift.cost_s, 3)
        return total

    @property
    def sentence(self) -> str:
        """Its summary with the rises it brought: one sentence for every output."""
        return self.summary + "".join(_with(s.sentence, f"{s.stage} shift") for s in self.with_shifts)

    def to_json(self, nested: bool = False) -> dict:
        """The finding as the contract prints it (``nested``: see ``Shift.to_json``)."""
        out = {
            "kind": "pitfall",
            "summary": self.sentence,
            "name": self.name,
            "scope": self.scope,
            "affected_requests": self.affected_requests,
            "evidence": self.evidence,
            "impact_s": self.cost_s,
            "spent_in": self.spent_in,
            "at": None if self.at is None else iso_utc(self.at),
            "with_shifts": [s.to_json(nested=True) for s in self.with_shifts],
        }
        if not nested:
            out["share_of_users_time"] = self.share_of_users_time
        return out


def pitfall(
    name: str,
    scope: Scope,
    affected: int,
    evidence: dict,
    summary: str,
    impact_s: float,
    spent_in: str,
    at: float | None = None,
) -> Pitfall:
    """A pitfall with its evidence's floats to 4 digits and its cost to the ms (as the JSON)."""
    return Pitfall(
        name=name,
        summary=summary,
        scope=scope,
        affected_requests=int(affected),
        evidence={k: (round(v, 4) if isinstance(v, float) else v) for k, v in evidence.items()},
        impact_s=round(float(impact_s), 3),
        spent_in=spent_in,
        at=at,
    )


Finding = Annotated[Shift | Pitfall, Field(discriminator="kind")]


@with_config(ConfigDict(extra="forbid"))
@dataclass(frozen=True)
class Findings:
    """The decided findings: ``findings`` the largest cost to users first, ``minor`` those under
    ``rank.MINOR_SHARE`` of their time (same order)."""

    findings: tuple[Finding, ...] = ()
    minor: tuple[Finding, ...] = ()

    def to_json(self) -> dict:
        return {"findings": [f.to_json() for f in self.findings], "minor": [f.to_json() for f in self.minor]}


def schema() -> dict:
    """The JSON schema of the findings (``findings`` and ``minor`` of ``hopline analyze --json``)."""
    return TypeAdapter(Findings).json_schema(mode="serialization")


def validate(data: dict) -> Findings:
    """``data`` (the ``findings`` and ``minor`` of the JSON) read back into the types: raises
    ``pydantic.ValidationError`` on a key, type or value the types do not allow."""
    return TypeAdapter(Findings).validate_python(
        {"findings": data.get("findings", []), "minor": data.get("minor", [])}
    )
