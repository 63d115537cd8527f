"""``long_prefill_stall``: a very long prompt prefilled in one piece (no chunked prefill) stalls
the output of every request decoding on that replica: their largest output gap lines up with it.

It is a prefill rise's consequence when it began after one in its scope (``caused_by_rise_of``:
a prefill regression makes long prompts' prefills long enough to stall the other streams, and
"enable chunked prefill" would be the wrong advice); and it brings a queue rise with it when
most of the seconds the rise's requests waited were spent behind its long prefills
(``brings_rise_of``, ``brought``: without chunked prefill a request that arrives during a long
prefill waits until it ends; "the queue grew" would send the user to add replicas).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl
from hopline.analyzer.findings.common import columns, ms
from hopline.analyzer.findings.detector import Context, Detector
from hopline.analyzer.findings.model import Pitfall, Scope, Shift, pitfall, to_second
from hopline.analyzer.findings.common import in_scope


def engine_rows(tl: pl.DataFrame) -> pl.DataFrame:
    """The requests with a replica, a prefill and the engine's first token: what the engine's
    clock places."""
    return tl.filter(
        pl.col("replica").is_not_null()
        & pl.col("prefill").is_not_null()
        & pl.col("engine_first").is_not_null()
    )


@dataclass(frozen=True)
class LongPrefillStall(Detector):
    name = "long_prefill_stall"
    kind = "pitfall"
    needs = ("replica", "prefill", "engine_first", "engine_max_gap_at")
    caused_by_rise_of = "prefill"
    brings_rise_of = "queue"
    long_prompt_factor: float = 8.0  # prompt >= this x the replica's median prompt ...
    long_prefill_factor: float = 10.0  # ... or prefill >= this x the median prefill
    long_prefill_min_s: float = 0.5  # and the prefill took at least this long
    stall_share: float = 0.5  # a stalled request's largest gap is >= this share of the prefill
    stall_slack_s: float = 0.05  # the gap may begin this much before / after the prefill
    brought_share: float = 0.5  # a queue rise is a stall's when this share of its wait was behind it

    def detect(self, frame: pl.DataFrame, ctx: Context) -> list[Pitfall]:
        """Long prefills and the output gaps that line up with them, per replica, on the engine's
        own clock (prefill interval = [engine_first - prefill, engine_first]; the stalled
        request's ``engine_max_gap_at``), matched with an as-of join: skew-free by construction."""
        read = columns(frame, "replica", "request_id", "prefill", "prompt_tokens", "engine_first", "engine_max_gap_at",
                       "engine_max_gap_s")  # fmt: skip
        base = engine_rows(read)
        if base.height == 0:
            return []
        long = long_prefills(base, self)  # base is already what long_prefills filters to
        if long.height == 0:
            return []
        stalled = self._stalled(base, long)
        findings = []
        for (replica,), part in stalled.group_by("replica", maintain_order=True):
            mine = long.filter(pl.col("replica") == replica)
            culprits = mine.filter(pl.col("long_id").is_in(part["long_id"].implode()))
            findings.append(self._finding(replica, culprits, part))
        return findings

    def _stalled(self, base: pl.DataFrame, long: pl.DataFrame) -> pl.DataFrame:
        """The requests whose largest output gap lines up with another request's long prefill
        on their replica (``long_id``: that prefill's request)."""
        gaps = (
            base.filter(pl.col("engine_max_gap_at").is_not_null())
            .select("replica", "request_id", gap_at=pl.col("engine_max_gap_at"), gap_s=pl.col("engine_max_gap_s"))
            .sort("gap_at")
        )
        other = pl.col("long_id").is_not_null() & (pl.col("request_id") != pl.col("long_id"))
        long_enough = pl.col("gap_s") >= self.stall_share * pl.col("long_prefill")
        stalled = gaps.join_asof(
            long, left_on="gap_at", right_on="begin", by="replica", strategy="backward", tolerance=None,
            check_sortedness=False,
        ).filter(other & (pl.col("gap_at") <= pl.col("end") + self.stall_slack_s) & long_enough)  # fmt: skip
        # a gap that starts just before the prefill (scheduling slack) belongs to it too
        early = gaps.join_asof(
            long, left_on="gap_at", right_on="begin", by="replica", strategy="forward",
            tolerance=self.stall_slack_s, check_sortedness=False,
        ).filter(other & long_enough)  # fmt: skip
        return pl.concat([stalled, early]).unique("request_id", keep="first")

    def _finding(self, replica: str, culprits: pl.DataFrame, part: pl.DataFrame) -> Pitfall:
        evidence = {
            "replica": replica,
            "long_prompts": culprits.height,
            "prompt_tokens_max": culprits["long_prompt"].max(),
            "prefill_max_ms": ms(culprits["long_prefill"].max()),
            "stalled_requests": part.height,
            "stall_gap_p50_ms": ms(part["gap_s"].median()),
            "stall_gap_max_ms": ms(part["gap_s"].max()),
        }
        summary = (
            f"{culprits.height} long prompt{'s' if culprits.height != 1 else ''} (up to {culprits['long_prompt'].max() or 0:,} tokens) "
            f"on replica {replica} prefilled for up to {culprits['long_prefill'].max():.1f} s in one piece and stalled "
            f"{part.height} other requests' output (largest gap p50 {part['gap_s'].median():.1f} s); enable chunked prefill"
        )
        return pitfall(
            self.name,
            {"replica": replica},
            part.height,
            evidence,
            summary,
            part["gap_s"].sum(),
            "decode",  # the stalled requests' output gaps
            at=culprits["begin"].min(),  # when the first long prefill began
        )

    def brought(self, rise: Shift, frame: pl.DataFrame, ctx: Context) -> Scope | None:
        """The replica whose long prefills held most of the seconds ``rise``'s requests (in its
        scope, from its onset to its end, at the contract's one-second resolution) queued, when
        they held at least ``brought_share`` of them."""
        window = pl.col("start") >= to_second(rise.at)
        if rise.until is not None:
            window &= pl.col("start") < to_second(rise.until)
        rose = frame.filter(in_scope(rise.scope).fill_null(False) & window)
        waits = queued_behind_long_prefills(rose, long_prefills(frame, self))
        per_replica = waits.group_by("replica").agg(pl.col("behind").sum())
        behind, queued = waits["behind"].sum(), waits["queue"].sum()
        if per_replica.height == 0 or queued <= 0 or behind < self.brought_share * queued:
            return None
        return {"replica": per_replica.sort("behind", descending=True)["replica"][0]}


def long_prefills(tl: pl.DataFrame, how: LongPrefillStall = LongPrefillStall()) -> pl.DataFrame:
    """The long prefills of ``tl``, on their replica's clock: replica, long_id, begin, end,
    long_prefill, long_prompt; sorted by begin."""
    return (
        engine_rows(tl)
        .with_columns(
            med_prompt=pl.col("prompt_tokens").median().over("replica"),
            med_prefill=pl.col("prefill").median().over("replica"),
        )
        .filter(
            (pl.col("prefill") >= how.long_prefill_min_s)
            & (
                (pl.col("prompt_tokens") >= how.long_prompt_factor * pl.col("med_prompt")).fill_null(False)
                | (pl.col("prefill") >= how.long_prefill_factor * pl.col("med_prefill"))
            )
        )
        .select(
            "replica",
            long_id=pl.col("request_id"),
            begin=pl.col("engine_first") - pl.col("prefill"),
            end=pl.col("engine_first"),
            long_prefill=pl.col("prefill"),
            long_prompt=pl.col("prompt_tokens"),
        )
        .sort("begin")
    )


def _busy_until(at: pl.DataFrame, t: str, busy: pl.DataFrame) -> pl.Series:
    """For each row of ``at`` (in its order): the seconds of ``busy`` (disjoint intervals per
    replica, ``before``: their busy seconds before each) on its replica up to time column ``t``."""
    joined = (
        at.with_row_index("_row")
        .sort(t)
        .join_asof(busy, left_on=t, right_on="begin", by="replica", strategy="backward", check_sortedness=False)
        .sort("_row")
    )
    inside = (pl.col(t) - pl.col("begin")).clip(0.0, pl.col("end") - pl.col("begin"))
    return joined.select((pl.col("before") + inside).fill_null(0.0)).to_series()


def queued_behind_long_prefills(tl: pl.DataFrame, long: pl.DataFrame) -> pl.DataFrame:
    """Per request of ``tl`` with a queue time on the engine's clock: replica, queue and
    ``behind``, the seconds of that wait spent while one of ``long`` (``long_prefills`` of the
    whole log) ran on its replica (their union: prefills in one batch count once). Without
    chunked prefill a request that arrives during a long prefill waits for its end: ``behind``
    ≈ ``queue``."""
    rows = (
        engine_rows(tl)
        .filter(pl.col("queue").is_not_null())
        .select("replica", "queue", q_end=pl.col("engine_first") - pl.col("prefill"))
        .with_columns(q_begin=pl.col("q_end") - pl.col("queue"))
    )
    if rows.height == 0 or long.height == 0:
        return rows.select("replica", "queue", behind=pl.lit(0.0))
    busy = (
        long.sort("replica", "begin")
        .with_columns(
            run=(pl.col("begin") > pl.col("end").cum_max().shift(1))
            .fill_null(True)
            .cum_sum()
            .over("replica")
        )
        .group_by("replica", "run")
        .agg(pl.col("begin").min(), pl.col("end").max())
        .with_columns(
            before=(pl.col("end") - pl.col("begin")).cum_sum().over("replica", order_by="begin")
            - (pl.col("end") - pl.col("begin"))
        )
        .sort("begin")
        .select("replica", "begin", "end", "before")
    )
    behind = _busy_until(rows, "q_end", busy) - _busy_until(rows, "q_begin", busy)
    return rows.select("replica", "queue", behind=behind)
