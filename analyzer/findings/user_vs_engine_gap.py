"""``user_vs_engine_gap``: users wait far longer for the first token than the engine takes;
which of connect / network / gateway takes the difference, and when it is network time, whether
a busy process's event loop accounts for it (``lateness.level``: said so, not blamed on the wire). Its cost is the gap beyond
``gap_min_ms``, spent in that part. With disaggregated prefill/decode the engines' TTFT is the
prefill instance's whole answer plus the decode instance's TTFT (``engine_time``): the prefill
leg is engine time, not a gap."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl
from hopline.analyzer.findings import lateness
from hopline.analyzer.findings.common import columns, ms, narrow, scoped
from hopline.analyzer.findings.detector import Context, Detector
from hopline.analyzer.findings.model import Pitfall, pitfall

PARTS = ("connect", "network", "gateway")


@dataclass(frozen=True)
class UserVsEngineGap(Detector):
    name = "user_vs_engine_gap"
    kind = "pitfall"
    needs = ("client_ttft", "engine_ttft")
    gap_factor: float = 1.5  # user TTFT p50 / engine TTFT p50
    gap_min_ms: float = 50.0  # and the gap's p50 at least this
    min_requests: int = 20  # a scope needs this many requests to be judged

    def detect(self, frame: pl.DataFrame, ctx: Context) -> list[Pitfall]:
        lags = tuple(lateness.LAG_COLUMNS.values())
        both = columns(frame, "client_ttft", "engine_ttft", "service", *PARTS, *lags, "start", "prefill_last", "prefill_received").filter(
            pl.col("client_ttft").is_not_null() & pl.col("engine_ttft").is_not_null()
        )
        both = both.with_columns(engine_ttft=engine_time(both))
        scopes = scoped(both, "service", self.min_requests)
        hits = []
        for scope, part in scopes:
            if part.height < self.min_requests:
                continue
            found = self._judge(scope, part)
            if found is not None:
                hits.append((scope, found))
        return narrow(hits, len(scopes))

    def _judge(self, scope: dict, part: pl.DataFrame) -> Pitfall | None:
        """``part``'s ``engine_ttft`` is ``engine_time``'s."""
        s = part.select(
            user=pl.col("client_ttft").median(),
            engine=pl.col("engine_ttft").median(),
            gap=(pl.col("client_ttft") - pl.col("engine_ttft")).median(),
            # the users' cost is the gap beyond the acceptable one: a few tens of ms of network and
            # gateway are the price of any deployment, and on a busy client machine they would
            # otherwise add up to outrank a real incident
            excess=(pl.col("client_ttft") - pl.col("engine_ttft") - self.gap_min_ms / 1e3).clip(lower_bound=0).sum(),
            **{p: pl.col(p).fill_null(0).mean() for p in PARTS},
        ).row(0, named=True)
        if s["gap"] * 1e3 < self.gap_min_ms or s["user"] < self.gap_factor * s["engine"]:
            return None
        total = sum(s[p] for p in PARTS) or 1.0
        shares = {p: s[p] / total for p in PARTS}
        main = max(shares, key=shares.__getitem__)
        where = f" for service {scope['service']}" if scope else ""
        summary = (
            f"users wait {s['user'] / s['engine']:.1f}× the engine's TTFT{where} (p50 {ms(s['user']):.0f} vs "
            f"{ms(s['engine']):.0f} ms); {main} takes {shares[main] * 100:.0f}% of the {ms(s['gap']):.0f} ms gap"
        )
        late = lateness.level(part, main)
        if late is not None:  # the time no endpoint stamps is a busy process's, not the wire's
            side, late_ms = late
            summary += (
                f"; it is mostly the {side}'s own event loop running late (p50 {late_ms:.0f} ms): "
                f"a busy {'calling process' if side == 'client' else side + ' server'}, not the wire"
            )
        evidence = {
            "client_ttft_p50_ms": ms(s["user"]),
            "engine_ttft_p50_ms": ms(s["engine"]),
            "gap_p50_ms": ms(s["gap"]),
            "gap_over_acceptable_s": round(s["excess"], 3),
            **{f"{p}_mean_ms": ms(s[p]) for p in PARTS},
            **{f"{p}_share_of_gap": round(shares[p], 3) for p in PARTS},
            "main": main,
        }
        return pitfall(self.name, scope, part.height, evidence, summary, s["excess"], main)


def engine_time(frame: pl.DataFrame) -> pl.Expr:
    """The engines' part of the TTFT: the engine's TTFT, plus a P/D prefill instance's arrival to
    its answer (``prefill_last - prefill_received``, on its own clock) where there was one."""
    if "prefill_last" not in frame.columns or "prefill_received" not in frame.columns:
        return pl.col("engine_ttft")
    return pl.col("engine_ttft") + (pl.col("prefill_last") - pl.col("prefill_received")).fill_null(0.0)
