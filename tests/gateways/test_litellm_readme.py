"""The README's LiteLLM config, as written, starts the pinned LiteLLM proxy (issue 35, the first
hour, round three).

Before: LiteLLM 1.106.12 refused to start on it ("LiteLLM proxy refused to start: no master key
is set", UnsafeMasterKeyError): the README's config had no ``general_settings.master_key``.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import httpx
from litellm_testing import LITELLM_BIN, _free_port, _wait_healthy

REPO = Path(__file__).resolve().parents[2]
KEY = "sk-readme-" + "0" * 32


def readme_config() -> str:
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"^```yaml\n(.*?)^```", readme, re.MULTILINE | re.DOTALL)
    (config,) = [b for b in blocks if "proxy_handler" in b]
    return config


def test_the_readmes_litellm_config_starts_the_pinned_proxy_and_asks_for_its_key(tmp_path):
    assert LITELLM_BIN.exists(), f"no LiteLLM proxy at {LITELLM_BIN}: run .ci/litellm-setup.sh"
    config = tmp_path / "config.yaml"
    config.write_text(readme_config())  # as written: its engine address (r1:8000) is never called here
    port = _free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("HOPLINE_", "LITELLM_"))},
        "HOPLINE_SINK": f"file:{tmp_path}/litellm.ndjson",  # what the README puts in the environment
        "HOPLINE_SERVICE": "litellm",
        "HOPLINE_REPLICA": "gw-0",
        "LITELLM_MASTER_KEY": KEY,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # the wheel's own cost map: no fetch from the internet
        "NO_PROXY": "127.0.0.1,localhost",
    }
    log = tmp_path / "litellm.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(LITELLM_BIN), "--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=tmp_path,
        )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, proc, log)  # before: it exited at startup, refusing to run without a key
        models = httpx.get(url + "/v1/models", timeout=10)
        # refused without the key (401 is meant; 1.106.12 answers 500: its auth failure handler
        # imports prisma, which its venv lacks without a database)
        assert models.status_code >= 400 and "llama" not in models.text, models.text
        models = httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
        assert models.status_code == 200, models.text
        assert [m["id"] for m in models.json()["data"]] == ["llama"]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
