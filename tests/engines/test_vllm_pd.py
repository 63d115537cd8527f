"""Disaggregated prefill/decode on two real vLLM instances, through a P/D proxy with hopline in it.

Two CPU vLLM servers on the tiny model, a prefill instance (replica ``p1``) and a decode instance
(``d1``), each with vLLM's disk-based ``ExampleConnector`` on one shared folder
(``--kv-transfer-config``, ``kv_role`` ``kv_both``: the prefill instance writes each new prompt's
KV to the folder, the decode instance finds it there by the prompt's tokens and loads it instead of
computing it). Between them the proxy of tests/support/pd_proxy.py (the legs of vLLM's own P/D
proxy) with hopline's gateway middleware, one ``forwarded()`` per leg; the client is hopline's.

The same requests go once through the proxy as a gateway without P/D support calls hopline
(``forwarded(replica)``: the decode leg is a second attempt) and, where hopline has it, once with
the legs named (``forwarded(replica, leg=...)``, issue 25: one attempt, the prefill instance's events
read as ``prefill.*``, a ``kv_transfer`` stage). Checked per request: the prefill leg ran on p1 (one
output token) and the decode leg on d1 with the prompt's KV loaded through the connector (vLLM's
usage on d1 counts it as cached: d1 had never seen the prompt, each one is new, so no local prefix
cache served it); the stats event's ``cached_tokens`` is that usage figure; the request's stages
across the two instances add up to its client TTFT with no negative term; with legs, the stages
are the two instances' own (queue and prefill on p1, the KV transfer on d1), the same in the
contract's evaluator and the analyzer's, and the request is scoped to both instances.
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import test_vllm as vllm
from hopline.analyzer.io import scan_events
from hopline.analyzer.timelines import timelines
from hopline.middleware.client import instrument
from hopline.middleware.contract import TTFT_STAGES, compute_stages, negative_stages
from hopline.middleware.contract.rules import describe_request
from hopline.middleware.emit import Emitter
from support.chat_stream import chat_stream
from support.pd_proxy import pd_proxy_app
from support.servers import running_server

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

BLOCK = 128  # vLLM's CPU block size (vllm/platforms/cpu.py); the connector moves whole blocks
REQUESTS = 8
MAX_TOKENS = 16
# Negative terms only by clock read granularity: each stage is a difference within one process.
TOLERANCE_S = 0.002
# 331 tokens with the chat template, whatever the ticket's three words (each one token of the tiny
# tokenizer): two full blocks for the connector to move, under --max-model-len 512. The length is
# kept fixed because the connector stores (len - 1) // 128 * 128 tokens and looks for
# (len - 2) // 128 * 128: at a length of 128k + 1 it would never find what it stored.
TEXT = " ".join(
    ["Observability middleware measures time to first token, queue time, prefill and decode."] * 20
)
WORDS = ("quick", "brown", "fox", "lazy", "dog", "world", "tiny", "model", "server", "client")


# hopline's P/D legs (issue 25): GatewayHops.forwarded(upstream, leg=...)


@dataclass
class Run:
    events: dict[str, Path]  # per proxy mode ("attempts", "legs"), its events' folder
    logs: dict[str, Path]
    answers: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


def connector(folder: Path) -> tuple[str, ...]:
    config = {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"shared_storage_path": str(folder)},
    }
    return ("--kv-transfer-config", json.dumps(config), "--enable-prompt-tokens-details")


def ask(client: httpx.Client, url: str, ticket: tuple[str, ...]) -> dict[str, Any]:
    """One streaming chat call whose prompt no instance has seen (its first words are new)."""
    body = {
        "model": vllm.MODEL,
        "messages": [{"role": "user", "content": f"Ticket {' '.join(ticket)}. {TEXT}"}],
        "stream": True,
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    return chat_stream(client, url + "/v1/chat/completions", body)


def through_proxy(run: Run, mode: str, upstreams: dict[str, str], tickets: Iterator[tuple[str, ...]]) -> None:
    """``REQUESTS`` calls through a proxy in ``mode``, each component's events in their own file
    (the engines', in the folder of the mode, were routed there by ``HOPLINE_SINK``: see below)."""
    folder = run.events[mode]
    proxy_emitter = Emitter(f"file:{folder / 'proxy.ndjson'}", service="pd-proxy", replica="proxy-1")
    client_emitter = Emitter(f"file:{folder / 'client.ndjson'}")
    app = pd_proxy_app(("p1", upstreams["p1"]), ("d1", upstreams["d1"]), proxy_emitter, legs=mode == "legs")
    try:
        with (
            running_server(app) as proxy,
            instrument(httpx.Client(timeout=120), emitter=client_emitter, service="chat") as client,
        ):
            run.answers[mode] = [ask(client, proxy, next(tickets)) for _ in range(REQUESTS)]
    finally:
        client_emitter.close()
        proxy_emitter.close()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """P and D once; the requests through the proxy without legs, then with them (when hopline has
    them). The engines write one file each; their events are split by request afterwards."""
    root = vllm.vllm_dir()
    tmp = tmp_path_factory.mktemp("pd")
    (tmp / "kv").mkdir()
    modes = ("attempts", "legs")
    result = Run(
        events={m: tmp / m for m in modes}, logs={name: tmp / f"{name}.log" for name in ("p1", "d1")}
    )
    for folder in result.events.values():
        folder.mkdir()
    ports = {name: vllm.free_port() for name in result.logs}
    procs = {
        name: vllm.start_server(
            root, ports[name], tmp / f"{name}.ndjson", log, extra_args=connector(tmp / "kv"), replica=name
        )
        for name, log in result.logs.items()
    }
    try:
        with ThreadPoolExecutor(2) as pool:  # both start at once
            waits = [
                pool.submit(vllm.wait_ready, procs[n], ports[n], result.logs[n], 2 * vllm.STARTUP_TIMEOUT_S)
                for n in procs
            ]
            for f in waits:
                f.result()
        upstreams = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
        tickets = itertools.permutations(WORDS, 3)
        for mode in modes:
            through_proxy(result, mode, upstreams, tickets)
    finally:
        for proc in procs.values():
            vllm.stop_server(proc)
    split_engine_events(tmp, result)
    yield result


def split_engine_events(tmp: Path, run: Run) -> None:
    """Each engine's events into the folder of the mode whose request they belong to."""
    mode_of = {a["request_id"]: mode for mode, answers in run.answers.items() for a in answers}
    for name in run.logs:
        lines: dict[str, list[bytes]] = defaultdict(list)
        for event in vllm.read_events(tmp / f"{name}.ndjson"):
            lines[mode_of.get(event["request_id"], "attempts")].append(orjson.dumps(event))
        for mode, found in lines.items():
            (run.events[mode] / f"{name}.ndjson").write_bytes(b"\n".join(found) + b"\n")


def by_request(folder: Path) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for path in sorted(folder.glob("*.ndjson")):
        for event in vllm.read_events(path):
            grouped[event["request_id"]].append(event)
    return grouped


def check_legs_ran(run: Run, mode: str, attempts: dict[str, int]) -> None:
    """Each request's prefill on p1, one token; its decode on d1, with the KV from the connector."""
    grouped = by_request(run.events[mode])
    for answer in run.answers[mode]:
        events = grouped[answer["request_id"]]
        stats = {e["replica"]: e for e in events if e["hop"] == "engine.stats"}
        assert sorted(stats) == ["d1", "p1"], (answer, events, vllm.tail(run.logs["d1"]))
        prefill, decode = stats["p1"], stats["d1"]
        usage = answer["usage"]
        assert (prefill["attempt"], prefill["output_tokens"]) == (attempts["p1"], 1), prefill
        assert prefill["prompt_tokens"] == decode["prompt_tokens"] == usage["prompt_tokens"], (prefill, usage)
        assert (decode["attempt"], decode["output_tokens"]) == (attempts["d1"], MAX_TOKENS), decode
        loaded = usage["prompt_tokens_details"]["cached_tokens"]
        # the connector loads the prompt's whole blocks but the last token's (example_connector.py)
        assert loaded == (usage["prompt_tokens"] - 2) // BLOCK * BLOCK >= 2 * BLOCK, usage
        assert decode["cached_tokens"] == loaded, (decode, usage)


def check_ttft_sum(folder: Path, answers: list[dict[str, Any]], terms_needed: tuple[str, ...]) -> None:
    """client_ttft == the sum of the TTFT stages, each present where ``terms_needed`` and none negative."""
    grouped = by_request(folder)
    for answer in answers:
        stages = compute_stages(grouped[answer["request_id"]])
        terms = {name: stages[name] for name in TTFT_STAGES}
        for name in terms_needed:
            assert terms[name] is not None, (name, terms)
        total = sum(v for v in terms.values() if v is not None)
        assert abs(total - stages["client_ttft"]) <= 1e-6, (stages["client_ttft"], terms)
        assert negative_stages(stages, TOLERANCE_S) == [], terms
        print(
            f"{answer['request_id']}: client_ttft {stages['client_ttft']:.4f} = "
            + " + ".join(f"{k} {v:.4f}" for k, v in terms.items() if v is not None)
        )


def test_the_kv_came_through_the_connector_without_legs(run: Run) -> None:
    """A gateway without P/D support: the decode leg is attempt 1."""
    grouped = by_request(run.events["attempts"])
    for answer in run.answers["attempts"]:
        events = grouped[answer["request_id"]]
        forwarded = sorted((e["attempt"], e["upstream"]) for e in events if e["hop"] == "gateway.forwarded")
        assert forwarded == [(0, "p1"), (1, "d1")], forwarded
    check_legs_ran(run, "attempts", {"p1": 0, "d1": 1})
    hits = vllm.tail(run.logs["d1"], 100_000).count("External Cache Hit!")
    assert hits >= sum(len(a) for a in run.answers.values()), f"d1 logged {hits} connector hits"


def test_stages_add_up_to_the_client_ttft_without_legs(run: Run) -> None:
    """Read as a failover, the prefill leg is in ``gateway``; the stages still add up."""
    check_ttft_sum(
        run.events["attempts"], run.answers["attempts"], ("gateway", "frontend", "queue", "prefill")
    )


def test_with_legs_the_stages_are_each_instances_own_and_add_up(run: Run) -> None:
    grouped = by_request(run.events["legs"])
    check_legs_ran(run, "legs", {"p1": 0, "d1": 0})
    frame, _ = scan_events([run.events["legs"]])
    table = timelines(frame).collect()
    analyzed = {row["request_id"]: row for row in table.iter_rows(named=True)}
    for answer in run.answers["legs"]:
        events = grouped[answer["request_id"]]
        forwarded = sorted(
            (e["upstream"], e["leg"], e["attempt"]) for e in events if e["hop"] == "gateway.forwarded"
        )
        assert forwarded == [("d1", "decode", 0), ("p1", "prefill", 0)], forwarded
        for event in events:
            if event["hop"].startswith("engine."):
                assert event["leg"] == {"p1": "prefill", "d1": "decode"}[event["replica"]], event
        stats = {e["replica"]: e for e in events if e["hop"] == "engine.stats"}
        stages = compute_stages(events)
        # queue and prefill are the prefill instance's; the decode instance's wait and forward
        # (its queue and its "prefill", which loaded the KV and made the first token) are the transfer
        assert stages["queue"] == stats["p1"]["queue_s"], (stages, stats)
        assert stages["prefill"] == stats["p1"]["prefill_s"], (stages, stats)
        assert stages["kv_transfer"] == pytest.approx(
            stats["d1"]["queue_s"] + stats["d1"]["prefill_s"], abs=1e-9
        )
        scope = describe_request(events)["scope"]
        assert (scope["prefill_replica"], scope["decode_replica"], scope["replica"]) == ("p1", "d1", "d1"), (
            scope
        )
        row = analyzed[answer["request_id"]]
        for name in (*TTFT_STAGES, "client_ttft", "decode"):
            assert row[name] == pytest.approx(stages[name], abs=1e-6), (name, row[name], stages[name])
    check_ttft_sum(
        run.events["legs"],
        run.answers["legs"],
        ("gateway", "frontend", "queue", "prefill", "kv_transfer", "network"),
    )
