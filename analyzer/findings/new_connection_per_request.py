"""``new_connection_per_request``: a client that does not reuse connections pays connect + TLS
on every request."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl
from hopline.analyzer.findings.common import columns, ms, narrow, scoped
from hopline.analyzer.findings.detector import Context, Detector
from hopline.analyzer.findings.model import Pitfall, pitfall


@dataclass(frozen=True)
class NewConnectionPerRequest(Detector):
    name = "new_connection_per_request"
    side = "client"
    kind = "pitfall"
    needs = ("conn_reused",)
    new_conn_share: float = 0.5  # share of requests opening a connection
    min_requests: int = 20  # a scope needs this many requests to be judged

    def detect(self, frame: pl.DataFrame, ctx: Context) -> list[Pitfall]:
        read = columns(frame, "conn_reused", "service", "connect", "client_ttft", "client_e2e")
        known = read.filter(pl.col("conn_reused").is_not_null())
        scopes = scoped(known, "service", self.min_requests)
        hits = []
        for scope, part in scopes:
            if part.height < self.min_requests:
                continue
            new = part.filter(~pl.col("conn_reused"))
            share = new.height / part.height
            if share >= self.new_conn_share:
                hits.append((scope, self._finding(scope, new, share)))
        return narrow(hits, len(scopes))

    def _finding(self, scope: dict, new: pl.DataFrame, share: float) -> Pitfall:
        s = new.select(
            connect_p50=pl.col("connect").median(),
            connect_mean=pl.col("connect").mean(),
            connect_total=pl.col("connect").sum(),
            share_of_ttft=pl.col("connect").sum() / pl.coalesce("client_ttft", "client_e2e").sum(),
        ).row(0, named=True)
        who = f"service {scope['service']} opens" if scope else "clients open"
        summary = (
            f"{who} a new connection for {share * 100:.0f}% of requests, adding {ms(s['connect_p50']):.0f} ms "
            f"(p50 connect + TLS) to their TTFT; reuse one HTTP client and read each response to its end "
            "(the OpenAI SDK's synchronous client closes every stream at [DONE], before its end, so its "
            "streamed calls never reuse a connection: stream with AsyncOpenAI)"
        )
        evidence = {
            "new_connection_share": round(share, 3),
            "new_connections": new.height,
            "connect_p50_ms": ms(s["connect_p50"]),
            "connect_mean_ms": ms(s["connect_mean"]),
            "connect_share_of_ttft": round(s["share_of_ttft"], 3) if s["share_of_ttft"] is not None else None,
        }
        return pitfall(self.name, scope, new.height, evidence, summary, s["connect_total"] or 0.0, "connect")
