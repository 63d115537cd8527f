"""The LiteLLM callback never raises into LiteLLM and keeps bounded state, whatever its hooks get.

Runs in the LiteLLM venv (the callback imports litellm, which hopline's own venv does not have):
tests/gateways/litellm_callback_check.py feeds every hook hostile input and reports back.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from hopline.middleware.contract import validate_event
from litellm_testing import LITELLM_DIR


def test_hooks_swallow_hostile_input_and_count_it():
    python = LITELLM_DIR / "venv" / "bin" / "python"
    assert python.exists(), f"no LiteLLM venv at {python.parent.parent}: run `bash .ci/setup`"
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    out = subprocess.run(
        [str(python), str(Path(__file__).with_name("litellm_callback_check.py"))],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=True,
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["raised"] == []
    assert report["relayed"] == [1, None, "x"]  # the stream passes through untouched
    assert report["errors"] >= 4  # each hostile mapping was caught and counted
    assert report["open"] == 10_000  # MAX_OPEN: the oldest unfinished requests are forgotten
    failure = [e for e in report["events"] if e["hop"] == "gateway.error"]
    assert [(e["error"], e.get("status")) for e in failure] == [("exception:Weird", None)]
    for event in report["events"]:
        validate_event(event)
