"""Production-shaped hop-event logs whose truth is known per request: the golden scenarios of the
shift detector (tests only; ``synth.py`` is the older, simpler bench).

What makes them production-shaped: three services on two models, not 1:1 (chat asks for both);
two regions, the ``eu`` one sent mostly to replica r1 and mostly for model X (so a region, a
replica and a model are correlated scopes); four replicas behind two gateways; a share of
non-streaming requests; every host with its own clock offset (clients included); heavy tails
(a few requests in every stage take many times the median); events shuffled.

What makes the truth exact: an incident (``Added``) adds time to one stage of the requests it
reaches, and the generator records every request's added seconds (``Log.truth``), so a test
compares the analyzer's users' time with the sum of what was added, and the requests its scope
selects with the requests that carried the change.

    log = generate(duration_s=600, seed=3, incidents=[Added("prefill", at_s=300, scope={"replica": "r1"}, factor=2)])
    log.events         # hop events (the contract's storage columns), shuffled
    log.truth          # request_id, start, service, model, replica, region, stream, <stage>_added_s ...
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np
import polars as pl
from hopline.analyzer.io import SCHEMA

START = datetime(2026, 3, 2, 13, 0, tzinfo=UTC).timestamp()
STAGES = ("connect", "network", "gateway", "frontend", "queue", "prefill", "decode")
REPLICAS = ("r1", "r2", "r3", "r4")
GATEWAYS = ("gw-a", "gw-b")
# service -> (share of traffic, {model: share of the service's requests})
SERVICES = {
    "chat": (0.5, {"X": 0.6, "Y": 0.4}),
    "agent": (0.3, {"X": 1.0}),
    "search": (0.2, {"Y": 1.0}),
}


@dataclass(frozen=True)
class Added:
    """Time added to ``stage`` of the requests in ``scope`` that start in [``at_s``, ``until_s``)
    (seconds from the log's start): the stage's own value × (``factor`` − 1), plus ``tail_s`` for
    a ``tail_share`` of them (a change that lives in the tail: the median barely moves)."""

    stage: str
    at_s: float
    scope: dict[str, str] = field(default_factory=dict)
    factor: float = 1.0
    tail_share: float = 0.0
    tail_s: float = 0.0
    until_s: float | None = None


@dataclass(frozen=True)
class Joined:
    """A change of the traffic, not of a stage: from ``at_s``, a new ``service`` (none before)
    sends ``share`` of model ``model``'s requests, with prompts ``prompt_tokens`` long (p50) and,
    if given, answers ``output_tokens`` long. Per prompt token and per output token the engine is
    as fast as ever: the model's prefill (or decode) rises with the mix alone."""

    service: str
    at_s: float
    model: str = "X"
    share: float = 0.3
    prompt_tokens: int = 600
    output_tokens: int | None = None


@dataclass(frozen=True)
class Log:
    events: pl.DataFrame
    truth: pl.DataFrame  # one row per request: its attributes and each stage's added seconds
    start: float

    def added_s(self, stage: str) -> float:
        """Users' seconds added to ``stage`` by the incidents, over all requests."""
        return float(self.truth[f"{stage}_added_s"].sum())

    def reached(self, incident: Added) -> set[str]:
        """The requests ``incident`` reaches: in its scope, starting in its interval (a tail
        incident adds time to a share of them only)."""
        at, until = self.start + incident.at_s, self.start + (incident.until_s or np.inf)
        hit = (pl.col("start") >= at) & (pl.col("start") < until)
        for dim, value in incident.scope.items():
            hit &= pl.col(dim) == value
        return set(self.truth.filter(hit)["request_id"].to_list())


def _heavy(rng: np.random.Generator, median: float, sigma: float, n: int, tail: float = 0.02) -> np.ndarray:
    """Lognormal around ``median``, and a ``tail`` share of requests taking 2-30x more (Pareto)."""
    x = median * np.exp(rng.normal(0.0, sigma, n))
    slow = rng.random(n) < tail
    return np.where(slow, x * np.minimum(2 + rng.pareto(1.5, n) * 4, 30), x)


def _pick(rng: np.random.Generator, options: dict[str, float], n: int) -> np.ndarray:
    names = list(options)
    p = np.array([options[k] for k in names], dtype=float)
    return np.array(names, dtype=object)[rng.choice(len(names), n, p=p / p.sum())]


def _requests(rng: np.random.Generator, duration_s: float, rate: float, stream_share: float) -> dict:
    n = rng.poisson(rate * duration_s)
    t0 = np.sort(rng.uniform(0, duration_s, n))
    region = np.where(rng.random(n) < 0.3, "eu", "us").astype(object)
    eu = region == "eu"
    # eu: mostly r1 and model X; us: mostly r2-r4 and model Y
    replica = np.where(
        eu,
        _pick(rng, {"r1": 0.8, "r2": 0.1, "r3": 0.05, "r4": 0.05}, n),
        _pick(rng, {"r1": 0.07, "r2": 0.31, "r3": 0.31, "r4": 0.31}, n),
    )
    model = np.where(eu, _pick(rng, {"X": 0.85, "Y": 0.15}, n), _pick(rng, {"X": 0.35, "Y": 0.65}, n))
    service = np.empty(n, dtype=object)
    for m in ("X", "Y"):
        users = {s: share * mix.get(m, 0.0) for s, (share, mix) in SERVICES.items() if m in mix}
        service[model == m] = _pick(rng, users, int((model == m).sum()))
    prompt = np.maximum(20, _heavy(rng, 600, 0.8, n)).astype(np.int64)
    output = np.maximum(2, _heavy(rng, 120, 0.7, n, 0.01)).astype(np.int64)
    reused = rng.random(n) > 0.05
    return {
        "n": n,
        "t0": t0,
        "region": region,
        "replica": replica,
        "model": model,
        "service": service,
        "stream": rng.random(n) < stream_share,
        "gateway": np.where(rng.random(n) < 0.5, GATEWAYS[0], GATEWAYS[1]).astype(object),
        "prompt": prompt,
        "output": output,
        "reused": reused,
        "connect": np.where(reused, 0.0, _heavy(rng, 0.02, 0.4, n)),
        "network": _heavy(rng, 0.008, 0.5, n) + np.where(eu, 0.012, 0.0),
        "gateway_s": _heavy(rng, 0.003, 0.4, n),
        "frontend": _heavy(rng, 0.004, 0.4, n),
        "queue": _heavy(rng, 0.02, 1.0, n, 0.05),
        # prefill is the prompt's length times a steady per-token time: its tail is the prompts'
        "prefill": 0.05 * np.exp(rng.normal(0.0, 0.2, n)) * prompt / 600,
        "decode": _heavy(rng, 0.02, 0.2, n) * (output - 1),
    }


def _join(rng: np.random.Generator, c: dict, joined: list[Joined]) -> None:
    """Each new service's requests, taken from its model's traffic after its start, with their
    own prompt (and answer) lengths, and prefill (decode) at the same time per token as before."""
    for new in joined:
        hit = (c["t0"] >= new.at_s) & (c["model"] == new.model) & (rng.random(c["n"]) < new.share)
        k = int(hit.sum())
        c["service"][hit] = new.service
        c["prompt"][hit] = np.maximum(20, new.prompt_tokens * np.exp(rng.normal(0.0, 0.3, k))).astype(np.int64)
        c["prefill"][hit] = 0.05 * np.exp(rng.normal(0.0, 0.2, k)) * c["prompt"][hit] / 600
        if new.output_tokens is not None:
            c["output"][hit] = np.maximum(2, new.output_tokens * np.exp(rng.normal(0.0, 0.3, k))).astype(np.int64)
            c["decode"][hit] = _heavy(rng, 0.02, 0.2, k) * (c["output"][hit] - 1)


def _apply(rng: np.random.Generator, c: dict, incidents: list[Added]) -> dict[str, np.ndarray]:
    added = {s: np.zeros(c["n"]) for s in STAGES}
    for inc in incidents:
        if inc.stage not in STAGES:
            raise ValueError(f"cannot add to stage {inc.stage!r}: choose one of {', '.join(STAGES)}")
        hit = (c["t0"] >= inc.at_s) & (c["t0"] < (np.inf if inc.until_s is None else inc.until_s))
        for dim, value in inc.scope.items():
            hit &= c[dim] == value
        base = c["gateway_s" if inc.stage == "gateway" else inc.stage]
        extra = base * (inc.factor - 1) + np.where(rng.random(c["n"]) < inc.tail_share, inc.tail_s, 0.0)
        added[inc.stage] += np.where(hit, extra, 0.0)
    return added


def generate(
    *,
    duration_s: float = 600.0,
    rate: float = 40.0,
    seed: int = 0,
    incidents: list[Added | Joined] | tuple[Added | Joined, ...] = (),
    stream_share: float = 0.6,
    start: float = START,
) -> Log:
    """A log of ``duration_s`` at ``rate`` requests/s (Poisson) with ``incidents``."""
    rng = np.random.default_rng(seed)
    c = _requests(rng, duration_s, rate, stream_share)
    _join(rng, c, [i for i in incidents if isinstance(i, Joined)])
    added = _apply(rng, c, [i for i in incidents if isinstance(i, Added)])
    stage = {s: c["gateway_s" if s == "gateway" else s] + added[s] for s in STAGES}
    legs = stage["network"][:, None] * np.array([0.3, 0.2, 0.2, 0.3])[None, :]
    sent = c["t0"]
    gw_received = sent + stage["connect"] + legs[:, 0]
    gw_forwarded = gw_received + stage["gateway"]
    eng_received = gw_forwarded + legs[:, 1]
    scheduled = eng_received + stage["frontend"] + stage["queue"]
    eng_first = scheduled + stage["prefill"]
    eng_last = eng_first + stage["decode"]
    gw_first, gw_last = eng_first + legs[:, 2], eng_last + legs[:, 2]
    cl_first, cl_last = gw_first + legs[:, 3], gw_last + legs[:, 3]
    times = {
        "sent": sent, "gw_received": gw_received, "gw_forwarded": gw_forwarded, "eng_received": eng_received,
        "eng_first": eng_first, "eng_last": eng_last, "gw_first": gw_first, "gw_last": gw_last,
        "cl_first": cl_first, "cl_last": cl_last,
    }  # fmt: skip
    truth = pl.DataFrame(
        {
            "request_id": [f"q{seed}-{i}" for i in range(c["n"])],
            "start": start + sent,
            **{k: c[k].astype(str) for k in ("service", "model", "replica", "region")},
            "stream": c["stream"],
        }
        | {f"{s}_added_s": added[s] for s in STAGES}
    )
    events = _events(rng, c, truth["request_id"], start, stage, times)
    return Log(events.sample(fraction=1.0, shuffle=True, seed=seed), truth, start)


def _events(
    rng: np.random.Generator, c: dict, ids: pl.Series, start: float, stage: dict, at: dict
) -> pl.DataFrame:
    """Every hop of every request, each stamped by its host's clock (off by up to 2 s on engines,
    0.2 s on gateways, 20 ms on the clients' hosts: one per region and service)."""
    n = c["n"]
    engine_off = dict(zip(REPLICAS, rng.uniform(-2, 2, len(REPLICAS)), strict=True))
    gateway_off = dict(zip(GATEWAYS, rng.uniform(-0.2, 0.2, len(GATEWAYS)), strict=True))
    client_hosts = sorted({f"{r}/{s}" for r, s in zip(c["region"], c["service"], strict=True)})
    client_off = dict(zip(client_hosts, rng.uniform(-0.02, 0.02, len(client_hosts)), strict=True))
    host = np.array([f"{r}/{s}" for r, s in zip(c["region"], c["service"], strict=True)], dtype=object)
    off = {
        "client": np.vectorize(client_off.get, otypes=[float])(host),
        "gateway": np.vectorize(gateway_off.get, otypes=[float])(c["gateway"]),
        "engine": np.vectorize(engine_off.get, otypes=[float])(c["replica"]),
    }
    text = {k: pl.Series(c[k].astype(str)) for k in ("service", "model", "replica", "region", "gateway")}
    attrs = {
        "client": {"service": text["service"], "model": text["model"], "region": text["region"]},
        "gateway": {
            "service": pl.repeat("gateway", n, eager=True),
            "replica": text["gateway"],
            "model": text["model"],
        },
        "engine": {
            "service": pl.repeat("engine", n, eager=True),
            "replica": text["replica"],
            "model": text["model"],
        },
    }
    stream = c["stream"]
    everyone = np.ones(n, dtype=bool)
    frames = []

    def hop(name: str, mask: np.ndarray, ts: np.ndarray, **extra: object) -> None:
        side = name.split(".")[0]
        idx = np.flatnonzero(mask)
        data = {"request_id": ids.gather(idx), "hop": pl.repeat(name, len(idx), eager=True)}
        data["ts"] = start + ts[idx] + off[side][idx]
        data |= {k: v.gather(idx) for k, v in attrs[side].items()}
        data |= {
            k: (v[idx] if isinstance(v, np.ndarray) else pl.repeat(v, len(idx), eager=True))
            for k, v in extra.items()
        }
        frames.append(pl.DataFrame(data, strict=False))

    conn = stage["connect"]
    hop("client.sent", everyone, at["sent"], stream=stream, pool_wait_s=conn * 0.0, connect_s=conn * 0.4,
        tls_s=conn * 0.6, conn_reused=c["reused"], max_tokens=np.full(n, 1024), max_tokens_set=everyone)  # fmt: skip
    hop("gateway.received", everyone, at["gw_received"], stream=stream)
    hop("gateway.forwarded", everyone, at["gw_forwarded"], upstream=c["replica"].astype(str))
    hop("engine.received", everyone, at["eng_received"], stream=stream, n=np.ones(n, dtype=np.int64))
    hop("engine.first_token", stream, at["eng_first"])
    hop("gateway.first_token", stream, at["gw_first"])
    hop("client.first_token", stream, at["cl_first"])
    ends = {"output_tokens": c["output"], "finish_reason": "stop"}
    hop("engine.last_token", everyone, at["eng_last"], **ends)
    hop("engine.stats", everyone, at["eng_last"] + 0.0005, queue_s=stage["queue"], prefill_s=stage["prefill"],
        decode_s=stage["decode"], prompt_tokens=c["prompt"], output_tokens=c["output"], cached_tokens=np.zeros(n, dtype=np.int64))  # fmt: skip
    hop("gateway.last_token", everyone, at["gw_last"], **ends)
    hop("client.last_token", everyone, at["cl_last"], **ends)
    events = pl.concat(frames, how="diagonal_relaxed").with_columns(
        v=pl.lit(1, pl.Int16), attempt=pl.lit(0, pl.Int32)
    )
    return events.select(
        [(pl.col(k) if k in events.columns else pl.lit(None)).cast(t).alias(k) for k, t in SCHEMA.items()]
    )
