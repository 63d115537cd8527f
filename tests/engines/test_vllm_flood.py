"""A flood on a real vLLM: the first finding is the queue rising at the flood's onset.

Issue 15 on the real engine (CPU build, tiny random Llama, ``--max-num-seqs 4``): two steady chat
users call it through hopline's client; after ``STEADY_S`` a batch job adds ``FLOOD_USERS``
back-to-back streams on the same replica for ``FLOOD_S``, then the chat users go on alone for
``AFTER_S``. With 14 streams on 4 slots, ten wait: queue time goes from ~0 to a second or more
and back. ``hopline analyze --json`` on the client's and the engine's events must put first
a queue shift whose ``at`` is the flood's start (± 2 windows), at least doubled — not the end of
the flood, nor the client's own pool wait, nor a percentage from a near-zero baseline.
"""

from __future__ import annotations

import contextlib
import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import httpx
import orjson
import pytest
from hopline.middleware.client import instrument
from hopline.middleware.emit import Emitter
from test_vllm import MODEL, free_port, start_server, stop_server, tail, vllm_dir, wait_ready

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(720)]

MAX_NUM_SEQS = 4
STEADY_USERS, FLOOD_USERS = 2, 12
STEADY_S, FLOOD_S, AFTER_S = 40.0, 40.0, 30.0  # at least; and MIN_SIDE answers before and after
# The analysis needs 50 requests on each side of a change (ShiftConfig.min_side): on a slow
# machine 40 s of steady chat gave 35, and the onset was found 4.4 s late, where the 50th was.
MIN_SIDE = 60
MAX_PHASE_S = 150.0
MAX_TOKENS = 64  # alike for both: decode time follows answer length, so a batch of longer
# answers would raise it without anything getting slower
THINK_S = 0.1  # a chat user's mean pause between answers; the batch job has none
WINDOW = "2s"  # 55 windows over 110 s; the onset must be found within 2 of them
MIN_FACTOR = 2.0
# The engine must be what saturates. The tiny model is so fast that the Python around it (the
# API server detokenizing and streaming, this client reading 14 streams), sharing two cores with
# it and, here, with other work, saturates first: the wait then moves out of the engine's queue
# into the stream's delivery ("network") and the client's pool, and no queue builds. So the
# engine serves the tiny model's tokenizer and config with random weights (no checkpoint read)
# and a model 16 layers deep and 2x wider, ~0.5 s for 64 tokens alone, and streams 16 tokens a
# chunk (the first at once).
BIGGER = {"hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 16, "num_attention_heads": 8,
          "num_key_value_heads": 4, "head_dim": 32}  # fmt: skip
SERVE_ARGS = ("--load-format", "dummy", "--hf-overrides", json.dumps(BIGGER), "--stream-interval", "16")


class Answers:
    """Answers finished so far, counted across the users' threads, and when the first call of
    any of them was sent (wall clock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0
        self.sent = threading.Event()
        self.first_sent: float | None = None

    def sending(self) -> None:
        with self._lock:
            if self.first_sent is None:
                self.first_sent = time.time()
                self.sent.set()

    def add(self) -> None:
        with self._lock:
            self.count += 1


def wait_for(answers: Answers, count: int, at_least_s: float) -> None:
    """Until ``answers`` reach ``count`` and ``at_least_s`` have passed (at most ``MAX_PHASE_S``)."""
    start = time.monotonic()
    while (elapsed := time.monotonic() - start) < MAX_PHASE_S:
        if elapsed >= at_least_s and answers.count >= count:
            return
        time.sleep(0.2)


def user(
    client: httpx.Client,
    port: int,
    stop: threading.Event,
    max_tokens: int,
    pause_s: float,
    seed: int,
    answers: Answers,
) -> int:
    """One user calling until ``stop`` is set, pausing a random time of mean ``pause_s`` between
    answers (users in lockstep would share every engine step); returns its answers."""
    rng = random.Random(seed)
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hello world, tell me about latency"}],
        "stream": True,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    done = 0
    while not stop.is_set():
        answers.sending()
        with client.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body) as r:
            assert r.status_code == 200, r.read()
            usage = [orjson.loads(line[6:])["usage"] for line in r.iter_lines() if '"usage":{' in line]
        assert usage and usage[-1]["completion_tokens"] == max_tokens, usage
        done += 1
        answers.add()
        time.sleep(rng.expovariate(1 / pause_s) if pause_s else 0.0)
    return done


@contextlib.contextmanager
def chat_and_batch(emitter: Emitter) -> Iterator[tuple[httpx.Client, httpx.Client, ThreadPoolExecutor]]:
    """The chat users' client (service ``chat``) and the batch job's (``batch``), instrumented,
    and a thread for each user of both."""
    limits = httpx.Limits(max_connections=32)
    with (
        instrument(httpx.Client(timeout=120, limits=limits), emitter=emitter, service="chat") as chat_c,
        instrument(httpx.Client(timeout=120, limits=limits), emitter=emitter, service="batch") as batch_c,
        ThreadPoolExecutor(STEADY_USERS + FLOOD_USERS) as pool,
    ):
        yield chat_c, batch_c, pool


def scenario(port: int, emitter: Emitter) -> dict[str, float]:
    """Steady chat, flood, steady chat; returns when the flood started, when its last call began
    (``flood_stop``) and when that call ended (``flood_end``), in wall-clock seconds.

    Each user is a thread with a blocking client: streams sharing one asyncio loop were seen to
    starve each other (a whole answer arriving at its end), which would be the client's artifact.
    """
    with chat_and_batch(emitter) as (chat_c, batch_c, pool):
        chat, steady_over, flood_over = Answers(), threading.Event(), threading.Event()
        steady = [
            pool.submit(user, chat_c, port, steady_over, MAX_TOKENS, THINK_S, i, chat)
            for i in range(STEADY_USERS)
        ]
        wait_for(chat, MIN_SIDE, STEADY_S)
        batch, flood_asked = Answers(), time.time()
        flood = [
            pool.submit(user, batch_c, port, flood_over, MAX_TOKENS, 0.0, i, batch) for i in range(FLOOD_USERS)
        ]
        # The flood starts when its first call is sent, not when it was asked for. In CI on
        # 2026-12-07, 78 s of wall clock passed from the ask to the flood's stop (40 s of sleep):
        # the test stalled 38 s in between, and the queue rose 40 s before the stop, when the
        # batch's calls reached the engine; against the ask, that read as an onset 38 s late.
        assert batch.sent.wait(MAX_PHASE_S), "no batch call was sent"
        flood_start = batch.first_sent
        time.sleep(FLOOD_S)
        flood_over.set()
        flood_stop = time.time()  # no batch call starts after this
        flooded = sum(f.result() for f in flood)
        flood_end = time.time()
        wait_for(chat, chat.count + MIN_SIDE, AFTER_S)
        steady_over.set()
        answered = sum(f.result() for f in steady)
    return {
        "flood_asked": flood_asked,
        "flood_start": flood_start,
        "flood_stop": flood_stop,
        "flood_end": flood_end,
        "chat": answered,
        "batch": flooded,
    }


def epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def test_a_flood_is_reported_at_its_onset_as_a_queue_rise(tmp_path: Path) -> None:
    root = vllm_dir()
    events = tmp_path / "events"
    events.mkdir()
    port, log_path = free_port(), tmp_path / "serve.log"
    proc = start_server(
        root, port, events / "engine.ndjson", log_path, max_num_seqs=MAX_NUM_SEQS, extra_args=SERVE_ARGS
    )
    emitter = Emitter(f"file:{events / 'client.ndjson'}")
    try:
        wait_ready(proc, port, log_path)
        run = scenario(port, emitter)
    finally:
        emitter.close()
        stop_server(proc)
    analysed = subprocess.run(
        [str(Path(sys.executable).parent / "hopline"), "analyze", str(events), "--json", "--window", WINDOW],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert analysed.returncode == 0, analysed.stderr[-2000:]
    result = json.loads(analysed.stdout)
    findings = result["findings"]
    print(f"\n{run}; {result['requests']} requests, window {result['window_s']} s")
    for f in findings[:5]:
        print(f"- {f['summary']}  [impact {f.get('impact_s')} s]")
    assert findings, f"no findings; server log:\n{tail(log_path)}"
    first = findings[0]
    window_s = result["window_s"]
    assert (first["kind"], first.get("stage")) == ("shift", "queue"), [f["summary"] for f in findings[:3]]
    assert abs(epoch(first["at"]) - run["flood_start"]) <= 2 * window_s, (first, run)
    assert first["after_ms"] >= MIN_FACTOR * first["before_ms"], first
    # one finding with its end, not the flood's first half and then another finding for its end:
    # the queue drains while the batch's last streams finish, around when its last call began
    until = first["until"]
    assert until is not None, first
    assert run["flood_start"] + FLOOD_S / 2 <= epoch(until) <= run["flood_end"] + 2 * window_s, (first, run)
    assert "%" not in first["summary"].split(";")[0], first["summary"]  # before → after, not 5372911%
