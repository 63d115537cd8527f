"""Three real collector processes behind one sharded http sink (middleware/sharded_sink.py), fed by
every kind of emitter: the client's httpx transport, the gateway's and the engine's ASGI
middleware on real uvicorn servers, and the vLLM stat logger's engine.stats.

What must hold: every request's hops meet in exactly one collector and are joined there; a killed
collector costs only its own share (buffered, the overflow dropped, both counted for that target),
while the other two keep joining theirs; restarted on its port, it receives what its buffers still
held, and new requests are delivered to it again; the per-target counts reach the collectors as
``hopline_emitter_target_*`` and sum across them; ``hopline analyze`` over the three stores sees
every stored request once.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import httpx
from hopline.collector.metric_names import STAGE_SECONDS as STAGE
from hopline.middleware.client import instrument
from hopline.middleware.emit import Emitter
from hopline.middleware.engine import EngineMiddleware
from hopline.middleware.sharded_sink import ShardedHttpSink
from hopline.middleware.vllm_stats import HoplineStatLogger
from prometheus_client.parser import text_string_to_metric_families

from support.cli import hopline
from support.collector import collector_process, stored_lines
from support.fakes import fake_engine_app, fake_gateway_app
from support.servers import running_server, wait_until

CLIENT_HOPS = ["client.sent", "client.first_token", "client.last_token"]
GATEWAY_HOPS = [
    "gateway.received", "gateway.admitted", "gateway.forwarded", "gateway.first_token", "gateway.last_token"
]  # fmt: skip
ENGINE_HOPS = ["engine.received", "engine.first_token", "engine.last_token", "engine.stats"]
ALL_HOPS = sorted(CLIENT_HOPS + GATEWAY_HOPS + ENGINE_HOPS)
EVENTS_PER_REQUEST = len(ALL_HOPS)  # 12, from four emitters
# Per emitter and collector: room for a healthy collector's share of a batch on a busy machine;
# the killed collector's share (LOST_SHARE requests) overflows it even counting the batch in flight.
CAPACITY = 100
LOST_SHARE = 45  # 225 gateway events for at most 2 x CAPACITY places
KILLED = 0  # the collector killed and restarted (index into the sink's targets)


class Fleet:
    """The four emitters, each with its own sharded sink over the same three collectors."""

    def __init__(self, urls: list[str]) -> None:
        def emitter(**static: str) -> Emitter:
            # a long retry budget: a batch taken while its collector is down waits for it
            sink = ShardedHttpSink(urls, capacity=CAPACITY, flush_interval=0.02, retry_budget=120.0,
                                   backoff=(0.05, 0.2))  # fmt: skip
            return Emitter(sink, flush_interval=0.02, stats_interval=0.1, **static)

        self.client = emitter(service="kite-chat")
        self.gateway = emitter(service="gateway", replica="gw-0")
        self.engine = emitter(service="engine", replica="r1", model="tiny")
        self.vllm = emitter(service="engine", replica="r1", model="tiny")
        self.all = [self.client, self.gateway, self.engine, self.vllm]
        self.router = self.client.sink.router
        self.names = [target.name for target in self.client.sink.targets]
        self.stat_logger = HoplineStatLogger(None, emitter=self.vllm)

    def owner(self, rid: str) -> int:
        return self.router.pick(rid)

    def share(self, target: int, count: str) -> int:
        """``count`` of one collector, summed over the emitters."""
        return sum(emitter.stats()["targets"][target][count] for emitter in self.all)

    def finished_in_engine(self, rid: str) -> None:
        """What vLLM's engine core reports for the request: its durations, under vLLM's ID."""
        stats = SimpleNamespace(
            request_id=f"chatcmpl-{rid}", queued_time=0.001, prefill_time=0.002, decode_time=0.003,
            num_prompt_tokens=5, num_generation_tokens=3, num_cached_tokens=0, finish_reason="length",
            max_tokens_param=3,
        )  # fmt: skip
        self.stat_logger.record(None, SimpleNamespace(finished_requests=[stats]))


def send(fleet: Fleet, http: httpx.Client, gateway_url: str, rids: list[str]) -> None:
    for rid in rids:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                "max_tokens": 3, "stream_options": {"include_usage": True}}  # fmt: skip
        answer = http.post(gateway_url + "/v1/chat/completions", json=body, headers={"X-Request-Id": rid})
        assert answer.status_code == 200 and answer.text.endswith("data: [DONE]\n\n")
        fleet.finished_in_engine(rid)


def joined_in(urls: list[str | None], rid: str) -> list[int]:
    """The collectors (indexes) holding every hop of ``rid``, joined, and no collector holding part of it."""
    complete = []
    for index, url in enumerate(urls):
        if url is None:
            continue
        answer = httpx.get(f"{url}/v1/requests/{rid}", timeout=5)
        if answer.status_code == 404:
            continue
        found = answer.json()
        hops = sorted(hop["hop"] for hop in found["hops"])
        if hops != ALL_HOPS:
            return []  # partial here (yet): not joined
        assert found["outcome"] == "ok" and found["missing"] == [], found
        complete.append(index)
    return complete


def wait_joined(urls: list[str | None], rids: list[str]) -> dict[str, int]:
    """Each of ``rids``' collector, once every one of them is joined in exactly one."""
    owners: dict[str, int] = {}

    def all_joined() -> bool:
        for rid in rids:
            if rid not in owners:
                where = joined_in(urls, rid)
                assert len(where) <= 1, f"{rid} joined in collectors {where}"
                if where:
                    owners[rid] = where[0]
        return len(owners) == len(rids)

    wait_until("every request joined in one collector", all_joined, timeout=60)
    return owners


def exposed(urls: list[str], name: str, **match: str) -> float:
    """``name``'s samples matching ``match``, summed over the collectors' /metrics (as Prometheus
    sums across instances)."""
    total = 0.0
    for url in urls:
        for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=5).text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in match.items()):
                    total += sample.value
    return total


def test_requests_meet_in_one_collector_a_killed_one_costs_only_its_share_and_delivery_resumes(tmp_path):
    dirs = [tmp_path / f"collector-{i}" for i in range(3)]
    with contextlib.ExitStack() as stack:
        running = [stack.enter_context(collector_process(d, "--grace", "1s")) for d in dirs]
        urls: list[str | None] = [url for _, url in running]
        fleet = Fleet([url for url in urls if url])
        stack.callback(lambda: [emitter.close(timeout=1) for emitter in fleet.all])
        engine_app = EngineMiddleware(fake_engine_app(), emitter=fleet.engine)
        engine_url = stack.enter_context(running_server(engine_app))
        gateway_app = fake_gateway_app([("r1", engine_url)], fleet.gateway)
        gateway_url = stack.enter_context(running_server(gateway_app))
        http = stack.enter_context(instrument(httpx.Client(timeout=10), emitter=fleet.client))

        # 1. all up: each request is joined in exactly one collector, the one its ID hashes to
        first = [f"first-{i}" for i in range(24)]
        send(fleet, http, gateway_url, first)
        owners = wait_joined(urls, first)
        assert all(owners[rid] == fleet.owner(rid) for rid in first)
        assert set(owners.values()) == {0, 1, 2}  # these 24 IDs spread over all three

        # 2. one collector killed: its share waits in its buffers (the overflow is dropped), counted
        # for it alone; the other two join theirs as before
        proc, killed_url = running[KILLED]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        urls[KILLED] = None
        sent_before = fleet.share(KILLED, "sent")
        candidates = [f"down-{i}" for i in range(1000)]
        lost_share = [rid for rid in candidates if fleet.owner(rid) == KILLED][:LOST_SHARE]
        down = lost_share + [rid for rid in candidates if fleet.owner(rid) != KILLED][:12]
        send(fleet, http, gateway_url, sorted(down))
        assert wait_joined(urls, [rid for rid in down if rid not in lost_share]) == {
            rid: fleet.owner(rid) for rid in down if rid not in lost_share
        }
        routed = EVENTS_PER_REQUEST * len(lost_share)
        wait_until(
            "the killed collector's share buffered or dropped",
            lambda: fleet.share(KILLED, "buffered") + fleet.share(KILLED, "dropped_full") == routed,
        )
        assert fleet.share(KILLED, "sent") == sent_before
        assert fleet.share(KILLED, "dropped_full") > 0  # more than CAPACITY per emitter: the oldest went
        assert fleet.share(KILLED, "dropped_sink") == 0  # still within the retry budget
        held = fleet.share(KILLED, "buffered")
        assert held > 0
        for other in (1, 2):
            expected = EVENTS_PER_REQUEST * sum(fleet.owner(rid) == other for rid in first + down)
            assert fleet.share(other, "sent") == expected
            assert fleet.share(other, "dropped_full") == fleet.share(other, "dropped_sink") == 0
            assert fleet.share(other, "buffered") == 0

        # 3. restarted where the emitters expect it: what its buffers held is delivered, and new
        # requests are joined in all three again
        port = int(killed_url.rsplit(":", 1)[1])
        _, restarted = stack.enter_context(collector_process(dirs[KILLED], "--grace", "1s", port=port))
        urls[KILLED] = restarted
        wait_until("the held events delivered", lambda: fleet.share(KILLED, "buffered") == 0, timeout=60)
        assert fleet.share(KILLED, "sent") == sent_before + held
        stored_down = [e for e in stored_lines(dirs[KILLED]) if e.get("request_id", "").startswith("down-")]
        assert len(stored_down) == held
        assert {e["request_id"] for e in stored_down} <= set(lost_share)
        after = [f"after-{i}" for i in range(24)]
        send(fleet, http, gateway_url, after)
        owners_after = wait_joined(urls, after)
        assert KILLED in owners_after.values()

        # 4. the emitters' final reports: per-target counts as hopline_emitter_target_*, which sum
        # across the collectors to what the emitters counted
        for emitter in fleet.all:
            emitter.close(timeout=10)
        stats = [emitter.stats() for emitter in fleet.all]
        live = [url for url in urls if url]

        def reported() -> bool:
            return exposed(live, "hopline_emitter_events_sent_total") == sum(s["sent"] for s in stats)

        wait_until("the final reports", reported, timeout=30)
        for index, name in enumerate(fleet.names):
            counted = {k: sum(s["targets"][index][k] for s in stats) for k in ("sent", "dropped_full")}
            assert exposed(live, "hopline_emitter_target_events_sent_total", target=name) == counted["sent"]
            assert exposed(
                live, "hopline_emitter_target_events_dropped_total", target=name, reason="full"
            ) == counted["dropped_full"]
        dropped_full = exposed(live, "hopline_emitter_events_dropped_total", reason="full")
        assert dropped_full == fleet.share(KILLED, "dropped_full")

    # 5. the three stores are partitions: a request's events are in one of them, and the analyzer
    # reading the three together sees each stored request once
    homes: dict[str, set[int]] = {}
    stored = Counter()
    for index, directory in enumerate(dirs):
        for event in stored_lines(directory):
            if "request_id" in event:
                homes.setdefault(event["request_id"], set()).add(index)
                stored[event["request_id"]] += 1
    assert all(len(where) == 1 for where in homes.values()), {r: w for r, w in homes.items() if len(w) > 1}
    complete = first + [rid for rid in down if rid not in lost_share] + after
    assert all(stored[rid] == EVENTS_PER_REQUEST for rid in complete)
    assert set(complete) <= set(homes) <= set(first + down + after)
    result = hopline("analyze", *map(str, dirs), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["requests"] == len(homes)


def test_recorded_quantiles_and_means_add_the_collectors_histograms(tmp_path):
    """Prometheus (promtool's rule tests: its real engine) evaluates the generated recording rules
    over two collectors' series: a request is observed in one collector only, so only buckets
    summed across instances (``sum by (le, …)``, no ``instance``) give the fleet's quantile. Here
    collector c1 saw 10 queue times under 0.1 s and c2 30 between 0.1 and 1 s: the p50 of the 40
    is 0.1 + 0.9 × (20 - 10) / 30 = 0.4 s (c1 alone would say 0.05, c2 alone 0.55), the mean
    (0.5 + 19.5) / 40 = 0.5 s."""
    import yaml
    from hopline.dashboards import rules

    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules.rule_file()))
    scope = 'stage="queue", service="kite-chat", model="tiny", replica="r1", job="hopline"'
    per_minute = {
        "c1": {"0.1": 10, "1": 10, "+Inf": 10, "sum": 0.5},
        "c2": {"0.1": 0, "1": 30, "+Inf": 30, "sum": 19.5},
    }
    series = []
    for instance, counts in per_minute.items():
        labels = f'{scope}, instance="{instance}"'
        for le in ("0.1", "1", "+Inf"):
            bucket = f'hopline_stage_seconds_bucket{{{labels}, le="{le}"}}'
            series.append({"series": bucket, "values": f"0+{counts[le]}x20"})
        for suffix, per_step in (("count", counts["+Inf"]), ("sum", counts["sum"])):
            name = f"hopline_stage_seconds_{suffix}{{{labels}}}"
            series.append({"series": name, "values": f"0+{per_step}x20"})
    recorded = '{stage="queue", service="kite-chat", model="tiny", replica="r1"}'  # one series: no instance
    tests = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [
                    {"expr": rules.recorded(m, "p50"), "eval_time": "10m", "exp_samples": [
                        {"labels": rules.recorded(m, "p50") + recorded, "value": 0.4}]}
                    for m in [STAGE]
                ] + [
                    {"expr": rules.recorded(STAGE, "mean"), "eval_time": "10m", "exp_samples": [
                        {"labels": rules.recorded(STAGE, "mean") + recorded, "value": 0.5}]}
                ],
            }
        ],
    }  # fmt: skip
    (tmp_path / "test.yml").write_text(yaml.safe_dump(tests))
    result = subprocess.run(
        ["promtool", "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
