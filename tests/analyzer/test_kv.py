"""KV-cache arithmetic: bytes per token from numbers or a config.json, per request, in flight per replica."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import polars as pl
import pytest

from hopline.analyzer.kv import KVConfigError, KVSpec, dtype_bytes, kv_in_flight, request_kv_bytes

KIB, MIB = 1024, 1024**2

# Trimmed from the models' published config.json files.
QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "hidden_size": 2048,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_hidden_layers": 48,
    "torch_dtype": "bfloat16",
}
LLAMA_31_8B = {
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 32,
    "torch_dtype": "bfloat16",
}


def test_lesson_examples_bytes_per_token() -> None:
    # 2 × 48 × 4 × 128 × 2 = 98,304 B = 96 KiB; 2 × 32 × 8 × 128 × 2 = 131,072 B = 128 KiB
    assert KVSpec(48, 4, 128, "bf16").bytes_per_token == 96 * KIB
    assert KVSpec(32, 8, 128, "bf16").bytes_per_token == 128 * KIB
    # at the end of the request: 6,000 + 400 tokens = 600 MiB; 1,500 + 20 = 190 MiB
    assert KVSpec(48, 4, 128, "bf16").bytes_for(6400) == 600 * MIB
    assert KVSpec(32, 8, 128, "bf16").bytes_for(1520) == 190 * MIB


def test_from_config_file(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(QWEN3_30B_A3B))
    spec = KVSpec.from_config(path)
    assert spec == KVSpec(48, 4, 128, "bfloat16")
    assert spec.bytes_per_token == 96 * KIB


def test_from_config_defaults_head_dim_and_kv_heads() -> None:
    # Llama's config has no head_dim: hidden_size / num_attention_heads = 4096 / 32 = 128
    assert KVSpec.from_config(LLAMA_31_8B).bytes_per_token == 128 * KIB
    # without num_key_value_heads every attention head keeps its own K and V (no GQA): 4× the KV
    no_gqa = {k: v for k, v in LLAMA_31_8B.items() if k != "num_key_value_heads"}
    assert KVSpec.from_config(no_gqa).kv_heads == 32
    assert KVSpec.from_config(no_gqa).bytes_per_token == 512 * KIB


def test_kv_dtype_overrides_weights_dtype() -> None:
    # an FP8 cache beside BF16 weights halves the KV bytes
    assert KVSpec.from_config(QWEN3_30B_A3B, kv_dtype="fp8").bytes_per_token == 48 * KIB
    assert (
        KVSpec.from_config({**QWEN3_30B_A3B, "torch_dtype": None, "dtype": "float32"}).bytes_per_token
        == 192 * KIB
    )


def test_text_config_of_multimodal_models() -> None:
    config = {"architectures": ["X"], "torch_dtype": "bfloat16", "text_config": LLAMA_31_8B}
    assert KVSpec.from_config(config).bytes_per_token == 128 * KIB


@pytest.mark.parametrize(
    ("name", "size"), [("bf16", 2), ("torch.float16", 2), ("FP32", 4), ("fp8_e4m3", 1), ("int8", 1)]
)
def test_dtype_names(name: str, size: int) -> None:
    assert dtype_bytes(name) == size


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({**LLAMA_31_8B, "num_hidden_layers": None}, "has no num_hidden_layers"),
        ({**LLAMA_31_8B, "num_hidden_layers": 0}, "num_hidden_layers must be a positive integer"),
        ({**LLAMA_31_8B, "num_key_value_heads": "8"}, "num_key_value_heads must be a positive integer"),
        ({**LLAMA_31_8B, "hidden_size": 4000, "num_attention_heads": 48}, "not a multiple"),
        ({k: v for k, v in LLAMA_31_8B.items() if k != "torch_dtype"}, "no torch_dtype or dtype"),
        ({**LLAMA_31_8B, "torch_dtype": "float7"}, "unknown dtype 'float7'"),
        ([1, 2], "must be a JSON object"),
    ],
)
def test_bad_configs_say_what_is_wrong(config, message: str) -> None:
    with pytest.raises(KVConfigError, match=message):
        KVSpec.from_config(config)


def test_bad_config_files(tmp_path) -> None:
    with pytest.raises(KVConfigError, match="cannot read model config"):
        KVSpec.from_config(tmp_path / "absent.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(KVConfigError, match="is not JSON"):
        KVSpec.from_config(broken)


def test_bad_explicit_numbers() -> None:
    with pytest.raises(KVConfigError, match="head_dim must be a positive integer"):
        KVSpec(32, 8, -128, "bf16")
    with pytest.raises(KVConfigError, match="unknown dtype"):
        KVSpec(32, 8, 128, "bf17")


def _timelines() -> pl.LazyFrame:
    t0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
    return pl.LazyFrame(
        {
            "request_id": ["a", "b", "c", "d", "e"],
            "replica": ["r1", "r1", "r1", "r2", "r2"],
            "model": ["m", "m", "m", "big", "m"],
            "engine_received": [t0, t0 + 0.5, t0 + 3.0, t0 + 0.2, None],
            "engine_last": [t0 + 1.0, t0 + 3.2, t0 + 3.5, t0 + 0.4, t0 + 1.0],
            "prompt_tokens": [10, 20, 30, 5, 7],
            "output_tokens": [1, 2, None, 3, 1],
        }
    )


def test_request_kv_bytes_per_model() -> None:
    out = request_kv_bytes(_timelines(), {"m": 10, "big": 100}).collect().sort("request_id")
    # a: 11 tokens × 10 B; b: 22 × 10; c: output unknown -> null, not a guess; d: 8 × 100
    assert out["kv_bytes"].to_list() == [110, 220, None, 800, 80]


def test_kv_in_flight_is_a_step_function_per_replica() -> None:
    steps = kv_in_flight(_timelines(), {"m": 10, "big": 100}).collect()
    r1 = steps.filter(pl.col("replica") == "r1")
    # a holds 110 B from 0.0 s; b adds 220 B at 0.5 s; a ends at 1.0 s; b ends at 3.2 s.
    # c has no output_tokens and e no engine_received: both left out.
    assert r1["kv_bytes"].to_list() == [110, 330, 220, 0]
    assert r1["requests"].to_list() == [1, 2, 1, 0]
    assert r1["time"][1] == datetime(2026, 1, 1, 0, 0, 0, 500_000, tzinfo=UTC)
    r2 = steps.filter(pl.col("replica") == "r2")
    assert r2["kv_bytes"].to_list() == [800, 0]


def test_kv_in_flight_resampled_carries_values_into_quiet_windows() -> None:
    per_s = kv_in_flight(_timelines(), 10, every="1s").collect().filter(pl.col("replica") == "r1")
    # second 0: peak 330 B (a + b); seconds 1 and 2: b alone (220 B), though nothing changes in
    # second 2; second 3: b until 3.2 s, so the peak is still 220 B.
    assert per_s["kv_bytes"].to_list() == [330, 220, 220, 220]
    assert per_s["requests"].to_list() == [2, 1, 1, 1]
