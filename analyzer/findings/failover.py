"""``failover``: a replica failed requests' first attempts and the gateway (or the client) retried
them elsewhere. It names the failing replica (``failed_replica``: where the first failed attempt
ran), how many first attempts it failed and with which status, from when, where the retries went
and what each retry added.

A request's ``replica`` is the one that served its last attempt, so a stage shift of a failover
("gateway time rose on r1, r2 and r4") names the healthy replicas. This detector owns that rise
(``brings_rise_of = "gateway"``, ``brought``): the shift is said with it, not apart.

The added time per retried request: for a gateway failover, its gateway stage (which holds the
failed try) over the mean of the requests that were not retried in the same span; for a client
retry, the time from its first send to its last attempt's (``client_sent - start``), which no
stage holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl
from hopline.analyzer.findings.common import ms
from hopline.analyzer.findings.detector import Context, Detector
from hopline.analyzer.findings.model import Pitfall, Scope, Shift, iso_utc, pitfall, to_second


@dataclass(frozen=True)
class Failover(Detector):
    name = "failover"
    side = "engine"  # the replica that failed the first attempts: its team acts, not the retrier
    kind = "pitfall"
    needs = ("failed_replica", "retries")
    brings_rise_of = "gateway"
    min_retried: int = 5  # retried first attempts a replica must have failed
    sudden_share: float = 0.5  # onset: the first window whose failed share is this x the usual
    brought_share: float = 0.5  # a gateway rise is the failover's when this share of its excess was retries'

    def detect(self, frame: pl.DataFrame, ctx: Context) -> list[Pitfall]:
        """Per failing replica: its retried requests (retried after their first attempt failed there)."""
        retried = retried_rows(frame)
        findings = []
        for (replica,), part in retried.group_by("failed_replica", maintain_order=True):
            if part.height >= self.min_retried:
                findings.append(self._finding(replica, part, frame, ctx))
        return findings

    def _finding(self, replica: str, part: pl.DataFrame, frame: pl.DataFrame, ctx: Context) -> Pitfall:
        at = self._onset(replica, part, frame, ctx)
        by_client = int((part["client_retries"].fill_null(0) > 0).sum()) * 2 > part.height
        added = self._added(part, frame, by_client)
        served = part.group_by("replica").len().sort("replica")
        where = [r for r in served["replica"].to_list() if r is not None]
        status = part["failed_status"].drop_nulls().mode().sort()
        status_word = f"answered {status[0]}" if len(status) else "failed"
        per = float(added.mean()) if added.len() else 0.0
        total = float(added.clip(0.0).sum())
        who = "client" if by_client else "gateway"
        evidence = {
            "failed_replica": replica,
            "status": None if not len(status) else int(status[0]),
            "failed_first_attempts": part.height,
            "retried_by": who,
            "served_by": ", ".join(f"{r}: {n}" for r, n in served.iter_rows() if r is not None),
            "added_ms_mean": ms(per),
            "added_s_total": round(total, 3),
        }
        adds = "of gateway time" if who == "gateway" else "before the answer began"
        summary = (
            f"replica {replica} {status_word} to {part.height:,} first attempts from {iso_utc(at)[11:19]}; "
            f"the {who} retried them on {_names(where)}, adding {per * 1e3:,.0f} ms {adds} each "
            f"({total:,.1f} s of users' time)"
        )
        spent_in = "gateway" if who == "gateway" else "retry"
        return pitfall(self.name, {"failed_replica": replica}, part.height, evidence, summary, total, spent_in, at=at)

    def _onset(self, replica: str, part: pl.DataFrame, frame: pl.DataFrame, ctx: Context) -> float:
        """The first failed first attempt of the first window where the replica's failed share of
        its first attempts reached ``sudden_share`` of its 90th-percentile window (sudden
        failures: the first of them; scattered ones: the first window that held many)."""
        origin = frame["start"].min()
        first = frame.filter(pl.col("first_replica") == replica).select(
            "start", failed=pl.col("request_id").is_in(part["request_id"].implode())
        )
        window = ((pl.col("start") - origin) // ctx.window_s).alias("w")
        shares = first.group_by(window).agg(share=pl.col("failed").mean()).sort("w")
        usual = shares["share"].quantile(0.9) or 0.0
        onset_w = shares.filter(pl.col("share") >= self.sudden_share * usual)["w"].min()
        started = part.filter(((pl.col("start") - origin) // ctx.window_s) >= (onset_w or 0))
        return float((started if started.height else part)["start"].min())

    @staticmethod
    def _added(part: pl.DataFrame, frame: pl.DataFrame, by_client: bool) -> pl.Series:
        """Per retried request, the time its failed try added (see the module docstring)."""
        if by_client:
            return part.select(added=pl.col("client_sent") - pl.col("start"))["added"].drop_nulls()
        lo, hi = part["start"].min(), part["start"].max()
        calm = frame.filter((pl.col("retries") == 0) & pl.col("start").is_between(lo, hi))["gateway"].mean()
        return part.select(added=pl.col("gateway") - (calm or 0.0))["added"].drop_nulls()

    def brought(self, rise: Shift, frame: pl.DataFrame, ctx: Context) -> Scope | None:
        """The failing replica whose retried requests carried at least ``brought_share`` of the
        gateway seconds ``rise``'s requests (its scope, from its onset to its end) spent above
        the median of the requests not retried meanwhile."""
        window = pl.col("start") >= to_second(rise.at)
        if rise.until is not None:
            window &= pl.col("start") < to_second(rise.until)
        scope = [pl.col(k).cast(pl.String) == v for k, v in rise.scope.items()]
        rose = frame.filter(pl.all_horizontal(pl.lit(True), *scope).fill_null(False) & window & pl.col("gateway").is_not_null())
        # the usual gateway time meanwhile: of the requests not retried (in any scope: after
        # its onset every request of a failing replica's scope may have been retried)
        calm = frame.filter(window & (pl.col("retries") == 0))["gateway"].median()
        if calm is None:
            return None
        excess = rose.with_columns(excess=(pl.col("gateway") - calm).clip(0.0))
        total = excess["excess"].sum()
        per = (
            excess.join(retried_rows(frame).select("request_id"), on="request_id", how="semi")
            .group_by("failed_replica")
            .agg(pl.col("excess").sum())
            .sort("excess", descending=True)
        )
        if per.height == 0 or total <= 0 or per["excess"][0] < self.brought_share * total:
            return None
        return {"failed_replica": per["failed_replica"][0]}


def retried_rows(frame: pl.DataFrame) -> pl.DataFrame:
    """Requests retried after their first attempt failed on a replica (``failed_replica`` is
    where it ran, ``first_replica`` the same replica)."""
    return frame.filter(
        pl.col("start").is_not_null()
        & (pl.col("retries") > 0)
        & pl.col("failed_replica").is_not_null()
        & (pl.col("failed_replica") == pl.col("first_replica"))
    )


def _names(values: list[str]) -> str:
    return values[0] if len(values) == 1 else ", ".join(values[:-1]) + " and " + values[-1]
