"""What pages and what does not: one incident, one page, and the right one.

Recorded real runs (``tests/data/repro/``: a real vLLM on a loaded 2-core host, two chat users
asking 48 tokens, then a batch job of 12 streams asking 160; see its README) are replayed through
the live detector with the settings they ran live with: exactly one page, the queue on the
flood's replica, no earlier than the flood and within 60 s of it. The rules behind it are then
stated one by one on generated logs: co-movers join the incident they began with, a standing
condition is a warning with the label ``standing``, the caller's own lateness is noted and never
paged, and leads nothing.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest
from hopline.analyzer.findings import lateness
from hopline.analyzer.findings.model import Consequence, MixChange, Pitfall, Shift, pitfall
from hopline.analyzer.io import scan_events
from hopline.analyzer.live.alertmanager import payload
from hopline.analyzer.live.detect import findings_now
from hopline.analyzer.live.detector import LiveConfig, LiveDetector
from hopline.analyzer.live.feed import replay
from hopline.analyzer.findings.rank import users_time
from hopline.analyzer.live import incidents
from hopline.analyzer.live.incidents import IncidentBook, since
from hopline.analyzer.live.watch import Watch
from hopline.analyzer.timelines import timelines
from hopline.middleware.contract.units import to_epoch
from support.cli import hopline
from support.synth import DEFAULT_START, StageShift, generate

REPRO = Path(__file__).parents[2] / "data" / "repro"
# the settings each recording's watch ran with: hopline watch's defaults, then test_vllm_flood_live's
RUNS = {
    "vllm-flood-live-2026-12-04": LiveConfig(),
    "vllm-flood-ci-1": LiveConfig(window_s=2.0, settle_s=2.0, lateness_s=2.0, hold_s=5.0),
    "vllm-flood-ci-3": LiveConfig(window_s=2.0, settle_s=2.0, lateness_s=2.0, hold_s=5.0),
    "vllm-flood-ci-5": LiveConfig(window_s=2.0, settle_s=2.0, lateness_s=2.0, hold_s=5.0),
}


def flood_start(name: str) -> float:
    """When the batch job began: its ``run.json``, else its first request asking 160 tokens."""
    run = REPRO / name / "run.json"
    if run.exists():
        return float(json.loads(run.read_text())["flood_start"])
    events = scan_events([REPRO / name])[0].collect()
    asked = events.filter((pl.col("hop") == "client.sent") & (pl.col("max_tokens") == 160))
    return float(asked["ts"].min())


def replayed(name: str, config: LiveConfig | None = None) -> tuple[list[tuple[float, dict]], LiveDetector]:
    """Every alert the watch would send (its event time, the alert), replaying ``name``."""
    detector = LiveDetector(config or RUNS[name])
    sent: list[tuple[float, dict]] = []
    watch = Watch(detector)
    step = watch.on_step

    def on_step(now: float, changed: list) -> None:
        sent.extend((now, payload(i)) for i in changed if i.pages)
        step(now, changed)

    detector.on_step = on_step
    for batch in replay([REPRO / name], detector.config.every_s):
        detector.feed(batch)
    detector.flush()
    return sent, detector


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_real_flood_on_a_loaded_host_pages_once_for_the_queue_on_its_replica(name):
    sent, detector = replayed(name)
    start, window = flood_start(name), detector.config.window_s
    firing = [(now, a) for now, a in sent if "endsAt" not in a]
    shown = [(now - start, a["labels"], a["annotations"]["summary"][:120]) for now, a in firing]
    assert len({tuple(sorted(a["labels"].items())) for _, a in firing}) == 1, shown
    now, alert = firing[0]
    labels = alert["labels"]
    assert (labels["alertname"], labels["stage"], labels["replica"], labels["side"]) == (
        "HoplineShift", "queue", "r1", "engine",
    ), shown  # fmt: skip
    assert labels["severity"] == "critical" and "standing" not in labels
    onset = next(i for i in detector.book.incidents if i.pages).fired_onset
    # sent after the flood began, within a minute; its onset at a window boundary next to it
    # (the boundary before it when the flood began late in a window)
    assert start <= now <= start + 60 and start - 2 * window <= onset, (onset - start, now - start)
    # what was noted and not paged: the caller's own lateness (the recorded live run's 155 ms
    # "network" on loopback was its load generator reading the first token late)
    noted = [i for i in detector.book.incidents if not i.pages]
    assert all(i.late == "client" for i in noted)


CI_WATCH = LiveConfig(window_s=2.0, settle_s=2.0, lateness_s=2.0, hold_s=5.0)  # test_vllm_flood_live's


def one_queue_page(name: str) -> tuple[LiveDetector, "incidents.Incident"]:
    """``name`` replayed with test_vllm_flood_live's watch: one firing label set, the queue on r1,
    at the webhook within a minute of the flood; the detector and the incident that paged."""
    sent, detector = replayed(name, CI_WATCH)
    start = flood_start(name)
    firing = [(now, a) for now, a in sent if "endsAt" not in a]
    shown = [(now - start, a["labels"], a["annotations"]["summary"][:120]) for now, a in firing]
    assert len({tuple(sorted(a["labels"].items())) for _, a in firing}) == 1, shown
    now, alert = firing[0]
    assert (alert["labels"]["stage"], alert["labels"]["replica"]) == ("queue", "r1") and start <= now <= start + 60, shown
    (paged,) = [i for i in detector.book.incidents if i.pages]
    return detector, paged


def test_a_co_mover_seen_for_one_step_does_not_lead_a_noted_incident():
    """ci-6: the batch's longer answers open a noted traffic-mix incident; the API server's
    frontend, found for one step, joined it and paged (a warning) ahead of the queue, still on
    hold. A co-mover leads a noted incident only once it held as long as one that opens: the
    queue pages, critical, once, within a minute of the flood. (Its onset is placed 9.6 s before
    the flood here, inside test_vllm_flood_live's 10 s slack: the chat requests sent just before
    it queued behind the batch.)"""
    _, paged = one_queue_page("vllm-flood-ci-6")
    assert paged.severity == "critical"
    # the queue took the lead of the incident the traffic's change opened: that change its co-mover
    assert any(isinstance(f, MixChange) and f.stage == "decode" for f in paged.co_movers), paged.co_movers


def test_the_api_servers_lateness_seen_first_does_not_lead_the_floods_page():
    """``vllm-flood-ci-4``: the API server's lateness (network 3.8 -> 34 ms) settles one step
    before the queue (0 -> 1.4 s); it once paged first with the queue in its sentence, and the
    batch's queue doubling 26 s into the flood paged again. The flood is one page, the queue on
    r1. (After the flood the chat's decode doubled as other test suites took the host's CPU: a
    real slowdown, with an onset after the flood's end, that pages on its own.)"""
    name = "vllm-flood-ci-4"
    sent, detector = replayed(name, RUNS["vllm-flood-ci-1"])
    run = json.loads((REPRO / name / "run.json").read_text())
    start, end = run["flood_start"], run["flood_end"]
    during = [(now, a) for now, a in sent if "endsAt" not in a and to_epoch(a["startsAt"]) < end]
    shown = [(now - start, a["labels"], a["annotations"]["summary"][:120]) for now, a in during]
    assert len({tuple(sorted(a["labels"].items())) for _, a in during}) == 1, shown
    labels = during[0][1]["labels"]
    assert (labels["stage"], labels["replica"]) == ("queue", "r1") and start <= during[0][0] <= start + 60, shown
    (flood,) = [i for i in detector.book.incidents if i.pages and i.fired_onset < end]
    assert {f.stage for f in flood.co_movers if isinstance(f, Shift)} >= {"queue"}  # the batch's own queue


def test_a_flood_on_a_host_busy_from_before_it_pages_once_for_the_queue():
    """``vllm-flood-ci-7``: two more busy loops, not niced, from 15 s before the flood for 60 s.
    The batch's longer answers open a noted traffic-mix incident and the chat's network a noted
    one (the caller's lateness); the API server's frontend then rises on the batch and on all
    traffic. Live, the frontend led the noted mix change into a second page and then a third;
    a co-mover of the paging queue is that incident's, whichever noted one it also moved with."""
    detector, paged = one_queue_page("vllm-flood-ci-7")
    assert {f.stage for f in paged.co_movers if isinstance(f, Shift)} >= {"frontend"}
    noted = [i for i in detector.book.incidents if not i.pages]
    assert noted and all(i.late == "client" or i.mix for i in noted), [(i.key, i.late) for i in noted]


def test_a_flood_whose_queue_falls_part_of_the_way_back_stays_one_page():
    """``vllm-flood-ci-9``: the chat's decode rose 1.7× (p90) 29 s before the flood as its client's
    reads became on time (taken back: noted); the flood's queue rose 0 -> 1.4 s and, 11 s on, fell
    to 0.6 s with the flood still on. That fall resolved the queue the step it opened, and the
    chat's decode, now "4.9× at" its early onset, paged on its own (live, and first at the
    webhook). A fall part of the way back is no end: one page, the queue, the decode its co-mover."""
    detector, paged = one_queue_page("vllm-flood-ci-9")
    assert paged.fired_onset >= flood_start("vllm-flood-ci-9") - 10.0
    assert any(getattr(f, "stage", None) == "decode" for f in paged.co_movers), paged.co_movers


def test_a_host_trading_cpu_between_client_and_engine_before_a_flood_pages_nothing_before_it():
    """``vllm-flood-ci-8``: 30 s before the flood the chat's decode rose 91 -> 137 ms as its
    client, on the same host, went from reading its streams 92 ms late to reading them on time
    (network 92 -> 0.7 ms): live it paged a warning before the flood. Then the flood's decode
    (the batch's 160-token answers) made that finding "decode quadrupled at" the early onset,
    which paged apart from the queue (the CI run at stop 47: onset 28 s before the flood). The
    rise is noted as taken back; the flood's decode is the queue's co-mover; once the queue is
    over, the same early rise said in other words (a p90 on the chat) is no news: one page."""
    detector, paged = one_queue_page("vllm-flood-ci-8")
    assert paged.fired_onset >= flood_start("vllm-flood-ci-8") - 10.0  # test_vllm_flood_live's slack: chat requests queued just before
    noted = [i for i in detector.book.incidents if not i.pages and not i.standing]
    assert [(i.key[1], incidents.taken_back(i.fired)) for i in noted] == [("decode", True)], [i.words for i in noted]
    assert any(getattr(f, "stage", None) == "decode" for f in paged.co_movers), paged.co_movers


def test_analyze_json_of_the_recorded_flood_parses_and_puts_the_queue_first(tmp_path):
    run = hopline("analyze", str(REPRO / "vllm-flood-live-2026-12-04"), "--json", timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout)
    first = result["findings"][0]
    assert (first["kind"], first["stage"]) == ("shift", "queue"), [f["summary"] for f in result["findings"]]
    # the batch asked for longer answers: a mix change, never "check its chat template"
    assert not [f for f in result["findings"] + result.get("minor", []) if f.get("name") == "verbose_outputs"]


# --- the rules, on generated logs -----------------------------------------------------------------

ONSET = DEFAULT_START + 150


@pytest.fixture(scope="module")
def queue_rise():
    events = generate(
        duration_s=300, rate=20, seed=11, incidents=[StageShift("queue", 3.0, at_s=150, scope={"replica": "r2"})]
    )
    frame = timelines(events.lazy()).collect()
    (found,) = [f for f in findings_now(frame, 10.0, ("replica", "model", "service")) if getattr(f, "stage", "") == "queue"]
    assert (found.scope, found.at) == ({"replica": "r2"}, ONSET)
    return frame, found


def book(**kw) -> IncidentBook:
    return IncidentBook(**{"window_s": 10.0, "horizon_s": 600.0, "recent_s": 60.0} | kw)


def test_a_stage_that_moved_with_a_firing_incident_is_its_co_mover_not_a_second_page(queue_rise):
    frame, queue = queue_rise
    b = book()
    (opened,) = b.step(ONSET + 20, [queue], frame)
    frontend = replace(queue, stage="frontend", summary="engine frontend time rose 3.6×", at=ONSET + 10, impact_s=1.0)
    assert b.step(ONSET + 30, [queue, frontend], frame) == []  # nothing new to send
    assert len(b.incidents) == 1 and [f.stage for f in opened.co_movers] == ["frontend"]
    assert "engine frontend time rose 3.6×" in payload(opened)["annotations"]["co_movers"]
    # while the frontend is still up, the queue coming back does not end the incident
    assert b.firing() == [opened]


def test_a_later_larger_change_in_the_same_place_is_news_of_its_own(queue_rise):
    frame, queue = queue_rise
    b = book(recent_s=120.0)
    b.step(ONSET + 20, [queue], frame)
    prefill = replace(queue, stage="prefill", summary="prefill time rose 5×", at=ONSET + 60, impact_s=queue.impact_s * 10)
    (news,) = b.step(ONSET + 80, [queue, prefill], frame)
    assert news.finding.stage == "prefill" and len(b.firing()) == 2


def test_a_larger_change_still_on_hold_leads_what_began_with_it(queue_rise):
    """A flood's API-server lateness settles a step before its queue: with its hold over, it waits
    for the queue (same place, same moment, costing users more) and becomes its co-mover."""
    frame, queue = queue_rise
    network = replace(queue, stage="network", summary="network time rose 8×", at=ONSET - 10, impact_s=queue.impact_s / 10)
    b = book(hold_s=10.0)
    assert b.step(ONSET + 10, [network], frame) == []  # on hold
    assert b.step(ONSET + 20, [network, queue], frame) == []  # its hold is over, the queue's is not
    (opened,) = b.step(ONSET + 30, [network, queue], frame)
    assert opened.finding.stage == "queue" and opened.pages
    assert [f.stage for f in opened.co_movers] == ["network"] and len(b.incidents) == 1
    # without a larger one on hold, the network pages as soon as its hold is over
    alone = book(hold_s=10.0)
    alone.step(ONSET + 10, [network], frame)
    (paged,) = alone.step(ONSET + 20, [network], frame)
    assert paged.finding.stage == "network" and paged.pages
    # nor does a larger one from another moment hold it back
    later = replace(queue, at=ONSET + 60)
    apart = book(hold_s=10.0, recent_s=120.0)
    apart.step(ONSET + 10, [network], frame)
    assert [i.finding.stage for i in apart.step(ONSET + 70, [network, later], frame)] == ["network"]


def test_the_same_stage_rising_further_inside_its_incident_is_no_second_page(queue_rise):
    """A flood's queue on the replica, then the batch's own queue doubling 30 s on: the incident
    got worse, one page; still so once the incident resolved, for a rise that began inside it."""
    frame, queue = queue_rise
    b = book(recent_s=120.0)
    (opened,) = b.step(ONSET + 20, [queue], frame)
    # beyond merge_s (45 s here) of its onset: not the analysis placing the same change better
    worse = replace(queue, scope={"replica": "r2", "service": "batch"}, at=ONSET + 60, impact_s=queue.impact_s * 3)
    assert b.step(ONSET + 80, [queue, worse], frame) == []
    assert len(b.incidents) == 1 and [f.scope for f in opened.co_movers] == [worse.scope]
    over = book(recent_s=120.0)
    (first,) = over.step(ONSET + 20, [queue], frame)
    over._resolve(first, ONSET + 70, "came back")
    assert over.step(ONSET + 90, [worse], frame) == [] and len(over.incidents) == 1
    # a rise of the same stage in a scope wider than the incident's is news (more than it paged for)
    wider = replace(queue, scope={}, at=ONSET + 60, impact_s=queue.impact_s * 3)
    again = book(recent_s=120.0)
    again.step(ONSET + 20, [queue], frame)
    assert [i.finding.scope for i in again.step(ONSET + 80, [queue, wider], frame)] == [{}]


def test_the_callers_own_lateness_leads_nothing_and_pages_nothing(queue_rise):
    frame, queue = queue_rise
    delay = replace(queue, stage="client_delay", summary="client-side delay rose", impact_s=queue.impact_s * 5)
    assert lateness.explained(delay, frame) == "client"
    b = book()
    (opened,) = b.step(ONSET + 20, [delay, queue], frame)  # the larger first, as ranked by cost
    assert opened.finding.stage == "queue" and opened.pages and opened.side == "engine"
    alone = book()
    (noted,) = alone.step(ONSET + 20, [delay], frame)
    assert not noted.pages and noted.late == "client" and noted.severity == "warning"
    assert "caller took it in late" not in noted.words  # client_delay is no remainder: its words say it
    printed: list[str] = []
    detector = LiveDetector(LiveConfig(window_s=10.0))
    Watch(detector, out=printed.append).on_step(ONSET + 20, [noted])
    assert printed and "NOTED (not paged: the client side's own lateness)" in printed[0]


def _gap(scope: dict) -> Pitfall:
    return pitfall(
        "new_connection_per_request", scope, 100, {"share_new": 1.0}, "service s opens a new connection", 200.0, "connect"
    )


def test_a_condition_with_no_onset_is_standing_and_never_pages(queue_rise):
    frame, _ = queue_rise
    origin = float(frame["start"].min())
    printed: list[str] = []
    detector = LiveDetector(LiveConfig(window_s=10.0))
    b = book(hold_s=20.0)
    for now in (origin + 250, origin + 270):  # found mid-run or from the start: a condition, not a change
        for noted in b.step(now, [_gap({})], frame):
            Watch(detector, out=printed.append).on_step(now, [noted])
    (standing,) = b.incidents
    assert standing.standing and not standing.pages and standing.severity == "warning"
    assert standing.to_json()["standing"] is True and standing.side == "client"
    assert printed == [printed[0]] and "NOTED (not paged: standing" in printed[0]  # said once
    # nor does it hold other findings as its co-movers: a queue rise still pages
    _, queue = queue_rise
    fresh = book()
    fresh.step(ONSET + 10, [_gap({})], frame)
    (opened,) = fresh.step(ONSET + 20, [_gap({}), queue], frame)
    assert opened.finding.stage == "queue" and opened.pages and not opened.co_movers


def test_network_time_that_is_the_readers_loop_lateness_is_the_clients():
    n = 200
    start = pl.Series([DEFAULT_START + i for i in range(n)], dtype=pl.Float64)
    late = pl.Series([0.01 if i < 100 else 0.4 for i in range(n)])
    frame = pl.DataFrame({"start": start, "network": 0.005 + late * 0.9, "client_read_lag_s": late})
    rise = Shift(
        summary="network time rose", stage="network", scope={}, at=DEFAULT_START + 100, statistic="p50",
        before_ms=14.0, after_ms=365.0, factor=26.0, z=10.0, affected_requests=100, impact_s=35.0,
    )  # fmt: skip
    assert lateness.explained(rise, frame) == "client"
    # a slower wire: the same rise with the reader on time is the network's
    on_time = frame.with_columns(client_read_lag_s=pl.lit(0.01))
    assert lateness.explained(rise, on_time) is None
    # a reader that was late all along explains a standing gap, not a change of it
    steady = frame.with_columns(client_read_lag_s=pl.lit(0.4), network=pl.lit(0.3) + (late > 0.1) * 0.3)
    assert lateness.explained(rise, steady) is None


def test_network_time_that_is_the_engines_late_loop_pages_as_the_engines(queue_rise):
    frame, queue = queue_rise
    late = (pl.col("start") >= ONSET).cast(pl.Float64) * 0.3 + 0.002
    slow = frame.with_columns(network=pl.col("network") + late, engine_loop_lag_s=late)
    rise = replace(queue, stage="network", summary="network time rose", before_ms=5.0, after_ms=305.0)
    assert lateness.explained(rise, slow) == "engine"
    (opened,) = book().step(ONSET + 20, [rise], slow)
    assert opened.pages and opened.side == "engine" and payload(opened)["labels"]["side"] == "engine"
    # and it is said as the engine's server taking the requests late, not as the wire
    summary = payload(opened)["annotations"]["summary"]
    assert summary.startswith("network time rose") and "engine's API server took the requests in late" in summary


def test_a_server_late_for_a_moment_is_noted_a_saturated_one_pages(queue_rise):
    frame, queue = queue_rise
    late = (pl.col("start") >= ONSET).cast(pl.Float64) * 0.3 + 0.002
    slow = frame.with_columns(network=pl.col("network") + late, gateway_loop_lag_s=late)
    rise = replace(queue, stage="network", summary="network time rose", before_ms=5.0, after_ms=305.0)
    (opened,) = book().step(ONSET + 20, [rise], slow)
    assert opened.late == "gateway" and opened.severity == "critical" and opened.pages
    waited = users_time(since(slow, ONSET))["first_output"]
    small = replace(rise, impact_s=0.03 * waited)  # a warning's worth of users' time (1-5%)
    (noted,) = book().step(ONSET + 20, [small], slow)
    assert noted.late == "gateway" and noted.severity == "warning" and not noted.pages


def test_a_shift_no_user_can_feel_is_noted_not_paged(queue_rise):
    frame, queue = queue_rise
    jitter = replace(queue, stage="network", summary="network time rose 7.7×", before_ms=2.1, after_ms=16.0)
    (noted,) = book().step(ONSET + 20, [jitter], frame)
    assert noted.unfelt and not noted.pages  # 14 ms a request: a host's jitter, whatever its share
    (opened,) = book().step(ONSET + 20, [queue], frame)
    assert not opened.unfelt and opened.pages  # 40 -> 120 ms


def test_a_pitfall_is_owned_by_who_can_fix_it():
    from hopline.analyzer.live.incidents import owner

    assert owner(_gap({})) == "client"  # new connections: the client's to fix
    capless = pitfall("no_max_tokens", {"service": "s"}, 10, {}, "10 requests sent without max_tokens", 9.0, "decode")
    assert owner(capless) == "client"  # spent in the engine's decode, fixed in the client
    stall = pitfall("long_prefill_stall", {"replica": "r1"}, 10, {}, "long prompts stalled", 9.0, "decode")
    assert owner(stall) == "engine"


def test_the_same_change_on_two_replicas_at_once_is_one_page(queue_rise):
    frame, queue = queue_rise
    b = book()
    (opened,) = b.step(ONSET + 20, [queue], frame)
    other = replace(queue, scope={"replica": "r1"}, at=ONSET + 10)
    assert b.step(ONSET + 30, [queue, other], frame) == []
    assert len(b.incidents) == 1 and [f.scope for f in opened.co_movers] == [{"replica": "r1"}]


def test_the_live_horizon_keeps_what_like_with_like_needs():
    """A batch asking 160 tokens beside a chat asking 48 is a mix, live as offline: the horizon
    keeps ``max_tokens`` (it once dropped it, and the live path paged "check its chat template")."""
    sent, _ = replayed("vllm-flood-json-2026-12-04", LiveConfig())
    pages = {tuple(sorted(a["labels"].items())) for _, a in sent if "endsAt" not in a}
    assert [dict(p).get("stage") for p in pages] == ["queue"], pages


def test_a_decode_the_hosts_other_work_slowed_is_the_hosts_and_noted_not_paged(queue_rise):
    """A CPU engine's decode slows when other work takes its host's CPUs: the engine's processes
    wait for a CPU (``engine_cpu_wait``, on ``engine.last_token``) a larger share of the time they
    run. A rise that the wait accounts for is the host's: said so, noted, never paged; the same
    rise with the engine given the CPU it asked for is the engine's, and pages."""
    frame, queue = queue_rise
    after = (pl.col("start") >= ONSET).cast(pl.Float64)
    # 20% of its runnable time waiting before, 50% after: the same work takes 0.8 / 0.5 = 1.6x
    busy = frame.with_columns(decode=pl.col("decode") * (1 + 0.6 * after), engine_cpu_wait=0.2 + 0.3 * after)
    added = float(busy.filter(pl.col("start") >= ONSET)["decode"].sum()) * 0.6 / 1.6  # what it cost users
    rise = replace(
        queue, stage="decode", summary="decode time rose 1.6×", before_ms=300.0, after_ms=480.0, impact_s=added
    )
    assert lateness.explained(rise, busy) == "host"
    (noted,) = book().step(ONSET + 20, [rise], busy)
    assert not noted.pages and noted.side == "host" and noted.severity == "warning"
    assert "engine's host being busy" in noted.words and "not a slower engine" in noted.words
    printed: list[str] = []
    Watch(LiveDetector(LiveConfig(window_s=10.0)), out=printed.append).on_step(ONSET + 20, [noted])
    assert printed and "NOTED (not paged: the engine's host was busy" in printed[0]
    # a host busy the same all along (the wait did not rise): the engine's own slowdown, paged
    steady = busy.with_columns(engine_cpu_wait=pl.lit(0.5))
    assert lateness.explained(rise, steady) is None
    (paged,) = book().step(ONSET + 20, [rise], steady)
    assert paged.pages and paged.side == "engine" and "host" not in paged.words
    # a wait that rose a little explains a little: a tripled decode is still the engine's
    tripled = busy.with_columns(decode=pl.col("decode") * (1 + 2.0 * after), engine_cpu_wait=0.2 + 0.05 * after)
    assert lateness.explained(replace(rise, after_ms=900.0), tripled) is None
    # the queue is never the host's: a flood's queue pages whatever the host's CPUs do
    queued = busy.with_columns(queue=pl.col("queue") * (1 + 2.0 * after))
    assert lateness.explained(queue, queued) is None


def test_a_noted_shift_pages_once_it_could_for_the_hold_and_waits_for_a_larger_one_on_hold(queue_rise):
    """A host's hiccup noted just before a flood (network 2.1 -> 16 ms, unfelt), whose network
    time then grows with the flood's: it pages only once it could page at every step for the hold,
    and not while the flood's queue, costing users more in the same place, is still on hold: the
    queue leads (a CI run paged "network time rose from 0.6 to 82 ms", the queue its co-mover)."""
    frame, queue = queue_rise
    jitter = replace(queue, stage="network", summary="network time rose 7.7×", at=ONSET - 15,
                     before_ms=2.1, after_ms=16.0, impact_s=queue.impact_s / 10)  # fmt: skip
    grown = replace(jitter, summary="network time rose 39×", after_ms=82.0)

    def noted_book() -> IncidentBook:
        b = book(hold_s=10.0)
        assert b.step(ONSET - 10, [jitter], frame) == []  # on hold
        (noted,) = b.step(ONSET, [jitter], frame)
        assert noted.unfelt and not noted.pages
        return b

    def paging(b: IncidentBook, now: float, findings: list) -> list:
        return [i for i in b.step(now, findings, frame) if i.pages]

    b = noted_book()
    assert paging(b, ONSET + 5, [grown]) == []  # felt for one step: not yet
    b.step(ONSET + 10, [jitter], frame)  # unfelt again: the run starts over
    assert paging(b, ONSET + 15, [grown]) == [] and paging(b, ONSET + 20, [grown]) == []
    (paged,) = paging(b, ONSET + 25, [grown])
    assert paged.pages and paged.finding.stage == "network" and paged.fired is grown
    # the flood's queue, found after the network could page, is on hold: it leads once its hold is over
    flood = noted_book()
    assert paging(flood, ONSET + 5, [grown]) == []
    assert paging(flood, ONSET + 12, [grown, queue]) == []
    assert paging(flood, ONSET + 16, [grown, queue]) == []  # the network's hold is over, the queue's is not
    (led,) = paging(flood, ONSET + 22, [grown, queue])
    assert led.pages and led.finding.stage == "queue" and len(flood.incidents) == 1
    assert [f.stage for f in led.co_movers] == ["network"]


def _late_reader(queue_rise) -> tuple[pl.DataFrame, Shift]:
    """Network time that rose from the onset with the reading client's loop lateness."""
    frame, queue = queue_rise
    late = (pl.col("start") >= ONSET).cast(pl.Float64) * 0.3 + 0.01
    slow = frame.with_columns(network=pl.col("network") + late, client_read_lag_s=late + 0.05)
    return slow, replace(queue, stage="network", summary="network time rose", before_ms=5.0, after_ms=305.0)


def test_sides_late_together_by_all_of_a_rise_leave_it_the_callers(queue_rise):
    """One busy host (or loop) under the caller and the gateway: each side's lateness accounts for
    all of the network time's rise, the gateway's by a hair more (its capped lateness was a little
    lower before). A side accounts for all of it at most, so the caller's, first, keeps it: noted,
    not paged as the gateway's server (the window watcher paged such a rise in the demo)."""
    frame, rise = _late_reader(queue_rise)
    both = frame.with_columns(gateway_loop_lag_s=(pl.col("start") >= ONSET).cast(pl.Float64))  # 0 s, then 1 s
    assert lateness.explained(rise, both) == "client"
    (noted,) = book().step(ONSET + 20, [rise], both)
    assert noted.late == "client" and not noted.pages
    # a gateway late while the caller is not still is the gateway's
    alone = both.with_columns(client_read_lag_s=pl.lit(0.01))
    assert lateness.explained(rise, alone) == "gateway"


def test_the_callers_lateness_stays_noted_once_the_recent_requests_no_longer_reach_before_its_onset(queue_rise):
    """The book's frame holds the recent requests; as the onset ages, the requests before it leave
    the frame and ``explained`` can no longer weigh the rise (None for want of them): the incident
    keeps its lateness, and does not page at the end of a replay for having forgotten why."""
    frame, rise = _late_reader(queue_rise)
    b = book(hold_s=10.0)
    b.step(ONSET + 10, [rise], frame)
    (noted,) = b.step(ONSET + 20, [rise], frame)
    assert noted.late == "client" and not noted.pages
    after = frame.filter(pl.col("start") >= rise.at)
    assert lateness.explained(rise, after) is None and not lateness.told(rise, after)
    for now in range(30, 90, 10):
        b.step(ONSET + now, [rise], after)
    assert not noted.pages and noted.late == "client" and b.paging() == []


def test_a_callers_lateness_that_ended_while_its_co_mover_goes_on_stays_noted(queue_rise):
    """The caller's late network time ended (the finding has an ``until``) while a co-mover of
    its incident, a small frontend rise no user feels, goes on: the incident goes on with it
    (``_carried_on``) and keeps its lateness. The book weighed lateness only for ongoing
    findings, so the ended one came with none, and the noted incident paged (the window watcher's
    cold-connections page, which the request-level one did not send)."""
    frame, rise = _late_reader(queue_rise)
    frame = frame.with_columns(frontend=pl.col("frontend") + (pl.col("start") >= ONSET).cast(pl.Float64) * 0.008)
    ended = replace(rise, until=ONSET + 100)
    small = replace(rise, stage="frontend", summary="engine frontend time rose", before_ms=4.0, after_ms=12.0,
                    impact_s=rise.impact_s / 10)  # fmt: skip
    assert lateness.explained(ended, frame) == "client" and incidents._unfelt(small)
    b = book(hold_s=10.0)
    b.step(ONSET + 10, [rise], frame)
    (noted,) = b.step(ONSET + 20, [rise], frame)
    b.step(ONSET + 25, [rise, small], frame)
    assert noted.late == "client" and not noted.pages and [f.stage for f in noted.co_movers] == ["frontend"]
    for now in range(30, 90, 10):
        b.step(ONSET + now, [ended, small], frame)
    assert noted.state == "firing" and not noted.pages and b.paging() == []


def test_a_flood_seen_first_by_its_decode_pages_once_for_the_queue():
    """``vllm-flood-ci-10`` (a local CI run): the chat's decode had bursts of 2-3× in the 12 s
    before the flood, which the engine's CPU wait does not explain; the analysis placed the
    decode's onset at the first burst, 10.2 s before the flood, with the flood's level after it,
    and found it 8 s before the queue (the flood's queued requests finish later): it paged
    "decode time tripled … concurrency 0.9 → 4.6" first, the queue its co-mover. The requests in
    flight rose 5× against the decode's mean 2.5× (``loaded``): noted, and the queue leads it."""
    detector, paged = one_queue_page("vllm-flood-ci-10")
    assert paged.severity == "critical"
    assert any(getattr(f, "stage", None) == "decode" for f in paged.co_movers), paged.co_movers


def test_a_host_hiccup_and_its_return_before_a_flood_are_no_onset_of_its_frontend():
    """``vllm-flood-ci-12`` (a local CI run): a host hiccup from 20 s to 8 s before the flood took
    the API server's frontend 13 -> 110 ms, then back to 11 ms; the flood raised it to 40 ms. With
    fewer than ``min_side`` requests in the hiccup and in its return, the frontend was found 4 s
    into the flood as one step from the hiccup's start and paged so, 21.9 s early, ahead of the
    queue. Past the return, the frontend's rise is the flood's: one page, the queue, with its onset
    at the flood, the frontend moving with it."""
    detector, paged = one_queue_page("vllm-flood-ci-12")
    assert paged.fired_onset >= flood_start("vllm-flood-ci-12") - 10.0  # test_vllm_flood_live's slack
    assert "engine frontend" in paged.finding.sentence, paged.finding.sentence
    assert all(not i.pages for i in detector.book.incidents if i is not paged)


def test_a_shared_stage_the_requests_in_flight_outgrew_is_the_loads(queue_rise):
    """A decode (or prefill) rise whose requests in flight (the analysis' ``concurrency``) rose
    more than the stage's own mean did is the load's doing: noted, not paged (a stage that slows
    by itself raises the requests in flight less than itself). A rise the requests in flight did
    not outgrow pages; a queue never counts as the load's (it is how the load shows)."""
    frame, queue = queue_rise
    frame = _short_answers(frame)
    start, r2 = pl.col("start"), pl.col("replica") == "r2"
    frame = frame.with_columns(decode=pl.col("decode") * pl.when(r2 & (start >= ONSET)).then(3.0).otherwise(1.0))
    mean = lambda side: float(frame.filter(r2 & side)["decode"].mean())  # noqa: E731
    risen = mean(start >= ONSET) / mean(start < ONSET)
    before = float(frame.filter(r2 & (start < ONSET))["decode"].median()) * 1e3

    def decode(in_flight: float, stage: str = "decode") -> Shift:
        context = {**queue.context, "covariates": {"concurrency": in_flight - 1.0}}
        return replace(queue, stage=stage, summary=f"{stage} time tripled", before_ms=before, after_ms=3 * before,
                       impact_s=queue.impact_s / 2, context=context)  # fmt: skip

    flood = decode(in_flight=risen * incidents.LOADED * 1.5)  # 12 streams joined: in flight 5x, each 3x slower
    assert incidents.loaded(flood, frame)
    (noted,) = book().step(ONSET + 20, [flood], frame)
    assert noted.load and not noted.pages
    slower = decode(in_flight=risen)  # the same arrivals: in flight by the end-to-end time, less than the decode
    assert not incidents.loaded(slower, frame)
    (paged,) = book().step(ONSET + 20, [slower], frame)
    assert paged.pages and not paged.load
    assert not incidents.loaded(decode(in_flight=risen * 3, stage="queue"), frame)


def test_a_rise_its_co_movers_took_back_is_noted_not_paged(queue_rise):
    """A CPU engine's decode 91 -> 137 ms while the client, on the same host, read its streams
    92 ms late before and on time after (network 92 -> 0.7 ms, a local vLLM run): the CPUs moved
    between processes, users did not wait longer. Net of its co-movers' fall, under ``FELT_MS`` a
    request and under half its own rise: noted. Without the fall, the same rise pages."""
    frame, queue = queue_rise
    frame = _short_answers(frame)
    n = queue.affected_requests
    own = 0.046 * n
    network_fall = Consequence("network", None, queue.at, "p50", 92.0, 0.7, -0.041 * n)
    decode = replace(queue, stage="decode", summary="decode time rose 1.5×", before_ms=91.0, after_ms=137.0,
                     impact_s=own + network_fall.impact_s, with_=(network_fall,))  # fmt: skip
    assert incidents.taken_back(decode)
    (noted,) = book().step(ONSET + 20, [decode], frame)
    assert noted.unfelt and not noted.pages
    alone = replace(decode, impact_s=own, with_=())
    (paged,) = book().step(ONSET + 20, [alone], frame)
    assert not incidents.taken_back(alone) and paged.pages
    # a fall that takes back less than half of it leaves a rise users feel
    partly = replace(decode, impact_s=own * 0.6, with_=(replace(network_fall, impact_s=-own * 0.4),))
    assert not incidents.taken_back(partly)


def _short_answers(frame: pl.DataFrame) -> pl.DataFrame:
    """The generated requests with end-to-end times ~100 ms (a tiny model's 48-token answers):
    a rise of a few ms a request is then a share of users' time that opens an incident."""
    return frame.with_columns(pl.col("client_e2e", "gateway_e2e", "engine_e2e") / 40)


def _drift_then_jump(queue_rise) -> tuple[pl.DataFrame, Shift]:
    """r2's decode 10% slower from 60 s before the queue's onset, then 3x with it: the analysis
    places the decode's onset at the drift, with the level the jump gave it after."""
    frame, queue = queue_rise
    start, r2 = pl.col("start"), pl.col("replica") == "r2"
    factor = pl.when(r2 & (start >= ONSET)).then(3.0).when(r2 & (start >= ONSET - 60)).then(1.1).otherwise(1.0)
    moved = _short_answers(frame).with_columns(decode=pl.col("decode") * factor)
    before = float(frame.filter(r2 & (start < ONSET - 60))["decode"].median()) * 1e3
    decode = replace(queue, stage="decode", summary="decode time tripled", at=ONSET - 60, before_ms=before,
                     after_ms=before * 3, impact_s=queue.impact_s / 4)  # fmt: skip
    return moved, decode


def test_a_rise_placed_at_an_earlier_drift_is_the_co_mover_of_the_incident_it_jumped_with(queue_rise):
    """The CI run that paged "decode time rose 4.3× at 08:11:04 (p50 102 → 441 ms)" 28 s before
    the flood it came with: what moved the stage (``moved_at``: its median past the midpoint of
    its levels) is the flood, so it is the queue's co-mover, not a second page."""
    moved, decode = _drift_then_jump(queue_rise)
    _, queue = queue_rise
    assert abs(incidents.moved_at(decode, moved, decode.at) - ONSET) < 10.0
    assert 0.0 <= incidents.moved_at(queue, moved, queue.at) - queue.at < 2.0  # placed where it moved
    b = book(recent_s=120.0)
    (opened,) = b.step(ONSET + 20, [queue], moved)
    assert decode.at < opened.onset - b.merge_s  # by its onset alone, another moment
    assert b.step(ONSET + 30, [queue, decode], moved) == []
    assert len(b.incidents) == 1 and [f.stage for f in opened.co_movers] == ["decode"]


def test_a_rise_noted_as_taken_back_pages_only_once_it_moves_again(queue_rise):
    """Noted as taken back when it opened, the same rise said later without the fall (a p90 in a
    narrower scope: the analysis' words change as requests come) is not news; a jump after it was
    noted is, and pages once it could for the hold."""
    moved, decode = _drift_then_jump(queue_rise)
    drift = replace(decode, after_ms=decode.before_ms * 1.1, summary="decode time rose 10%")
    n = drift.affected_requests
    fall = Consequence("network", None, drift.at, "p50", 40.0, 1.0, -drift.impact_s * 0.9)
    taken = replace(drift, impact_s=drift.impact_s * 0.1, with_=(fall,))
    assert incidents.taken_back(taken) and taken.impact_s / n * 1e3 < incidents.FELT_MS
    steady = moved.filter(pl.col("start") < ONSET)  # the requests so far: the drift, not the jump
    b = book(recent_s=240.0)
    (noted,) = b.step(ONSET - 40, [taken], steady)
    assert not noted.pages
    words = replace(drift, summary="decode time rose 10% (p90)", impact_s=drift.impact_s)
    for now in (ONSET - 30, ONSET - 20, ONSET - 10):
        assert [i for i in b.step(now, [words], steady) if i.pages] == []
    assert not noted.pages
    # the jump at the onset: moved after it was noted, it pages once it held
    paged = [i for now in (ONSET + 20, ONSET + 30) for i in b.step(now, [decode], moved) if i.pages]
    assert paged and paged[0] is noted and noted.fired is decode
