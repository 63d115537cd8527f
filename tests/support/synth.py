"""Realistic hop-event logs with known, injected changes: the analyzer's test bench (tests only; not shipped).

``generate`` draws requests (Poisson arrivals, lognormal stage times, prompt-proportional
prefill, per-token decode), routes them over replicas, and writes every hop a real stack emits:
client, gateway and engine (+ ``engine.stats``), each host with its own clock offset, in
shuffled order. Incidents change it from a time on, in a scope, so a test can state what the
analyzer must find:

    generate(n_requests=20_000, seed=1, incidents=[StageShift("queue", 3.0, at_s=300, scope={"replica": "r2"})])

Everything is vectorised numpy / Polars (millions of requests in seconds, seedable).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import polars as pl
from hopline.analyzer.io import SCHEMA

DEFAULT_START = datetime(2026, 1, 5, 10, 0, tzinfo=UTC).timestamp()
SHIFTABLE = ("connect", "network", "gateway", "frontend", "queue", "prefill", "decode")


@dataclass(frozen=True)
class StageShift:
    """``stage`` times ``factor`` for requests in ``scope`` starting at or after ``at_s`` (seconds
    from the log's start) and before ``until_s`` (None: to the end). ``arrivals`` multiplies a
    replica scope's traffic meanwhile (a replica that gets more load queues more)."""

    stage: str
    factor: float
    at_s: float
    scope: dict[str, str] = field(default_factory=dict)
    arrivals: float = 1.0
    until_s: float | None = None

    def active(self, t: np.ndarray) -> np.ndarray:
        return (t >= self.at_s) & (t < (np.inf if self.until_s is None else self.until_s))


@dataclass(frozen=True)
class LongPrompts:
    """``count`` very long prompts on ``replica`` (no chunked prefill): their prefill stalls the
    decode of every request running on that replica meanwhile."""

    replica: str
    count: int = 5
    prompt_tokens: int = 32_000
    after: float = 0.2  # they start past this fraction of the log
    queue_behind: bool = False  # requests that reach the replica's queue meanwhile wait for its end


@dataclass(frozen=True)
class ColdConnections:
    """``service`` opens a new connection (connect + TLS) for ``share`` of its requests sent at
    or after ``at_s`` (a deploy that dropped the shared HTTP client)."""

    service: str
    share: float = 1.0
    at_s: float = 0.0


@dataclass(frozen=True)
class NoMaxTokens:
    """``share`` of ``service``'s requests are sent without max_tokens and some run very long."""

    service: str
    share: float = 0.3


@dataclass(frozen=True)
class VerboseService:
    """``service`` gets answers ``factor`` times longer than others on the same model."""

    service: str
    factor: float = 3.0


@dataclass(frozen=True)
class NewTenant:
    """From ``at_s``, ``share`` of the requests come from a new ``service`` (none before) whose
    prompts are ``prompt_tokens`` long (p50): the engine is as fast per computed token as
    ever, and the model's prefill rises with the mix (issue 33's new tenant)."""

    service: str
    at_s: float
    share: float = 0.3
    prompt_tokens: int = 6000
    output_tokens: float | None = None  # its answers' p50 (None: as the others')


Incident = StageShift | LongPrompts | ColdConnections | NoMaxTokens | VerboseService | NewTenant


def _lognormal(rng: np.random.Generator, median: float, sigma: float, n: int) -> np.ndarray:
    return median * np.exp(sigma * rng.standard_normal(n))


def _lookup(keys: np.ndarray, mapping: dict) -> np.ndarray:
    out = np.empty(len(keys), dtype=object)
    for key, value in mapping.items():
        out[keys == key] = value
    return out


def _in_scope(scope: dict[str, str], cols: dict[str, np.ndarray]) -> np.ndarray:
    mask = np.ones(len(cols["t0"]), dtype=bool)
    for key, value in scope.items():
        mask &= cols[key] == value
    return mask


def _arrivals(
    rng: np.random.Generator, n: int, rate: float, n_replicas: int, shifts: list[StageShift]
) -> np.ndarray:
    """Poisson arrival times; a shift with ``arrivals`` f on one replica raises the total rate
    so that, with ``_route``'s weights, that replica gets f times its traffic and the others
    keep theirs (the time axis runs (R + f - 1) / R times faster from ``at_s`` to ``until_s``)."""
    t = np.cumsum(rng.exponential(1.0 / rate, n))
    for s in sorted(shifts, key=lambda s: s.at_s):
        if s.arrivals != 1.0 and set(s.scope) == {"replica"}:
            speed = (n_replicas + s.arrivals - 1) / n_replicas
            fast_end = np.inf if s.until_s is None else s.at_s + (s.until_s - s.at_s) * speed
            squeezed = s.at_s + (np.minimum(t, fast_end) - s.at_s) / speed + np.maximum(t - fast_end, 0)
            t = np.where(t > s.at_s, squeezed, t)
    return t


def _route(
    rng: np.random.Generator, t: np.ndarray, replicas: tuple[str, ...], shifts: list[StageShift]
) -> np.ndarray:
    """Replica per request: uniform, except where a shift sends a replica more traffic."""
    weights = np.ones((len(t), len(replicas)))
    for s in shifts:
        if s.arrivals != 1.0 and set(s.scope) == {"replica"} and s.scope["replica"] in replicas:
            weights[s.active(t), replicas.index(s.scope["replica"])] *= s.arrivals
    cum = np.cumsum(weights / weights.sum(axis=1, keepdims=True), axis=1)
    pick = (rng.random(len(t))[:, None] > cum).sum(axis=1)
    return np.asarray(replicas, dtype=object)[np.minimum(pick, len(replicas) - 1)]


def _requests(
    rng: np.random.Generator,
    n: int,
    rate: float,
    replicas: tuple[str, ...],
    services: tuple[str, ...],
    models: dict[str, str],
    incidents: list[Incident],
    error_rate: float,
    regions: tuple[str, ...] = (),
) -> dict[str, np.ndarray]:
    """One row per request, in true time (seconds from start): who, what, and every stage."""
    shifts = [i for i in incidents if isinstance(i, StageShift)]
    t0 = _arrivals(rng, n, rate, len(replicas), shifts)
    service = np.asarray(services, dtype=object)[rng.integers(0, len(services), n)]
    cols: dict[str, np.ndarray] = {"t0": t0, "service": service}
    cols["replica"] = _route(rng, t0, replicas, shifts)
    cols["model"] = _lookup(service, models)
    # the clients' region (an attribute of client.sent); no draw without regions, so such a log
    # is the same as before regions existed
    cols["region"] = (
        np.asarray(regions, dtype=object)[rng.integers(0, len(regions), n)]
        if regions
        else np.full(n, None, dtype=object)
    )
    prompt = np.clip(_lognormal(rng, 700, 0.7, n), 16, 8000).astype(np.int64)
    joined = {}
    for inc in incidents:
        if isinstance(inc, NewTenant):
            joined[inc] = mask = (t0 >= inc.at_s) & (rng.random(n) < inc.share)
            service[mask] = inc.service
            cols["model"][mask] = models[services[0]]  # the first service's model
            prompt[mask] = np.clip(_lognormal(rng, inc.prompt_tokens, 0.3, int(mask.sum())), 16, None)
    max_tokens = np.full(n, 1024, dtype=np.int64)
    max_tokens_set = np.ones(n, dtype=bool)
    out_median = np.full(n, 180.0)
    for inc in incidents:
        if isinstance(inc, VerboseService):
            out_median[service == inc.service] *= inc.factor
        if isinstance(inc, NewTenant) and inc.output_tokens is not None:
            out_median[joined[inc]] = inc.output_tokens
    output = np.clip(out_median * np.exp(0.6 * rng.standard_normal(n)), 1, None)
    for inc in incidents:
        if isinstance(inc, NoMaxTokens):
            hit = (service == inc.service) & (rng.random(n) < inc.share)
            max_tokens_set[hit] = False
            output[hit] *= np.exp(np.abs(1.2 * rng.standard_normal(hit.sum())))  # some run on and on
            max_tokens[hit] = 8192
    output = np.minimum(output, max_tokens).astype(np.int64)
    reused = rng.random(n) < 0.97
    for inc in incidents:
        if isinstance(inc, ColdConnections):
            reused[(service == inc.service) & (t0 >= inc.at_s) & (rng.random(n) < inc.share)] = False
    long_prompt = np.zeros(n, dtype=bool)
    for inc in incidents:
        if isinstance(inc, LongPrompts):
            candidates = np.flatnonzero((cols["replica"] == inc.replica) & (t0 > t0[-1] * inc.after))
            chosen = rng.choice(candidates, size=min(inc.count, len(candidates)), replace=False)
            long_prompt[chosen] = True
            prompt[chosen] = inc.prompt_tokens
    cols.update(
        prompt=prompt, output=output, max_tokens=max_tokens, max_tokens_set=max_tokens_set, reused=reused
    )
    cols["long_prompt"] = long_prompt
    cols["cached"] = (prompt * rng.uniform(0, 0.5, n)).astype(np.int64)
    # stage times, seconds
    new = ~reused
    cols["pool_wait_s"] = np.where(new, _lognormal(rng, 0.0002, 0.5, n), 0.0)
    cols["connect_s"] = np.where(new, _lognormal(rng, 0.012, 0.3, n), 0.0)
    cols["tls_s"] = np.where(new, _lognormal(rng, 0.030, 0.3, n), 0.0)
    legs = np.stack(
        [_lognormal(rng, m, 0.35, n) for m in (0.004, 0.001, 0.001, 0.004)]
    )  # out, out, back, back
    cols["gateway"] = _lognormal(rng, 0.003, 0.4, n)
    cols["frontend"] = _lognormal(rng, 0.004, 0.3, n) + prompt * 1e-6
    cols["queue"] = _lognormal(rng, 0.040, 0.6, n)
    cols["prefill"] = prompt * 6e-5 * np.exp(0.15 * rng.standard_normal(n))
    cols["itl"] = _lognormal(rng, 0.022, 0.15, n)
    scale = {stage: np.ones(n) for stage in SHIFTABLE}
    for s in shifts:
        scale[s.stage][_in_scope(s.scope, cols) & s.active(t0)] *= s.factor
    cols["connect_scale"] = scale["connect"]
    for stage in ("gateway", "frontend", "queue", "prefill"):
        cols[stage] = cols[stage] * scale[stage]
    cols["itl"] = cols["itl"] * scale["decode"]
    cols["legs"] = legs * scale["network"]
    cols["failed"] = rng.random(n) < error_rate
    return cols


def _stall(
    rng: np.random.Generator,
    cols: dict[str, np.ndarray],
    engine_first: np.ndarray,
    engine_last: np.ndarray,
    scheduled: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Largest output gap per request (true time) and how much a stall lengthened its decode:
    a few token times normally; a long prompt's whole prefill when it ran on the same replica
    while the request was decoding (a few long prompts: a loop over them, vectorised inside)."""
    n = len(engine_first)
    gap_s = cols["itl"] * (2.0 + np.abs(rng.standard_normal(n)))
    gap_at = engine_first + (engine_last - engine_first) * 0.5
    extra = np.zeros(n)
    for i in np.flatnonzero(cols["long_prompt"]):
        begin, length = scheduled[i], cols["prefill"][i]
        hit = (cols["replica"] == cols["replica"][i]) & (engine_first < begin) & (engine_last > begin)
        hit[i] = False
        longer = hit & (length > gap_s)
        gap_s = np.where(longer, length, gap_s)
        gap_at = np.where(longer, begin, gap_at)
        extra = np.where(hit, extra + length, extra)
    return gap_s, gap_at, extra


def _wait_behind(c: dict[str, np.ndarray], scheduled: np.ndarray, replica: str) -> np.ndarray:
    """The extra queue wait of requests scheduled on ``replica`` while one of its long prompts
    prefills (no chunked prefill: they wait for its end), long prompts in time order, each one's
    own start moved by the earlier ones."""
    extra = np.zeros(len(scheduled))
    on = c["replica"] == replica
    for i in sorted(np.flatnonzero(c["long_prompt"] & on), key=lambda i: scheduled[i]):
        begin = scheduled[i] + extra[i]
        end = begin + c["prefill"][i]
        at = scheduled + extra
        hit = on & (at > begin) & (at < end)
        hit[i] = False
        extra[hit] += end - at[hit]
    return extra


def generate(
    n_requests: int | None = None,
    *,
    duration_s: float | None = None,
    seed: int = 0,
    rate: float = 20.0,
    replicas: tuple[str, ...] = ("r1", "r2"),
    services: tuple[str, ...] = ("kite-chat", "search-assist"),
    models: dict[str, str] | None = None,
    incidents: list[Incident] | tuple[Incident, ...] = (),
    start: float = DEFAULT_START,
    clock_skew_s: float = 2.0,
    error_rate: float = 0.002,
    shuffle: bool = True,
    engine_id_prefix: bool = False,
    regions: tuple[str, ...] = (),
) -> pl.DataFrame:
    """Events (``contract.STORAGE_COLUMNS``) for ``n_requests`` (or ``duration_s`` × ``rate``).

    ``models`` maps service → model (default: one model for all). Hosts' clocks are off by up
    to ``clock_skew_s`` (engines), a tenth of it (gateway), and the clients are the reference.
    ``engine_id_prefix`` makes ``engine.stats`` report ``chatcmpl-<id>`` as vLLM does.
    ``regions``: the clients' regions (``client.sent`` carries ``region``; a scope for incidents).
    """
    if n_requests is None:
        if duration_s is None:
            raise ValueError("give n_requests or duration_s")
        n_requests = max(1, int(duration_s * rate))
    rng = np.random.default_rng(seed)
    models = models or {s: "llama-3.1-8b" for s in services}
    incidents = list(incidents)
    for inc in incidents:
        if isinstance(inc, StageShift) and inc.stage not in SHIFTABLE:
            raise ValueError(f"cannot shift stage {inc.stage!r}: choose one of {', '.join(SHIFTABLE)}")
    c = _requests(rng, n_requests, rate, replicas, services, models, incidents, error_rate, regions)
    n = n_requests
    legs = c["legs"]
    connect = (c["pool_wait_s"] + c["connect_s"] + c["tls_s"]) * c["connect_scale"]
    client_sent = c["t0"]
    gw_received = client_sent + connect + legs[0]
    gw_admitted = gw_received + c["gateway"] * 0.4
    gw_forwarded = gw_received + c["gateway"]
    eng_received = gw_forwarded + legs[1]
    scheduled = eng_received + c["frontend"] + c["queue"]
    for inc in incidents:
        if isinstance(inc, LongPrompts) and inc.queue_behind:
            c["queue"] += _wait_behind(c, scheduled, inc.replica)
            scheduled = eng_received + c["frontend"] + c["queue"]
    eng_first = scheduled + c["prefill"]
    eng_last_plain = eng_first + c["itl"] * np.maximum(c["output"] - 1, 0)
    gap_s, gap_at, stalled = _stall(rng, c, eng_first, eng_last_plain, scheduled)
    eng_last = eng_last_plain + stalled
    gw_first, gw_last = eng_first + legs[2], eng_last + legs[2]
    cl_first, cl_last = gw_first + legs[3], gw_last + legs[3]
    failed = c["failed"]

    # clock offsets: clients are the reference; the gateway and each replica are off
    offsets = {r: rng.uniform(-clock_skew_s, clock_skew_s) for r in replicas}
    gw_off = rng.uniform(-clock_skew_s / 10, clock_skew_s / 10)
    eng_off = _lookup(c["replica"], offsets).astype(np.float64)
    base = start
    ids = pl.select(pl.format("s{}-{}", pl.lit(seed), pl.int_range(n, dtype=pl.Int64))).to_series()
    ok = ~failed
    stream = np.ones(n, dtype=bool)
    frames: list[pl.DataFrame] = []

    def column(value: object, idx: np.ndarray) -> object:
        if isinstance(value, pl.Series):
            return value.gather(idx)
        if isinstance(value, np.ndarray):
            return value[idx]
        return pl.repeat(value, len(idx), eager=True)

    def hop(name: str, mask: np.ndarray, ts: np.ndarray, offset: float | np.ndarray, **attrs: object) -> None:
        idx = np.flatnonzero(mask)
        off = offset[idx] if isinstance(offset, np.ndarray) else offset
        data = {
            "request_id": ids.gather(idx),
            "hop": pl.repeat(name, len(idx), eager=True),
            "ts": base + ts[idx] + off,
        }
        data.update((key, column(value, idx)) for key, value in attrs.items())
        frames.append(pl.DataFrame(data, strict=False))

    everyone = np.ones(n, dtype=bool)
    # strings become Polars columns once (object arrays convert slowly), then are gathered per hop
    svc, rep, mod = (pl.Series(c[k], dtype=pl.String) for k in ("service", "replica", "model"))
    client = {"service": svc, "model": mod}
    if regions:
        client["region"] = pl.Series(c["region"], dtype=pl.String)
    gateway = {"service": "gateway", "replica": "gw-0", "model": mod}
    engine = {"service": "engine", "replica": rep, "model": mod}
    hop(
        "client.sent",
        everyone,
        client_sent,
        0.0,
        **client,
        stream=stream,
        pool_wait_s=c["pool_wait_s"] * c["connect_scale"],
        connect_s=c["connect_s"] * c["connect_scale"],
        tls_s=c["tls_s"] * c["connect_scale"],
        conn_reused=c["reused"],
        max_tokens=np.where(c["max_tokens_set"], c["max_tokens"], -1),
        max_tokens_set=c["max_tokens_set"],
    )
    hop("gateway.received", everyone, gw_received, gw_off, **gateway, stream=stream)
    hop("gateway.admitted", everyone, gw_admitted, gw_off, **gateway)
    hop("gateway.forwarded", everyone, gw_forwarded, gw_off, **gateway, upstream=rep)
    hop(
        "engine.received",
        everyone,
        eng_received,
        eng_off,
        **engine,
        stream=stream,
        n=np.ones(n, dtype=np.int64),
        max_tokens=np.where(c["max_tokens_set"], c["max_tokens"], -1),
        max_tokens_set=c["max_tokens_set"],
    )
    hop("engine.first_token", ok, eng_first, eng_off, **engine)
    finish = pl.Series(np.where(c["output"] >= c["max_tokens"], "length", "stop"))
    hop(
        "engine.last_token",
        ok,
        eng_last,
        eng_off,
        **engine,
        output_tokens=c["output"],
        finish_reason=finish,
        output_chunks=c["output"],
        max_gap_s=gap_s,
        max_gap_at=base + gap_at + eng_off,
    )
    hop(
        "engine.stats",
        ok,
        eng_last + 0.0005,
        eng_off,
        **engine,
        queue_s=c["queue"],
        prefill_s=c["prefill"],
        decode_s=eng_last - eng_first,
        prompt_tokens=c["prompt"],
        output_tokens=c["output"],
        cached_tokens=c["cached"],
    )
    hop("gateway.first_token", ok, gw_first, gw_off, **gateway)
    hop("client.first_token", ok, cl_first, 0.0, **client)
    hop("gateway.last_token", ok, gw_last, gw_off, **gateway, output_tokens=c["output"], finish_reason=finish)
    hop(
        "client.last_token",
        ok,
        cl_last,
        0.0,
        **client,
        output_tokens=c["output"],
        finish_reason=finish,
        output_chunks=c["output"],
        max_gap_s=gap_s,
        max_gap_at=base + gap_at,
    )
    error_at = eng_received + c["frontend"]
    hop("engine.error", failed, error_at, eng_off, **engine, status=np.full(n, 500), error="engine_error")
    hop(
        "gateway.error",
        failed,
        error_at + legs[2],
        gw_off,
        **gateway,
        status=np.full(n, 502),
        error="upstream_error",
    )
    hop(
        "client.error",
        failed,
        error_at + legs[2] + legs[3],
        0.0,
        **client,
        status=np.full(n, 502),
        error="upstream_error",
    )

    events = pl.concat(frames, how="diagonal_relaxed").with_columns(
        v=pl.lit(1, pl.Int16),
        attempt=pl.lit(0, pl.Int32),
        max_tokens=pl.when(pl.col("max_tokens") >= 0).then(pl.col("max_tokens")),
    )
    if engine_id_prefix:
        events = events.with_columns(
            request_id=pl.when(pl.col("hop") == "engine.stats")
            .then("chatcmpl-" + pl.col("request_id"))
            .otherwise(pl.col("request_id"))
        )
    events = events.select(
        [
            (pl.col(name) if name in events.columns else pl.lit(None)).cast(dtype).alias(name)
            for name, dtype in SCHEMA.items()
        ]
    )
    if shuffle:
        events = events.sample(fraction=1.0, shuffle=True, seed=seed)
    return events


def on_localhost(events: pl.DataFrame, connect_s: float = 0.0001) -> pl.DataFrame:
    """``events`` as if every new connection took ``connect_s`` (pool wait + TCP + TLS on
    localhost, no TLS to speak of): ``client.sent`` is stamped before the connect, so it moves later
    by the time saved, and every later hop stays where it was."""
    new = (pl.col("hop") == "client.sent") & ~pl.col("conn_reused")
    parts = pl.sum_horizontal(pl.col(c).fill_null(0.0) for c in ("pool_wait_s", "connect_s", "tls_s"))
    return events.with_columns(
        ts=pl.when(new).then(pl.col("ts") + parts - connect_s).otherwise(pl.col("ts")),
        pool_wait_s=pl.when(new).then(0.0).otherwise(pl.col("pool_wait_s")),
        connect_s=pl.when(new).then(connect_s).otherwise(pl.col("connect_s")),
        tls_s=pl.when(new).then(0.0).otherwise(pl.col("tls_s")),
    )


def write_ndjson(events: pl.DataFrame, path: str | Path) -> Path:
    """Events as an NDJSON log, one event per line (what a file sink writes)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    events.drop("attrs").write_ndjson(path)
    return path


def with_retries(events: pl.DataFrame, seed: int) -> pl.DataFrame:
    """Extra events for a third of the requests: a later attempt of some hops (other times and
    attributes), an earlier attempt, and exact-time duplicates — what retries, failover and sink
    retries leave in a log. The contract's pick (highest attempt, earliest ts) must win."""
    rng = np.random.default_rng(seed)
    chosen = events.filter(pl.col("request_id").hash(seed) % 3 == 0)
    later = chosen.sample(fraction=0.5, seed=seed).with_columns(
        attempt=pl.col("attempt") + 1,
        ts=pl.col("ts") + pl.Series(rng.uniform(-0.5, 0.5, chosen.sample(fraction=0.5, seed=seed).height)),
        queue_s=pl.col("queue_s") * 2,
        connect_s=pl.col("connect_s") + 0.1,
        output_tokens=pl.col("output_tokens") + 7,
        replica=pl.lit("r9"),
    )
    earlier_tie = later.with_columns(ts=pl.col("ts") + 0.25, queue_s=pl.col("queue_s") + 1)
    duplicates = chosen.sample(fraction=0.2, seed=seed + 1)
    return pl.concat([events, later, earlier_tie, duplicates]).sample(fraction=1.0, shuffle=True, seed=seed)
