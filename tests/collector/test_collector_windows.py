"""Window summaries (issue 36, its foundation): a real collector keeps, per window and scope value,
a DDSketch of each stage; ``GET /v1/windows`` serves them and ``analyzer/windows.py`` merges them.

The sketches' relative accuracy is 1% (``RELATIVE_ACCURACY``): every quantile of a merged
sketch is within 1% of the exact quantile (numpy's ``lower`` method: the value at rank
floor(q·(n-1)), DDSketch's rank), whatever the distribution and however the requests were split
across collectors, because bins add exactly when sketches merge.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import zlib

import numpy as np
import pytest
from ddsketch import DDSketch
from ddsketch.pb.proto import DDSketchProto, pb
from hopline.analyzer.windows import WindowsError, decode, merge, read_windows
from hopline.collector.config import CollectorConfig
from hopline.collector.recent import summarize
from hopline.collector.stages import compute_stages
from hopline.collector.windows import RELATIVE_ACCURACY, WindowSummaries
from hopline.middleware.contract.rules import describe_request
from prometheus_client.parser import text_string_to_metric_families
from support.collector import parts_config, serve
from support.events import ndjson
from support.servers import wait_until
from support.synth import generate

NDJSON = {"Content-Type": "application/x-ndjson"}
WIDTH = 10.0
CHECKED = ("queue", "prefill", "decode", "network", "ttft", "e2e")
QS = (0.5, 0.9, 0.99)


@pytest.fixture(scope="module")
def requests() -> dict[str, list[dict]]:
    """900 generated requests (30 s at 30/s, two replicas, two services), events by request ID."""
    frame = generate(900, seed=36, rate=30.0).drop("attrs")
    by_id: dict[str, list[dict]] = collections.defaultdict(list)
    for row in frame.to_dicts():
        by_id[row["request_id"]].append({k: v for k, v in row.items() if v is not None})
    return by_id


def windows_config(tmp_path, name: str, **limits) -> CollectorConfig:
    # grace: a request's late hops (engine.stats) arrive in the same body; settled at once: the
    # generated events are from 2026-01-05, long past
    return CollectorConfig(data_dir=tmp_path / name, grace=0.2, fsync="none", window_settle=0.0, **limits)


def ingest(c, by_id: dict[str, list[dict]]) -> None:
    events = [ev for evs in by_id.values() for ev in evs]
    for i in range(0, len(events), 2000):
        r = c.client.post("/v1/events", content=ndjson(events[i : i + 2000]), headers=NDJSON)
        assert r.status_code == 200, r.text
    finished = c.collector.joiner.counts
    wait_until("every request finished", lambda: finished["complete"] == len(by_id), timeout=20)


def exact_values(by_id: dict[str, list[dict]]) -> dict[tuple[float, str, str], list[float]]:
    """(window start, replica, stage) -> every request's value, from the same stage table."""
    out: dict[tuple[float, str, str], list[float]] = collections.defaultdict(list)
    for rid, events in by_id.items():
        values, described = compute_stages(events), describe_request(events)
        s = summarize(rid, events, values, described, "complete")
        start = (s.started // WIDTH) * WIDTH
        for stage in CHECKED:
            v = {"ttft": s.ttft_s, "e2e": s.e2e_s}.get(stage, values.get(stage))
            if v is not None and v >= 0:
                out[(start, described["scope"]["replica"], stage)].append(v)
    return out


def test_merged_quantiles_are_within_the_sketch_accuracy_of_exact_ones(tmp_path, requests):
    with serve(windows_config(tmp_path, "one")) as c:
        ingest(c, requests)
        answer = c.client.get("/v1/windows").json()
    assert answer["width_s"] == WIDTH and answer["by"] == ["replica", "model", "service"]
    merged = merge([answer])
    assert sum(merged.requests.values()) == len(requests)  # every finished request, in one window
    exact = exact_values(requests)
    assert len(exact) >= 4 * len(CHECKED)  # >= 4 (window, replica) pairs: 30 s, two replicas
    worst = 0.0
    for (start, replica, stage), values in exact.items():
        measure = merged.measure(start, "replica", replica, stage)
        assert measure.count == len(values)
        assert measure.sum == pytest.approx(sum(values), rel=1e-9)
        for q in QS:
            want = np.quantile(values, q, method="lower")
            worst = max(worst, abs(merged.quantile(start, "replica", replica, stage, q) - want) / want)
    assert worst <= RELATIVE_ACCURACY + 1e-9, worst
    # arrivals and outcomes of a scope add up to the window's requests
    for start, attributes in merged.windows.items():
        assert sum(s.arrivals for s in attributes["service"].values()) == merged.requests[start]


def test_three_collectors_merged_equal_one_collector_with_every_request(tmp_path, requests):
    """Bins add exactly: the merge of three shards answers the very quantiles of one collector."""
    shards = [dict() for _ in range(3)]
    for rid, events in requests.items():
        shards[zlib.crc32(rid.encode()) % 3][rid] = events
    with contextlib.ExitStack() as stack:
        running = [stack.enter_context(serve(windows_config(tmp_path, f"c{i}"))) for i in range(3)]
        for c, shard in zip(running, shards, strict=True):
            ingest(c, shard)
        merged = read_windows([c.url for c in running])  # the analyzer's reader, over HTTP
    with serve(windows_config(tmp_path, "all")) as c:
        ingest(c, requests)
        whole = merge([c.client.get("/v1/windows").json()])
    assert merged.requests == whole.requests
    quantiles = whole.quantiles("queue")
    assert len(quantiles) > 10
    for name in ("queue", "decode", "ttft", "output_tokens"):
        assert merged.quantiles(name) == whole.quantiles(name)
        for key in whole.quantiles(name):
            a, b = merged.measure(*key, name), whole.measure(*key, name)
            assert (a.count, pytest.approx(a.sum)) == (b.count, b.sum)


def test_the_bins_are_those_ddsketch_add_makes():
    """The vectorized fold writes the sketch DDSketch.add builds value by value: same quantiles
    everywhere (zeros and a heavy tail included)."""
    rng = np.random.default_rng(7)
    values = np.concatenate([rng.lognormal(-3, 1.5, 5000), np.zeros(50), rng.pareto(1.2, 200) * 5])
    windows = WindowSummaries.from_config(parts_config(window=WIDTH, window_by="replica", window_settle=0.0))
    reference = DDSketch(RELATIVE_ACCURACY)
    for v in values:
        windows.add(1000.0, {"replica": "r1"}, {"queue": float(v)}, "ok")
        reference.add(float(v))
    part = windows.answer(now=2000.0)["windows"][0]["parts"][0]
    text = part["scopes"]["replica"]["r1"]["stages"]["queue"]["sketch"]
    sketch = decode(text, RELATIVE_ACCURACY)
    # the library's own reader of its protobuf reads the same sketch (deflated, base64 on the wire)
    library = DDSketchProto.from_proto(pb.DDSketch.FromString(zlib.decompress(base64.b64decode(text))))
    assert sketch.count == library.count == reference.count == len(values)
    for q in np.linspace(0, 1, 201):
        want = reference.get_quantile_value(q)
        assert sketch.get_quantile_value(q) == pytest.approx(want, rel=1e-12)
        assert library.get_quantile_value(q) == pytest.approx(want, rel=1e-12)


def test_the_read_token_guards_the_windows(tmp_path):
    config = CollectorConfig(data_dir=tmp_path, token="write-secret", read_token="read-secret")
    with serve(config) as c:
        assert c.client.get("/v1/windows").status_code == 401
        wrong = c.client.get("/v1/windows", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        for token in ("read-secret", "write-secret"):
            r = c.client.get("/v1/windows", headers={"Authorization": f"Bearer {token}"})
            assert r.status_code == 200 and r.json()["windows"] == []
        assert read_windows([c.url], token="read-secret").windows == {}
        with pytest.raises(WindowsError, match="answered 401"):
            read_windows([c.url])


def test_beyond_the_cap_values_are_summarized_as_other_and_counted(tmp_path, requests):
    """A cap of 1 value per attribute per window: the second replica of a window is ``other``."""
    with serve(windows_config(tmp_path, "cap", window_scope_cap=1)) as c:
        ingest(c, requests)
        merged = merge([c.client.get("/v1/windows").json()])
        text = c.client.get("/metrics").text
    for start, attributes in merged.windows.items():  # one named replica at most, then other
        assert len(attributes["replica"]) <= 2 and len(set(attributes["replica"]) - {"other"}) == 1
        if merged.requests[start] >= 100:  # a whole window (30/s) sees both replicas
            assert "other" in attributes["replica"]
    other = sum(a["replica"]["other"].arrivals for a in merged.windows.values() if "other" in a["replica"])
    assert other == merged.overflowed["replica"] > 0
    name = "hopline_collector_window_scopes_overflowed"
    family = next(f for f in text_string_to_metric_families(text) if f.name == name)
    counted = {s.labels["by"]: s.value for s in family.samples if s.name.endswith("_total")}
    assert counted["replica"] == other


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ("since=1767607300&until=1767607200", "is after until"),
        ("since=abc", "since: not a time"),
        ("until=12x", "until: not a time"),
        ("from=1", "unknown parameter 'from'"),
    ],
)
def test_a_bad_query_is_a_400_that_says_why(collector, query, said):
    r = collector.client.get(f"/v1/windows?{query}")
    assert r.status_code == 400
    assert said in r.json()["error"]


def test_since_and_until_select_windows_by_start(tmp_path, requests):
    with serve(windows_config(tmp_path, "range")) as c:
        ingest(c, requests)
        starts = [w["start"] for w in c.client.get("/v1/windows").json()["windows"]]
        assert len(starts) >= 3
        chosen = c.client.get("/v1/windows", params={"since": starts[1], "until": starts[1]}).json()
    assert [w["start"] for w in chosen["windows"]] == [starts[1]]


def test_each_sides_lateness_is_kept_capped_at_the_requests_network_time_and_the_hosts_wait_as_is():
    """The windows keep what the incident book tells a busy process from a slower hop by
    (``analyzer/findings/lateness.py``'s ``MEASURED``, the same names): each side's loop lateness,
    each request's capped at its own network time, and the engine host's CPU wait; a request that
    did not measure one adds nothing to it."""
    from hopline.analyzer.findings import lateness
    from hopline.collector.windows import LATENESS

    assert LATENESS == lateness.MEASURED
    windows = WindowSummaries.from_config(parts_config(window=WIDTH, window_by="replica", window_settle=0.0))
    rng = np.random.default_rng(39)
    network = rng.lognormal(-3, 1.0, 400)
    lag = rng.lognormal(-3, 1.0, 400)
    wait = rng.uniform(0, 0.9, 400)
    for k in range(400):
        values = {"network": float(network[k]), "client_read_lag_s": float(lag[k]), "engine_cpu_wait": float(wait[k])}
        if k % 4 == 0:  # no gateway lateness measured here: nor below
            values["gateway_loop_lag_s"] = float(lag[k])
        windows.add(1000.0, {"replica": "r1"}, values, "ok")
    kept = windows.answer(now=2000.0)["windows"][0]["parts"][0]["scopes"]["replica"]["r1"]["lateness"]
    assert set(kept) == {
        "client_read_lag_s@network", "gateway_loop_lag_s@network", "engine_cpu_wait",
    }  # fmt: skip
    capped = np.minimum(lag, network)
    for name, want in (
        ("client_read_lag_s@network", capped), ("gateway_loop_lag_s@network", capped[::4]), ("engine_cpu_wait", wait),
    ):  # fmt: skip
        sketch = decode(kept[name]["sketch"], RELATIVE_ACCURACY)
        assert kept[name]["count"] == len(want)
        assert kept[name]["sum"] == pytest.approx(want.sum(), rel=1e-12)
        for q in QS:
            exact = np.quantile(want, q, method="lower")
            assert sketch.get_quantile_value(q) == pytest.approx(exact, rel=RELATIVE_ACCURACY * 1.01)
