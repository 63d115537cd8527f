"""``GET /v1/requests?since=…&until=…&slowest=N``: recent requests' IDs with their TTFT (issue 11).

Before: the collector answered only ``/v1/requests/{id}``, so finding a slow request meant
already knowing its ID (``/v1/requests`` was a 404).
"""

from __future__ import annotations

from hopline.collector.config import CollectorConfig
from support.collector import serve
from support.events import event, ndjson
from support.servers import wait_until

NDJSON = {"Content-Type": "application/x-ndjson"}
T0 = 1767225600.0  # 2026-01-01T00:00:00Z
SCOPE = {"service": "kite-chat"}
ENGINE = {"model": "m", "replica": "r2"}


def streaming(rid: str, t: float, ttft_s: float) -> list[dict]:
    """A complete streaming request whose client TTFT is ``ttft_s`` and e2e ``ttft_s + 1``."""
    return [
        event("client.sent", rid, t, stream=True, conn_reused=True, **SCOPE),
        event("engine.received", rid, t + 0.01, stream=True, **ENGINE),
        event("engine.first_token", rid, t + ttft_s - 0.01, **ENGINE),
        event("client.first_token", rid, t + ttft_s),
        event("engine.last_token", rid, t + ttft_s + 0.99, output_tokens=20, **ENGINE),
        event("client.last_token", rid, t + ttft_s + 1.0, output_tokens=20),
    ]


def non_streaming(rid: str, t: float, e2e_s: float) -> list[dict]:
    return [
        event("client.sent", rid, t, stream=False, conn_reused=True, **SCOPE),
        event("engine.received", rid, t + 0.01, stream=False, **ENGINE),
        event("engine.last_token", rid, t + e2e_s - 0.01, output_tokens=5, **ENGINE),
        event("client.last_token", rid, t + e2e_s, output_tokens=5),
    ]


# five streaming requests 10 s apart, TTFT 0.2, 0.9, 0.4, 1.5, 0.3 s; one non-streaming of 4 s;
# one that never ends (closed as incomplete when its TTL runs out)
TTFTS = (0.2, 0.9, 0.4, 1.5, 0.3)


def all_events() -> list[dict]:
    events = [e for i, ttft in enumerate(TTFTS) for e in streaming(f"s{i}", T0 + 10 * i, ttft)]
    events += non_streaming("plain", T0 + 15, 4.0)
    events.append(event("client.sent", "hung", T0 + 25, stream=True, **SCOPE))
    return events


def ingest(c, events: list[dict]) -> None:
    r = c.client.post("/v1/events", content=ndjson(events), headers=NDJSON)
    assert r.status_code == 200 and r.json()["accepted"] == len(events), r.text


def test_slowest_requests_in_a_window_with_their_ttft_e2e_outcome_and_scope(tmp_path):
    with serve(CollectorConfig(data_dir=tmp_path / "data", grace=0.0, ttl=0.5)) as c:
        ingest(c, all_events())
        wait_until("the hung request to expire", lambda: c.collector.joiner.counts["expired"] == 1)

        everything = c.client.get("/v1/requests", params={"slowest": 2}).json()
        assert [r["request_id"] for r in everything["requests"]] == ["s3", "s1"]  # TTFT 1.5, 0.9
        top = everything["requests"][0]
        assert top == {
            "started": T0 + 30,
            "request_id": "s3",
            "ttft_s": top["ttft_s"],
            "ttft_view": "client",
            "e2e_s": top["e2e_s"],
            "e2e_view": "client",
            "outcome": "ok",
            "state": "complete",
            "service": "kite-chat",
            "model": "m",
            "replica": "r2",
        }
        assert abs(top["ttft_s"] - 1.5) < 1e-6 and abs(top["e2e_s"] - 2.5) < 1e-6
        # 7 requests: 5 ranked by TTFT; the non-streaming one and the hung one have none
        assert (everything["matched"], everything["unranked"], everything["kept"]) == (7, 2, 7)
        assert everything["capacity"] == 100_000 and everything["ranked_by"] == "ttft"

        # since / until as the analyzer's --since takes them: ISO (UTC when naive) or Unix seconds
        window = {"since": "2026-01-01T00:00:05Z", "until": str(T0 + 22), "slowest": 5}
        answer = c.client.get("/v1/requests", params=window).json()
        assert [r["request_id"] for r in answer["requests"]] == ["s1", "s2"]  # started at +10 and +20
        assert (answer["matched"], answer["unranked"]) == (3, 1)  # and "plain", at +15: no TTFT
        naive = c.client.get("/v1/requests", params={**window, "since": "2026-01-01T00:00:05"}).json()
        assert naive["requests"] == answer["requests"]

        by_e2e = c.client.get("/v1/requests", params={"slowest": 1, "by": "e2e"}).json()
        assert [r["request_id"] for r in by_e2e["requests"]] == ["plain"]  # 4 s end to end

        # without slowest: the newest finished first; the hung one is there, as incomplete
        newest = c.client.get("/v1/requests", params={"limit": 1}).json()["requests"]
        assert [(r["request_id"], r["outcome"], r["state"]) for r in newest] == [
            ("hung", "incomplete", "expired")
        ]


def test_bad_parameters_are_one_line_400s_naming_the_parameter(tmp_path):
    with serve(CollectorConfig(data_dir=tmp_path / "data", grace=0.0)) as c:
        cases = {
            "since=yesterday": "since: not a time: 'yesterday'",
            "slowest=0": "slowest must be a whole number from 1 to 10000, got '0'",
            "slowest=ten": "slowest must be a whole number",
            "by=queue": "by must be one of ttft, e2e, got 'queue'",
            "slowset=5": "unknown parameter 'slowset'",
            f"since={T0 + 10}&until={T0}": "since 2026-01-01T00:00:10.000Z is after until 2026-01-01T00:00:00.000Z",
            "until=nan": "until: not a time",
            "slowest=3&limit=5": "give slowest (the N slowest) or limit (the N newest), not both",
        }
        for query, message in cases.items():
            r = c.client.get(f"/v1/requests?{query}")
            assert r.status_code == 400, (query, r.text)
            assert r.json()["error"].startswith(message), (query, r.json())


def test_listing_needs_the_token_when_one_is_set(tmp_path):
    config = CollectorConfig(data_dir=tmp_path / "data", grace=0.0, token="s3cret")
    with serve(config) as c:
        c.client.headers["Authorization"] = "Bearer s3cret"
        ingest(c, streaming("auth-1", T0, 0.5))
        assert c.client.get("/v1/requests").json()["matched"] == 1
        del c.client.headers["Authorization"]
        r = c.client.get("/v1/requests")
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"


def test_memory_is_bounded_by_the_newest_capacity_summaries():
    from hopline.collector.recent import RecentRequests, Summary

    recent = RecentRequests(capacity=3)
    for i in range(5):
        recent.add(Summary(T0 + i, f"r{i}", 0.1, "client", 1.0, "client", "ok", "complete", None, None, None))
    assert [s.request_id for s in recent.snapshot()] == ["r2", "r3", "r4"]
