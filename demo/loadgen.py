"""Client traffic for the demo: the real OpenAI SDK over TLS, through hopline's client transport.

Each ``Traffic`` is one client population (one ``service``): requests arrive as a Poisson process
at ``rate`` per second between two moments of the run (or, for a batch job, from a fixed number
of workers that each send the next request when the previous one is answered); each request
continues one of ``users`` conversations (the history grows turn by turn, so the prompt does too,
and the gateway's affinity keeps the conversation on the replica whose prefix cache holds it).
Prompt sizes are log-normal; answers are as long as the engine decides, capped by ``max_tokens``
unless the client forgets it. A client either keeps one connection pool (as it should) or opens a new
connection per request (the ``cold-connections`` pitfall). The prompt text is filler: nothing
in it means anything, and hopline never records it anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import ssl
import statistics
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import orjson
from hopline.demo.engine_sim import CHARS_PER_TOKEN
from hopline.demo.wiring import WARMUP_PREFIX, instrument_client

WARM_CONNECTIONS = 40  # a long-running service's pool is warm (a burst of workers needs no new TLS handshake); only the cold client starts from zero
POOL = httpx.Limits(max_connections=256, max_keepalive_connections=64, keepalive_expiry=60.0)
_SYLLABLES = ("ka", "lo", "mi", "ren", "to", "vu", "sha", "pel", "dor", "ni", "que", "zam")


def _filler(seed: int = 7, words: int = 40_000) -> str:
    rng = random.Random(seed)
    return " ".join("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(words))


FILLER = _filler()


def filler_text(tokens: int, rng: random.Random) -> str:
    """About ``tokens`` tokens of meaningless text (a random slice of the filler, repeated if needed)."""
    chars = max(1, tokens * CHARS_PER_TOKEN)
    text = FILLER * (1 + chars // len(FILLER))
    start = rng.randrange(0, len(FILLER))
    return (text + text)[start : start + chars]


@dataclass(frozen=True)
class Traffic:
    """One client population. ``start`` / ``stop`` are fractions of the run."""

    service: str
    rate: float  # requests per second, Poisson arrivals...
    concurrency: int | None = None  # ...or this many workers, each sending its next request when one ends
    api_key: str = "sk-demo-chat"
    users: int = 50  # conversations
    pinned_user: str | None = None  # every request in one `user` (a batch job): one replica
    system_tokens: int = 300
    prompt_median_tokens: float = 150.0  # each new user message
    prompt_sigma: float = 0.8
    max_turns: int = 5
    max_tokens: int | None = 512
    stream: bool = True
    new_connection_per_request: bool = False
    via_proxy: bool = False
    start: float = 0.0
    stop: float = 1.0


@dataclass
class LiveStats:
    """What the live display shows: the client's own view, independent of hopline."""

    sent: int = 0
    ok: int = 0
    errors: int = 0
    in_flight: int = 0
    ttfts: deque[float] = field(default_factory=lambda: deque(maxlen=200))
    last_error: str = ""

    def p50_ttft_ms(self) -> float | None:
        return statistics.median(self.ttfts) * 1000 if self.ttfts else None


class LoadGenerator:
    """Runs every ``Traffic`` for ``seconds``, then waits (up to ``grace``) for answers in flight."""

    def __init__(
        self,
        traffic: list[Traffic],
        *,
        gateway_url: str,
        proxy_url: str | None,
        verify: ssl.SSLContext,
        emitter_for: Callable[[str], Any],
        model: str,
        seconds: float,
        grace: float = 8.0,
        seed: int | None = None,
    ) -> None:
        self.traffic = traffic
        self.gateway_url = gateway_url
        self.proxy_url = proxy_url
        self.verify = verify
        self.emitter_for = emitter_for
        self.model = model
        self.seconds = seconds
        self.grace = grace
        self.rng = random.Random(seed)
        self.stats = LiveStats()
        self.started = 0.0
        self._clients: dict[str, openai.AsyncOpenAI] = {}
        self._conversations: dict[str, list[dict[str, str]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    # -- clients ------------------------------------------------------------------------------

    def _base_url(self, t: Traffic) -> str:
        return f"{self.proxy_url if t.via_proxy and self.proxy_url else self.gateway_url}/v1"

    def _new_client(self, t: Traffic, http_client: httpx.AsyncClient | None = None) -> openai.AsyncOpenAI:
        http_client = instrument_client(
            http_client or httpx.AsyncClient(verify=self.verify, limits=POOL),
            emitter=self.emitter_for(t.service),
            service=t.service,
        )
        return openai.AsyncOpenAI(
            base_url=self._base_url(t),
            api_key=t.api_key,
            http_client=http_client,
            max_retries=0,
            timeout=120.0,
        )

    async def warm_up(self) -> None:
        """Open each pooled client's connections before the run (with health checks hopline does not see)."""

        async def warm(t: Traffic) -> None:
            http_client = httpx.AsyncClient(verify=self.verify, limits=POOL)
            url = self._base_url(t).removesuffix("/v1") + "/health"
            await asyncio.gather(*(http_client.get(url) for _ in range(WARM_CONNECTIONS)))
            self._clients[t.service] = self._new_client(t, http_client)

        pooled = {t.service: t for t in self.traffic if not t.new_connection_per_request}
        await asyncio.gather(*(warm(t) for t in pooled.values()))

    def _client(self, t: Traffic) -> openai.AsyncOpenAI:
        if t.service not in self._clients:
            self._clients[t.service] = self._new_client(t)
        return self._clients[t.service]

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.close()

    # -- requests -------------------------------------------------------------------------------

    def _messages(self, t: Traffic, user: str) -> list[dict[str, str]]:
        history = self._conversations.get(user)
        if history is None or len(history) >= 1 + 2 * t.max_turns:
            history = [{"role": "system", "content": filler_text(t.system_tokens, self.rng)}]
        tokens = round(self.rng.lognormvariate(math.log(t.prompt_median_tokens), t.prompt_sigma))
        history = [*history, {"role": "user", "content": filler_text(max(5, tokens), self.rng)}]
        self._conversations[user] = history
        return history

    async def _request(self, t: Traffic, warmup: bool = False) -> None:
        user = t.pinned_user or f"{t.service}-u{self.rng.randrange(t.users)}"
        messages = self._messages(t, user)
        extra: dict[str, Any] = {"max_tokens": t.max_tokens} if t.max_tokens else {}
        if warmup:  # not recorded by any demo component (wiring.WARMUP_PREFIX), not counted here
            extra["extra_headers"] = {"X-Request-Id": f"{WARMUP_PREFIX}{uuid.uuid4().hex}"}
        stats = self.stats if not warmup else LiveStats()
        stats.sent += 1
        stats.in_flight += 1
        fresh = self._new_client(t) if t.new_connection_per_request else None
        client = fresh or self._client(t)
        answer = []
        sent = time.perf_counter()
        try:
            if t.stream:
                # The SDK builds, sends and (through hopline's transport) times the request; its
                # per-chunk model objects cost ~0.3 ms of CPU each, more than everything else in
                # this process, so the SSE lines are read raw (as the SDK's own raw-response API allows).
                async with client.chat.completions.with_streaming_response.create(
                    model=self.model,
                    messages=messages,
                    user=user,
                    stream=True,
                    stream_options={"include_usage": True},
                    **extra,
                ) as response:
                    async for line in response.iter_lines():
                        if not line.startswith("data: {"):
                            continue
                        choices = orjson.loads(line[6:]).get("choices")
                        content = choices[0].get("delta", {}).get("content") if choices else None
                        if content:
                            if not answer:
                                stats.ttfts.append(time.perf_counter() - sent)
                            answer.append(content)
            else:
                completion = await client.chat.completions.create(
                    model=self.model, messages=messages, user=user, stream=False, **extra
                )
                answer.append(completion.choices[0].message.content or "")
            stats.ok += 1
            self._conversations[user] = [*messages, {"role": "assistant", "content": "".join(answer)}]
        except (openai.OpenAIError, OSError) as exc:
            stats.errors += 1
            stats.last_error = f"{t.service}: {type(exc).__name__}"
            self._conversations.pop(user, None)
        finally:
            stats.in_flight -= 1
            if fresh is not None:
                await fresh.close()

    def _span(self, t: Traffic) -> tuple[float, float]:
        """When ``t`` runs: from ``start`` to ``stop`` (fractions of the run), monotonic seconds."""
        return self.started + t.start * self.seconds, self.started + t.stop * self.seconds

    async def _arrivals(self, t: Traffic, span: tuple[float, float], warmup: bool = False) -> None:
        """Poisson arrivals at ``t.rate`` during ``span``."""
        begin, end = span
        await asyncio.sleep(max(0.0, begin - time.monotonic()))
        at = time.monotonic()
        while True:
            at += self.rng.expovariate(t.rate)
            if at >= end:
                return
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            task = asyncio.create_task(self._request(t, warmup))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _workers(self, t: Traffic, span: tuple[float, float], warmup: bool = False) -> None:
        """A closed loop (a batch job with ``concurrency`` workers) during ``span``."""
        begin, end = span
        await asyncio.sleep(max(0.0, begin - time.monotonic()))

        async def worker() -> None:
            await asyncio.sleep(self.rng.uniform(0.0, 1.0))  # workers come up within a second
            while time.monotonic() < end:
                await self._request(t, warmup)

        assert t.concurrency is not None
        for _ in range(t.concurrency):
            task = asyncio.create_task(worker())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def warm_traffic(self, seconds: float) -> None:
        """The traffic that runs from the start, for ``seconds``, unrecorded: prefix caches, code
        paths and connection pools warm up, so the measured run starts in a steady state."""
        now = time.monotonic()
        span = (now, now + seconds)
        await asyncio.gather(
            *(
                self._workers(t, span, warmup=True) if t.concurrency else self._arrivals(t, span, warmup=True)
                for t in self.traffic
                if t.start == 0
            )
        )
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=self.grace)

    async def run(self) -> LiveStats:
        """The traffic itself (call ``warm_up`` first)."""
        self.started = time.monotonic()
        await asyncio.gather(
            *(self._workers(t, self._span(t)) if t.concurrency else self._arrivals(t, self._span(t)) for t in self.traffic)
        )
        await asyncio.sleep(max(0.0, self.started + self.seconds - time.monotonic()))
        if self._tasks:
            _, late = await asyncio.wait(set(self._tasks), timeout=self.grace)
            for task in late:
                task.cancel()  # answers still streaming: the client gives up, as users do
            if late:
                await asyncio.wait(late, timeout=2.0)
        with contextlib.suppress(Exception):
            await self.aclose()
        return self.stats
