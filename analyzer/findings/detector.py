"""What a detector is: a name, what it reads, and ``detect(frame, ctx)``.

A detector's input is the collected per-request timelines frame (``timelines.timelines``: one
row per request, ``start`` and the stages in seconds, the scope attributes) and a ``Context``:
nothing of the pipeline around it, so that the same detector runs on a whole log
(``hopline analyze``) or on a sliding window of finished requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import polars as pl
from hopline.analyzer import attribution
from hopline.analyzer.findings.model import Finding as Finding
from hopline.analyzer.findings.model import Scope, Shift
from hopline.middleware.contract.rules import SCOPE_SOURCES

DEFAULT_SCOPES = ("replica", "service", "model")

MAX_AUTO_SCOPE_VALUES = 16  # a scope attribute with more values is searched only when asked for


def scopes_to_search(timelines: pl.DataFrame, by: tuple[str, ...]) -> tuple[str, ...]:
    """``by`` (the user's, or replica, model, service), plus every other scope attribute of the
    rule book (gateway_replica, region, route, first_replica, …) present with 2 to
    ``MAX_AUTO_SCOPE_VALUES`` values and not the same as a searched one on every request
    (first_replica is replica where no request was retried)."""
    searched = [d for d in by if d in timelines.columns]
    for name in SCOPE_SOURCES:
        if (
            name not in by
            and name not in attribution.SCOPES  # the user's --by decides about these
            and name in timelines.columns
            and 2 <= timelines[name].drop_nulls().n_unique() <= MAX_AUTO_SCOPE_VALUES
            and not any(timelines[name].cast(pl.String).eq_missing(timelines[d].cast(pl.String)).all() for d in searched)
        ):
            searched.append(name)
    return tuple(searched)


@dataclass(frozen=True)
class Context:
    """What a detector is told besides the requests.

    ``window_s``: the window width (candidate change times are its boundaries); ``scopes``: the
    attributes searched for a narrower scope besides all traffic; ``kv_bytes_per_token``: the
    model's KV-cache bytes per token, when known (``hopline budget``); ``seed``: the seeded
    subsample of a scope beyond a detector's request cap; ``complete_before``: live detection's
    horizon holds the requests that finished, so of those that started at or after this time some
    are still running and missing, and those present have no end yet (``live.detector``): what is
    measured over time (the load after a change) stops there (None: every request is complete)."""

    window_s: float
    scopes: tuple[str, ...] = DEFAULT_SCOPES
    kv_bytes_per_token: int | None = None
    seed: int = 0
    complete_before: float | None = None


class Detector:
    """One detector: subclasses set the class attributes and ``detect``.

    ``needs``: the columns it reads (it is skipped when one is absent or all null);
    ``min_requests``: it is skipped on fewer requests. Relations (decided by ``rank``):
    ``caused_by_rise_of`` names a stage whose rise, when this detector's finding began after it
    in its scope, makes the finding that rise's consequence (said in its ``with_pitfalls``);
    ``brings_rise_of`` names a stage whose rise this detector's finding may bring with it, and
    ``brought`` measures whether it did."""

    name: ClassVar[str]
    kind: ClassVar[Literal["shift", "pitfall"]]
    needs: ClassVar[tuple[str, ...]]
    min_requests: int = 1
    caused_by_rise_of: ClassVar[str | None] = None
    # who can act on it (an alert's ``side``) when not the side its time is spent in: a client
    # that sends no max_tokens spends the engine's decode, and only the client can fix it
    side: ClassVar[str | None] = None
    brings_rise_of: ClassVar[str | None] = None

    def detect(self, frame: pl.DataFrame, ctx: Context) -> list[Finding]:
        raise NotImplementedError

    def runs_on(self, frame: pl.DataFrame) -> bool:
        """Enough requests, and every column it needs present with a value somewhere."""
        return frame.height >= max(self.min_requests, 1) and all(
            name in frame.columns and frame[name].null_count() < frame.height for name in self.needs
        )

    def brought(self, rise: Shift, frame: pl.DataFrame, ctx: Context) -> Scope | None:
        """The scope of this detector's finding that brought ``rise`` (a rise of
        ``brings_rise_of``), or None when none did."""
        return None
