"""Hop-event logs of modern serving (issue 25), with their truth known by construction: a
disaggregated prefill/decode (P/D) deployment behind a proxy, prefix caching on replicas, a
reasoning model with speculative decoding. Tests only.

Each request's durations are drawn around a median with a lognormal spread; an incident changes
them for the requests of its scope from ``at_s`` on. Events carry the contract's fields the way
hopline's emitters write them: the P/D proxy one ``gateway.forwarded`` per leg (``leg``), each
engine its leg on every event, the vLLM stat logger ``engine.stats``.

    log = pd_log(seed=1, slow_pair=("p1", "d2"))   # the decode side of p1 -> d2 waits 5x longer for the KV
    log = cache_log(seed=1)                         # r2's prefix-cache hits fall from ~78% to ~6% at 10:05
    log = reasoning_log(seed=1)                     # r1's acceptance length halves at 10:05, its decode doubles
"""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import polars as pl
from hopline.analyzer.io import SCHEMA

START = datetime(2026, 12, 3, 10, 0, tzinfo=UTC).timestamp()
INCIDENT_S = 300.0  # 10:05
DURATION_S = 900.0


def _spread(rng: np.random.Generator, median: float, n: int, sigma: float = 0.25) -> np.ndarray:
    return median * np.exp(rng.normal(0.0, sigma, n))


def _frame(rows: list[dict]) -> pl.DataFrame:
    return pl.DataFrame([{k: r.get(k) for k in SCHEMA} for r in rows], schema=SCHEMA)


def _ev(ts: float, rid: str, hop: str, **attrs) -> dict:
    return {"v": 1, "ts": float(ts), "request_id": rid, "hop": hop, "attempt": 0, **attrs}


def _ends(rid: str, first: float, last: float, tokens: int, service: str, extra: dict | None = None) -> list[dict]:
    """The proxy's and the client's first and last token, 2 and 4 ms after the engine's."""
    extra = extra or {}
    return [
        _ev(first + 0.002, rid, "gateway.first_token", service="proxy", replica="gw-0"),
        _ev(last + 0.002, rid, "gateway.last_token", service="proxy", replica="gw-0", output_tokens=tokens),
        _ev(first + 0.004, rid, "client.first_token", service=service),
        _ev(last + 0.004, rid, "client.last_token", service=service, output_tokens=tokens, finish_reason="stop", **extra),
    ]


def pd_log(seed: int, slow_pair: tuple[str, str] = ("p1", "d2"), factor: float = 5.0, rate: float = 4.0) -> pl.DataFrame:
    """P/D through a proxy: prefill on p1 or p2, decode on d1 or d2. From 10:05 the decode side of
    ``slow_pair`` waits ``factor`` times longer for the KV (vLLM counts it in the decode
    instance's queue); prefill and decode stay as they were."""
    rng = np.random.default_rng(seed)
    n = int(DURATION_S * rate)
    t = START + np.sort(rng.uniform(0, DURATION_S, n))
    pre = rng.choice(["p1", "p2"], n)
    dec = rng.choice(["d1", "d2"], n)
    p_queue, p_prefill, p_front = _spread(rng, 0.02, n), _spread(rng, 0.04, n), _spread(rng, 0.005, n)
    d_wait, d_forward, d_front = _spread(rng, 0.015, n), _spread(rng, 0.005, n), _spread(rng, 0.003, n)
    decode = _spread(rng, 2.0, n, 0.1)
    slow = (t >= START + INCIDENT_S) & (pre == slow_pair[0]) & (dec == slow_pair[1])
    d_wait = np.where(slow, d_wait * factor, d_wait)
    rows: list[dict] = []
    for i in range(n):
        rid = f"pd-{seed}-{i}"
        p_recv = t[i] + 0.005
        p_last = p_recv + p_front[i] + p_queue[i] + p_prefill[i]
        d_fwd = p_last + 0.003
        d_recv = d_fwd + 0.002
        d_first = d_recv + d_front[i] + d_wait[i] + d_forward[i]
        d_last = d_first + decode[i]
        p, d = str(pre[i]), str(dec[i])
        rows += [
            _ev(t[i], rid, "client.sent", service="chat", stream=True, conn_reused=True),
            _ev(t[i] + 0.002, rid, "gateway.received", service="proxy", replica="gw-0"),
            _ev(t[i] + 0.003, rid, "gateway.forwarded", service="proxy", replica="gw-0", upstream=p, leg="prefill"),
            _ev(p_recv, rid, "engine.received", replica=p, model="m", stream=False, max_tokens=1, leg="prefill"),
            _ev(p_last, rid, "engine.last_token", replica=p, output_tokens=1, leg="prefill"),
            _ev(p_last, rid, "engine.stats", replica=p, queue_s=p_queue[i], prefill_s=p_prefill[i], decode_s=0.0,
                prompt_tokens=3000, cached_tokens=0, output_tokens=1, leg="prefill"),
            _ev(d_fwd, rid, "gateway.forwarded", service="proxy", replica="gw-0", upstream=d, leg="decode"),
            _ev(d_recv, rid, "engine.received", replica=d, model="m", stream=True, n=1, leg="decode"),
            _ev(d_first, rid, "engine.first_token", replica=d, leg="decode"),
            _ev(d_last, rid, "engine.last_token", replica=d, output_tokens=101, leg="decode"),
            _ev(d_last, rid, "engine.stats", replica=d, queue_s=d_wait[i], prefill_s=d_forward[i], decode_s=decode[i],
                prompt_tokens=3000, output_tokens=101, leg="decode"),
            *_ends(rid, d_first, d_last, 101, "chat"),
        ]
    return _frame(rows)


def _unified(
    rng: np.random.Generator, rid: str, t: float, replica: str, prefill_s: float, cached: int, prompt: int,
    decode_s: float, tokens: int, last_extra: dict | None = None, stats_extra: dict | None = None,
    usage: dict | None = None,
) -> list[dict]:
    """One request served by one engine (client, proxy, engine with stats); ``usage``: attributes
    read from the engine's usage, on the engine's and the client's last token."""
    recv = t + 0.004
    queue, front = float(_spread(rng, 0.01, 1)[0]), 0.004
    first = recv + front + queue + prefill_s
    last = first + decode_s
    return [
        _ev(t, rid, "client.sent", service="chat", stream=True, conn_reused=True),
        _ev(t + 0.002, rid, "gateway.received", service="proxy", replica="gw-0"),
        _ev(t + 0.003, rid, "gateway.forwarded", service="proxy", replica="gw-0", upstream=replica),
        _ev(recv, rid, "engine.received", replica=replica, model="m", stream=True, n=1),
        _ev(first, rid, "engine.first_token", replica=replica),
        _ev(last, rid, "engine.last_token", replica=replica, output_tokens=tokens, **(usage or {})),
        _ev(last, rid, "engine.stats", replica=replica, queue_s=queue, prefill_s=prefill_s, decode_s=decode_s,
            prompt_tokens=prompt, cached_tokens=cached, output_tokens=tokens, **(stats_extra or {})),
        *_ends(rid, first, last, tokens, "chat", {**(last_extra or {}), **(usage or {})}),
    ]


def cache_log(seed: int, rate: float = 6.0, per_token_s: float = 9e-5) -> pl.DataFrame:
    """Prefix caching on r1, r2, r3 with a shared 1,560-token system prompt of 2,000. Until 10:05
    the traffic that shares it lands on r2 (78% of r2's prompt tokens hit its cache); from then on
    it lands on r1 and r3, and r2's hits fall to 6%: its prefill (0.09 ms per computed token)
    rises about fourfold."""
    rng = np.random.default_rng(seed)
    n = int(DURATION_S * rate)
    t = START + np.sort(rng.uniform(0, DURATION_S, n))
    replica = rng.choice(["r1", "r2", "r3"], n)
    after = t >= START + INCIDENT_S
    share = np.where(replica == "r2", np.where(after, 0.06, 0.78), np.where(after, 0.6, 0.4))
    cached = np.round(2000 * np.clip(share + rng.normal(0, 0.03, n), 0, 1)).astype(int)
    prefill = (2000 - cached) * per_token_s * np.exp(rng.normal(0, 0.1, n))
    decode = _spread(rng, 1.0, n, 0.1)
    rows: list[dict] = []
    for i in range(n):
        rows += _unified(rng, f"pc-{seed}-{i}", t[i], str(replica[i]), prefill[i], int(cached[i]), 2000, decode[i], 51)
    return _frame(rows)


def reasoning_log(seed: int, rate: float = 4.0) -> pl.DataFrame:
    """A reasoning model with speculative decoding on r1 and r2: each answer thinks for ~1.2 s
    before its first content token. From 10:05 r1's drafts are accepted half as often (mean
    acceptance length 3.0 -> 1.5) and its decode doubles."""
    rng = np.random.default_rng(seed)
    n = int(DURATION_S * rate)
    t = START + np.sort(rng.uniform(0, DURATION_S, n))
    replica = rng.choice(["r1", "r2"], n)
    worse = (t >= START + INCIDENT_S) & (replica == "r1")
    accept = np.where(worse, 1.5, 3.0) * np.exp(rng.normal(0, 0.05, n))
    decode = _spread(rng, 2.0, n, 0.1) * np.where(worse, 2.0, 1.0)
    think = _spread(rng, 1.2, n, 0.1)
    rows: list[dict] = []
    for i in range(n):
        rid = f"rs-{seed}-{i}"
        prefill = float(_spread(rng, 0.05, 1)[0])
        # the engine's first token is reasoning; its first content comes ``think`` seconds later
        first_at = t[i] + 0.004 + 0.004 + prefill + 0.012  # about the engine's first token (on the client's clock: +0.004)
        extra = {"first_reasoning_at": first_at + 0.004, "first_content_at": first_at + 0.004 + think[i]}
        rows += _unified(
            rng, rid, t[i], str(replica[i]), prefill, 0, 500, decode[i], 201,
            last_extra=extra,
            stats_extra={"spec_acceptance_length": float(accept[i]), "spec_draft_tokens": 200,
                         "spec_accepted_tokens": int(round(200 * (accept[i] - 1) / 3))},
        )
    return _frame(rows)


def reasoning_growth_log(
    seed: int, factor: float = 3.0, rate: float = 4.0, counted: bool = False, grows: str = "reasoning"
) -> pl.DataFrame:
    """A reasoning model on r1 and r2 that thinks ~1.2 s (at 10 ms a token) and then answers 150
    tokens of content. From 10:05 (a template change) it thinks ``factor`` times longer on both:
    time to first content rises with it, while the first token (reasoning) and the time per
    output token hold; decode, which holds the thinking, grows by the extra thought.

    ``counted``: the engine counts the reasoning in its usage (vLLM with a reasoning parser):
    ``reasoning_tokens`` on the last tokens (the thinking's tokens; the output's rest is content).
    ``grows="content"``: from 10:05 the content gets ``factor`` times longer instead (its answers
    run on), the thinking holds."""
    rng = np.random.default_rng(seed)
    n = int(DURATION_S * rate)
    t = START + np.sort(rng.uniform(0, DURATION_S, n))
    replica = rng.choice(["r1", "r2"], n)
    itl = 0.01
    grown = np.where(t >= START + INCIDENT_S, factor, 1.0)
    think = _spread(rng, 1.2, n, 0.1) * (grown if grows == "reasoning" else 1.0)
    content = _spread(rng, 150 * itl, n, 0.1) * (grown if grows == "content" else 1.0)
    rows: list[dict] = []
    for i in range(n):
        rid = f"rg-{seed}-{i}"
        prefill = float(_spread(rng, 0.05, 1)[0])
        first_at = t[i] + 0.004 + 0.004 + prefill + 0.012
        extra = {"first_reasoning_at": first_at + 0.004, "first_content_at": first_at + 0.004 + think[i]}
        tokens = int(round((think[i] + content[i]) / itl)) + 1
        usage = {"reasoning_tokens": int(round(think[i] / itl))} if counted else None
        rows += _unified(
            rng, rid, t[i], str(replica[i]), prefill, 0, 500, think[i] + content[i], tokens, last_extra=extra,
            usage=usage,
        )
    return _frame(rows)


def with_output_gaps(
    events: pl.DataFrame, seed: int, itl_s: float = 0.02, hiccup_share: float = 0.04, hiccup_min_s: float = 0.2
) -> pl.DataFrame:
    """``events`` (any log whose streams have an ``engine.first_token``, e.g. a
    ``scenarios.generate`` log) with each stream's largest output gap on its ``engine.last_token``
    (``max_gap_s``; ``max_gap_at`` on that engine's clock), placed uniformly at random in its
    decode: a few token times (``itl_s`` x 2-4), and for ``hiccup_share`` of the streams a hiccup
    of ``hiccup_min_s`` or more (Pareto: a preemption, a host pause). Healthy: no gap is caused by
    another request's prefill; where one falls during a long prefill, it is there by chance."""
    rng = np.random.default_rng(seed)
    decode_leg = pl.col("leg").is_null() | (pl.col("leg") != "prefill")
    ends = (
        events.filter(pl.col("hop").is_in(["engine.first_token", "engine.last_token"]) & decode_leg)
        .group_by("request_id")
        .agg(
            first=pl.col("ts").filter(pl.col("hop") == "engine.first_token").min(),
            last=pl.col("ts").filter(pl.col("hop") == "engine.last_token").max(),
        )
        .drop_nulls()
        .sort("request_id")
    )
    n = ends.height
    decode = np.maximum((ends["last"] - ends["first"]).to_numpy(), 0.0)
    gap = itl_s * (2.0 + np.abs(rng.standard_normal(n)))
    hiccup = rng.random(n) < hiccup_share
    gap = np.where(hiccup, hiccup_min_s * (1.0 + rng.pareto(1.5, n)), gap)
    gap = np.minimum(gap, decode)
    at = ends["first"].to_numpy() + rng.uniform(0.0, 1.0, n) * (decode - gap)
    gaps = ends.select("request_id", _gap_s=pl.Series(gap), _gap_at=pl.Series(at), _hop=pl.lit("engine.last_token"))  # fmt: skip
    out = events.with_columns(_hop=pl.when(decode_leg).then(pl.col("hop"))).join(
        gaps, on=["request_id", "_hop"], how="left"
    )
    return out.with_columns(
        max_gap_s=pl.coalesce("_gap_s", "max_gap_s"), max_gap_at=pl.coalesce("_gap_at", "max_gap_at")
    ).select(events.columns)


def pd_stall_log(
    seed: int, long_on: str = "p1", count: int = 12, long_prefill_s: float = 2.0, rate: float = 4.0,
    hiccup_share: float = 0.04,
) -> pl.DataFrame:
    """P/D through a proxy as ``pd_log`` (prefill on p1 or p2, decode on d1 or d2, no incident),
    with ``count`` long prompts (32,000 tokens against 3,000) prefilled in one piece for
    ``long_prefill_s``, and on every decode leg's ``engine.last_token`` its largest output gap,
    at random as ``with_output_gaps`` places them (a few token times; ``hiccup_share`` of them a
    hiccup of 0.2 s or more).

    ``long_on`` a prefill instance (``p1``): the long prompts' prefill legs run there, which holds
    p1 alone; no decode anywhere stalls. ``long_on`` a decode instance (``d1``): the proxy sends
    each long prompt to d1 alone (no prefill leg) and d1 prefills it itself, stalling every
    stream it is decoding meanwhile: their largest gap is that prefill, from its start, and their
    decode is that much longer."""
    rng = np.random.default_rng(seed)
    n = int(DURATION_S * rate)
    t = START + np.sort(rng.uniform(0, DURATION_S, n))
    pre = rng.choice(["p1", "p2"], n).astype(object)
    dec = rng.choice(["d1", "d2"], n).astype(object)
    long = np.zeros(n, dtype=bool)
    long[rng.choice(np.flatnonzero(t > START + 60), count, replace=False)] = True
    alone = long & (long_on not in ("p1", "p2"))  # prefilled on the decode instance, no prefill leg
    pre[long & ~alone] = long_on
    dec[alone] = long_on
    prompt = np.where(long, 32_000, 3000)
    p_queue, p_front = _spread(rng, 0.02, n), _spread(rng, 0.005, n)
    p_prefill = np.where(long, long_prefill_s * np.exp(rng.normal(0.0, 0.1, n)), _spread(rng, 0.04, n))
    d_wait, d_forward, d_front = _spread(rng, 0.015, n), _spread(rng, 0.005, n), _spread(rng, 0.003, n)
    decode = _spread(rng, 2.0, n, 0.1)
    d_recv = t + 0.005 + np.where(alone, 0.0, p_front + p_queue + p_prefill + 0.005)
    d_prefill = np.where(alone, p_prefill, d_forward)  # alone: d1 prefills the prompt itself
    d_first = d_recv + d_front + np.where(alone, p_queue, d_wait) + d_prefill
    hiccup = rng.random(n) < hiccup_share
    gap = np.where(hiccup, 0.2 * (1.0 + rng.pareto(1.5, n)), 0.02 * (2.0 + np.abs(rng.standard_normal(n))))
    gap = np.minimum(gap, decode)
    gap_at = d_first + rng.uniform(0.0, 1.0, n) * (decode - gap)
    for i in sorted(np.flatnonzero(alone), key=lambda i: d_first[i]):
        begin = d_first[i] - d_prefill[i]
        hit = (dec == dec[i]) & (d_first < begin) & (d_first + decode > begin)
        hit[i] = False
        decode = np.where(hit, decode + d_prefill[i], decode)
        longer = hit & (d_prefill[i] > gap)
        gap, gap_at = np.where(longer, d_prefill[i], gap), np.where(longer, begin, gap_at)
    rows: list[dict] = []
    for i in range(n):
        rid, p, d, tokens = f"pds-{seed}-{i}", str(pre[i]), str(dec[i]), 101
        d_last = d_first[i] + decode[i]
        rows += [
            _ev(t[i], rid, "client.sent", service="chat", stream=True, conn_reused=True),
            _ev(t[i] + 0.002, rid, "gateway.received", service="proxy", replica="gw-0"),
        ]
        if not alone[i]:
            p_recv = t[i] + 0.005
            p_last = p_recv + p_front[i] + p_queue[i] + p_prefill[i]
            rows += [
                _ev(t[i] + 0.003, rid, "gateway.forwarded", service="proxy", replica="gw-0", upstream=p, leg="prefill"),
                _ev(p_recv, rid, "engine.received", replica=p, model="m", stream=False, max_tokens=1, leg="prefill"),
                _ev(p_last, rid, "engine.last_token", replica=p, output_tokens=1, leg="prefill"),
                _ev(p_last, rid, "engine.stats", replica=p, queue_s=p_queue[i], prefill_s=p_prefill[i], decode_s=0.0,
                    prompt_tokens=int(prompt[i]), cached_tokens=0, output_tokens=1, leg="prefill"),
            ]  # fmt: skip
        leg = {} if alone[i] else {"leg": "decode"}
        rows += [
            _ev(d_recv[i] - 0.002, rid, "gateway.forwarded", service="proxy", replica="gw-0", upstream=d, **leg),
            _ev(d_recv[i], rid, "engine.received", replica=d, model="m", stream=True, n=1, **leg),
            _ev(d_first[i], rid, "engine.first_token", replica=d, **leg),
            _ev(d_last, rid, "engine.last_token", replica=d, output_tokens=tokens, max_gap_s=float(gap[i]),
                max_gap_at=float(gap_at[i]), **leg),
            _ev(d_last, rid, "engine.stats", replica=d, queue_s=p_queue[i] if alone[i] else d_wait[i],
                prefill_s=d_prefill[i], decode_s=decode[i], prompt_tokens=int(prompt[i]), output_tokens=tokens, **leg),
            *_ends(rid, d_first[i], d_last, tokens, "chat"),
        ]  # fmt: skip
    return _frame(rows)
