"""``LiveConfig.sample``: the live analysis on a fixed fraction of the requests, chosen by request
ID (the same on every watcher, shard and run), every event of a chosen request kept."""

from __future__ import annotations

import subprocess
import sys

import polars as pl
import pytest
from hopline.analyzer.live.alertmanager import payload
from hopline.analyzer.live.detector import LiveConfig, LiveDetector, sampled
from support.synth import StageShift, generate

REPLICAS = ("r1", "r2", "r3", "r4")


def test_the_sample_is_a_fixed_set_of_request_ids_nested_across_fractions():
    ids = pl.Series([f"req-{i}" for i in range(20_000)])
    quarter, sixteenth = sampled(ids, 0.25), sampled(ids, 1 / 16)
    # about the fraction asked (binomial: 4 standard deviations), the same set every time
    assert abs(quarter.mean() - 0.25) < 4 * (0.25 * 0.75 / 20_000) ** 0.5
    assert abs(sixteenth.mean() - 1 / 16) < 4 * (1 / 16 * 15 / 16 / 20_000) ** 0.5
    assert sampled(ids.reverse(), 0.25).reverse().to_list() == quarter.to_list()
    assert not (sixteenth & ~quarter).any()  # a smaller sample lies inside a larger one
    assert sampled(ids, 1.0).all()
    # one request's events are kept or left together, and a null ID is never kept
    repeated = pl.Series(["req-7", None, "req-7", "req-7"])
    assert len(set(sampled(repeated, 0.5).to_list()[::2])) == 1 and not sampled(repeated, 1.0)[1]


def test_a_sampled_detector_still_names_the_replica_and_says_it_is_a_sample():
    rise = StageShift("queue", 3.0, at_s=360, scope={"replica": "r2"})
    events = generate(duration_s=600, rate=160, seed=4, replicas=REPLICAS, incidents=[rise])
    detector = LiveDetector(LiveConfig(window_s=10.0, horizon_s=600.0, recent_s=240.0, sample=0.25))
    slot = (pl.col("ts") // 10.0).alias("_slot")
    for part in events.sort("ts").with_columns(slot).partition_by("_slot", maintain_order=True):
        detector.feed(part.drop("_slot"))
        if detector.book.firing():
            break
    (incident,) = detector.book.firing()
    assert (incident.finding.stage, incident.scope) == ("queue", {"replica": "r2"})
    assert incident.sample == 0.25 and incident.to_json()["sample"] == 0.25
    assert "sample=0.25" in payload(incident)["annotations"]["evidence"]
    # a quarter of the requests analysed, all of their events kept, the rest counted
    seen = events.filter(pl.col("ts") <= detector.newest)
    kept = seen.filter(sampled(seen["request_id"], 0.25))
    assert detector.events_not_sampled == seen.height - kept.height > 0
    share = detector.horizon.height / seen["request_id"].n_unique()
    assert 0.2 < share < 0.3, share


@pytest.mark.parametrize("fraction", [0.0, -0.1, 1.5])
def test_a_sample_outside_0_1_is_refused(fraction):
    with pytest.raises(ValueError, match="sample must be a fraction in"):
        LiveConfig(sample=fraction)


def test_watch_refuses_a_bad_sample_with_a_clear_error(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "hopline.analyzer.live", "--replay", str(tmp_path), "--sample", "2"],
        check=False, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and "sample must be a fraction in (0, 1], got 2.0" in proc.stderr, proc.stderr


def test_the_sample_and_what_it_left_out_are_on_metrics():
    from hopline.analyzer.live.metrics import NOT_SAMPLED, SAMPLE, build_registry
    from hopline.analyzer.live.watch import Watch
    from prometheus_client import generate_latest

    detector = LiveDetector(LiveConfig(sample=0.5))
    detector.feed(generate(duration_s=20, rate=20, seed=5, replicas=REPLICAS))
    text = generate_latest(build_registry(Watch(detector, out=None))).decode()
    assert f"{SAMPLE} 0.5" in text
    left = next(float(x.split()[1]) for x in text.splitlines() if x.startswith(NOT_SAMPLED + "_total "))
    assert left == detector.events_not_sampled > 0


def test_following_with_a_sample_reads_only_the_sampled_requests_lines(tmp_path):
    from hopline.analyzer import io
    from hopline.analyzer.io import ScanReport
    from hopline.analyzer.live.feed import Tail
    from support.synth import write_ndjson

    # engine.stats names requests as vLLM does (chatcmpl-<id>): the same request, the same verdict
    events = generate(duration_s=30, rate=20, seed=6, replicas=REPLICAS, engine_id_prefix=True)
    log = tmp_path / "events.ndjson"
    write_ndjson(events, log)
    with log.open("ab") as f:
        f.write(b'{"broken": \n')  # a line with no ID the pattern finds: read, and reported
    lines = log.read_bytes().count(b"\n")
    everything = io.parse_ndjson(log.read_bytes(), str(log), ScanReport())
    tail = Tail([log], sample=0.25)
    got = tail.poll()
    want = everything.filter(sampled(everything["request_id"], 0.25))
    assert 0 < got.height == want.height < everything.height
    assert sorted(got["request_id"].unique()) == sorted(want["request_id"].unique())
    assert (got.group_by("request_id").len().sort("request_id")["len"].to_list()
            == want.group_by("request_id").len().sort("request_id")["len"].to_list())  # fmt: skip
    assert tail.not_sampled == everything.height - want.height
    assert tail.report.bad_lines == 1 and f"events.ndjson:{lines}" in str(tail.report.__dict__)
