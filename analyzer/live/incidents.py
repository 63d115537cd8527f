"""Findings over time -> incidents: one per change, opened at its onset, resolved when it ends.

An incident's fingerprint (``Incident.key``) is what Alertmanager keys an alert by: the alert
name per kind (``HoplineShift``, ``HoplinePitfall``), the stage (a pitfall: its name), the
scope's keys and values, and the direction (``up``: the stage got slower, ``down``: faster).

Each step (``IncidentBook.step``) reads the findings on the horizon at event time ``now``:

- a finding whose fingerprint is firing updates that incident (its sentence, numbers, examples);
  with ``until`` set (the analysis saw the stage come back) it resolves it, ``ends_at = until``;
- a shift in the other direction, in the very same scope, from after a firing incident's onset,
  that takes the stage nearer its level before than after, is that incident's end: it resolves
  it at its onset and opens nothing (nor later, while its onset is within ``merge_s`` of that
  end); one that takes it back part of the way (a flood's queue 0 -> 1.4 s, then 0.6 s) is not;
- a new fingerprint opens an incident only when its onset is recent (at or after
  ``now - recent_s``): an old change still inside the horizon never fires again, nor one already
  resolved (a finding whose onset is at or before a resolved incident's end is that incident);
  the same stage and direction in a nested scope (``{}`` then ``{"replica": "r2"}``) with an
  onset within ``merge_s`` is the same incident (its annotations follow, its labels stay);
- what pages is a harm that is still going on: a shift down (the stage got faster) and a finding
  the analysis already sees ended (``until``) at first sight open nothing (both stay in the
  detector's findings, ``GET /v1/findings``); the second is the usual shape of a machine's
  passing hiccup, a few seconds of slower network that the analysis finds only once it is over;
- it must have been found at every step for ``hold_s`` of event time (Prometheus' ``for:``):
  the analysis of the newest seconds sees a change in a handful of requests before it knows
  whether it lasts;
- it must cost users at least ``MINOR_SHARE`` of their time since its onset (``live_share``;
  the offline report weighs a finding over the whole log, which on a 30-minute horizon would
  hide a fresh incident for its first minutes), or, in a scope, at least ``SCOPE_SHARE`` of its
  own scope's users' time since its onset (``scope_share``): one replica of 1,000 whose queue
  tripled costs the fleet 0.06% of its waits and that replica's users a quarter of theirs;
  severity is ``critical`` from ``CRITICAL_SHARE`` of all users' time on, ``warning`` below
  (so a change felt in its scope only is a warning), set when it opens (a label: it must not
  change);
- two scopes are one place when their keys nest (``{}``, ``{"replica": "r2"}``) or when the
  requests of one since the onset are nearly all (``SAME_PLACE``) the other's: a batch job pinned
  to r2 is ``{"service": "batch-eval"}`` and ``{"replica": "r2"}`` at once, and the analysis names
  one then the other as requests come; they share one hold and one incident. Of such sibling
  scopes (keys that do not nest) named during the hold, it opens with the broadest (the most
  requests since the onset): the analysis names the replica only once the replica's other
  requests show the rise too (``findings.shifts.scopes.fold_explained``; before, too few of them
  to tell, it names the job, the smaller), which is what ``hopline analyze`` names on the whole
  log. A scope whose requests all share a sibling's value that holds more requests
  (``broader_sibling``: the job's requests are all on r2, which serves others too) is held twice
  as long before it opens, so that the analysis sees enough of the sibling's other requests to
  tell. Once open, a sibling's finding keeps the incident firing, but the words stay those of
  the incident's own scope (its labels): the sentence never names another place than the labels;
- ``common``: the searched attributes (``dims``) not in its scope whose value every request in
  its scope since the onset shared, when it opens (a one-replica deployment's ``{}`` is replica
  r1): the alert carries them as labels too, so that a route on ``replica`` matches; the finding's
  scope and sentence stay those of ``hopline analyze``;
- one incident, one page: a finding of another subject in the same place that began within
  ``merge_s`` of a firing incident (or later, costing no more than what it paged with), or the
  same subject in another place at the same moment, or the same subject moving on the same way
  later within the scope it fires for (it got worse), is that incident's co-mover
  (``_companion``), and keeps it firing until it too came back; the caller's own lateness
  never leads (``findings.lateness``);
- the lead is the one that costs users most: a finding whose hold is over waits while another
  one in the same place, within ``merge_s`` of its onset, costing users more and able to page,
  is still on hold (``_outranked``). A flood's API-server lateness is seen a step before its
  queue (a 30 ms rise that settles early, against 1.3 s that needs a few more requests): it
  must not page first and make the queue its co-mover. The wait is at most the other's hold;
  a finding that is gone before its hold ends leaves the first to page at the next step;
- what does not page (``Incident.pages``) is noted: a change of the traffic (``MixChange``), a
  pitfall with no onset (``standing``), the caller's own lateness, a server's late loop short of
  critical, a shift under ``FELT_MS`` or one whose co-movers took it back (``taken_back``: a
  stage that rose while another of the same requests fell as much), a prefill or decode rise
  the requests in flight outgrew (``loaded``: the load's doing; what brought the load leads it).
  The kinds of finding among these (all but the lateness) are one predicate, ``noted_kind``,
  wherever a finding could come to lead: a noted incident it moved with (``_join``), one it
  outranks, its own incident's update (an incident that opens is noted by ``Incident.pages``,
  from the same kinds); a standing pitfall that moved with a noted shift does not page in its
  place. A noted shift that grows into one that could page pages once it could for the hold, and not
  while a larger one in its place is on hold, as one that opens (``_noted_pages_now``): a host's
  hiccup noted just before a flood, whose network time then grows with the flood's, waits for
  the flood's queue to lead;
- a firing incident whose finding is gone for ``absent_steps`` steps resolves when its stage, in
  its scope, over the last ``recent_check_s``, is nearer its level before than after (a shift
  whose onset left the horizon is gone from the findings but may still hold: it keeps firing),
  or when its scope had no requests for that long; a pitfall resolves when gone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

import numpy as np
import polars as pl
from hopline.analyzer.findings import lateness
from hopline.analyzer.findings.model import Finding, MixChange, Pitfall, Shift, iso_utc
from hopline.analyzer.findings.rank import MINOR_SHARE, share_of, users_time
from hopline.analyzer.findings.registry import REGISTRY
from hopline.analyzer.findings.common import in_scope
from hopline.analyzer.findings.stats import STATISTICS
from hopline.middleware.contract.rules import side_of

ALERTNAMES = {"shift": "HoplineShift", "mix_change": "HoplineMixChange", "pitfall": "HoplinePitfall"}
CRITICAL_SHARE = 0.05  # users' time added since the onset, from which an incident is critical
# the share of its own scope's users' time since the onset from which a scoped change pages, however
# small its scope: far above a healthy replica's drift (a finding needs the rank test and ``FELT_MS``
# too), below a tripled queue's share of its replica's waits (~25% in bench_live_windows' fleet)
SCOPE_SHARE = 0.10
EXAMPLES = 3  # request IDs an alert names
FELT_MS = 20.0  # a shift whose statistic moved less than this per request is noted, not paged
TAKEN_BACK = 0.5  # a rise whose co-movers' falls leave less than this share of it is noted (``taken_back``)
# sides whose time is not the serving's doing, noted, never paged: the measuring caller's own
# lateness; the engine's host giving it less CPU (other work on it: ``findings.lateness``)
CALLERS = ("client", "host")
SAME_PLACE = 0.8  # the share of one scope's requests in another from which they are one place
MOVED_REQUESTS = 10  # requests in a row whose median says a stage reached its level after (``moved_at``)
# the stages a batch shares: more requests in flight make each one slower (``loaded``)
SHARED_STAGES = ("prefill", "decode")
LOADED = 1.2  # requests in flight that rose this much more than the stage's own mean: the load's doing


def direction(finding: Finding) -> str:
    return "down" if isinstance(finding, Shift) and not finding.up else "up"


def subject(finding: Finding) -> str:
    """What changed: a shift's stage, a pitfall's name."""
    return finding.stage if isinstance(finding, Shift) else finding.name


def owner(finding: Finding) -> str:
    """Who can act on it: its detector's ``side``, else the side its time is spent in; a change
    of the traffic, its senders (``client``)."""
    if isinstance(finding, MixChange):
        return "client"
    if isinstance(finding, Pitfall):
        declared = next((d.side for d in REGISTRY if d.name == finding.name), None)
        if declared is not None:
            return declared
    return side_of(finding.spent_in)


def fingerprint(finding: Finding) -> tuple:
    scope = tuple(sorted((str(k), str(v)) for k, v in finding.scope.items()))
    return (ALERTNAMES[finding.kind], subject(finding), scope, direction(finding))


def onset_of(finding: Finding, now: float) -> float:
    """When it began (event time); a pitfall that does not say: now."""
    return finding.at if finding.at is not None else now


def until_of(finding: Finding) -> float | None:
    """When the analysis saw it end (a shift's ``until``), else None."""
    return finding.until if isinstance(finding, Shift) else None


def since(frame: pl.DataFrame, start: float, scope: dict | None = None) -> pl.DataFrame:
    if "start" not in frame.columns:  # no request yet
        return frame
    keep = pl.col("start") >= start
    if scope:
        keep &= in_scope(scope).fill_null(False)
    return frame.filter(keep)


def live_share(finding: Finding, frame: pl.DataFrame, onset: float) -> float | None:
    """The users' time it added over the users' time of all requests since its onset: their
    end-to-end time for a finding spent in decode, else their waits for the first output
    (``rank.share_of``, the rule offline ranking uses). A finding that names no onset (a pitfall
    such as ``user_vs_engine_gap``, measured over the horizon) is weighed over the horizon."""
    totals = users_time(since(frame, weighed_from(finding, frame, onset)))
    return share_of(finding.cost_s, finding.spent_in, totals)


def weighed_from(finding: Finding, frame: pl.DataFrame, onset: float) -> float:
    """Its onset, or the horizon's first request for a finding that names none."""
    if finding.at is None and "start" in frame.columns and frame.height:
        return float(frame["start"].min())
    return onset


ScopeTime = Callable[[dict, float], "dict[str, float] | None"]


def scope_share(
    finding: Finding, frame: pl.DataFrame, onset: float, scope_time: ScopeTime | None = None
) -> float | None:
    """``live_share`` over its own scope's users' time since its onset (None: no scope, or no
    time). ``scope_time(scope, onset)``: that time where the frame cannot say it (window
    summaries' exact sums; None there too: not known), else the frame's requests in scope."""
    if not finding.scope:
        return None
    onset = weighed_from(finding, frame, onset)
    if scope_time is not None:
        totals = scope_time(finding.scope, onset)
    else:
        totals = users_time(since(frame, onset, finding.scope))
    return None if totals is None else share_of(finding.cost_s, finding.spent_in, totals)


def costs_enough(share: float | None, local: float | None) -> bool:
    """Whether it costs users enough to page: ``MINOR_SHARE`` of all users' time since its onset,
    or ``SCOPE_SHARE`` of its own scope's (see the module doc)."""
    return (share is not None and share >= MINOR_SHARE) or (local is not None and local >= SCOPE_SHARE)


def examples(finding: Finding, frame: pl.DataFrame, onset: float, n: int = EXAMPLES) -> list[str]:
    """A few requests to look at: in its scope since its onset, the slowest in its stage."""
    rows = since(frame, onset, finding.scope)
    stage = finding.spent_in
    if stage in rows.columns:
        rows = rows.filter(pl.col(stage).is_not_null()).sort(stage, descending=True)
    else:
        rows = rows.sort("start", descending=True)
    return rows["request_id"].head(n).to_list()


def common_values(scope: dict, dims: tuple[str, ...], frame: pl.DataFrame, onset: float) -> dict[str, str]:
    """The attributes of ``dims`` outside ``scope`` with one value (not null) on every request in
    ``scope`` since ``onset``."""
    rows = since(frame, onset, scope)
    found: dict[str, str] = {}
    for dim in dims:
        if dim in scope or dim not in rows.columns or rows.height == 0:
            continue
        values = rows[dim].cast(pl.String)
        if values.null_count() == 0 and values.n_unique() == 1:
            found[dim] = values[0]
    return found


def broader_sibling(scope: dict, dims: tuple[str, ...], frame: pl.DataFrame, onset: float) -> dict | None:
    """A scope of one attribute outside ``scope`` whose value all of ``scope``'s requests since
    ``onset`` share and which holds more of them, but not all traffic (the replica a batch job is
    pinned to, serving other services too); None when there is none."""
    if not scope:
        return None
    mine, everyone = since(frame, onset, scope).height, since(frame, onset).height
    for dim, value in common_values(scope, dims, frame, onset).items():
        if mine < since(frame, onset, {dim: value}).height < everyone:
            return {dim: value}
    return None


def same_place(a: dict, b: dict, frame: pl.DataFrame, start: float) -> bool:
    """Scopes ``a`` and ``b`` are one place: their keys nest, or ``SAME_PLACE`` of the requests of
    one of them since ``start`` are the other's."""
    if _nested(tuple(a.items()), tuple(b.items())):
        return True
    if "start" not in frame.columns:
        return False
    rows = frame.filter(pl.col("start") >= start)
    if rows.height == 0:
        return False
    in_a, in_b = (in_scope(a).fill_null(False), in_scope(b).fill_null(False))
    counts = rows.select(in_a.sum().alias("a"), in_b.sum().alias("b"), (in_a & in_b).sum().alias("ab"))
    n_a, n_b, both = counts.row(0)
    smaller = min(n_a, n_b)
    return smaller > 0 and both >= SAME_PLACE * smaller


def moved_at(finding: Finding, frame: pl.DataFrame, onset: float, k: int = MOVED_REQUESTS) -> float:
    """When a shift's stage, in its scope, reached its level after: the start of the middle
    request of the first ``k`` in a row since its onset whose median is past the midpoint of its
    levels before and after (their geometric mean, with 1 ms added: a stage may start from 0);
    ``onset`` when none is yet, or for other findings. The analysis places an onset at a window
    boundary that splits the requests so far best: a stage that drifted a little and then moved
    with another change (a host's wander, then a flood) is placed at the drift, with the flood's
    level after it. What moved it is the later change, and that is the one it moved with."""
    if not isinstance(finding, Shift) or finding.stage not in frame.columns or "start" not in frame.columns:
        return onset
    stage = finding.stage
    rows = since(frame, onset, finding.scope).filter(pl.col(stage).is_not_null()).sort("start")
    if rows.height < k:
        return onset
    mid = (math.sqrt((finding.before_ms + 1.0) * (finding.after_ms + 1.0)) - 1.0) / 1e3
    median = rows[stage].rolling_median(window_size=k)
    past = (median >= mid) if finding.up else (median <= mid)
    hits = past.fill_null(False).arg_true()
    if hits.len() == 0:
        return onset
    return max(onset, float(rows["start"][int(hits[0]) - k // 2]))


def returned(finding: Shift, frame: pl.DataFrame, start: float, min_requests: int = 20) -> bool | None:
    """Whether the stage, in scope, since ``start``, is nearer its level before than after (its
    statistic's ratio); None with fewer than ``min_requests`` requests to tell."""
    if finding.stage not in frame.columns:
        return None
    values = since(frame, start, finding.scope)[finding.stage].drop_nulls().to_numpy()
    if len(values) < min_requests:
        return None
    return nearer_before(float(np.percentile(values, STATISTICS.get(finding.statistic, 50))) * 1e3, finding)


def nearer_before(level_ms: float, finding: Shift) -> bool:
    """Whether ``level_ms`` is nearer ``finding``'s level before than after, in log terms (1 ms
    added: a stage at 0 compares by its distance in ms)."""
    distance = lambda level: abs(math.log((level_ms + 1.0) / (level + 1.0)))
    return distance(finding.before_ms) <= distance(finding.after_ms)


@dataclass
class Incident:
    """One change (or a standing condition) over time. ``finding`` is its newest finding,
    ``fired`` the one it paged with (the alert's sentence, kept to its end: the resolved
    notification says what the firing one said, and how it ended); ``co_movers`` the findings
    of other stages that began with it in its place (said with it, never paged apart).

    ``pages``: whether it goes to Alertmanager: not for a shift of less than ``FELT_MS`` a
    request (``unfelt``), nor a shared stage's rise the requests in flight outgrew (``load``),
    not while its time is the calling side's own
    lateness (``late`` in ``CALLERS``: ``findings.lateness``), nor a server's late loop that is not
    critical (an engine's or gateway's late loop is that server's time: critical, it pages with
    that ``side``); such an incident is in ``GET /v1/findings`` and
    the printout all the same; nor a ``standing`` one (a pitfall that names no onset: a
    condition, not a change), a ``warning`` said once in the printout and in ``/v1/findings``."""

    key: tuple
    finding: Finding
    onset: float
    first_seen: float
    last_seen: float
    severity: str
    share: float | None
    examples: list[str] = field(default_factory=list)
    state: str = "firing"
    ends_at: float | None = None
    absent_steps: int = 0
    common: dict[str, str] = field(default_factory=dict)  # see the module doc; set when it opens
    fired: Finding | None = None  # the finding it opened (or began to page) with
    co_movers: list[Finding] = field(default_factory=list)
    standing: bool = False
    late: str | None = None  # the side whose own loop lateness its time is (the caller's: it does not page)
    sample: float | None = None  # the fraction of requests analysed, when below 1
    ended: str | None = None  # how it ended, said in the resolved notification
    fired_onset: float | None = None  # its onset when it paged (the alert's ``startsAt``)
    scope_share: float | None = None  # its share of its own scope's users' time (``scope_share``)
    pageable_since: float | None = None  # noted: the first step of the run in which it could page
    load: bool = False  # its stage rose with the requests in flight, more than itself (``loaded``)

    def __post_init__(self) -> None:
        if self.fired is None:
            self.fired = self.finding
        if self.fired_onset is None:
            self.fired_onset = self.onset

    def moved_with(self, finding: Finding) -> None:
        """``finding`` is one of its co-movers, the newest of its fingerprint."""
        self.co_movers = [f for f in self.co_movers if fingerprint(f) != fingerprint(finding)] + [finding]

    def page_with(self, finding: Finding, now: float) -> None:
        """From now on it pages with ``finding``'s words (it did not page before)."""
        self.fired, self.fired_onset, self.first_seen, self.late = finding, self.onset, now, None

    @property
    def scope(self) -> dict[str, str]:
        return dict(self.key[2])

    @property
    def pages(self) -> bool:
        return (
            not self.standing
            and _would_page(self.late, self.severity)
            and not self.unfelt
            and not self.mix
            and not self.load
        )

    @property
    def mix(self) -> bool:
        """A change of the traffic, not a slowdown (``MixChange``): noted, not paged; what it
        brought on for other traffic (a queue) is a shift of its own, and pages."""
        return isinstance(self.fired or self.finding, MixChange)

    @property
    def unfelt(self) -> bool:
        """A shift whose statistic moved less than ``FELT_MS`` a request (a host's jitter on a
        model whose whole TTFT is a few tens of ms: a large share of little), or whose co-movers
        took it back (``taken_back``): noted, not paged."""
        return _unfelt(self.fired or self.finding)

    @property
    def side(self) -> str:
        """Who owns its time (``client``, ``gateway``, ``network``, ``engine``): the side of the
        stage its seconds are spent in, or the side whose loop was late."""
        return self.late or owner(self.fired or self.finding)

    @property
    def words(self) -> str:
        """The alert's sentence: what it paged with; resolved, with how it ended."""
        said = (self.fired or self.finding).sentence + lateness.said(self.fired or self.finding, self.late)
        if self.state == "resolved":
            end = iso_utc(self.ends_at)[11:19] if self.ends_at is not None else "now"
            said += f"; resolved at {end}" + (f": {self.ended}" if self.ended else "")
        return said

    def to_json(self) -> dict:
        """The newest finding (contract fields) plus the incident's state and times (ISO-8601 UTC)."""
        out = self.finding.to_json() | {
            "state": self.state,
            "onset": iso_utc(self.onset),
            "first_seen": iso_utc(self.first_seen),
            "last_seen": iso_utc(self.last_seen),
            "ends_at": None if self.ends_at is None else iso_utc(self.ends_at),
            "severity": self.severity,
            "side": self.side,
            "pages": self.pages,
            "standing": self.standing,
            "late": self.late,
            "share_since_onset": None if self.share is None else round(self.share, 4),
            "scope_share_since_onset": None if self.scope_share is None else round(self.scope_share, 4),
            "examples": self.examples,
            "common": self.common,
            "alert_summary": self.words,
            "co_movers": [f.to_json() for f in self.co_movers],
        }
        if self.sample is not None:
            out["sample"] = self.sample
        return out


def _unfelt(finding: Finding) -> bool:
    """A shift of less than ``FELT_MS`` a request, or one its co-movers took back (``taken_back``)."""
    return isinstance(finding, Shift) and (abs(finding.after_ms - finding.before_ms) < FELT_MS or taken_back(finding))


def taken_back(finding: Finding) -> bool:
    """A rise whose co-movers (``with``: stages of its scope that moved at its onset) fell by
    nearly as much: its incident's net cost to users (``impact_s``, its own rise and theirs) is
    under ``TAKEN_BACK`` of its own and under ``FELT_MS`` a request. Time moved between stages,
    users did not wait longer: one host's CPUs moving between its processes (a client that read
    its streams late reads them on time, a CPU engine beside it decodes slower for it)."""
    if not isinstance(finding, Shift) or not finding.up or not finding.with_ or finding.affected_requests <= 0:
        return False
    own = finding.impact_s - sum(c.impact_s for c in finding.with_)
    net = finding.impact_s
    return own > 0 and net < TAKEN_BACK * own and net / finding.affected_requests * 1e3 < FELT_MS


def loaded(finding: Finding, frame: pl.DataFrame) -> bool:
    """A prefill or decode rise that the requests in flight outgrew (``LOADED``): the ``concurrency``
    the analysis measured with it (arrivals × mean end-to-end time) rose more than the stage's own
    mean, in its scope, before and since its onset. A stage that slows by itself cannot raise the
    requests in flight more than itself (at the same arrivals the end-to-end time rises less than
    any of its parts): more requests came, or others of their stages grew (a queue), and the engine
    shares each step among more of them. It is the load's doing, noted, not paged; what brought the
    load (a flood's queue) pages, with it as a co-mover. A flood seen first by its decode (its
    queued requests finish later) paged the decode before the queue."""
    if not isinstance(finding, Shift) or not finding.up or finding.stage not in SHARED_STAGES:
        return False
    rise = finding.context.get("covariates", {}).get("concurrency") if finding.context else None
    if rise is None or finding.stage not in frame.columns or finding.at is None:
        return False
    values = frame.filter(in_scope(finding.scope).fill_null(False)) if finding.scope else frame
    stage, start = pl.col(finding.stage), pl.col("start")
    before, after = values.select(
        stage.filter(start < finding.at).mean().alias("before"), stage.filter(start >= finding.at).mean().alias("after")
    ).row(0)
    if not before or not after or after <= before:
        return False
    return 1.0 + rise > LOADED * after / before


def is_standing(finding: Finding) -> bool:
    """A pitfall that names no onset: a condition, not a change (measured over the horizon, it
    cannot say when it began)."""
    return isinstance(finding, Pitfall) and finding.at is None


def noted_kind(finding: Finding, frame: pl.DataFrame) -> bool:
    """Whether ``finding`` is noted, never paged, for what it is, wherever it comes in (opening an
    incident, leading a noted one, outranking another, an update): a change of the traffic
    (``MixChange``), a standing pitfall (a condition without an onset), a shift users do not feel
    (``_unfelt``), or a shared stage's rise the requests in flight outgrew (``loaded``)."""
    return (
        isinstance(finding, MixChange)
        or is_standing(finding)
        or _unfelt(finding)
        or loaded(finding, frame)
    )


def _would_page(late: str | None, severity: str) -> bool:
    """The caller's own lateness never pages; a server's late loop pages when it costs users
    enough to be critical (a host busy for a moment is noted, a saturated server pages)."""
    return late not in CALLERS and (late is None or severity == "critical")


def _nested(a: tuple, b: tuple) -> bool:
    return set(a) <= set(b) or set(b) <= set(a)


def _place(key: tuple) -> tuple:
    """What a fingerprint says besides its scope: alert name, subject, direction."""
    return (key[0], key[1], key[3])


def _lead_order(finding: Finding, late: str | None) -> tuple:
    """Which of findings that began together leads their incident: one that pages before one
    that is the measuring side's own lateness, then the larger cost to users."""
    return (late in CALLERS, -abs(finding.cost_s))


@dataclass
class IncidentBook:
    """The incidents of one detector (see the module doc); ``step`` returns those that changed
    (opened, updated, resolved; ``Incident.pages`` says which go to Alertmanager)."""

    window_s: float
    horizon_s: float
    recent_s: float = 300.0
    recent_check_s: float = 30.0
    absent_steps: int = 3
    max_firing: int = 200
    hold_s: float = 0.0
    dims: tuple[str, ...] = ()  # the scope attributes searched (``common``)
    sample: float | None = None  # the detector's sample (said on each incident), None when whole
    incidents: list[Incident] = field(default_factory=list)
    held: dict[tuple, float] = field(default_factory=dict)  # fingerprint -> first step it was found
    named: dict[tuple, tuple[float, Finding]] = field(default_factory=dict)  # fingerprint -> (last step, finding)
    latest: float = -math.inf  # this step's time, or the newest event's if earlier (``step``)
    frame: pl.DataFrame = field(default_factory=pl.DataFrame)  # this step's requests
    suppressed: int = 0  # incidents not opened because max_firing were firing
    ongoing: set[tuple] = field(default_factory=set)  # this step's fingerprints without an end
    contenders: list[tuple[Finding, str | None]] = field(default_factory=list)  # this step's ongoing, with lateness
    scope_time: ScopeTime | None = None  # a scope's users' time since an onset, where the frame cannot say it

    @property
    def merge_s(self) -> float:
        return 3 * self.window_s + 15.0

    def firing(self) -> list[Incident]:
        return [i for i in self.incidents if i.state == "firing"]

    def paging(self) -> list[Incident]:
        return [i for i in self.firing() if i.pages]

    def step(
        self, now: float, findings: list[Finding], frame: pl.DataFrame, newest: float | None = None
    ) -> list[Incident]:
        """``newest``: the newest event's time. Past it (a replay's end, a drained stream) event
        time runs on without events: what ends or begins then is dated at most ``newest``."""
        changed: dict[int, Incident] = {}
        seen: dict[int, bool] = {}  # incidents found in this step -> whether a finding gave its words
        self.latest = now if newest is None else min(now, newest)
        self.frame = frame
        ongoing = [f for f in findings if until_of(f) is None]
        self.ongoing = {fingerprint(f) for f in ongoing}
        self.held = self._hold(now, ongoing, frame)
        keep_s = 2 * self.hold_s + self.merge_s
        self.named = {k: v for k, v in self.named.items() if v[0] >= now - keep_s}
        self.named.update((fingerprint(f), (now, f)) for f in reversed(ongoing))  # the first wins
        # of every finding: one that ended (``until``) goes on in its incident while a co-mover of it
        # does (``_carried_on``), and must not page then for want of its lateness
        lateness_of = {id(f): lateness.explained(f, frame) for f in findings}
        self.contenders = [(f, lateness_of[id(f)]) for f in ongoing]
        order = sorted(findings, key=lambda f: _lead_order(f, lateness_of.get(id(f))))
        for finding in order:  # the lead first: the one an incident shows
            incident, news, worded = self._apply(now, finding, frame, seen, lateness_of.get(id(finding)))
            if incident is not None:
                seen[id(incident)] = seen.get(id(incident), False) or worded
                if news:
                    changed[id(incident)] = incident
        for incident in self.firing():
            if id(incident) in seen:
                incident.absent_steps = 0
                continue
            incident.absent_steps += 1
            ended = self._gone(now, incident, frame)
            if ended is not None:
                self._resolve(incident, min(ended[0], self.latest), ended[1])
                changed[id(incident)] = incident
        self.incidents = [
            i for i in self.incidents if i.state == "firing" or (i.ends_at or now) >= now - self.horizon_s
        ]
        return list(changed.values())

    def _resolve(self, incident: Incident, at: float, how: str) -> None:
        incident.state, incident.ends_at, incident.ended = "resolved", at, how

    def _hold(self, now: float, findings: list[Finding], frame: pl.DataFrame) -> dict[tuple, float]:
        """Fingerprint -> the first step it was found at every step since: its own, or that of
        one held in the same place (``same_place``) whose scope the analysis now names otherwise."""
        held: dict[tuple, float] = {}
        for finding in findings:
            key = fingerprint(finding)
            first = self.held.get(key, now)
            for other, since_ in self.held.items():
                if other != key and _place(other) == _place(key) and since_ < first:
                    if same_place(dict(other[2]), dict(key[2]), frame, onset_of(finding, self.latest)):
                        first = since_
            held[key] = min(held.get(key, now), first)
        return held

    def _gone(self, now: float, incident: Incident, frame: pl.DataFrame) -> tuple[float, str] | None:
        """When it ended and how (None: it has not): now, or for a scope gone quiet, its last
        request's start (a drained stream's event time runs past the wall clock; an ``endsAt`` in
        the future would keep Alertmanager's alert firing until then)."""
        if incident.absent_steps < self.absent_steps:
            return None
        finding = incident.finding
        if not isinstance(finding, Shift):
            return now, "no longer found"
        back = returned(finding, frame, now - self.recent_check_s)
        if back is None:  # too few requests in scope lately: gone when quiet for a horizon
            if since(frame, now - self.horizon_s / 2, incident.scope).height:
                return None
            last = since(frame, incident.onset, incident.scope)
            return (float(last["start"].max()) if last.height else now), "its scope has had no requests since"
        return (now, f"{finding.stage} back near its level before ({finding.before_ms:.3g} ms)") if back else None

    def _related(self, key: tuple, onset: float, state: str, same_direction: bool = True) -> Incident | None:
        for incident in reversed(self.incidents):  # the newest first: a key may have ended twice
            k = incident.key
            if incident.state != state or k[:2] != key[:2]:
                continue
            if not _nested(k[2], key[2]) and not (
                k[3] == key[3]
                and same_place(incident.scope, dict(key[2]), self.frame, min(onset, incident.onset))
            ):
                continue
            if (k[3] == key[3]) != same_direction:
                continue
            if not same_direction and k[2] != key[2]:  # a reversal in its very scope, not a wider mix
                continue
            if not same_direction and incident.onset <= onset:  # a reversal: whenever it began
                return incident
            if k == key or abs(incident.onset - onset) <= self.merge_s:
                return incident
        return None

    def _companion(self, finding: Finding, key: tuple, onset: float) -> Incident | None:
        """The incident of another subject this finding belongs to, in the same place (nested
        scopes, or one place by their requests): a firing one whose onset is within ``merge_s``
        of this one's (they moved together), or earlier while this finding costs users no more
        than what it paged with (what moves while an incident goes on is part of it: a flood's
        queue, then its API server as the bottleneck moves; a larger change is news of its own);
        or a resolved one with this onset inside its span. The same stage (or pitfall) moving the
        same way in another place within ``merge_s`` is the same incident too (huge prompts sent
        to every replica stall each of them: one cause, one page, the other replicas its
        co-movers). Of several, one that pages comes first: a finding that moved with a paging
        incident and with a noted one (a flood's queue and its batch's mix change) must not lead
        the noted one into a second page."""
        found = list(self._companions(finding, key, onset))
        return next((i for i in found if i.state == "firing" and i.pages), found[0] if found else None)

    def _companions(self, finding: Finding, key: tuple, onset: float) -> Iterator[Incident]:
        """The incidents ``finding`` belongs to (``_companion``), the newest first."""
        for incident in reversed(self.incidents):
            if incident.standing or onset < incident.onset - self.merge_s:
                continue  # a standing condition is no change for others to move with
            if incident.state == "resolved" and onset > (incident.ends_at or incident.onset):
                continue
            if incident.key[:2] == key[:2]:
                if incident.key[3] != key[3]:
                    continue
                if incident.state == "firing" and abs(onset - incident.onset) <= self.merge_s:
                    yield incident  # the same change in another place at the same moment
                # or the same stage moving on, the same way, within the place it is for, while it
                # went on: the incident getting worse (a flood's batch queueing longer still)
                elif onset >= incident.onset and _nested(incident.key[2], key[2]):
                    if len(incident.key[2]) <= len(key[2]):
                        yield incident
                continue
            lead = incident.fired or incident.finding
            later = onset > incident.onset + self.merge_s
            if incident.state == "firing" and later and abs(finding.cost_s) > abs(lead.cost_s):
                continue
            if _nested(incident.key[2], key[2]) or same_place(
                incident.scope, dict(key[2]), self.frame, min(onset, incident.onset)
            ):
                yield incident

    def _carried_on(self, incident: Incident) -> bool:
        """A co-mover of ``incident`` is still found and its stage, in its scope, lately, is
        still nearer its level after than before: its change is not over."""
        return any(
            fingerprint(f) in self.ongoing
            and (not isinstance(f, Shift) or returned(f, self.frame, self.latest - self.recent_check_s) is False)
            for f in incident.co_movers
        )

    def _apply(
        self, now: float, finding: Finding, frame: pl.DataFrame, seen: dict[int, bool], late: str | None
    ) -> tuple[Incident | None, bool, bool]:
        """The incident this finding belongs to (None: none), whether it changed and whether the
        finding gave it its words; an incident ``seen`` in this step already took a more
        important finding's words and keeps them."""
        key, onset = fingerprint(finding), onset_of(finding, self.latest)
        until = until_of(finding)
        reversed_ = self._related(key, onset, "firing", same_direction=False)
        if isinstance(finding, Shift) and reversed_ is not None:
            if self._carried_on(reversed_):  # its stage came back, what moved with it did not
                return reversed_, False, False
            rise = reversed_.finding
            if isinstance(rise, Shift) and not nearer_before(finding.after_ms, rise):
                return reversed_, False, False  # it fell back part of the way: still nearer its level after
            said = f"{finding.stage} came back ({finding.statistic} {finding.before_ms:.3g} → {finding.after_ms:.3g} ms)"
            self._resolve(reversed_, onset, said)
            return reversed_, True, True
        incident = self._related(key, onset, "firing")
        if incident is not None and until is not None and until < incident.onset:
            return None, False, False  # an earlier change of the same stage, over before this one began
        if incident is not None and seen.get(id(incident)):
            return incident, False, False
        if incident is not None:
            return self._update(now, incident, finding, until, frame, late)
        old = self._related(key, onset, "resolved")
        if old is not None and onset <= (old.ends_at or now) + self.window_s:
            return None, False, False
        ended = self._related(key, onset, "resolved", same_direction=False)
        if ended is not None and abs(onset - (ended.ends_at or onset)) <= self.merge_s:
            return None, False, False  # the end of a resolved incident, seen again
        if onset < now - self.recent_s or until is not None or key[3] == "down":
            return None, False, False
        companion = self._companion(finding, key, moved_at(finding, frame, onset))
        if companion is not None and companion.state == "resolved":
            if all(fingerprint(f) != key for f in companion.co_movers):
                companion.co_movers = [*companion.co_movers, finding]
            return None, False, False  # part of a change that is over: noted with it, not news
        if companion is not None:
            return self._join(now, companion, finding, late)
        opened = self._open(now, key, finding, frame, late)
        return opened, opened is not None, opened is not None

    def _join(self, now: float, incident: Incident, finding: Finding, late: str | None) -> tuple[Incident, bool, bool]:
        """``finding`` began with ``incident`` in its place: one of its co-movers. An incident that
        does not page (its lead is the measuring side's lateness, a change in the traffic) is led
        by a co-mover that would, once that co-mover was found at every step for the hold (as
        long as it would have waited to open: a finding seen for one step leads nothing): nothing
        was sent of it yet, so its labels may change."""
        incident.last_seen = now
        incident.moved_with(finding)
        if incident.pages or incident.standing:
            return incident, False, False
        if now - self.held.get(fingerprint(finding), now) < self.hold_s:
            return incident, False, False  # it leads once it held as long as one that opens
        onset = onset_of(finding, self.latest)
        share = live_share(finding, self.frame, onset)
        local = scope_share(finding, self.frame, onset, self.scope_time)
        severity = "critical" if (share or 0.0) >= CRITICAL_SHARE else "warning"
        if not _would_page(late, severity) or noted_kind(finding, self.frame) or not costs_enough(share, local):
            return incident, False, False
        incident.co_movers = [f for f in incident.co_movers if f is not finding] + [incident.finding]
        incident.key, incident.finding, incident.onset = fingerprint(finding), finding, onset
        incident.page_with(finding, now)
        incident.share, incident.scope_share, incident.severity, incident.late = share, local, severity, late
        incident.load = False
        incident.examples = examples(finding, self.frame, onset)
        return incident, True, True

    def _open(self, now: float, key: tuple, finding: Finding, frame: pl.DataFrame, late: str | None) -> Incident | None:
        """A new incident for this finding, in the broadest sibling scope named during its hold,
        once held long enough and costing enough (see the module doc); None: not yet, or not."""
        held_since = self.held.get(key, now)
        key, finding = self._broadest_named(key, finding, frame, held_since)
        onset = onset_of(finding, self.latest)
        hold = self.hold_s * (2 if broader_sibling(dict(key[2]), self.dims, frame, onset) else 1)
        if now - held_since < hold:
            return None
        share = live_share(finding, frame, onset)
        local = scope_share(finding, frame, onset, self.scope_time)
        if not costs_enough(share, local):
            return None
        if self._outranked(now, key, finding, moved_at(finding, frame, onset), frame):
            return None
        if len(self.firing()) >= self.max_firing:
            self.suppressed += 1
            return None
        standing = is_standing(finding)
        severity = "critical" if (share or 0.0) >= CRITICAL_SHARE and not standing and late not in CALLERS else "warning"
        incident = Incident(
            key, finding, onset, now, now, severity, share, examples(finding, frame, onset),
            standing=standing, late=late, sample=self.sample, scope_share=local,
        )  # fmt: skip
        incident.common = common_values(incident.scope, self.dims, frame, onset)
        incident.load = loaded(finding, frame)
        self.incidents.append(incident)
        return incident

    def _outranked(self, now: float, key: tuple, finding: Finding, onset: float, frame: pl.DataFrame) -> bool:
        """Whether another ongoing finding in the same place, within ``merge_s`` of ``onset``,
        that costs users more and could page, is still on hold (it will lead; see the module doc)."""
        for other, late in self.contenders:
            other_key = fingerprint(other)
            if other_key == key or abs(other.cost_s) <= abs(finding.cost_s) or other_key[3] != key[3]:
                continue
            if late in CALLERS or noted_kind(other, frame):
                continue
            other_onset = onset_of(other, self.latest)
            if abs(other_onset - onset) > self.merge_s or now - self.held.get(other_key, now) >= self.hold_s:
                continue  # another moment, or its hold is over (then it is the incident already)
            if _nested(other_key[2], key[2]) or same_place(dict(other_key[2]), dict(key[2]), frame, min(onset, other_onset)):
                return True
        return False

    def _noted_pages_now(self, now: float, incident: Incident, finding: Finding, frame: pl.DataFrame) -> bool:
        """Whether a noted incident that could page now begins to: once it could at every step
        for the hold (a lateness explanation or a rise that crosses ``FELT_MS`` for one step pages
        nothing, as a finding seen for one step opens nothing), and not while a finding in its
        place that costs users more is still on hold (``_outranked``: a host's hiccup noted just
        before a flood, grown with the flood's network time, must not page before the queue), nor
        when it moved (``moved_at``) with an incident that pages (or paged, and that moment is
        inside its span): it is that one's co-mover."""
        if incident.pageable_since is None:
            incident.pageable_since = now
        if now - incident.pageable_since < self.hold_s:
            return False
        moved = moved_at(finding, frame, incident.onset)
        if self._outranked(now, incident.key, finding, moved, frame):
            return False
        lead = next((i for i in self._companions(finding, incident.key, moved) if i is not incident and i.pages), None)
        if lead is not None:
            lead.moved_with(finding)
            return False
        return True

    def _judged(self, incident: Incident, finding: Finding, frame: pl.DataFrame) -> bool:
        """A rise noted as taken back when it opened (``taken_back``) that has not moved since:
        its stage reached its level after (``moved_at``) before the incident was first seen. The
        analysis words the same change otherwise as requests come (a p90 in a narrower scope,
        without the fall that took it back); that is not news."""
        return taken_back(incident.fired) and moved_at(finding, frame, incident.onset) <= incident.first_seen

    def _broadest_named(
        self, key: tuple, finding: Finding, frame: pl.DataFrame, held_since: float
    ) -> tuple[tuple, Finding]:
        """Of ``key`` and the sibling scopes in its place named since ``held_since`` (keys that
        do not nest: ``{service: batch-eval}`` and ``{replica: r2}``), the one with the most
        requests since the onset, with its newest finding."""
        onset = onset_of(finding, self.latest)
        best, most = (key, finding), since(frame, onset, dict(key[2])).height
        for other, (seen_at, found) in self.named.items():
            if other == key or _place(other) != _place(key) or seen_at < held_since or _nested(other[2], key[2]):
                continue
            if not same_place(dict(other[2]), dict(key[2]), frame, onset):
                continue
            n = since(frame, onset, dict(other[2])).height
            if n > most:
                best, most = (other, found), n
        return best

    def _update(
        self, now: float, incident: Incident, finding: Finding, until: float | None, frame: pl.DataFrame,
        late: str | None = None,
    ) -> tuple[Incident, bool, bool]:
        """The incident with its newest finding, whether what an alert shows changed and whether
        the finding gave the words. A sibling scope's finding (one place, keys that do not nest)
        only keeps it firing: the words stay those of the incident's own scope, its labels. An
        incident that did not page (its time was the measuring side's lateness, or it was unfelt)
        pages once it could for the hold (``_noted_pages_now``). Its lateness, once the recent
        requests no longer reach back before its onset (``lateness.told``), stays what it was."""
        incident.last_seen = now
        if late is None and not lateness.told(finding, frame):
            late = incident.late
        if fingerprint(finding) != incident.key and not _nested(fingerprint(finding)[2], incident.key[2]):
            if until is not None:  # the place's change is over, whichever of its scopes says so
                self._resolve(incident, until, "came back")
            return incident, until is not None, False
        if finding.at is not None:  # the analysis places it better as requests come (a pitfall: first seen)
            incident.onset = onset_of(finding, now)
        if fingerprint(finding) != incident.key:  # a nested scope: keep the labels, take the words
            finding = replace(finding, scope=incident.finding.scope)
        if until is not None and self._carried_on(incident):
            until = None  # its stage came back, what moved with it did not: it goes on
        if until is not None:
            self._resolve(incident, until, "came back")
        same = finding.sentence == incident.finding.sentence and until is None
        incident.finding = finding
        incident.share = live_share(finding, frame, incident.onset)
        incident.scope_share = scope_share(finding, frame, incident.onset, self.scope_time)
        severity = "critical" if (incident.share or 0.0) >= CRITICAL_SHARE else "warning"
        pageable = (
            not incident.pages
            and _would_page(late, severity)
            and not noted_kind(finding, frame)
            and until is None
            and not incident.standing
            and not self._judged(incident, finding, frame)
        )
        if not pageable:
            incident.pageable_since = None
        elif self._noted_pages_now(now, incident, finding, frame):
            incident.page_with(finding, now)
            incident.late, incident.severity, incident.load = late, severity, False
            same = False
        if not same:
            incident.examples = examples(finding, frame, incident.onset)
        return incident, not same, True
