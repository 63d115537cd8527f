"""The middleware's http:// sink posting to a real collector with a token."""

from __future__ import annotations

import time

from hopline.collector.config import CollectorConfig
from hopline.middleware.contract import EMITTER_STATS_HOP
from hopline.middleware.emit import Emitter
from hopline.middleware.sinks import HttpSink
from support.collector import serve, stored_lines


def test_http_sink_with_token_reaches_the_store_and_the_join(tmp_path):
    config = CollectorConfig(data_dir=tmp_path / "data", token="t0ken", grace=0)
    with serve(config) as c:
        emitter = Emitter(HttpSink(c.url, token="t0ken"), service="kite-chat", replica="r1", model="m")
        t = time.time()
        for i in range(20):
            rid = f"sink-{i}"
            emitter.emit("engine.received", rid, t, stream=True)
            emitter.emit("engine.first_token", rid, t + 0.05)
            emitter.emit("engine.last_token", rid, t + 0.5, output_tokens=12)
        emitter.close()
        assert emitter.stats()["sent"] == 60 and emitter.stats()["dropped"] == 0
        stored = stored_lines(config.data_dir)
        # the 60 hop events, then the emitter's final health report (stored, exposed, not joined)
        assert [e["hop"] for e in stored].count(EMITTER_STATS_HOP) == 1 and stored[-1]["sent"] == 60
        assert len(stored) == 61
        # the read endpoints need the token too (no read token configured)
        assert c.client.get("/v1/requests/sink-7").status_code == 401
        c.client.headers["Authorization"] = "Bearer t0ken"
        got = c.client.get("/v1/requests/sink-7").json()
        assert got["state"] == "complete"
        assert got["stages"]["engine_ttft"] == got["hops"][1]["ts"] - got["hops"][0]["ts"]
        reg = c.collector.registry
        # engine hops only: the service is the engine's (the rule book's last source)
        assert (
            reg.get_sample_value(
                "hopline_ttft_seconds_count",
                {"view": "engine", "service": "kite-chat", "model": "m", "replica": "r1"},
            )
            == 20
        )
        # a sink with the wrong token is refused (401): nothing stored, the sink counts the drop
        wrong = Emitter(HttpSink(c.url, token="wrong"), service="kite-chat")
        wrong.emit("engine.received", "intruder", t, stream=True)
        wrong.close()
        assert wrong.stats()["dropped"] == 1
        assert c.client.get("/v1/requests/intruder").status_code == 404
        assert len(stored_lines(config.data_dir)) == 61
        assert reg.get_sample_value("hopline_emitter_events_sent_total", {"service": "kite-chat", "replica": "r1"}) == 60
