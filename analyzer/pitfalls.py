"""Known ways LLM serving goes wrong, recognised in the timelines, each with its evidence.

Every check takes the collected per-request frame of ``timelines.timelines`` and returns
``pitfall`` findings (DESIGN.md): ``name``, ``scope``, ``affected_requests``, ``evidence`` (numbers),
a one-sentence ``summary``, ``impact_s`` (users' seconds at stake, for ordering) and ``spent_in``
(the stage those seconds are spent in: the report weighs a decode cost against end-to-end time,
any other against the wait for the first output).

* ``user_vs_engine_gap``: users wait far longer for the first token than the engine takes; which
  of connect / network / gateway takes the difference. Its cost is the gap beyond ``gap_min_ms``.
* ``new_connection_per_request``: a client that does not reuse connections pays connect + TLS on
  every request.
* ``long_prefill_stall``: a very long prompt prefilled in one piece (no chunked prefill) stalls
  the output of every request decoding on that replica: their largest output gap lines up with it.
* ``no_max_tokens``: requests without ``max_tokens`` that ran long hold decode time and KV memory.
* ``verbose_outputs``: one service's answers are far longer than others' on the same model (the
  symptom of a wrong chat template or missing stop tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl
from hopline.analyzer.attribution import e2e
from hopline.analyzer.shifts import iso_utc


# A pitfall that a rise of this stage brings with it: when all of it falls in such a shift's scope
# and after its onset, it is said as the shift's consequence (its ``with_pitfalls``), not as a
# cause of its own. A prefill regression makes long prompts' prefills long enough to stall the
# other streams of their replica, and "enable chunked prefill" would be the wrong advice.
CAUSED_BY = {"long_prefill_stall": "prefill"}
# A rise of this stage that a pitfall brings with it: when most of the seconds users waited in it
# after the rise (in the rise's scope) were spent behind the pitfall's cause, the rise is said as
# the pitfall's consequence (its ``with_shifts``). Without chunked prefill a request that arrives
# during a long prefill waits in the queue until it ends; "the queue grew" would send the user to
# add replicas, when the fix is chunked prefill. ``queued_behind_long_prefills`` measures it.
BRINGS = {"long_prefill_stall": "queue"}


@dataclass(frozen=True)
class PitfallConfig:
    gap_factor: float = 1.5  # user TTFT p50 / engine TTFT p50
    gap_min_ms: float = 50.0  # and the gap's p50 at least this
    new_conn_share: float = 0.5  # share of requests opening a connection
    min_requests: int = 20  # a scope needs this many requests to be judged
    long_prompt_factor: float = 8.0  # prompt >= this x the replica's median prompt ...
    long_prefill_factor: float = 10.0  # ... or prefill >= this x the median prefill
    long_prefill_min_s: float = 0.5  # and the prefill took at least this long
    stall_share: float = 0.5  # a stalled request's largest gap is >= this share of the prefill
    stall_slack_s: float = 0.05  # the gap may begin this much before / after the prefill
    long_output_quantile: float = 0.9  # "ran long": above this quantile of capped requests
    verbose_factor: float = 2.0  # a service's p50 output tokens / the others' on the model
    brought_share: float = 0.5  # a queue rise is a stall's when this share of its wait was behind it


def _finding(
    name: str, scope: dict, affected: int, evidence: dict, summary: str, impact_s: float, spent_in: str
) -> dict:
    return {
        "kind": "pitfall",
        "summary": summary,
        "name": name,
        "scope": scope,
        "affected_requests": int(affected),
        "evidence": {k: (round(v, 4) if isinstance(v, float) else v) for k, v in evidence.items()},
        "impact_s": round(float(impact_s), 3),
        "spent_in": spent_in,
        "at": None,  # when it began, for the pitfalls that know (long_prefill_stall)
        "with_shifts": [],  # shifts it brought with it (report.fold_into_pitfalls)
    }


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1e3, 2)


def _scoped(tl: pl.DataFrame, dim: str, min_requests: int) -> list[tuple[dict, pl.DataFrame]]:
    """``[({}, all)]`` plus one entry per value of ``dim`` with enough requests."""
    out = [({}, tl)]
    if dim in tl.columns:
        for (value,), part in tl.filter(pl.col(dim).is_not_null()).group_by(dim, maintain_order=True):
            if part.height >= min_requests:
                out.append(({dim: value}, part))
    return out


def _narrow(hits: list[tuple[dict, dict]], scopes: int) -> list[dict]:
    """All-traffic finding when every value of the dimension (or only all traffic) is hit, else
    the values that are."""
    overall = [f for scope, f in hits if not scope]
    narrow = [f for scope, f in hits if scope]
    if narrow and len(narrow) < scopes - 1:
        return narrow
    return overall or narrow


def user_vs_engine_gap(tl: pl.DataFrame, cfg: PitfallConfig = PitfallConfig()) -> list[dict]:
    parts = ("connect", "network", "gateway")
    both = tl.filter(pl.col("client_ttft").is_not_null() & pl.col("engine_ttft").is_not_null())
    scoped = _scoped(both, "service", cfg.min_requests)
    hits = []
    for scope, part in scoped:
        if part.height < cfg.min_requests:
            continue
        s = part.select(
            user=pl.col("client_ttft").median(),
            engine=pl.col("engine_ttft").median(),
            gap=(pl.col("client_ttft") - pl.col("engine_ttft")).median(),
            # the users' cost is the gap beyond the acceptable one: a few tens of ms of network and
            # gateway are the price of any deployment, and on a busy client machine they would
            # otherwise add up to outrank a real incident
            excess=(pl.col("client_ttft") - pl.col("engine_ttft") - cfg.gap_min_ms / 1e3).clip(lower_bound=0).sum(),
            **{p: pl.col(p).fill_null(0).mean() for p in parts},
        ).row(0, named=True)
        if s["gap"] * 1e3 < cfg.gap_min_ms or s["user"] < cfg.gap_factor * s["engine"]:
            continue
        total = sum(s[p] for p in parts) or 1.0
        shares = {p: s[p] / total for p in parts}
        main = max(shares, key=shares.__getitem__)
        where = f" for service {scope['service']}" if scope else ""
        summary = (
            f"users wait {s['user'] / s['engine']:.1f}× the engine's TTFT{where} (p50 {_ms(s['user']):.0f} vs "
            f"{_ms(s['engine']):.0f} ms); {main} takes {shares[main] * 100:.0f}% of the {_ms(s['gap']):.0f} ms gap"
        )
        evidence = {
            "client_ttft_p50_ms": _ms(s["user"]),
            "engine_ttft_p50_ms": _ms(s["engine"]),
            "gap_p50_ms": _ms(s["gap"]),
            "gap_over_acceptable_s": round(s["excess"], 3),
            **{f"{p}_mean_ms": _ms(s[p]) for p in parts},
            **{f"{p}_share_of_gap": round(shares[p], 3) for p in parts},
            "main": main,
        }
        hits.append(
            (
                scope,
                _finding("user_vs_engine_gap", scope, part.height, evidence, summary, s["excess"], main),
            )
        )
    return _narrow(hits, len(scoped))


def new_connection_per_request(tl: pl.DataFrame, cfg: PitfallConfig = PitfallConfig()) -> list[dict]:
    known = tl.filter(pl.col("conn_reused").is_not_null())
    scoped = _scoped(known, "service", cfg.min_requests)
    hits = []
    for scope, part in scoped:
        if part.height < cfg.min_requests:
            continue
        new = part.filter(~pl.col("conn_reused"))
        share = new.height / part.height
        if share < cfg.new_conn_share:
            continue
        s = new.select(
            connect_p50=pl.col("connect").median(),
            connect_mean=pl.col("connect").mean(),
            connect_total=pl.col("connect").sum(),
            share_of_ttft=pl.col("connect").sum() / pl.coalesce("client_ttft", "client_e2e").sum(),
        ).row(0, named=True)
        who = f"service {scope['service']} opens" if scope else "clients open"
        summary = (
            f"{who} a new connection for {share * 100:.0f}% of requests, adding {_ms(s['connect_p50']):.0f} ms "
            f"(p50 connect + TLS) to their TTFT; reuse one HTTP client / connection pool"
        )
        evidence = {
            "new_connection_share": round(share, 3),
            "new_connections": new.height,
            "connect_p50_ms": _ms(s["connect_p50"]),
            "connect_mean_ms": _ms(s["connect_mean"]),
            "connect_share_of_ttft": round(s["share_of_ttft"], 3) if s["share_of_ttft"] is not None else None,
        }
        hits.append(
            (
                scope,
                _finding(
                    "new_connection_per_request",
                    scope,
                    new.height,
                    evidence,
                    summary,
                    s["connect_total"] or 0.0,
                    "connect",
                ),
            )
        )
    return _narrow(hits, len(scoped))


def _engine_base(tl: pl.DataFrame) -> pl.DataFrame:
    """The requests with a replica, a prefill and the engine's first token: what the engine's
    clock places."""
    return tl.filter(
        pl.col("replica").is_not_null()
        & pl.col("prefill").is_not_null()
        & pl.col("engine_first").is_not_null()
    )


def long_prefills(tl: pl.DataFrame, cfg: PitfallConfig = PitfallConfig()) -> pl.DataFrame:
    """The long prefills of ``tl``, on their replica's clock: replica, long_id, begin, end,
    long_prefill, long_prompt; sorted by begin."""
    return (
        _engine_base(tl)
        .with_columns(
            med_prompt=pl.col("prompt_tokens").median().over("replica"),
            med_prefill=pl.col("prefill").median().over("replica"),
        )
        .filter(
            (pl.col("prefill") >= cfg.long_prefill_min_s)
            & (
                (pl.col("prompt_tokens") >= cfg.long_prompt_factor * pl.col("med_prompt")).fill_null(False)
                | (pl.col("prefill") >= cfg.long_prefill_factor * pl.col("med_prefill"))
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


def long_prefill_stall(tl: pl.DataFrame, cfg: PitfallConfig = PitfallConfig()) -> list[dict]:
    """Long prefills and the output gaps that line up with them, per replica, on the engine's
    own clock (prefill interval = [engine_first - prefill, engine_first]; the stalled request's
    ``engine_max_gap_at``), matched with an as-of join: skew-free by construction."""
    base = _engine_base(tl)
    if base.height == 0:
        return []
    long = long_prefills(base, cfg)  # base is already what long_prefills filters to
    if long.height == 0:
        return []
    gaps = (
        base.filter(pl.col("engine_max_gap_at").is_not_null())
        .select("replica", "request_id", gap_at=pl.col("engine_max_gap_at"), gap_s=pl.col("engine_max_gap_s"))
        .sort("gap_at")
    )
    stalled = gaps.join_asof(
        long,
        left_on="gap_at",
        right_on="begin",
        by="replica",
        strategy="backward",
        tolerance=None,
        check_sortedness=False,
    ).filter(
        pl.col("long_id").is_not_null()
        & (pl.col("request_id") != pl.col("long_id"))
        & (pl.col("gap_at") <= pl.col("end") + cfg.stall_slack_s)
        & (pl.col("gap_s") >= cfg.stall_share * pl.col("long_prefill"))
    )
    # a gap that starts just before the prefill (scheduling slack) belongs to it too
    early = gaps.join_asof(
        long,
        left_on="gap_at",
        right_on="begin",
        by="replica",
        strategy="forward",
        tolerance=cfg.stall_slack_s,
        check_sortedness=False,
    ).filter(
        pl.col("long_id").is_not_null()
        & (pl.col("request_id") != pl.col("long_id"))
        & (pl.col("gap_s") >= cfg.stall_share * pl.col("long_prefill"))
    )
    stalled = pl.concat([stalled, early]).unique("request_id", keep="first")
    findings = []
    for (replica,), part in stalled.group_by("replica", maintain_order=True):
        mine = long.filter(pl.col("replica") == replica)
        culprits = mine.filter(pl.col("long_id").is_in(part["long_id"].implode()))
        evidence = {
            "replica": replica,
            "long_prompts": culprits.height,
            "prompt_tokens_max": culprits["long_prompt"].max(),
            "prefill_max_ms": _ms(culprits["long_prefill"].max()),
            "stalled_requests": part.height,
            "stall_gap_p50_ms": _ms(part["gap_s"].median()),
            "stall_gap_max_ms": _ms(part["gap_s"].max()),
        }
        summary = (
            f"{culprits.height} long prompt{'s' if culprits.height != 1 else ''} (up to {culprits['long_prompt'].max() or 0:,} tokens) "
            f"on replica {replica} prefilled for up to {culprits['long_prefill'].max():.1f} s in one piece and stalled "
            f"{part.height} other requests' output (largest gap p50 {part['gap_s'].median():.1f} s); enable chunked prefill"
        )
        finding = _finding(
            "long_prefill_stall",
            {"replica": replica},
            part.height,
            evidence,
            summary,
            part["gap_s"].sum(),
            "decode",  # the stalled requests' output gaps
        )
        finding["at"] = iso_utc(culprits["begin"].min())  # when the first long prefill began
        findings.append(finding)
    return findings


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
        _engine_base(tl)
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


def no_max_tokens(
    tl: pl.DataFrame, cfg: PitfallConfig = PitfallConfig(), kv_bytes_per_token: int | None = None
) -> list[dict]:
    """Requests sent without max_tokens whose output ran past the capped requests' p90 (per model)."""
    if tl.filter(pl.col("max_tokens_set") == False).height == 0:
        return []
    capped_p90 = (
        tl.filter(pl.col("max_tokens_set") == True)
        .group_by("model")
        .agg(p90=pl.col("output_tokens").quantile(cfg.long_output_quantile, "linear"))
    )
    uncapped = tl.filter(pl.col("max_tokens_set") == False).join(capped_p90, on="model", how="left")
    ran_long = uncapped.filter(pl.col("output_tokens") > pl.col("p90"))
    if ran_long.height < max(5, cfg.min_requests // 4):
        return []
    findings = []
    for (service,), part in ran_long.group_by("service", maintain_order=True):
        held = part.select(
            decode_total=pl.col("decode").sum(),
            decode_p50=pl.col("decode").median(),
            decode_max=pl.col("decode").max(),
            out_p50=pl.col("output_tokens").median(),
            out_max=pl.col("output_tokens").max(),
            token_seconds=(
                (pl.col("prompt_tokens").fill_null(0) + pl.col("output_tokens")) * pl.col("decode")
            ).sum(),
            cap_p90=pl.col("p90").max(),
        ).row(0, named=True)
        evidence = {
            "requests_without_max_tokens": uncapped.filter(pl.col("service") == service).height,
            "ran_long": part.height,
            "output_tokens_p50": held["out_p50"],
            "output_tokens_max": held["out_max"],
            "capped_output_tokens_p90": held["cap_p90"],
            "decode_p50_s": round(held["decode_p50"] or 0.0, 3),
            "decode_max_s": round(held["decode_max"] or 0.0, 3),
            "decode_total_s": round(held["decode_total"] or 0.0, 3),
            "kv_token_seconds": round(held["token_seconds"] or 0.0, 1),
        }
        kv = ""
        if kv_bytes_per_token:
            gb_s = held["token_seconds"] * kv_bytes_per_token / 1e9
            evidence["kv_gb_seconds"] = round(gb_s, 2)
            kv = f" and {gb_s:,.1f} GB·s of KV cache"
        summary = (
            f"{part.height} requests from service {service} sent without max_tokens ran long (p50 {held['out_p50']:.0f} "
            f"output tokens vs p90 {held['cap_p90']:.0f} with a cap), holding {held['decode_total']:.0f} s of decode{kv}; "
            f"set max_tokens"
        )
        findings.append(
            _finding(
                "no_max_tokens",
                {"service": service},
                part.height,
                evidence,
                summary,
                held["decode_total"] or 0.0,
                "decode",
            )
        )
    return findings


def verbose_outputs(tl: pl.DataFrame, cfg: PitfallConfig = PitfallConfig()) -> list[dict]:
    """A service whose p50 output length is ``verbose_factor`` × the other services' on the model."""
    rows = tl.filter(
        pl.col("output_tokens").is_not_null()
        & pl.col("service").is_not_null()
        & pl.col("model").is_not_null()
    )
    per = (
        rows.group_by("model", "service")
        .agg(
            n=pl.len(),
            out_p50=pl.col("output_tokens").median(),
            decode_mean=pl.col("decode").mean(),
            e2e_mean=e2e().mean(),
        )
        .filter(pl.col("n") >= cfg.min_requests)
    )
    findings = []
    for (model,), group in per.group_by("model", maintain_order=True):
        if group.height < 2:
            continue
        for row in group.iter_rows(named=True):
            others = rows.filter((pl.col("model") == model) & (pl.col("service") != row["service"]))
            others_p50 = others["output_tokens"].median()
            if not others_p50 or row["out_p50"] < cfg.verbose_factor * others_p50:
                continue
            ratio = row["out_p50"] / others_p50
            others_decode = others["decode"].mean() or 0.0
            extra = max((row["decode_mean"] or 0.0) - others_decode, 0.0) * row["n"]
            evidence = {
                "model": model,
                "output_tokens_p50": row["out_p50"],
                "others_output_tokens_p50": others_p50,
                "ratio": round(ratio, 2),
                "decode_mean_s": round(row["decode_mean"] or 0.0, 3),
                "others_decode_mean_s": round(others_decode, 3),
                "extra_decode_s": round(extra, 1),
            }
            summary = (
                f"service {row['service']}'s answers are {ratio:.1f}× longer than other services' on {model} "
                f"(p50 {row['out_p50']:.0f} vs {others_p50:.0f} tokens); check its chat template and stop tokens"
            )
            findings.append(
                _finding("verbose_outputs", {"service": row["service"]}, row["n"], evidence, summary, extra,
                         "decode")  # fmt: skip
            )
    return findings


def find_pitfalls(
    tl: pl.DataFrame, cfg: PitfallConfig = PitfallConfig(), kv_bytes_per_token: int | None = None
) -> list[dict]:
    """Every pitfall check, largest impact first."""
    findings = (
        user_vs_engine_gap(tl, cfg)
        + new_connection_per_request(tl, cfg)
        + long_prefill_stall(tl, cfg)
        + no_max_tokens(tl, cfg, kv_bytes_per_token)
        + verbose_outputs(tl, cfg)
    )
    return sorted(findings, key=lambda f: -f["impact_s"])
