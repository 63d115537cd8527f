"""A reasoning stream from a real vLLM: hopline counts the model's thinking as output.

vLLM (CPU build, tiny random Llama) serves with a reasoning parser (tests/engines/
tiny_reasoning_parser.py: vLLM's DeepSeek-R1 parser with the tiny tokenizer's ``<|assistant|>`` and
``<|end|>`` as its start and end), and each request sets ``thinking_token_budget``: vLLM forces the
end of the thought after that many tokens, so every stream is ``BUDGET`` chunks of ``reasoning``
deltas, then ``content`` deltas to ``max_tokens`` (the forced end token itself is no delta). The
requests go through hopline's client; the engine runs hopline's middleware. vLLM 0.32.0 has no
per-request reasoning/content split of its own to compare with (no
``--enable-per-request-output-token-metrics``), and its usage says ``reasoning_tokens: 0`` for
these streams.

Checked: the stream has that shape (so the parser and the budget ran); hopline's engine and client
``*.last_token`` count the reasoning chunks among the output chunks, and the output tokens are
vLLM's usage. The last test asserts the reasoning timings of issue 25's contract work (first
reasoning and first content delta per reader), kept apart because it depends on that work.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import test_vllm as vllm
from hopline.middleware.client import instrument
from hopline.middleware.contract import compute_stages
from hopline.middleware.emit import Emitter
from support.chat_stream import chat_stream

# vLLM starts in 20-45 s alone, in minutes on a machine busy with other work
STARTUP_WAIT_S = 2 * vllm.STARTUP_TIMEOUT_S
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

HERE = Path(__file__).resolve().parent
SERVE_ARGS = (
    "--reasoning-parser-plugin", str(HERE / "tiny_reasoning_parser.py"), "--reasoning-parser", "tiny_think",
)  # fmt: skip
REQUESTS = 3
BUDGET = 6  # reasoning tokens before vLLM forces the end of the thought
MAX_TOKENS = 20  # up to BUDGET reasoning tokens, the end token, content tokens


@dataclass
class Run:
    events: Path
    log: Path
    streams: list[dict[str, Any]] = field(default_factory=list)


def ask(client: httpx.Client, port: int, question: int) -> dict[str, Any]:
    """One streaming chat call; per output chunk, in order, the kinds of text its delta carried
    (``reasoning``, ``content``, or both), and the usage."""
    body = {
        "model": vllm.MODEL,
        "messages": [{"role": "user", "content": f"Question {question}: why is the sky blue?"}],
        "stream": True,
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "temperature": 0.0,
        "thinking_token_budget": BUDGET,
        "stream_options": {"include_usage": True},
    }
    seen = chat_stream(client, f"http://127.0.0.1:{port}/v1/chat/completions", body)
    kinds = []
    for chunk in seen["chunks"]:
        for choice in chunk.get("choices", []):
            delta = choice.get("delta", {})
            carried = "+".join(kind for kind in ("reasoning", "content") if delta.get(kind))
            if carried:
                kinds.append(carried)
    return {"request_id": seen["request_id"], "kinds": kinds, "usage": seen["usage"]}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    root = vllm.vllm_dir()
    tmp = tmp_path_factory.mktemp("reasoning")
    result = Run(events=tmp / "events", log=tmp / "serve.log")
    result.events.mkdir()
    port = vllm.free_port()
    proc = vllm.start_server(root, port, result.events / "engine.ndjson", result.log, extra_args=SERVE_ARGS)
    emitter = Emitter(f"file:{result.events / 'client.ndjson'}")
    try:
        vllm.wait_ready(proc, port, result.log, STARTUP_WAIT_S)
        with instrument(httpx.Client(timeout=120), emitter=emitter, service="chat") as client:
            result.streams = [ask(client, port, i) for i in range(REQUESTS)]
    finally:
        emitter.close()
        vllm.stop_server(proc)
    yield result


def last_tokens(run: Run) -> dict[str, dict[str, dict[str, Any]]]:
    """Per request ID, its ``*.last_token`` events by component."""
    found: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for path in sorted(run.events.glob("*.ndjson")):
        for event in vllm.read_events(path):
            if event["hop"].endswith(".last_token"):
                found[event["request_id"]][event["hop"].partition(".")[0]] = event
    return found


def test_the_stream_thinks_first_and_hopline_counts_its_thoughts_as_output(run: Run) -> None:
    """Reasoning chunks, then content chunks (one chunk may carry the end of the one and the start
    of the other). Their numbers are not the tokens': a random model's byte-level tokens can end
    inside a character, whose text vLLM holds back to the next chunk."""
    ends = last_tokens(run)
    for stream in run.streams:
        kinds = stream["kinds"]
        thinking = kinds.index("content") if "content" in kinds else len(kinds)
        if thinking < len(kinds) and kinds[thinking - 1] == "reasoning+content":
            thinking -= 1
        assert 1 <= thinking <= BUDGET, (kinds, vllm.tail(run.log))
        assert set(kinds[:thinking]) == {"reasoning"}, kinds
        assert set(kinds[thinking:]) <= {"reasoning+content", "content"} and "content" in kinds, kinds
        assert kinds.count("reasoning+content") <= 1, kinds
        assert stream["usage"]["completion_tokens"] == MAX_TOKENS, stream["usage"]
        mine = ends[stream["request_id"]]
        assert sorted(mine) == ["client", "engine"], mine
        for event in mine.values():
            assert event["output_chunks"] == len(kinds), (event, kinds)
            assert event["output_tokens"] == MAX_TOKENS, event


# hopline's reasoning timings (issue 25): first_reasoning_at / first_content_at on *.last_token


def test_first_reasoning_and_first_content_are_told_apart(run: Run) -> None:
    """Each reader notes when the thought began (its first token) and when the answer began; the
    stage table's content TTFT and reasoning phase come from them."""
    grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for path in sorted(run.events.glob("*.ndjson")):
        for event in vllm.read_events(path):
            grouped[event["request_id"]].append(event)
    for stream in run.streams:
        events = grouped[stream["request_id"]]
        by_hop = {e["hop"]: e for e in events}
        for view in ("engine", "client"):
            last = by_hop[f"{view}.last_token"]
            assert by_hop[f"{view}.first_token"]["ts"] == pytest.approx(
                last["first_reasoning_at"], abs=1e-6
            ), last
            assert last["first_reasoning_at"] < last["first_content_at"], last
        stages = compute_stages(events)
        for view in ("engine", "client"):
            assert stages[f"{view}_content_ttft"] > stages[f"{view}_ttft"], stages
        engine = by_hop["engine.last_token"]
        assert stages["reasoning"] == pytest.approx(
            engine["first_content_at"] - engine["first_reasoning_at"]
        ), stages
