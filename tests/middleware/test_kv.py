"""KV-cache arithmetic: bytes per token from numbers or a config.json."""

from __future__ import annotations

import json

import pytest
from hopline.middleware.contract.kv import KVConfigError, KVSpec, dtype_bytes

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
