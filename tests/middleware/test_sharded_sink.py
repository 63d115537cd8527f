"""The sharded http sink on its own: the HOPLINE_SINK spelling, rendezvous routing, and a collector
that hangs holding up nobody but its own share (three collectors and every emitter kind:
tests/collector/test_sharding.py)."""

from __future__ import annotations

import contextlib
import socket
import time
from collections import Counter

import pytest
from hopline.collector.config import CollectorConfig
from hopline.middleware.contract import EMITTER_STATS_HOP, EventError, validate_event
from hopline.middleware.emit import Emitter
from hopline.middleware.sharded_sink import Rendezvous, ShardedHttpSink, routing_key
from hopline.middleware.sinks import HttpSink, make_sink

from support.collector import serve, stored_lines
from support.servers import wait_until

NAMES = ["10.0.0.1:4318", "10.0.0.2:4318", "10.0.0.3:4318"]
KEYS = [f"req-{i}" for i in range(3000)]


def test_several_comma_separated_urls_build_a_sharded_sink_and_one_url_a_plain_one():
    sink = make_sink("http://10.0.0.1:4318, http://10.0.0.2:4318/v1/events,https://u:p@10.0.0.3:4318")
    assert isinstance(sink, ShardedHttpSink)
    assert [t.name for t in sink.targets] == NAMES  # no credentials in names, logs or metrics
    assert type(make_sink("http://10.0.0.1:4318")) is HttpSink


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("http://10.0.0.1:4318,,http://10.0.0.2:4318", "empty collector URL"),
        ("http://10.0.0.1:4318,http://10.0.0.1:4318/v1/events", "listed more than once: 10.0.0.1:4318"),
        ("http://10.0.0.1:4318,ftp://10.0.0.2", "got 'ftp://10.0.0.2'"),
        ("http://10.0.0.1:4318,http://10.0.0.2:4318/ingest", "must be empty or end in /v1/events"),
    ],
)
def test_a_bad_list_of_collectors_is_refused_naming_what_is_wrong(spec, message):
    with pytest.raises(ValueError, match=message):
        make_sink(spec)


def test_rendezvous_ignores_the_list_order_spreads_evenly_and_moves_only_a_removed_targets_keys():
    three = Rendezvous(NAMES)
    reordered = Rendezvous([NAMES[2], NAMES[0], NAMES[1]])
    owner = {key: NAMES[three.pick(key)] for key in KEYS}
    assert owner == {key: [NAMES[2], NAMES[0], NAMES[1]][reordered.pick(key)] for key in KEYS}
    assert owner == {key: NAMES[three.pick(key)] for key in KEYS}  # the cache answers the same
    share = Counter(owner.values())
    assert all(900 <= share[name] <= 1100 for name in NAMES), share  # 1000 each, give or take
    two = Rendezvous([NAMES[0], NAMES[2]])
    moved = {key for key in KEYS if [NAMES[0], NAMES[2]][two.pick(key)] != owner[key]}
    assert moved == {key for key in KEYS if owner[key] == NAMES[1]}  # a modulo hash would move 2/3


def test_events_are_routed_by_request_id_else_trace_id_and_reports_by_their_emitter():
    assert routing_key({"request_id": "r1", "trace_id": "ab" * 16, "hop": "client.sent"}) == "r1"
    assert routing_key({"trace_id": "ab" * 16, "hop": "client.sent"}) == "ab" * 16
    assert routing_key({"hop": EMITTER_STATS_HOP, "emitter": "e1"}) == "e1"
    assert routing_key({"hop": "client.sent"}) is None


def test_a_report_with_per_target_counts_must_name_each_target_and_count_in_integers():
    counts = {"sent": 3, "buffered": 0, "dropped_full": 0, "dropped_sink": 0}
    report = {"hop": EMITTER_STATS_HOP, "ts": 1.0, "eid": "e", "emitter": "x", "sent": 3,
              "targets": [{"target": "c1:4318", **counts}]}  # fmt: skip
    assert validate_event(dict(report))["targets"] == report["targets"]
    with pytest.raises(EventError, match=r"targets\[0\]\.dropped_full must be an integer"):
        validate_event({**report, "targets": [{"target": "c1:4318", "dropped_full": -1}]})
    with pytest.raises(EventError, match=r"targets\[1\]\.target must be a string"):
        validate_event({**report, "targets": [{"target": "c1:4318"}, {"sent": 1}]})
    with pytest.raises(EventError, match="targets must be a list"):
        validate_event({**report, "targets": {"c1:4318": 3}})


@contextlib.contextmanager
def hanging_url():
    """A port that accepts connections and never answers (a collector stuck mid-request)."""
    sock = socket.create_server(("127.0.0.1", 0), backlog=64)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


def test_a_hanging_collector_holds_up_only_its_share_which_is_counted_for_it(tmp_path):
    with (
        serve(CollectorConfig(data_dir=tmp_path / "a", grace=0.0)) as a,
        serve(CollectorConfig(data_dir=tmp_path / "b", grace=0.0)) as b,
        hanging_url() as stuck,
    ):
        sink = ShardedHttpSink([a.url, b.url, stuck], flush_interval=0.01, timeout=60.0)
        emitter = Emitter(sink, service="svc", flush_interval=0.01, stats_interval=0.05)
        rids = [f"r{i}" for i in range(60)]
        for rid in rids:
            emitter.emit("engine.received", rid, time.time(), stream=True)
            emitter.emit("engine.last_token", rid, time.time(), output_tokens=1)
        owners = {rid: sink.router.pick(rid) for rid in rids}
        expected = Counter(owners.values())
        assert set(expected) == {0, 1, 2}

        def delivered(index: int, data_dir) -> bool:
            stored = {e["request_id"] for e in stored_lines(data_dir) if "request_id" in e}
            return stored == {rid for rid, owner in owners.items() if owner == index}

        live_sent = [2 * expected[0], 2 * expected[1]]

        def live_delivered() -> bool:
            return [t["sent"] for t in emitter.stats()["targets"][:2]] == live_sent

        wait_until("the live collectors' shares", live_delivered)
        assert delivered(0, tmp_path / "a") and delivered(1, tmp_path / "b")
        targets = emitter.stats()["targets"]
        assert targets[2]["sent"] == 0 and targets[2]["buffered"] == 2 * expected[2]
        emitter.close(timeout=0.5)
        # what waited behind the stuck request is dropped at the deadline; the batch stuck in it
        # stays counted as buffered (it may still arrive): neither lost silently nor claimed sent
        stats = emitter.stats()
        stuck_share = stats["targets"][2]
        assert stuck_share["sent"] == 0
        assert stuck_share["dropped_sink"] + stuck_share["buffered"] == 2 * expected[2]
        assert stats["targets"][:2] == targets[:2]
        assert stats["sent"] + stats["dropped"] + stats["buffered"] == 2 * len(rids)
        # the reports went to the one collector the emitter's ID picks (a live one here, or none)
        reports = [e for d in ("a", "b") for e in stored_lines(tmp_path / d) if e["hop"] == EMITTER_STATS_HOP]
        home = sink.router.pick(emitter.instance)
        assert {e["emitter"] for e in reports} <= {emitter.instance}
        assert bool(reports) == (home != 2)


def test_an_event_without_any_key_goes_to_the_first_collector_and_a_bad_one_never_raises():
    sink = ShardedHttpSink(["http://10.0.0.1:4318", "http://10.0.0.2:4318", "http://10.0.0.3:4318"])
    odd = [{"hop": "client.sent"}, {"hop": "client.sent", "request_id": 7},
           {"hop": "client.sent", "request_id": ["x"]}]  # fmt: skip
    assert [len(share) for share in sink.shares(odd)] == [3, 0, 0]
