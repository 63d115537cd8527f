"""The compiled stage table (collector/stages.py) gives exactly what the contract's functions give."""

from __future__ import annotations

import inspect
import random
import traceback

import pytest
from hopline.collector import stages
from hopline.middleware import contract
from hopline.middleware.contract import HOPS, INPUTS, RATIOS, STAGE_NAMES, validate_event
from support.golden import GOLDEN


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: c["name"])
def test_golden_cases_match_the_interpreted_table(case):
    events = [validate_event(e) for e in case["events"]]
    assert stages.request_inputs(events) == contract.request_inputs(events)
    assert stages.compute_stages(events) == contract.compute_stages(events)


def test_random_inputs_evaluate_bit_for_bit():
    rng = random.Random(7)
    names = [i.name for i in INPUTS] + ["stream", "n", "output_tokens"]
    for _ in range(3000):
        values = {}
        for name in names:
            if name == "stream":
                values[name] = rng.choice([True, False, None])
            elif name in ("n", "output_tokens"):
                values[name] = rng.choice([None, 0, 1, 2, 3, 50])
            else:
                values[name] = rng.choice([None, None, 0, rng.uniform(-1, 100), 1700000000.5])
        want = contract.evaluate(dict(values))
        got = stages.evaluate(dict(values))
        for key in (*STAGE_NAMES, *(r.name for r in RATIOS)):
            assert got[key] == want[key] and type(got[key]) is type(want[key]), key


def test_random_requests_pick_the_same_events():
    """Retries, repeated hops, ties on ts, attributes on some hops only."""
    rng = random.Random(11)
    attrs = ("stream", "n", "output_tokens", "prompt_tokens", "pool_wait_s", "queue_s", "finish_reason")
    for r in range(500):
        events = []
        for i in range(rng.randint(1, 20)):
            event = {
                "ts": 1_700_000_000 + rng.choice([0.0, 0.5, 1.0, rng.random()]),
                "request_id": f"r{r}",
                "hop": rng.choice(HOPS),
                "attempt": rng.randint(0, 2),
                "eid": f"{r}-{i}",
            }
            for name in rng.sample(attrs, rng.randint(0, 3)):
                event[name] = {"stream": rng.random() < 0.5, "finish_reason": "stop"}.get(
                    name, rng.randint(0, 9)
                )
            events.append(validate_event(event))
        assert stages.request_inputs(events) == contract.request_inputs(events)
        assert stages.compute_stages(events) == contract.compute_stages(events)


def test_generated_code_shows_in_tracebacks_and_getsource():
    """A bug in the generated functions is debuggable: the traceback quotes the generated line."""
    values = {name: "not a number" for name in stages._names()}  # str + float fails in a stage sum
    with pytest.raises(TypeError) as caught:
        stages.evaluate({**values, "stream": True})
    frame = caught.traceback[-1]
    assert str(frame.path) == "<hopline stage table>"
    assert "v_" in str(frame.statement)  # the generated statement, e.g. v_client_ttft = (0.0 + ...)
    formatted = "".join(traceback.format_exception(caught.value))
    assert 'File "<hopline stage table>"' in formatted and " * v_" in formatted
    assert inspect.getsource(stages.evaluate).startswith("def evaluate(values):")
    assert inspect.getsource(stages.request_inputs).startswith("def request_inputs(events):")


def test_one_function_gives_the_contracts_dict_key_for_key_bit_for_bit():
    """``stages.compute_stages`` (the join's: reads and formulas in one generated function) gives
    the contract's dict with its keys in the same order (the ``upstream`` attribute overwritten by
    the ``upstream`` stage in place) and each value of the same type and bits (an int stays an int),
    on random requests: retries, ties on ts, P/D prefill legs, attributes on some
    hops only."""
    rng = random.Random(13)
    floats = (
        "queue_s", "prefill_s", "decode_s", "connect_s", "pool_wait_s", "engine_queue_s", "kv_transfer_s"
    )
    ints = ("n", "output_tokens", "prompt_tokens", "max_tokens", "cached_tokens")
    listed = 0
    for r in range(1500):
        events = []
        for i in range(rng.randint(1, 24)):
            event = {
                "ts": 1_700_000_000 + rng.choice([0.0, 0.5, 1.0, rng.random(), rng.uniform(-2, 2)]),
                "request_id": f"r{r}",
                "hop": rng.choice(HOPS),
                "attempt": rng.randint(0, 2),
                "eid": f"{r}-{i}",
            }
            if event["hop"].startswith("engine.") and rng.random() < 0.2:
                event["leg"] = rng.choice(["prefill", "decode"])
            for name in rng.sample(floats, rng.randint(0, 3)):
                event[name] = rng.choice([0.0, 0.25, 1e-9, rng.uniform(0, 3)])
            for name in rng.sample(ints, rng.randint(0, 3)):
                event[name] = rng.choice([0, 1, 2, 7, 300])
            if rng.random() < 0.5:
                event["stream"] = rng.random() < 0.7
            if event["hop"] == "gateway.forwarded" and rng.random() < 0.5:
                event["upstream"] = rng.choice(["r0", "r1"])
            events.append(validate_event(event))
        got, want = stages.compute_stages(events), contract.compute_stages(events)
        assert list(got) == list(want)
        for key, value in want.items():
            assert type(got[key]) is type(value) and repr(got[key]) == repr(value), (r, key)
        negative = stages.negative_stages(got)
        assert negative == contract.negative_stages(want), r
        listed += bool(negative)
    assert 100 < listed < 1400  # requests with negative stages and without both met


def test_negative_stages_of_the_compiled_dict_as_the_contracts():
    """``stages.negative_stages`` (the join's: the stages' slots of the compiled dict by C loops)
    lists what the contract's function lists: a stage in a slot of its own or in an attribute's
    (``upstream``), just below the tolerance or not, and behind a NaN (which hides nothing)."""
    values = stages.compute_stages([validate_event(e) for e in GOLDEN["cases"][0]["events"]])
    own = [name for name in STAGE_NAMES if name not in stages._STAGES_IN_PLACE]
    assert stages.negative_stages(values) == contract.negative_stages(values) == []
    for case in (
        {own[0]: -1.0},
        {own[-1]: -2e-9},
        {own[3]: -0.5e-9},
        {"upstream": -0.25},
        {own[0]: float("nan"), own[5]: -3.0},
        {own[2]: float("nan"), "upstream": -3.0},
        {own[1]: 0.0, own[4]: -0.0, own[6]: None},
    ):
        changed = {**values, **case}
        assert list(changed) == list(values)
        assert stages.negative_stages(changed) == contract.negative_stages(changed), case
    both = stages.negative_stages({**values, own[0]: -1.0, "upstream": -1.0})
    assert both == [name for name in STAGE_NAMES if name in (own[0], "upstream")]  # in STAGE_NAMES' order
