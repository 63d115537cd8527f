"""Command-line parsing: durations, --model-config (KV bytes per token), the command's errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hopline.collector.config import CollectorConfig
from hopline.collector.kv_cache import parse_model_config
from hopline.middleware.contract.durations import parse_duration
from support.servers import env_without_hopline


def test_durations():
    assert parse_duration("14d") == 14 * 86400
    assert parse_duration("90s") == parse_duration("90") == 90
    assert parse_duration("1.5h") == 5400
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration("two weeks")


def test_model_config_inline_and_from_a_hugging_face_config(tmp_path):
    # 2 (K and V) x 32 layers x 8 KV heads x 128 dims x 2 bytes (bf16) = 131072 bytes per token
    assert parse_model_config("llama=32,8,128,bf16") == ("llama", 131072)
    config = {
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "hidden_size": 2048,
        "torch_dtype": "bfloat16",
    }  # no head_dim: hidden_size / heads = 64 -> 2 x 48 x 4 x 64 x 2 = 49152
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert parse_model_config(f"qwen={tmp_path}") == ("qwen", 49152)
    assert parse_model_config(f"qwen={tmp_path / 'config.json'}") == ("qwen", 49152)
    with pytest.raises(ValueError, match="NAME=PATH"):
        parse_model_config("no-equals-sign")
    with pytest.raises(ValueError, match="unknown dtype"):
        parse_model_config("m=32,8,128,float13")


def test_bad_fsync_policy_is_refused(tmp_path):
    with pytest.raises(ValueError, match="fsync must be one of batch, interval, none"):
        CollectorConfig(data_dir=tmp_path, fsync="sometimes")


def test_command_reports_a_bad_model_config_and_exits_2(tmp_path):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "hopline.collector",
            "--data-dir",
            str(tmp_path),
            "--model-config",
            "m=/nonexistent.json",
        ],
        check=False,
        capture_output=True,
        text=True,
        env=env_without_hopline(),
        timeout=60,
    )
    assert r.returncode == 2
    assert "--model-config m: cannot read model config /nonexistent.json" in r.stderr


def test_help_has_an_example():
    r = subprocess.run(
        [sys.executable, "-m", "hopline.collector", "--help"],
        check=False,
        capture_output=True,
        text=True,
        env={**env_without_hopline(), "COLUMNS": "200"},
        timeout=60,
    )
    assert r.returncode == 0
    assert "hopline collector --port 9400 --data-dir" in r.stdout
