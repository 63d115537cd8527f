"""``new_connection_per_request``: a client that does not reuse connections pays connect + TLS
on every request.

A rise of ``connect`` in a scope (a replica) whose new connections are mostly such a client's,
that opened one per request before the rise too, and whose handshakes take no longer than its
own did before, is this finding's (``brings_rise_of``, ``brought``): the client's traffic came to
that scope (a router's choice, a chance run of its conversations), nothing got slower; the rise
is said with the pitfall, never as a shift that pages on its own."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl
from hopline.analyzer.findings.common import columns, in_scope, ms, narrow, scoped
from hopline.analyzer.findings.detector import Context, Detector
from hopline.analyzer.findings.model import Pitfall, Scope, Shift, pitfall, to_second


@dataclass(frozen=True)
class NewConnectionPerRequest(Detector):
    name = "new_connection_per_request"
    side = "client"
    kind = "pitfall"
    needs = ("conn_reused",)
    brings_rise_of = "connect"
    new_conn_share: float = 0.5  # share of requests opening a connection
    min_requests: int = 20  # a scope needs this many requests to be judged
    carried_share: float = 0.8  # of a connect rise's new connections, the client's: the rise is its traffic
    slower: float = 1.5  # its handshakes this much slower than its own before: the rise is the network's
    min_before: int = 10  # the client's requests before a rise, to tell its habit then

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

    def brought(self, rise: Shift, frame: pl.DataFrame, ctx: Context) -> Scope | None:
        """This finding's scope when ``rise`` (of ``connect``, a handshake, not a pool wait) is
        its client's traffic come to the rise's scope: of the connections opened there from the
        rise's onset (to its end), at least ``carried_share`` are the client's, the client opened
        one for at least ``new_conn_share`` of its requests before the onset too (anywhere), and
        its handshakes there are under ``slower`` times its own before."""
        if rise.part == "pool_wait" or not rise.up:
            return None
        read = columns(frame, "conn_reused", "service", "connect", "start", *rise.scope)
        if not {"conn_reused", "service", "connect", "start", *rise.scope} <= set(read.columns):
            return None
        at = to_second(rise.at)
        start = pl.col("start")
        during = (start >= at) & (start < (to_second(rise.until) if rise.until is not None else float("inf")))
        known = read.filter(pl.col("conn_reused").is_not_null())
        opened = known.filter(~pl.col("conn_reused") & in_scope(rise.scope).fill_null(False) & during)
        for found in self.detect(frame, ctx):
            if not found.scope:
                continue
            own = in_scope(found.scope).fill_null(False)
            theirs = opened.filter(own)
            if not opened.height or theirs.height < self.carried_share * opened.height:
                continue
            earlier = known.filter(own & (start < at))
            if earlier.height < self.min_before or (~earlier["conn_reused"]).mean() < self.new_conn_share:
                continue  # the client began opening connections with the rise: its own change
            before = earlier.filter(~pl.col("conn_reused"))["connect"].median()
            now = theirs["connect"].median()
            if before is not None and now is not None and now < self.slower * before:
                return found.scope
        return None
