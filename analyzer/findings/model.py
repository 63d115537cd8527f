"""Findings as typed values: a ``Shift`` (a stage's time changed), a ``Pitfall`` (a known way
serving goes wrong), and the relations between them as fields.

A detector makes them (``findings.registry``), ``findings.rank`` decides once which one explains
another (a ``Shift``'s ``with_pitfalls``, a ``Pitfall``'s ``with_shifts``), what each costs users
(``share_of_users_time``) and their order; every output reads them and none edits them. Times
are Unix seconds here and ISO-8601 UTC to the second in the JSON (``to_json``), which is the
findings contract of DESIGN.md; its schema (``schema``) is generated from these types.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from numbers import Integral, Real
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
Evidence = dict[str, float | int | str | None]


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _doc(text: str) -> Field:
    """A key's meaning: in the schema's ``description`` and in docs/findings.md."""
    return Field(description=text)


@with_config(ConfigDict(extra="forbid"))
@dataclass(frozen=True)
class Consequence:
    """A shift of the same scope that began with a ``Shift``: said as its consequence (``with``)."""

    stage: Annotated[str, _doc("the stage that moved with it")]
    part: Annotated[str | None, _doc("for connect: which part moved, else null")]
    at: Annotated[Time, _doc("ISO-8601 UTC to the second: when it began")]
    statistic: Annotated[str, _doc("p50 or p90")]
    before_ms: Annotated[float, _doc("before, ms")]
    after_ms: Annotated[float, _doc("after, ms")]
    impact_s: Annotated[float, _doc("its own users' seconds at stake")]

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


SHARE_DOC = (
    "abs(impact_s) over the users' total time: their e2e for a finding spent in decode, else their wait "
    "for the first output (TTFT, or a non-streaming request's e2e); on top-level findings only"
)


@with_config(ConfigDict(extra="forbid"))
@dataclass(frozen=True, kw_only=True)
class Shift:
    """A stage's statistic moved at ``at`` (until ``until``, when it came back) in ``scope``.
    Fields in the order of the JSON's keys."""

    kind: Annotated[Literal["shift"], _doc("shift")] = "shift"
    summary: Annotated[str, _doc("one sentence (with the pitfalls it brought, said after it)")]
    stage: Annotated[str, _doc("the stage that moved")]
    part: Annotated[
        str | None,
        _doc("for connect: which part moved (pool_wait: the client's own pool; connect: new connections), else null"),
    ] = None
    at: Annotated[Time, _doc("ISO-8601 UTC to the second: the start of the first window after the change")]
    until: Annotated[Time | None, _doc("when a burst ended (null: it lasted to the end of the log)")] = None
    scope: Annotated[
        Scope,
        _doc(
            "the narrowest scope the change is confined to ({} for all traffic; two attributes, e.g. "
            "{replica, model}, when it is confined to one cell of them)"
        ),
    ]
    statistic: Annotated[str, _doc("p50 or p90: the quantile that moved most clearly")]
    before_ms: Annotated[float, _doc("before, ms")]
    after_ms: Annotated[float, _doc("after, ms")]
    factor: Annotated[float | None, _doc("after / before (null from a zero baseline)")]
    z: Annotated[float, _doc("the rank test's z score")]
    affected_requests: Annotated[int, _doc("requests after the change in the scope")]
    impact_s: Annotated[float, _doc("users' seconds at stake (for ordering; the sum over the shifts it heads)")]
    with_: Annotated[
        tuple[Consequence, ...],
        Field(
            alias="with",
            description="shifts in the same scope that began with it, said as its consequences: stage, part, "
            "at, statistic, before_ms, after_ms, impact_s",
        ),
    ] = ()
    with_pitfalls: Annotated[
        tuple[Pitfall, ...],
        _doc(
            "pitfalls this rise brought with it, e.g. a long_prefill_stall after a prefill rise: whole "
            "pitfall findings, listed here instead of among the findings"
        ),
    ] = ()
    context: Annotated[dict[str, Any], _doc("what moved with it: other stages, load")] = field(default_factory=dict)
    share_of_users_time: Annotated[float | None, _doc(SHARE_DOC)] = None

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
            "kind": self.kind,
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


@with_config(ConfigDict(extra="forbid"))
@dataclass(frozen=True, kw_only=True)
class MixChange(Shift):
    """A stage's time rose because the traffic changed, not the component: per unit of work
    (per computed prompt token for prefill, per output token for decode) it held, while the
    requests got bigger (a new tenant's long documents). Its ``stage``, ``before_ms`` and
    ``after_ms`` are the stage's time, as a shift's; its ``scope`` is the new traffic it came with
    when there is one (within the scope where the stage rose), else that scope."""

    kind: Annotated[Literal["mix_change"], _doc("mix_change")] = "mix_change"
    per_unit: Annotated[
        dict[str, Any],
        _doc(
            "the stage per unit of work, before and after: unit (computed prompt token, output token), "
            "before_ms, after_ms (the same statistic); size (prompt token, output token), units_before, "
            "units_after (the requests' p50 size in it); statistic, when the per-unit figures are not the "
            "finding's statistic (mean: the window watcher's, from exact sums)"
        ),
    ] = field(default_factory=dict)
    new_traffic: Annotated[
        dict[str, Any] | None,
        _doc(
            "the traffic that began with it: scope (e.g. {service: S}), since (ISO-8601 UTC), requests_per_s, "
            "units_p50 (its requests' p50 size), share (of the stage's time in the scope where it rose, since), "
            "elsewhere (where it ran before outside that scope, where: attribute -> values, and since: ISO-8601 UTC; "
            "null when it is new to the log); null when the same traffic sent bigger requests"
        ),
    ] = None

    def to_json(self, nested: bool = False) -> dict:
        return super().to_json(nested) | {"per_unit": self.per_unit, "new_traffic": self.new_traffic}


Rise = Annotated[Shift | MixChange, Field(discriminator="kind")]  # a stage that rose: either kind


@with_config(ConfigDict(extra="forbid"))
@dataclass(frozen=True, kw_only=True)
class Pitfall:
    """A known way serving goes wrong, seen in ``scope``, with the numbers behind it. Fields in
    the order of the JSON's keys."""

    kind: Annotated[Literal["pitfall"], _doc("pitfall")] = "pitfall"
    summary: Annotated[str, _doc("one sentence (with the rises it brought, said after it)")]
    name: Annotated[str, _doc("the detector that found it")]
    scope: Annotated[Scope, _doc("where it was seen")]
    affected_requests: Annotated[int, _doc("requests it concerns")]
    evidence: Annotated[Evidence, _doc("the numbers behind it")]
    impact_s: Annotated[
        float, _doc("users' seconds at stake (for ordering), with those of the rises it brought (with_shifts)")
    ]
    spent_in: Annotated[str, _doc(
            "the stage those seconds are spent in (decode, connect, network or gateway; retry: a client's "
            "retries, before its last attempt's send)"
        )]
    at: Annotated[
        Time | None, _doc("ISO-8601 UTC: when it began (long_prefill_stall: its first long prefill), null for the others")
    ] = None
    with_shifts: Annotated[
        tuple[Rise, ...],
        _doc(
            "rises this pitfall brought with it, e.g. a queue rise behind the long prefills of a "
            "long_prefill_stall (most of its queued seconds spent while one ran on the replica): whole shift "
            "findings, listed here instead of among the findings; impact_s includes theirs"
        ),
    ] = ()
    share_of_users_time: Annotated[float | None, _doc(SHARE_DOC + "; spent_in is its stage")] = None

    @property
    def cost_s(self) -> float:
        """Users' seconds at stake, as the JSON says it: its own and its rises' (stages add up; a
        rise of the stage its own seconds are spent in holds those same seconds, counted once)."""
        total = self.impact_s
        for shift in self.with_shifts:
            if shift.stage != self.spent_in:
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


def plain(value: Any, digits: int = 4) -> float | int | str | None:
    """``value`` as the plain Python value the JSON holds: a numpy or polars scalar (numpy's
    ``float64`` subclasses ``float`` and ``round`` keeps its type), a bool (as 0 or 1), a
    ``Decimal`` or a duration (seconds) to ``int``, ``float`` (to ``digits``; NaN and infinities,
    which JSON cannot say, to None) or ``str``. A value of any other type is a detector's mistake:
    ``TypeError``."""
    if value is None or isinstance(value, str):
        return None if value is None else str(value)
    if hasattr(value, "item") and not isinstance(value, int | float):  # numpy: np.bool_, np.int64, np.str_...
        return plain(value.item(), digits)
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, Integral):  # bool, numpy's integers (registered as Integral)
        return int(value)
    if isinstance(value, Real | Decimal):  # float, numpy's floats (registered as Real)
        number = float(value)
        return round(number, digits) if math.isfinite(number) else None
    raise TypeError(f"{type(value).__module__}.{type(value).__qualname__} is not a number or a string")


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
    """A pitfall with plain values (``plain``: whatever numpy or polars type a detector computed
    them in, the JSON serialises them): its evidence's floats to 4 digits, its cost to the ms."""
    values = {}
    for key, value in evidence.items():
        try:
            values[str(key)] = plain(value)
        except TypeError as e:
            raise TypeError(f"{name}'s evidence {key!r}: {e}") from None
    return Pitfall(
        name=name,
        summary=str(summary),
        scope={str(k): str(v) for k, v in scope.items()},
        affected_requests=int(affected),
        evidence=values,
        impact_s=float(plain(impact_s, 3) or 0.0),
        spent_in=str(spent_in),
        at=None if at is None else float(at),
    )


Finding = Annotated[Shift | MixChange | Pitfall, Field(discriminator="kind")]


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
