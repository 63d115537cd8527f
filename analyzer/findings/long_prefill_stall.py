"""``long_prefill_stall``: a very long prompt prefilled in one piece (no chunked prefill) stalls
the output of every request decoding on the instance that prefilled it: their largest output gap
lines up with it, more often than chance would line them up.

Where: a prefill ran on its request's ``replica``, or, in a disaggregated (P/D) log, on its
``prefill_replica`` (its interval on that instance's clock, ending at ``prefill_last``); a
decode instance prefilled a prompt itself when the proxy sent it there alone (no prefill leg:
the request's ``replica``). A long prefill stalls only the decodes of the instance where it ran
(a request's ``decode_replica``, else its ``replica``): a prompt prefilled on p1 never stalls
d1's decodes. The finding is scoped to where its evidence is, the stalled requests' decode
instance (``replica``). Every interval and gap is on that one instance's clock: skew-free by
construction.

The stalled requests are those whose largest gap began during another request's long prefill
there (or ``stall_slack_s`` before it) and lasted ``stall_share`` of it. Beyond chance: output
gaps come anyway (a preemption, a host pause), and on a busy replica some fall during a long
prefill by chance. A prefill in one piece holds every stream decoding beside it from its first
moment, so a stall's gap begins as the prefill begins (within ``aligned_s``: the demo's engine
puts them within 45 ms), where a gap that came by chance begins anywhere. Per instance, the
candidates are the requests decoding there whose largest gap is long enough to be a stall
(``stall_share`` of its shortest long prefill); the stalled ones whose gap began within
``aligned_s`` of their prefill's begin are counted, and chance would place about the sum, over
the candidates, of the share of the gap's possible starts (from ``engine_first`` to the end of
its ``decode`` less the gap) within ``aligned_s`` of a long prefill's begin there. A finding
needs a count that a Poisson variable of that mean reaches with a probability under ``alpha``
(over the instances tested: Bonferroni); the Poisson tail bounds that of the sum of unequal chances from above
(Anderson and Samuels, 1967): a conservative test. Gaps that one cause opens on many requests at
once (a host pause as a long prefill began) are not told from a stall: they are one.

It is a prefill rise's consequence when it began after one in its scope (``caused_by_rise_of``:
a prefill regression makes long prompts' prefills long enough to stall the other streams, and
"enable chunked prefill" would be the wrong advice); and it brings a queue rise with it when
most of the seconds the rise's requests waited were spent behind its long prefills
(``brings_rise_of``, ``brought``: without chunked prefill a request that arrives during a long
prefill waits until it ends; "the queue grew" would send the user to add replicas).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import polars as pl
from hopline.analyzer.findings.common import columns, in_scope, ms
from hopline.analyzer.findings.detector import Context, Detector
from hopline.analyzer.findings.model import Pitfall, Scope, Shift, pitfall, to_second

MIN_RANGE_S = 1e-3  # a gap that filled its whole decode could start only here: chance ~ 0 or 1


@dataclass(frozen=True)
class LongPrefillStall(Detector):
    name = "long_prefill_stall"
    kind = "pitfall"
    needs = ("replica", "prefill", "engine_first", "engine_max_gap_at")
    caused_by_rise_of = "prefill"
    brings_rise_of = "queue"
    long_prompt_factor: float = 8.0  # prompt >= this x the instance's median prompt ...
    long_prefill_factor: float = 10.0  # ... or prefill >= this x the median prefill
    long_prefill_min_s: float = 0.5  # and the prefill took at least this long
    stall_share: float = 0.5  # a stalled request's largest gap is >= this share of the prefill
    stall_slack_s: float = 0.05  # the gap may begin this much before / after the prefill
    aligned_s: float = 0.1  # a stall's gap begins within this of its prefill's begin ...
    alpha: float = 1e-3  # ... more often than chance: Poisson tail under this, Bonferroni over instances
    brought_share: float = 0.5  # a queue rise is a stall's when this share of its wait was behind it

    def detect(self, frame: pl.DataFrame, ctx: Context) -> list[Pitfall]:
        """Long prefills and the output gaps that line up with them, per instance, matched with
        an as-of join on that instance's clock; kept where their gaps began as the prefills did
        beyond chance."""
        long = long_prefills(frame, self)
        if long.height == 0:
            return []
        gaps = decode_gaps(frame)
        stalled = self._stalled(gaps, long)
        if stalled.height == 0:
            return []
        chance = self._by_chance(gaps, long)
        tests = chance.height
        findings = []
        for (replica,), part in stalled.group_by("replica", maintain_order=True):
            aligned = part.filter((pl.col("gap_at") - pl.col("begin")).abs() <= self.aligned_s).height
            expected = float(chance.filter(pl.col("replica") == replica)["expected"].sum())
            if poisson_sf(aligned, expected) >= self.alpha / max(tests, 1):
                continue
            mine = long.filter(pl.col("replica") == replica)
            culprits = mine.filter(pl.col("long_id").is_in(part["long_id"].implode()))
            findings.append(self._finding(replica, culprits, part, aligned, expected))
        return findings

    def _stalled(self, gaps: pl.DataFrame, long: pl.DataFrame) -> pl.DataFrame:
        """The requests whose largest output gap lines up with another request's long prefill
        on the instance that decoded them (``long_id``: that prefill's request)."""
        gaps = gaps.sort("gap_at")
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
        return pl.concat([stalled, early]).unique("request_id", keep="first", maintain_order=True)

    def _by_chance(self, gaps: pl.DataFrame, long: pl.DataFrame) -> pl.DataFrame:
        """Per instance with long prefills and candidates (gaps long enough for its shortest long
        prefill): ``expected``, how many of the candidates' gaps would begin within ``aligned_s``
        of one of its long prefills' begin were each gap's start uniform over its possible starts."""
        shortest = long.group_by("replica").agg(shortest=pl.col("long_prefill").min())
        latest = pl.max_horizontal(pl.col("last") - pl.col("gap_s"), pl.col("first") + MIN_RANGE_S)
        rows = (
            gaps.join(shortest, on="replica")
            .filter(pl.col("gap_s") >= self.stall_share * pl.col("shortest"))
            .select("replica", a=pl.col("first"), b=latest)
        )
        at = pl.col("begin")
        busy = merged(long.select("replica", begin=at - self.aligned_s, end=at + self.aligned_s))
        covered = _busy_until(rows, "b", busy) - _busy_until(rows, "a", busy)
        return (
            rows.with_columns(p=(covered / (pl.col("b") - pl.col("a"))).clip(0.0, 1.0))
            .group_by("replica", maintain_order=True)
            .agg(expected=pl.col("p").sum())
        )

    def _finding(
        self, replica: str, culprits: pl.DataFrame, part: pl.DataFrame, aligned: int, expected: float
    ) -> Pitfall:
        evidence = {
            "replica": replica,
            "long_prompts": culprits.height,
            "prompt_tokens_max": culprits["long_prompt"].max(),
            "prefill_max_ms": ms(culprits["long_prefill"].max()),
            "stalled_requests": part.height,
            "aligned_with_prefill_begin": aligned,
            "aligned_by_chance": round(expected, 2),
            "stall_gap_p50_ms": ms(part["gap_s"].median()),
            "stall_gap_max_ms": ms(part["gap_s"].max()),
        }
        summary = (
            f"{culprits.height} long prompt{'s' if culprits.height != 1 else ''} (up to {culprits['long_prompt'].max() or 0:,} tokens) "
            f"prefilled on {replica} for up to {culprits['long_prefill'].max():.1f} s in one piece and stalled "
            f"{part.height} other requests' output there (largest gap p50 {part['gap_s'].median():.1f} s; "
            f"{aligned} began as a long prefill did, chance would put {expected:.1f}); enable chunked prefill"
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
        """The instance whose long prefills held most of the seconds ``rise``'s requests (in its
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


def poisson_sf(k: int, mean: float) -> float:
    """P(X >= k) for X ~ Poisson(``mean``)."""
    if k <= 0:
        return 1.0
    if mean <= 0:
        return 0.0
    log_mean = math.log(mean)
    below = math.fsum(math.exp(j * log_mean - mean - math.lgamma(j + 1)) for j in range(k))
    return max(0.0, 1.0 - below)


def _read(tl: pl.DataFrame, *names: str) -> tuple[pl.DataFrame, dict[str, pl.Expr]]:
    """``tl`` narrowed to ``names``, and each name as an expression (a typed null when absent)."""
    read = columns(tl, *names)
    types = {"replica": pl.String, "prefill_replica": pl.String, "decode_replica": pl.String,
             "request_id": pl.String, "prompt_tokens": pl.Int64}  # fmt: skip
    typed = {n: types.get(n, pl.Float64) for n in names}
    return read, {n: pl.col(n).cast(t) if n in read.columns else pl.lit(None, t) for n, t in typed.items()}


def prefill_rows(tl: pl.DataFrame) -> pl.DataFrame:
    """Each request's prefill where it ran, in ``tl``'s order: replica (the instance: the
    ``prefill_replica`` of a P/D request, else its ``replica``), request_id, begin, end (on that
    instance's clock: the prefill instance's ``prefill_last``, else ``engine_first``), prefill,
    prompt_tokens, queue (its wait before the prefill, on the same instance); null where unknown.
    Only the columns the live horizon keeps (``analyzer.live.detector.NOT_KEPT``) are read."""
    read, c = _read(tl, "replica", "prefill_replica", "request_id", "prefill", "prompt_tokens", "queue",
                    "engine_first", "prefill_last")  # fmt: skip
    pd = c["prefill_replica"].is_not_null() & c["prefill_last"].is_not_null()
    end = pl.when(pd).then(c["prefill_last"]).otherwise(c["engine_first"])
    return read.select(
        replica=pl.when(pd).then(c["prefill_replica"]).otherwise(c["replica"]),
        request_id=c["request_id"],
        begin=end - c["prefill"],
        end=end,
        prefill=c["prefill"],
        prompt_tokens=c["prompt_tokens"],
        queue=c["queue"],
    )


def decode_gaps(tl: pl.DataFrame) -> pl.DataFrame:
    """The requests with a largest output gap, on the clock of the instance that decoded them:
    replica (``decode_replica``, else ``replica``), request_id, first and last (the engine's
    first token, and the end of its ``decode``), gap_at, gap_s."""
    read, c = _read(tl, "replica", "decode_replica", "request_id", "engine_first", "decode",
                    "engine_max_gap_at", "engine_max_gap_s")  # fmt: skip
    return read.select(
        replica=pl.coalesce(c["decode_replica"], c["replica"]),
        request_id=c["request_id"],
        first=c["engine_first"],
        last=c["engine_first"] + c["decode"],
        gap_at=c["engine_max_gap_at"],
        gap_s=c["engine_max_gap_s"],
    ).drop_nulls()


def long_prefills(tl: pl.DataFrame, how: LongPrefillStall = LongPrefillStall()) -> pl.DataFrame:
    """The long prefills of ``tl`` (``prefill_rows``), on their instance's clock: replica (the
    instance), long_id, begin, end, long_prefill, long_prompt; sorted by begin. A prompt is long
    against the median of those the instance served: it prefilled, or (P/D) decoded after
    another instance prefilled them (a decode instance that prefills only the prompts sent to it
    alone compares them with the ones it decodes)."""
    rows = prefill_rows(tl).drop_nulls(["replica", "end", "prefill"])
    read, c = _read(tl, "replica", "prefill_replica", "prefill_last", "prompt_tokens")
    pd = c["prefill_replica"].is_not_null() & c["prefill_last"].is_not_null()
    decoded = read.filter(pd).select(replica=c["replica"], prompt_tokens=c["prompt_tokens"])
    served = pl.concat([rows.select("replica", "prompt_tokens"), decoded])
    return (
        rows.join(served.group_by("replica").agg(med_prompt=pl.col("prompt_tokens").median()), on="replica", how="left")  # fmt: skip
        .with_columns(med_prefill=pl.col("prefill").median().over("replica"))
        .filter(
            (pl.col("prefill") >= how.long_prefill_min_s)
            & (
                (pl.col("prompt_tokens") >= how.long_prompt_factor * pl.col("med_prompt")).fill_null(False)
                | (pl.col("prefill") >= how.long_prefill_factor * pl.col("med_prefill"))
            )
        )
        .select(
            "replica",
            "begin",
            "end",
            long_id=pl.col("request_id"),
            long_prefill=pl.col("prefill"),
            long_prompt=pl.col("prompt_tokens"),
        )
        .sort("begin")
    )


def merged(intervals: pl.DataFrame) -> pl.DataFrame:
    """``intervals`` (replica, begin, end) as disjoint busy runs per replica (overlapping ones,
    e.g. prefills of one batch, count once), with ``before``: their busy seconds before each;
    sorted by begin."""
    return (
        intervals.sort("replica", "begin")
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


def _busy_until(at: pl.DataFrame, t: str, busy: pl.DataFrame) -> pl.Series:
    """For each row of ``at`` (in its order): the seconds of ``busy`` (``merged``) on its
    replica up to time column ``t``."""
    joined = (
        at.with_row_index("_row")
        .sort(t)
        .join_asof(busy, left_on=t, right_on="begin", by="replica", strategy="backward", check_sortedness=False)
        .sort("_row")
    )
    inside = (pl.col(t) - pl.col("begin")).clip(0.0, pl.col("end") - pl.col("begin"))
    return joined.select((pl.col("before") + inside).fill_null(0.0)).to_series()


def queued_behind_long_prefills(tl: pl.DataFrame, long: pl.DataFrame) -> pl.DataFrame:
    """Per request of ``tl`` with a queue time before its prefill (``prefill_rows``: on the
    instance that prefilled it): replica (that instance), queue and ``behind``, the seconds of
    that wait spent while one of ``long`` (``long_prefills`` of the whole log) ran there (their
    union: prefills in one batch count once). Without chunked prefill a request that arrives
    during a long prefill waits for its end: ``behind`` ≈ ``queue``."""
    rows = (
        prefill_rows(tl)
        .drop_nulls(["replica", "begin", "queue"])
        .select("replica", "queue", q_end=pl.col("begin"))
        .with_columns(q_begin=pl.col("q_end") - pl.col("queue"))
    )
    if rows.height == 0 or long.height == 0:
        return rows.select("replica", "queue", behind=pl.lit(0.0))
    busy = merged(long.select("replica", "begin", "end"))
    behind = _busy_until(rows, "q_end", busy) - _busy_until(rows, "q_begin", busy)
    return rows.select("replica", "queue", behind=behind)
