"""``hopline watch --collector`` (the window watcher, issue 36) against ``hopline analyze`` on the
demo's six scenarios: the same answer as offline.

The logs: ``hopline demo --seconds 60 --scenario S --seed 7``'s stored events, one recording per
scenario (tests/data/demo-scenarios/README.md says when and how). Offline is
``pipeline.analyze_files`` (``hopline analyze``'s composition) of the whole log. Live, each
request is handed, as the collector's join finishes it (``compute_stages``, ``describe_request``,
``summarize``: what ``Joiner._finish`` gives ``WindowSummaries.add``), at its last event's time, to
one of two in-process ``WindowSummaries`` (the demo's 1 s settle, offline's window), and a
``WindowDetector`` polls them every quarter second of event time (``CollectorFeed._merge`` on
``answer``, as ``GET /v1/windows`` serves it; HTTP is test_watch_collectors.py's), with the demo's
watch settings (``demo/live.py``: window, horizon, hold, settle), then ``drain``.

The recordings ran on a busy machine (load average 9-20): the demo distrusted every one, and
offline's first finding is then not always the injected incident (huge-prompt's is r2's queue,
no-max-tokens' the gateway's share of the load generator's lateness). That is what is compared:
the same events on both sides. ``huge-prompt-2``, a second recording, is the one whose first
finding offline is the scenario's pitfall.

What is asserted, per log:

- at the log's end (the watcher has the requests offline has) the window analysis finds offline's
  first shift, same stage, scope and onset within one window, and before it only other shifts
  offline finds (it orders by users' time alone; offline puts the calling process's own
  lateness after the others); no pitfall, by design (``findings/shifts/windows.py``);
- the first page is offline's first finding that can page: a shift up (a pitfall has no place in
  the windows; a shift down pages nowhere) whose time is not the calling process's own lateness
  (``lateness.explained``: the windows keep each side's loop lateness, capped at each request's
  network time, as the request-level book reads it). Same stage and scope, and the incident's onset
  (``Incident.onset`` at the log's end, what ``GET /v1/findings`` says) within one window. Not
  the alert's ``startsAt``, its onset when it paged, which comes with fewer requests after the
  change: prefill-regression's is 2 s early, huge-prompt's 4 s, where ``hopline analyze`` of the
  requests the watcher had then puts it too (bench/README.md, "live on window summaries", has
  them). Four logs differ, and ``NOT_OFFLINES_FIRST`` says how and why: three page nothing (as the
  request-level watcher), one is a disagreement;
- every page is one of offline's incidents (its lead or a stage that moved with it, its scope,
  onset within a window), and none twice: one incident, one page.

``python tests/analyzer/live/test_windows_vs_offline.py`` prints the table of bench/README.md.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import polars as pl
import pytest
from hopline.analyzer import io
from hopline.analyzer.findings import lateness
from hopline.analyzer.findings.model import MixChange, Shift
from hopline.analyzer.findings.registry import WindowSeries
from hopline.analyzer.live.detector import LiveConfig
from hopline.analyzer.live.incidents import Incident
from hopline.analyzer.live.windowed import LOOKBACK_S, CollectorFeed, WindowDetector, pseudo_frame
from hopline.analyzer.pipeline import analysis, analyze_files
from hopline.collector.config import WINDOW_BY
from hopline.collector.recent import summarize
from hopline.collector.stages import compute_stages
from hopline.collector.windows import WindowSummaries
from hopline.demo.live import HOLD, LATENESS, SETTLE, watch_argv
from hopline.middleware.contract.rules import describe_request
from hopline.middleware.contract.units import parse_duration, to_epoch

DATA = Path(__file__).resolve().parents[2] / "data" / "demo-scenarios"
SECONDS = 60.0  # the recordings' --seconds
COLLECTORS = 2
POLL_S = 0.25  # the watcher's poll, event time
SCENARIOS = (
    "queue-burst", "prefill-regression", "slow-network", "huge-prompt", "cold-connections", "no-max-tokens",
    "huge-prompt-2",  # a second recording, whose first finding offline is the pitfall
)  # fmt: skip


@dataclass
class Page:
    """An incident as it began to page (``Watch.on_step``'s news: ``first_seen == now``)."""

    at: float  # the step's event time
    stage: str
    scope: dict[str, str]
    starts_at: float  # the alert's startsAt (the onset when it paged)
    onset: float  # the incident's onset when it paged (``Incident.onset``, as ``starts_at`` unless it moved)
    words: str
    incident: Incident


@dataclass
class Live:
    window_s: float
    pages: list[Page] = field(default_factory=list)
    onsets: dict[int, float] = field(default_factory=dict)  # id(incident) -> its onset at the log's end
    steps: int = 0
    final: list = field(default_factory=list)  # the window analysis' findings at the log's end

    def onset(self, page: Page) -> float:
        """The incident's onset at the log's end (paged after it: when it paged)."""
        return self.onsets.get(id(page.incident), page.onset)


class InProcess(CollectorFeed):
    """``CollectorFeed`` on in-process collectors: their ``answer`` (``GET /v1/windows``'s body)
    from the newest window taken on, less ``LOOKBACK_S`` (late parts)."""

    def __init__(self, collectors: list[WindowSummaries], clock) -> None:
        super().__init__(urls=[f"collector-{i}" for i in range(len(collectors))])
        self.collectors, self.clock = collectors, clock

    def poll(self) -> int:
        since = None if self.newest_start is None else self.newest_start - LOOKBACK_S
        answers = [c.answer(since=since, now=self.clock()) for c in self.collectors]
        return sum(self._merge(url, a) for url, a in zip(self.urls, answers, strict=True))


def events_of(path: Path) -> list[dict]:
    """The log's events as the collector took them (stored columns, and ``attrs`` spread out)."""
    frame, _ = io.scan_events([path])
    out = []
    for row in frame.sort("ts").collect().iter_rows(named=True):
        attrs = row.pop("attrs", None)
        event = {k: v for k, v in row.items() if v is not None}
        if attrs:
            event |= orjson.loads(attrs)
        out.append(event)
    return out


def finished_requests(events: list[dict]) -> list[tuple]:
    """Each request as the join finishes it, in the order it finishes: (its last event's ts, then
    ``WindowSummaries.add``'s arguments: start, scope, stage values, outcome, ttft, e2e; its ID)."""
    by_id: dict[str, list[dict]] = defaultdict(list)
    for event in events:
        by_id[event["request_id"]].append(event)
    out = []
    for rid, evs in by_id.items():
        values = compute_stages(evs)
        described = describe_request(evs)
        s = summarize(rid, evs, values, described, "complete")
        finish = max(e["ts"] for e in evs)
        out.append((finish, s.started, described["scope"], values, s.outcome, s.ttft_s, s.e2e_s, rid))
    return sorted(out, key=lambda r: r[0])


def demo_config(window_s: float) -> LiveConfig:
    """The demo's watch (``demo.live.watch_argv``) for a run of ``SECONDS``."""
    argv = watch_argv(Path("run"), SECONDS, [])
    option = lambda name: parse_duration(argv[argv.index(name) + 1])  # noqa: E731
    return LiveConfig(
        window_s=window_s, horizon_s=option("--horizon"), recent_s=option("--recent"),
        settle_s=parse_duration(SETTLE), lateness_s=parse_duration(LATENESS), hold_s=parse_duration(HOLD),
    )  # fmt: skip


def watch(requests: list[tuple], window_s: float) -> Live:
    """The window watcher on two collectors fed ``requests`` as they finish (module doc)."""
    config = demo_config(window_s)
    clock = [0.0]
    collectors = [
        WindowSummaries(
            window=window_s, window_keep=3600.0, window_by=WINDOW_BY, window_scope_cap=128,
            window_settle=config.settle_s, clock=lambda: clock[0],
        )  # fmt: skip
        for _ in range(COLLECTORS)
    ]
    detector = WindowDetector(InProcess(collectors, lambda: clock[0]), config)
    live = Live(window_s)

    def on_step(now: float, changed: list[Incident]) -> None:
        for i in changed:
            if i.first_seen == now and i.state == "firing" and i.pages:
                fired = i.fired or i.finding
                page = Page(now, i.key[1], dict(i.scope), i.fired_onset, i.onset, fired.sentence, i)
                live.pages.append(page)

    detector.on_step = on_step
    t = min(r[1] for r in requests) // POLL_S * POLL_S
    end = requests[-1][0] + config.settle_s + 2 * window_s
    k = 0
    while t <= end:
        while k < len(requests) and requests[k][0] <= t:
            collectors[k % COLLECTORS].add(*requests[k][1:7])
            k += 1
        clock[0] = t
        detector.poll()
        t += POLL_S
    # the log's end: the watcher has the requests offline has (drain then steps on without
    # requests, its horizon leaving the log's start behind: the onsets it says then are of less)
    live.onsets = {id(i): i.onset for i in detector.incidents()}
    live.final = list(detector.findings)
    detector.drain()
    live.steps = detector.steps
    return live


@dataclass
class Compared:
    report: dict  # hopline analyze's JSON of the whole log
    callers: list[bool]  # per finding of it: its time is the calling process's own lateness
    live: Live
    frame: pl.DataFrame  # its timelines
    requests: list[tuple]  # as the join finished them (``finished_requests``)
    t0: float  # the log's first request start


@functools.cache
def compared(scenario: str) -> Compared:
    path = DATA / f"{scenario}.parquet"
    offline, frame = analyze_files(io.find_files([path]))
    report = offline.to_json()
    callers = [lateness.explained(f, frame) == "client" for f in offline.findings.findings]
    requests = finished_requests(events_of(path))
    live = watch(requests, report["window_s"])
    return Compared(report, callers, live, frame, requests, min(r[1] for r in requests))


def offline_upto(c: Compared, now: float) -> dict:
    """``hopline analyze`` (its window) of the requests the watcher had at its step ``now``: those
    that started before ``now`` and finished within the collectors' settle after it."""
    settle = demo_config(c.live.window_s).settle_s
    ids = [r[-1] for r in c.requests if r[1] < now and r[0] <= now + settle]
    return analysis(c.frame.filter(pl.col("request_id").is_in(ids)), window=f"{c.live.window_s:g}s").to_json()


def same_place(page: Page, finding: dict, live: Live, stages: tuple[str, ...] | None = None) -> bool:
    """Whether ``page`` is offline's shift ``finding``: its stage (or one of ``stages``), its
    scope, and the incident's onset at the log's end within a window of it."""
    return (
        finding["kind"] == "shift"
        and page.stage in (stages or (finding["stage"],))
        and page.scope == finding["scope"]
        and abs(live.onset(page) - to_epoch(finding["at"])) <= live.window_s
    )


def with_stages(finding: dict) -> tuple[str, ...]:
    """The stages of offline's incident: its lead's and those that moved with it."""
    return (finding.get("stage"), *(w["stage"] for w in finding.get("with", ())))


def can_page(finding: dict) -> bool:
    """What the window watcher can page: a shift up (a stage got slower); no pitfall (the windows
    hold none: findings/shifts/windows.py), no shift down (live/incidents.py)."""
    return finding["kind"] == "shift" and finding["after_ms"] > finding["before_ms"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_at_the_logs_end_the_window_analysis_finds_what_hopline_analyze_finds_first(scenario):
    """On the requests offline has, the windows' findings hold offline's first shift (its stage,
    scope and onset), and before it only other shifts offline finds (the windows order by users'
    time alone; offline puts the calling process's own lateness after the others: rank.py)."""
    c = compared(scenario)
    offline = [f for f in c.report["findings"] if f["kind"] == "shift"]
    assert all(isinstance(f, Shift) for f in c.live.final)  # no pitfall, by design

    def names(w, f) -> bool:
        same = (w.stage, w.scope) == (f["stage"], f["scope"])
        return same and abs(w.at - to_epoch(f["at"])) <= c.live.window_s

    first = next(n for n, w in enumerate(c.live.final) if names(w, offline[0]))
    before = c.live.final[:first]
    said = ([w.sentence for w in before], offline[0]["summary"])
    assert all(any(names(w, f) for f in offline[1:]) for w in before), said


# where the window watcher's first page is not offline's first finding that can page, and why
# (the request-level watcher, ``hopline watch --replay`` with the demo's settings, sends the same
# shift pages as the window watcher on every log but huge-prompt-2: the caller's lateness pages
# on neither)
NOT_OFFLINES_FIRST = {
    # every rise offline finds is the calling process's own lateness: nothing pages
    "slow-network": None,
    "cold-connections": None,
    # while it went on, network led the incident (as ``hopline analyze`` of the requests the watcher
    # had then leads it) and its time was the caller's lateness, the gateway's rise its consequence
    "no-max-tokens": None,
    # a disagreement: engine frontend time on r2, where offline finds it in all traffic at the same
    # onset (the windows narrow a scope from one attribute at a time), with offline's first incident
    # that can page (gateway) its co-mover (the request-level watcher pages gateway {model})
    "huge-prompt-2": ("frontend", {"replica": "r2"}),
}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_first_page_is_what_hopline_analyze_finds_first_that_can_page(scenario):
    c = compared(scenario)
    live, offline = c.live, c.report["findings"]
    said = ([p.words for p in live.pages], [f["summary"] for f in offline])
    pageable = [f for f, caller in zip(offline, c.callers, strict=True) if can_page(f) and not caller]
    if scenario not in NOT_OFFLINES_FIRST:
        assert live.pages and same_place(live.pages[0], pageable[0], live), said
        return
    expected = NOT_OFFLINES_FIRST[scenario]
    if expected is None:
        assert not live.pages, said
        return
    page = live.pages[0]
    assert (page.stage, page.scope) == expected, said
    stage, onset = page.stage, live.onset(page)
    assert any(  # offline finds that stage rising at that onset
        f["kind"] == "shift" and f.get("stage") == stage and abs(to_epoch(f["at"]) - onset) <= 2 * live.window_s
        for f in offline
        if can_page(f)
    ), said
    if pageable:  # offline's first incident that can page moved with it
        want = pageable[0]
        assert any(
            (m.stage, m.scope) == (want["stage"], want["scope"]) and abs(m.at - to_epoch(want["at"])) <= live.window_s
            for m in page.incident.co_movers
        ), said


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_page_is_an_incident_hopline_analyze_finds_and_pages_once(scenario):
    c = compared(scenario)
    live, offline = c.live, c.report["findings"]
    said = ([p.words for p in live.pages], [f["summary"] for f in offline])
    named = []
    for page in live.pages:  # an incident of offline's: its lead, or a stage offline says moved with it
        match = [n for n, f in enumerate(offline) if same_place(page, f, live, with_stages(f))]
        if scenario == "huge-prompt-2" and not match:  # its frontend rise, narrowed to r2 (NOT_OFFLINES_FIRST)
            match = [n for n, f in enumerate(offline) if same_place(page, f | {"scope": page.scope}, live)]
        assert match, said
        named.append(match[0])
    assert len(named) == len(set(named)), said
    assert len({id(p.incident) for p in live.pages}) == len(live.pages), said


def test_a_tenants_long_prompts_routed_to_a_replica_are_a_change_of_the_traffic_in_the_windows_too():
    """The demo run where kite-cli's 4k-token prompts reached r2 only from 9 s in
    (tests/data/demo-scenarios/README.md): r2's prefill rose 7x while its time per computed prompt
    token did not follow. The windows say it as offline does, a change of the traffic, noted, and
    page no prefill (before, "prefill time rose 7.0x on replica r2" paged)."""
    c = compared("cold-connections-moved")
    rises = [w for w in c.live.final if w.stage == "prefill"]
    said = [w.sentence for w in c.live.final]
    assert rises and all(isinstance(w, MixChange) for w in rises), said
    assert "not a slower engine" in rises[0].sentence and rises[0].per_unit["statistic"] == "mean", said
    assert not [p.words for p in c.live.pages if p.stage == "prefill"]
    offline = [f for f in c.report["findings"] if f.get("stage") == "prefill"]
    assert [(f["kind"], f["scope"].get("replica")) for f in offline] == [("mix_change", "r2")]


def test_with_no_request_in_the_recent_windows_the_books_frame_has_its_columns():
    """A drain steps on past the last window: the book's frame of pseudo-requests is then empty,
    and must still have the columns the book sorts and filters by (it crashed on ``start``)."""
    series = WindowSeries(width_s=1.0, relative_accuracy=0.01, by=WINDOW_BY)
    frame = pseudo_frame(series, [], LiveConfig(window_s=1.0), ("queue",))
    assert frame.height == 0
    assert {"start", "request_id", "queue", "client_ttft", "client_e2e", *WINDOW_BY} <= set(frame.columns)


def table() -> None:
    """bench/README.md's table: per scenario, offline's first finding and the watcher's first page."""
    from hopline.analyzer.findings.model import iso_utc

    print("| log | offline first finding | first that can page | window watcher's first page | pages |")
    print("|---|---|---|---|---|")
    for scenario in SCENARIOS:
        c = compared(scenario)
        live, offline = c.live, c.report["findings"]
        first = offline[0]
        at = (first.get("at") or "")[11:19] or "no onset"
        said = f"{first['kind']} {first.get('stage') or first.get('name')} {first['scope']} {at}"
        want = next(f for f in offline if can_page(f))
        paged = "none"
        if live.pages:
            p = live.pages[0]
            paged = (
                f"{p.stage} {p.scope}, onset {iso_utc(live.onset(p))[11:19]} "
                f"(startsAt {iso_utc(p.starts_at)[11:19]}), "
                f"paged {p.at - live.onset(p):.0f} s after the onset"
            )
        print(
            f"| {scenario} | {said} | {want['stage']} {want['scope']} {want['at'][11:19]} | {paged} | "
            f"{len(live.pages)}: " + "; ".join(f"{p.stage} {p.scope}" for p in live.pages) + " |"
        )


if __name__ == "__main__":
    table()
