"""``hopline budget`` reproduces the lesson's two worked examples, through the real command."""

from __future__ import annotations

import json

import pytest
from hopline.analyzer.budget import compute_budget, human_bytes
from hopline.middleware.contract.kv import KVSpec
from support.cli import hopline

KIB, MIB, GIB = 1024, 1024**2, 1024**3
QWEN_ARGS = [
    "--network", "40ms", "--queue", "60ms", "--prefill", "300ms", "--prompt-tokens", "6000",
    "--output-tokens", "400", "--itl", "20ms",
]  # fmt: skip


def test_qwen3_30b_a3b_example_as_json() -> None:
    run = hopline(
        "budget", *QWEN_ARGS, "--layers", "48", "--kv-heads", "4", "--head-dim", "128", "--dtype", "bf16",
        "--concurrent", "50", "--gpu-mem-gib", "141", "--weights-gib", "61", "--json",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    b = json.loads(run.stdout)
    assert b["ttft_ms"] == 400  # 40 + 60 + 300
    assert b["e2e_ms"] == 8400  # 400 + 400 tokens × 20 ms
    assert b["tokens_per_s"] == 50  # 1000 / 20
    assert b["kv_bytes_per_token"] == 96 * KIB
    assert b["kv_bytes_per_request"] == 600 * MIB  # 6,400 tokens × 96 KiB
    assert b["kv_bytes_concurrent"] == 50 * 600 * MIB
    assert round(b["kv_bytes_concurrent"] / GIB, 1) == 29.3
    # 141 - 61 = 80 GiB left; 80 GiB / 600 MiB = 136.5 -> 136 whole requests
    assert b["requests_fit"] == 136


def test_llama_31_8b_example_from_config_file(tmp_path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
        "num_hidden_layers": 32, "torch_dtype": "bfloat16",
    }))  # fmt: skip
    run = hopline(
        "budget", "--network", "30ms", "--queue", "5ms", "--prefill", "40ms", "--prompt-tokens", "1500",
        "--output-tokens", "20", "--itl", "8ms", "--model-config", str(config), "--json",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    b = json.loads(run.stdout)
    assert (b["ttft_ms"], b["e2e_ms"], b["tokens_per_s"]) == (75, 235, 125)  # 30+5+40; +20×8; 1000/8
    assert b["kv_bytes_per_token"] == 128 * KIB
    assert b["kv_bytes_per_request"] == 190 * MIB  # 1,520 tokens × 128 KiB
    assert "requests_fit" not in b


def test_terminal_table_shows_the_sums_in_human_units() -> None:
    run = hopline(
        "budget", *QWEN_ARGS, "--layers", "48", "--kv-heads", "4", "--head-dim", "128", "--dtype", "bf16",
        "--concurrent", "50",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    for text in (
        "= TTFT",
        "400 ms",
        "= end-to-end",
        "8,400 ms",
        "50 tokens/s",
        "96 KiB",
        "600 MiB",
        "29.3 GiB",
    ):
        assert text in run.stdout


def test_help_has_the_example() -> None:
    run = hopline("budget", "--help")
    assert run.returncode == 0
    assert "--network 40ms" in run.stdout and "Qwen3-30B-A3B" in run.stdout


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--layers", "48", "--kv-heads", "4"], "give --head-dim, --dtype"),
        (["--model-config", "/nonexistent/config.json"], "cannot read model config"),
        (
            ["--layers", "48", "--kv-heads", "4", "--head-dim", "128", "--dtype", "bf99"],
            "unknown dtype 'bf99'",
        ),
        (
            [
                "--layers",
                "48",
                "--kv-heads",
                "4",
                "--head-dim",
                "128",
                "--dtype",
                "bf16",
                "--gpu-mem-gib",
                "80",
                "--weights-gib",
                "90",
            ],
            "leave no room",
        ),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(extra: list[str], message: str) -> None:
    run = hopline("budget", *QWEN_ARGS, *extra)
    assert run.returncode == 2
    assert message in " ".join(run.stderr.split())


def test_fp8_kv_cache_doubles_what_fits() -> None:
    common = dict(network_ms=40, queue_ms=60, prefill_ms=300, prompt_tokens=6000, output_tokens=400, itl_ms=20,
                  gpu_mem_gib=141, weights_gib=61)  # fmt: skip
    bf16 = compute_budget(kv=KVSpec(48, 4, 128, "bf16"), **common)
    fp8 = compute_budget(kv=KVSpec(48, 4, 128, "fp8"), **common)
    assert fp8["kv_bytes_per_request"] * 2 == bf16["kv_bytes_per_request"]
    assert fp8["requests_fit"] == 273  # 80 GiB / 300 MiB = 273.07


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (512, "512 B"),
        (96 * KIB, "96 KiB"),
        (600 * MIB, "600 MiB"),
        (50 * 600 * MIB, "29.3 GiB"),
        (1536, "1.5 KiB"),
    ],  # fmt: skip
)
def test_human_bytes(n: int, text: str) -> None:
    assert human_bytes(n) == text


@pytest.mark.parametrize(
    ("option", "value"), [("--network", "40"), ("--queue", "60"), ("--prefill", "0.3"), ("--itl", "20")]
)
def test_a_duration_without_a_unit_is_an_error_naming_the_form(option: str, value: str) -> None:
    """Issue 24: ``--network 40`` silently meant 40 s (the lesson's 40 ms network became 40,000 ms of
    TTFT). Every duration option of budget now wants its unit and names the form it expects."""
    args = [*QWEN_ARGS, "--layers", "48", "--kv-heads", "4", "--head-dim", "128", "--dtype", "bf16"]
    args[args.index(option) + 1] = value
    run = hopline("budget", *args)
    assert run.returncode == 2 and run.stdout == ""
    line = " ".join(run.stderr.split())
    assert f"hopline budget: {option}: '{value}' has no unit: write {value}ms or {value}s" in line, line
    assert "Traceback" not in run.stderr
