"""The demo gateway on real uvicorn servers: auth, rate limit, conversation affinity, failover."""

from __future__ import annotations

from collections import Counter

import httpx
import pytest
from hopline.demo.engine_sim import Engine, EngineConfig
from hopline.demo.engine_sim import create_app as engine_app
from hopline.demo.gateway_app import Router, TokenBucket, create_app, home_replica
from hopline.demo.process import free_port
from hopline.demo.wiring import gateway_middleware
from support.events import events_of, memory_emitter
from support.servers import running_server

FAST = EngineConfig(step_base_s=0.002, step_per_seq_s=0.0, prefill_per_token_s=0.000001, frontend_s=0.0)
BODY = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, "stream": True}


def test_home_replica_is_stable_and_spreads_conversations() -> None:
    names = ["r1", "r2"]
    homes = Counter(home_replica(f"user-{i}", names) for i in range(400))
    assert set(homes) == {"r1", "r2"} and min(homes.values()) > 150  # 400 keys, about even
    assert all(
        home_replica(f"user-{i}", names) == home_replica(f"user-{i}", list(reversed(names)))
        for i in range(50)
    )


def test_router_prefers_the_replica_that_served_the_conversation() -> None:
    router = Router(["r1", "r2"])
    key = next(f"c{i}" for i in range(100) if home_replica(f"c{i}", ["r1", "r2"]) == "r2")
    assert router.order(key) == ["r2", "r1"]
    router.served(key, "r1")  # e.g. after a failover
    assert router.order(key) == ["r1", "r2"]


def test_token_bucket_allows_the_burst_then_refuses() -> None:
    bucket = TokenBucket(rate=0.001, burst=3)
    assert [bucket.take() for _ in range(4)] == [True, True, True, False]


@pytest.fixture
def stack():
    """Engine r1 up; r2 a port nobody listens on (a dead replica)."""
    engine = Engine(FAST, replica="r1", emitter=None, truth_path=None)
    emitter = memory_emitter(service="gateway", replica="gw-0")
    with running_server(engine_app(engine)) as r1:
        upstreams = {"r1": r1, "r2": f"http://127.0.0.1:{free_port()}"}
        keys = {"sk-good": (100.0, 100.0), "sk-tiny": (0.001, 1.0)}
        with running_server(gateway_middleware(create_app(upstreams, keys), emitter)) as gateway:
            yield gateway, emitter


def _post(url: str, key: str, user: str, rid: str) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}", "x-request-id": rid}
    return httpx.post(f"{url}/v1/chat/completions", json={**BODY, "user": user}, headers=headers, timeout=10)


def test_unknown_key_401_and_rate_limit_429(stack) -> None:
    gateway, emitter = stack
    assert _post(gateway, "sk-wrong", "u", "rid-401").status_code == 401
    user = next(f"u{i}" for i in range(100) if home_replica(f"u{i}", ["r1", "r2"]) == "r1")
    assert _post(gateway, "sk-tiny", user, "rid-ok").status_code == 200
    assert _post(gateway, "sk-tiny", user, "rid-429").status_code == 429
    hops = {(e["request_id"], e["hop"]) for e in events_of(emitter)}
    assert ("rid-401", "gateway.rejected") in hops and ("rid-401", "gateway.admitted") not in hops
    assert ("rid-429", "gateway.rejected") in hops
    assert ("rid-ok", "gateway.admitted") in hops


def test_dead_replica_fails_over_and_affinity_follows(stack) -> None:
    gateway, emitter = stack
    user = next(f"u{i}" for i in range(100) if home_replica(f"u{i}", ["r1", "r2"]) == "r2")
    first = _post(gateway, "sk-good", user, "rid-failover")
    assert first.status_code == 200 and "data: [DONE]" in first.text
    second = _post(gateway, "sk-good", user, "rid-sticky")
    assert second.status_code == 200
    forwarded = [e for e in events_of(emitter) if e["hop"] == "gateway.forwarded"]
    # the home replica r2 is dead: attempt 0 went to r2, attempt 1 to r1 ...
    assert [(e["upstream"], e["attempt"]) for e in forwarded if e["request_id"] == "rid-failover"] == [
        ("r2", 0),
        ("r1", 1),
    ]
    # ... and the conversation now sticks to r1, which served it
    assert [(e["upstream"], e["attempt"]) for e in forwarded if e["request_id"] == "rid-sticky"] == [
        ("r1", 0)
    ]
