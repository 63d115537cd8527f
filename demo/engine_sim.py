"""A simulated OpenAI-compatible LLM engine whose timing follows the arithmetic of real serving.

One process is one replica. Its scheduler (an asyncio loop, no busy work: every forward pass is
an ``asyncio.sleep`` of the pass's modelled duration) does what vLLM's does, so the numbers
hopline measures have the causes they have in production:

* **continuous batching**: each step is one forward pass over the running batch; requests join
  and leave between steps, at most ``max_num_seqs`` of them;
* **a KV-cache budget**: the GPU memory left after the weights over the model's KV bytes per token
  (``hopline.middleware.contract.kv``); a request waits in the queue until its prompt fits;
* **prefill** costs time per prompt token not already in the prefix cache; with chunked prefill a
  step takes at most ``max_num_batched_tokens`` tokens, without it a long prompt is prefilled in one
  long step during which every other stream stalls;
* **decode** step time grows with the batch size; answer lengths are drawn from a long-tailed
  distribution, cut by ``max_tokens`` (``finish_reason: length``) or by the context window.

It serves ``POST /v1/chat/completions`` (streaming SSE in the OpenAI chunk format: role chunk,
content chunks, finish chunk, usage chunk when asked, ``[DONE]``; and non-streaming), runs
hopline's engine middleware, emits ``engine.stats`` per finished request as the vLLM plugin does,
and appends each request's true intervals to a JSONL file, so tests compare hopline's stages with
what really happened rather than with themselves. No prompt or answer text is logged.

    python -m hopline.demo.engine_sim --replica r1 --sink http://127.0.0.1:9000 \\
        --truth truth-r1.jsonl --port-file r1.port --config '{"chunked_prefill": false}'

``SIGUSR1`` applies the config's ``incident`` overrides (e.g. a prefill regression) at run time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import hashlib
import math
import random
import signal
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from hopline.middleware.contract.kv import KVSpec, dtype_bytes
from hopline.middleware import clock

GIB = 1024**3
CHARS_PER_TOKEN = 4  # English text, roughly; the load generator sizes its prompts with it


@dataclass(frozen=True)
class ModelShape:
    """What sets the KV-cache size per token and the weights' share of GPU memory (Llama-3-8B)."""

    name: str = "sim-llama-3-8b"
    params_b: float = 8.0
    layers: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    dtype: str = "bf16"

    @property
    def kv(self) -> KVSpec:
        return KVSpec(self.layers, self.kv_heads, self.head_dim, self.dtype)

    @property
    def weight_bytes(self) -> float:
        return self.params_b * 1e9 * dtype_bytes(self.dtype)


@dataclass(frozen=True)
class EngineConfig:
    """A replica's shape and speed. Times are scaled down so that a demo minute holds many requests."""

    model: ModelShape = ModelShape()
    gpu_memory_gib: float = 24.0
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 24
    max_model_len: int = 16384
    chunked_prefill: bool = True
    max_num_batched_tokens: int = 1024  # per step, with chunked prefill
    step_base_s: float = 0.010  # a forward pass's fixed cost (weights read once per step)
    step_per_seq_s: float = 0.0001  # + per running sequence (decode is memory-bound: weights dominate)
    prefill_per_token_s: float = 0.00004  # + per prompt token computed in the step
    frontend_s: float = 0.001  # HTTP parsing, chat template, tokenization
    frontend_per_token_s: float = 0.0000005
    answer_median_tokens: float = 80.0  # answers: log-normal around this...
    answer_sigma: float = 0.7
    runaway_share: float = 0.02  # ...plus answers that would go on and on
    runaway_tokens: tuple[int, int] = (600, 1500)
    prefix_cache_entries: int = 4096
    # Output tokens per SSE chunk after the first (SGLang's --stream-interval; the first token
    # always leaves at once, so TTFT is unchanged)
    stream_interval: int = 1
    seed: int | None = None
    incident: dict[str, Any] = field(default_factory=dict)  # overrides applied on SIGUSR1

    @property
    def kv_budget_tokens(self) -> int:
        """Tokens of KV cache that fit in the GPU memory left after the weights."""
        free = self.gpu_memory_gib * GIB * self.gpu_memory_utilization - self.model.weight_bytes
        return max(int(free // self.model.kv.bytes_per_token), self.max_model_len)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineConfig:
        data = dict(data)
        if isinstance(data.get("model"), dict):
            data["model"] = ModelShape(**data["model"])
        if "runaway_tokens" in data:
            data["runaway_tokens"] = tuple(data["runaway_tokens"])
        return cls(**data)

    def with_incident(self) -> EngineConfig:
        return dataclasses.replace(self, **self.incident, incident={})


def estimate_tokens(text: str) -> int:
    """Prompt tokens estimated from text length (no tokenizer: nothing of the text is kept)."""
    return max(1, -(-len(text) // CHARS_PER_TOKEN))


def estimate_prompt_tokens(messages: list[dict[str, Any]]) -> int:
    """Chat template overhead plus each message's content (strings or content-part lists)."""
    total = 3
    for message in messages:
        content = message.get("content") or ""
        if isinstance(content, list):
            content = " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
        total += 4 + estimate_tokens(str(content))
    return total


def prefix_key(messages: list[dict[str, Any]]) -> str:
    """A digest of a message list: the prefix-cache key (nothing of the text is kept)."""
    return hashlib.blake2b(orjson.dumps(messages), digest_size=12).hexdigest()


@dataclass(eq=False)
class SimRequest:
    """One generation request inside the engine, with its true timeline (engine clock)."""

    request_id: str
    attempt: int
    stream: bool
    prompt_tokens: int
    cached_tokens: int
    limit: int  # max_tokens, or what is left of the context window
    max_tokens_set: bool
    target: int  # how many tokens the "model" wants to say (cut at limit)
    received: float
    queued: float = 0.0
    scheduled: float | None = None
    first_token: float | None = None
    last_token: float | None = None
    # when the stream handed the chunk with the first / last token to the server: on a busy host
    # later than the token's pass ended (the scheduler's loop and then the stream's task wake late),
    # a delay on the response path, where hopline stamps it
    first_sent: float | None = None
    last_sent: float | None = None
    # when the stream's last chunk ([DONE]) had gone out and the stream ended: the server's last
    # body message, where hopline's engine.last_token is stamped, follows at once
    end_sent: float | None = None
    prefill_left: int = 0
    generated: int = 0
    finish_reason: str | None = None
    aborted: bool = False
    outbox: asyncio.Queue[float | None] = field(default_factory=asyncio.Queue)

    def intervals(self) -> dict[str, float]:
        """queue_s, prefill_s, decode_s: the engine's own stage durations (engine.stats, truth)."""
        assert self.scheduled is not None and self.first_token is not None and self.last_token is not None
        return {
            "queue_s": self.scheduled - self.queued,
            "prefill_s": self.first_token - self.scheduled,
            "decode_s": self.last_token - self.first_token,
        }

    def truth(self, replica: str) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "attempt": self.attempt,
            "replica": replica,
            "stream": self.stream,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "output_tokens": self.generated,
            "max_tokens_set": self.max_tokens_set,
            "finish_reason": self.finish_reason,
            "received": self.received,
            "queued": self.queued,
            "scheduled": self.scheduled,
            "first_token": self.first_token,
            "last_token": self.last_token,
            **self.intervals(),
            "first_sent_late_s": None if self.first_sent is None else self.first_sent - self.first_token,
            "last_sent_late_s": None if self.last_sent is None else self.last_sent - self.last_token,
            "end_sent_late_s": None if self.end_sent is None else self.end_sent - self.last_token,
        }


class Scheduler:
    """Continuous batching over one replica: admit, run one forward pass, hand out tokens, repeat."""

    def __init__(
        self,
        config: EngineConfig,
        *,
        replica: str,
        on_finished: Callable[[SimRequest], None],
    ) -> None:
        self.config = config
        self.replica = replica
        self.on_finished = on_finished
        self.rng = random.Random(config.seed)
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.kv_used = 0
        self.steps = 0
        self.prefix_cache: OrderedDict[str, int] = OrderedDict()
        self._wake = asyncio.Event()

    # -- requests -----------------------------------------------------------------------------

    def draw_answer_tokens(self) -> int:
        cfg = self.config
        if self.rng.random() < cfg.runaway_share:
            return self.rng.randint(*cfg.runaway_tokens)
        return max(1, round(self.rng.lognormvariate(math.log(cfg.answer_median_tokens), cfg.answer_sigma)))

    def cached_prefix(self, messages: list[dict[str, Any]]) -> int:
        """Prompt tokens already in this replica's prefix cache (the conversation so far)."""
        for cut in (len(messages), len(messages) - 1, len(messages) - 2):
            if cut > 0 and (hit := self.prefix_cache.get(prefix_key(messages[:cut]))) is not None:
                return hit
        return 0

    def remember_prefix(self, messages: list[dict[str, Any]], tokens: int) -> None:
        key = prefix_key(messages)
        self.prefix_cache[key] = tokens
        self.prefix_cache.move_to_end(key)
        while len(self.prefix_cache) > self.config.prefix_cache_entries:
            self.prefix_cache.popitem(last=False)

    def submit(self, request: SimRequest) -> None:
        request.queued = clock.now()
        request.prefill_left = max(1, request.prompt_tokens - request.cached_tokens)
        self.waiting.append(request)
        self._wake.set()

    def apply(self, config: EngineConfig) -> None:
        self.config = config

    # -- the loop -------------------------------------------------------------------------------

    def _admit(self, now: float) -> None:
        cfg = self.config
        budget = cfg.kv_budget_tokens
        while self.waiting and len(self.running) < cfg.max_num_seqs:
            head = self.waiting[0]
            if head.aborted:
                self.waiting.popleft()
                continue
            if head.queued > now:
                break  # it arrived after this pass was planned: the next one takes it
            if self.kv_used + head.prompt_tokens + 1 > budget:
                break  # first come, first served: the head waits for memory, so does everyone behind it
            self.waiting.popleft()
            head.scheduled = now
            self.kv_used += head.prompt_tokens
            self.running.append(head)

    def _plan(self) -> tuple[list[SimRequest], list[SimRequest], int]:
        """Which sequences decode this step, which finish their prefill, how many prompt tokens run."""
        cfg = self.config
        decoding = [r for r in self.running if r.prefill_left == 0]
        budget = cfg.max_num_batched_tokens - len(decoding) if cfg.chunked_prefill else math.inf
        prefill_tokens = 0
        prefilled: list[SimRequest] = []
        for r in self.running:
            if r.prefill_left == 0:
                continue
            take = min(r.prefill_left, budget - prefill_tokens)
            if take <= 0:
                break
            r.prefill_left -= take
            prefill_tokens += int(take)
            if r.prefill_left == 0:
                prefilled.append(r)
        return decoding, prefilled, prefill_tokens

    def _emit_token(self, r: SimRequest, at: float) -> None:
        r.generated += 1
        self.kv_used += 1
        done = r.generated >= r.target
        if done or r.generated == 1 or r.generated % self.config.stream_interval == 0:
            r.outbox.put_nowait(at)  # the stream sends every token generated since its last chunk
        if done:
            r.last_token = at
            r.finish_reason = "length" if r.target >= r.limit else "stop"

    async def run(self) -> None:
        """Forward passes back to back on the GPU's own clock (vLLM's async scheduling: the CPU
        plans step N+1 while the GPU runs step N). A pass lasts its modelled time whatever the
        host's CPU does: when this loop wakes late (a busy machine), the pass still ended on time,
        its tokens are stamped then and leave late, and that lateness is the API server's (it is
        in the engine frontend and the network, where a starved CPU shows in production), not the
        GPU's queue, prefill or decode."""
        free_at = clock.now()  # when the GPU finished its last pass
        while True:
            if not self.running and not self.waiting:
                self._wake.clear()
                await self._wake.wait()
            cfg = self.config
            if self.running:
                start = free_at
            else:  # an idle GPU starts when the first waiting request arrived
                start = max(free_at, min((r.queued for r in self.waiting), default=free_at))
            self._admit(start)
            decoding, prefilled, prefill_tokens = self._plan()
            if not decoding and not prefilled and not prefill_tokens:
                # nothing fits yet (only aborted or memory-blocked requests): wait for a change
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), cfg.step_base_s)
                self._reap()
                free_at = max(free_at, clock.now())
                continue
            end = start + (
                cfg.step_base_s
                + cfg.step_per_seq_s * (len(decoding) + len(prefilled))
                + cfg.prefill_per_token_s * prefill_tokens
            )
            await asyncio.sleep(max(0.0, end - clock.now()))
            self.steps += 1
            free_at = end
            for r in decoding:
                if not r.aborted:
                    self._emit_token(r, end)
            for r in prefilled:
                if not r.aborted:
                    r.first_token = end
                    self._emit_token(r, end)
            self._reap()

    def _reap(self) -> None:
        """Free finished and aborted sequences' KV cache."""
        keep = []
        for r in self.running:
            if r.finish_reason is not None or r.aborted:
                self.kv_used -= r.prompt_tokens + r.generated
                if r.finish_reason is not None:
                    r.outbox.put_nowait(None)
                    self.on_finished(r)
            else:
                keep.append(r)
        self.running = keep

    def load(self) -> dict[str, Any]:
        return {
            "running": len(self.running),
            "waiting": len(self.waiting),
            "kv_used_tokens": self.kv_used,
            "kv_budget_tokens": self.config.kv_budget_tokens,
            "steps": self.steps,
        }


# --- HTTP -------------------------------------------------------------------------------------

WORDS = ("the ", "model ", "answers ", "with ", "tokens ", "that ", "mean ", "nothing ", "at ", "all ")


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)


class Engine:
    """The replica: scheduler, truth log and the stats it emits for each finished request."""

    def __init__(self, config: EngineConfig, *, replica: str, emitter: Any | None, truth_path: Path | None):
        self.replica = replica
        self.emitter = emitter
        self.truth_file = truth_path.open("ab") if truth_path else None
        self.scheduler = Scheduler(config, replica=replica, on_finished=self._finished)

    def _finished(self, r: SimRequest) -> None:
        """The engine's own stats, as the scheduler frees the sequence (vLLM's stat loggers)."""
        if self.emitter is not None:
            self.emitter.emit(
                "engine.stats",
                r.request_id,
                attempt=r.attempt,
                **r.intervals(),
                prompt_tokens=r.prompt_tokens,
                output_tokens=r.generated,
                cached_tokens=r.cached_tokens,
                finish_reason=r.finish_reason,
            )

    def _write_truth(self, r: SimRequest) -> None:
        """A finished request's true intervals, once its response has left (so it knows when)."""
        if self.truth_file is not None and r.finish_reason is not None:
            self.truth_file.write(orjson.dumps(r.truth(self.replica), option=orjson.OPT_APPEND_NEWLINE))
            self.truth_file.flush()

    def close(self) -> None:
        if self.truth_file is not None:
            self.truth_file.close()
            self.truth_file = None  # a stream that ends after the shutdown writes no truth

    async def chat_completions(self, request: Request) -> Response:
        received = clock.now()
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            body = None
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            return _error(400, "body must be JSON with a non-empty 'messages' list")
        cfg = self.scheduler.config
        prompt_tokens = estimate_prompt_tokens(messages)
        if prompt_tokens >= cfg.max_model_len:
            return _error(
                400, f"prompt has about {prompt_tokens} tokens; this model's context is {cfg.max_model_len}"
            )
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        room = cfg.max_model_len - prompt_tokens
        limit = min(int(max_tokens), room) if max_tokens else room
        stream = bool(body.get("stream"))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        request_id = request.headers.get("x-request-id") or f"{time.time_ns():x}"
        attempt = int(request.headers.get("x-hopline-attempt") or 0)
        await asyncio.sleep(cfg.frontend_s + cfg.frontend_per_token_s * prompt_tokens)
        r = SimRequest(
            request_id=request_id,
            attempt=attempt,
            stream=stream,
            prompt_tokens=prompt_tokens,
            cached_tokens=min(self.scheduler.cached_prefix(messages), prompt_tokens - 1),
            limit=limit,
            max_tokens_set=bool(max_tokens),
            target=min(self.scheduler.draw_answer_tokens(), limit),
            received=received,
        )
        self.scheduler.remember_prefix(messages, prompt_tokens)
        self.scheduler.submit(r)
        meta = {
            "id": f"chatcmpl-{request_id}",
            "created": int(time.time()),
            "model": body.get("model") or cfg.model.name,
        }
        if stream:
            return StreamingResponse(self._stream(r, meta, include_usage), media_type="text/event-stream")
        return await self._complete(r, meta)

    def _usage(self, r: SimRequest) -> dict[str, Any]:
        return {
            "prompt_tokens": r.prompt_tokens,
            "completion_tokens": r.generated,
            "total_tokens": r.prompt_tokens + r.generated,
            "prompt_tokens_details": {"cached_tokens": r.cached_tokens},
        }

    async def _stream(self, r: SimRequest, meta: dict[str, Any], include_usage: bool) -> AsyncIterator[bytes]:
        """One SSE event per token, or per run of tokens when the reader falls behind (as vLLM's
        output processor merges what accumulated since the reader last took output)."""
        chunk = {**meta, "object": "chat.completion.chunk"}
        sent = 0
        try:
            while (await r.outbox.get()) is not None:
                done = False
                while not r.outbox.empty():
                    done = r.outbox.get_nowait() is None
                    if done:
                        break
                if sent == 0:  # like vLLM, the role chunk leaves with the first output
                    yield _sse(
                        {
                            **chunk,
                            "choices": [
                                {
                                    "index": 0,
                                    "delta": {"role": "assistant", "content": ""},
                                    "logprobs": None,
                                    "finish_reason": None,
                                }
                            ],
                        }
                    )
                text = "".join(WORDS[i % len(WORDS)] for i in range(sent, r.generated))
                r.last_sent = clock.now()  # the server sends it as this generator yields it
                if sent == 0:
                    r.first_sent = r.last_sent
                sent = r.generated
                yield _sse(
                    {
                        **chunk,
                        "choices": [
                            {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": None}
                        ],
                    }
                )
                if done:
                    break
            yield _sse(
                {
                    **chunk,
                    "choices": [
                        {"index": 0, "delta": {}, "logprobs": None, "finish_reason": r.finish_reason}
                    ],
                }
            )
            if include_usage:
                yield _sse({**chunk, "choices": [], "usage": self._usage(r)})
            yield b"data: [DONE]\n\n"
            r.end_sent = clock.now()
        finally:
            if r.finish_reason is None:
                r.aborted = True  # the client went away: stop generating for it
            try:  # written after the stream's end went out: a slow disk is not on the response path
                asyncio.get_running_loop().call_soon(self._write_truth, r)
            except RuntimeError:  # closed outside the event loop
                self._write_truth(r)

    async def _complete(self, r: SimRequest, meta: dict[str, Any]) -> Response:
        try:
            while (await r.outbox.get()) is not None:
                pass
        finally:
            if r.finish_reason is None:
                r.aborted = True
            self._write_truth(r)
        text = "".join(WORDS[i % len(WORDS)] for i in range(1, r.generated + 1))
        return JSONResponse(
            {
                **meta,
                "object": "chat.completion",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "logprobs": None,
                        "finish_reason": r.finish_reason,
                    }
                ],
                "usage": self._usage(r),
            }
        )


def create_app(engine: Engine) -> FastAPI:
    """The engine's HTTP API (without hopline's middleware: ``main`` adds it)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        task = loop.create_task(engine.scheduler.run())
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # Windows; not main thread
            loop.add_signal_handler(
                signal.SIGUSR1, lambda: engine.scheduler.apply(engine.scheduler.config.with_incident())
            )
        try:
            yield
        finally:
            task.cancel()
            engine.close()

    app = FastAPI(title=f"simulated engine {engine.replica}", lifespan=lifespan)
    app.add_api_route("/v1/chat/completions", engine.chat_completions, methods=["POST"])

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": engine.scheduler.config.model.name, "object": "model"}]}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return engine.scheduler.load()

    return app


def main(argv: list[str] | None = None) -> None:
    from hopline.demo.process import announce_port, listening_socket, watch_parent
    from hopline.demo.wiring import engine_middleware, make_emitter, serve

    parser = argparse.ArgumentParser(description="Simulated OpenAI-compatible engine replica (hopline demo).")
    parser.add_argument("--replica", required=True)
    parser.add_argument("--sink", help="hopline event sink, e.g. http://127.0.0.1:9000")
    parser.add_argument("--truth", type=Path, help="JSONL file for each request's true intervals")
    parser.add_argument("--port-file", type=Path, required=True)
    parser.add_argument("--config", default="{}", help="EngineConfig fields as JSON")
    args = parser.parse_args(argv)
    watch_parent()
    config = EngineConfig.from_dict(orjson.loads(args.config))
    emitter = make_emitter(args.sink, service="engine", replica=args.replica, model=config.model.name)
    engine = Engine(config, replica=args.replica, emitter=emitter, truth_path=args.truth)
    sock = listening_socket()
    announce_port(args.port_file, sock.getsockname()[1])
    serve(engine_middleware(create_app(engine), emitter), sock)


if __name__ == "__main__":
    main()
