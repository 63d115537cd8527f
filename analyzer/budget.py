"""``hopline budget``: the latency and KV-cache arithmetic for one kind of request on one deployment.

Before any log exists, the sums of DESIGN.md already say what a request will cost:

    TTFT       = network + queue + prefill
    end-to-end = TTFT + output tokens × ITL           (the lesson's decode; tokens/s = 1000 / ITL)
    KV bytes   = (prompt + output tokens) × bytes per token   (what a request holds at its end)

and, given GPU memory and the weights' size, how many such requests fit in what is left.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import typer
from hopline.middleware.exits import UsageError
from hopline.middleware.contract.kv import KVConfigError, KVSpec, dtype_bytes
from hopline.middleware.contract.units import parse_duration
from rich.console import Console
from rich.table import Table

GIB = 1024**3
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def human_bytes(n: float) -> str:
    """Binary units, three significant figures: ``98304`` -> ``"96 KiB"``, ``31457280000`` -> ``"29.3 GiB"``."""
    value, unit = float(n), _UNITS[0]
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            break
        value /= 1024
    text = f"{value:.0f}" if abs(value) >= 100 else f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return f"{text} {unit}"


def compute_budget(
    *,
    network_ms: float,
    queue_ms: float,
    prefill_ms: float,
    prompt_tokens: int,
    output_tokens: int,
    itl_ms: float,
    kv: KVSpec,
    concurrent: int = 1,
    gpu_mem_gib: float | None = None,
    weights_gib: float | None = None,
) -> dict[str, Any]:
    """The budget as a JSON-ready dict (times in ms, memory in bytes).

    ``requests_fit`` (with both ``gpu_mem_gib`` and ``weights_gib``) is how many requests of
    this size fit in the memory the weights leave, ignoring activations and the engine's own
    reserve: an upper bound to hold a deployment against.
    """
    for name, value in (
        ("network_ms", network_ms),
        ("queue_ms", queue_ms),
        ("prefill_ms", prefill_ms),
        ("itl_ms", itl_ms),
    ):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {value}")
    if itl_ms == 0:
        raise ValueError("itl_ms must be > 0 (tokens/s = 1000 / ITL)")
    for name, count in (("prompt_tokens", prompt_tokens), ("output_tokens", output_tokens)):
        if count < 0:
            raise ValueError(f"{name} must be >= 0, got {count}")
    if concurrent < 1:
        raise ValueError(f"concurrent must be >= 1, got {concurrent}")
    ttft_ms = network_ms + queue_ms + prefill_ms
    decode_ms = output_tokens * itl_ms
    per_request = kv.bytes_for(prompt_tokens + output_tokens)
    result: dict[str, Any] = {
        "network_ms": network_ms,
        "queue_ms": queue_ms,
        "prefill_ms": prefill_ms,
        "ttft_ms": ttft_ms,
        "output_tokens": output_tokens,
        "itl_ms": itl_ms,
        "decode_ms": decode_ms,
        "e2e_ms": ttft_ms + decode_ms,
        "tokens_per_s": 1000.0 / itl_ms,
        "model": {"layers": kv.layers, "kv_heads": kv.kv_heads, "head_dim": kv.head_dim, "dtype": kv.dtype},
        "prompt_tokens": prompt_tokens,
        "kv_bytes_per_token": kv.bytes_per_token,
        "kv_bytes_per_request": per_request,
        "concurrent": concurrent,
        "kv_bytes_concurrent": per_request * concurrent,
    }
    if (gpu_mem_gib is None) != (weights_gib is None):
        raise ValueError("give both gpu_mem_gib and weights_gib to know how many requests fit")
    if gpu_mem_gib is not None and weights_gib is not None:
        free = (gpu_mem_gib - weights_gib) * GIB
        if free <= 0:
            raise ValueError(f"weights ({weights_gib} GiB) leave no room in {gpu_mem_gib} GiB of GPU memory")
        result.update(
            gpu_mem_gib=gpu_mem_gib,
            weights_gib=weights_gib,
            kv_budget_bytes=int(free),
            requests_fit=int(free // per_request) if per_request else None,
        )
    return result


def _ms(value: float) -> str:
    return f"{value:,.0f} ms" if value == int(value) else f"{value:,.1f} ms"


def render_budget(budget: dict[str, Any], console: Console) -> None:
    """The two sums and the memory lines as a small table."""
    table = Table(title="hopline budget", show_header=False, title_justify="left")
    table.add_column("term")
    table.add_column("value", justify="right")
    table.add_column("how", style="dim")
    table.add_row("network", _ms(budget["network_ms"]), "")
    table.add_row("+ queue", _ms(budget["queue_ms"]), "")
    table.add_row("+ prefill", _ms(budget["prefill_ms"]), "")
    table.add_row("[bold]= TTFT", f"[bold]{_ms(budget['ttft_ms'])}", "", end_section=True)
    table.add_row(
        "+ decode",
        _ms(budget["decode_ms"]),
        f"{budget['output_tokens']:,} tokens × {budget['itl_ms']:g} ms ITL ({budget['tokens_per_s']:g} tokens/s)",
    )
    table.add_row("[bold]= end-to-end", f"[bold]{_ms(budget['e2e_ms'])}", "", end_section=True)
    m = budget["model"]
    table.add_row(
        "KV per token",
        human_bytes(budget["kv_bytes_per_token"]),
        f"2 × {m['layers']} layers × {m['kv_heads']} KV heads × {m['head_dim']} dims × "
        f"{dtype_bytes(m['dtype']):g} B ({m['dtype']})",
    )
    tokens = budget["prompt_tokens"] + budget["output_tokens"]
    table.add_row(
        "KV per request", human_bytes(budget["kv_bytes_per_request"]), f"{tokens:,} tokens at its end"
    )
    if budget["concurrent"] > 1:
        table.add_row(
            f"KV for {budget['concurrent']:,} requests",
            human_bytes(budget["kv_bytes_concurrent"]),
            "in flight at once",
        )
    if "requests_fit" in budget:
        table.add_row(
            "requests that fit",
            f"{budget['requests_fit']:,}",
            f"{human_bytes(budget['kv_budget_bytes'])} left by {budget['weights_gib']:g} GiB of weights "
            f"in {budget['gpu_mem_gib']:g} GiB",
        )
    console.print(table)


def kv_spec(
    model_config: Path | None,
    layers: int | None,
    kv_heads: int | None,
    head_dim: int | None,
    *,
    dtype: str | None = None,
    kv_dtype: str | None = None,
) -> KVSpec:
    """The model's KV shape from a config.json or from the explicit numbers (not both, not neither)."""
    explicit = (layers, kv_heads, head_dim)
    if model_config is not None:
        if any(v is not None for v in explicit):
            raise KVConfigError("give either --model-config or --layers/--kv-heads/--head-dim, not both")
        return KVSpec.from_config(model_config, kv_dtype=kv_dtype or dtype)
    missing = [
        f"--{n}" for n, v in zip(("layers", "kv-heads", "head-dim"), explicit, strict=True) if v is None
    ]
    if kv_dtype is None and dtype is None:
        missing.append("--dtype")
    if missing:
        raise KVConfigError(f"without --model-config, give {', '.join(missing)}")
    return KVSpec(layers, kv_heads, head_dim, kv_dtype or dtype)  # type: ignore[arg-type]


def duration_ms(option: str, text: str) -> float:
    """A duration option's value in ms; a number without a unit is an error naming ``--option``
    (``--network 40`` would otherwise mean 40 s where 40 ms was meant)."""
    try:
        return parse_duration(text, unit_required=True) * 1e3
    except ValueError as exc:
        raise ValueError(f"--{option}: {exc}") from None


EXAMPLE = """\
Example, Qwen3-30B-A3B (TTFT 400 ms, end-to-end 8,400 ms, 96 KiB per token, 600 MiB per request):

hopline budget --network 40ms --queue 60ms --prefill 300ms --prompt-tokens 6000 --output-tokens 400 \
--itl 20ms --layers 48 --kv-heads 4 --head-dim 128 --dtype bf16 --concurrent 50 --gpu-mem-gib 141 --weights-gib 61

From a Hugging Face config, with an FP8 KV cache, as JSON:

hopline budget ... --model-config ./Qwen3-30B-A3B/config.json --kv-dtype fp8 --json
"""


def budget_command(
    network: Annotated[
        str, typer.Option(help="Network time, both directions (a duration with its unit: 40ms, 0.04s).")
    ],
    queue: Annotated[str, typer.Option(help="Time waiting in the engine's queue (e.g. 60ms).")],
    prefill: Annotated[str, typer.Option(help="Prefill time (e.g. 300ms).")],
    prompt_tokens: Annotated[int, typer.Option(help="Prompt tokens per request.")],
    output_tokens: Annotated[int, typer.Option(help="Output tokens per request.")],
    itl: Annotated[str, typer.Option(help="Inter-token latency during decode (e.g. 20ms).")],
    model_config: Annotated[
        Path | None,
        typer.Option(help="A Hugging Face config.json (instead of --layers/--kv-heads/--head-dim)."),
    ] = None,
    layers: Annotated[int | None, typer.Option(help="Transformer layers (num_hidden_layers).")] = None,
    kv_heads: Annotated[int | None, typer.Option(help="KV heads (num_key_value_heads).")] = None,
    head_dim: Annotated[int | None, typer.Option(help="Head dimension.")] = None,
    dtype: Annotated[
        str | None, typer.Option(help="Weights' dtype with explicit numbers: bf16, fp16, fp32 …")
    ] = None,
    kv_dtype: Annotated[
        str | None, typer.Option(help="KV-cache dtype when it differs from the weights' (fp8, int8 …).")
    ] = None,
    concurrent: Annotated[int, typer.Option(help="Requests in flight at once.")] = 1,
    gpu_mem_gib: Annotated[float | None, typer.Option(help="GPU memory in GiB (with --weights-gib).")] = None,
    weights_gib: Annotated[
        float | None, typer.Option(help="Model weights in GiB (with --gpu-mem-gib).")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object instead of a table.")
    ] = False,
) -> None:
    """The latency and KV-cache arithmetic for a deployment: TTFT, end-to-end, tokens/s and KV memory."""
    try:
        kv = kv_spec(model_config, layers, kv_heads, head_dim, dtype=dtype, kv_dtype=kv_dtype)
        result = compute_budget(
            network_ms=duration_ms("network", network),
            queue_ms=duration_ms("queue", queue),
            prefill_ms=duration_ms("prefill", prefill),
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            itl_ms=duration_ms("itl", itl),
            kv=kv,
            concurrent=concurrent,
            gpu_mem_gib=gpu_mem_gib,
            weights_gib=weights_gib,
        )
    except ValueError as exc:  # KVConfigError included
        raise UsageError(str(exc)) from exc
    if as_json:
        typer.echo(json.dumps(result))
    else:
        render_budget(result, Console())


def register(app: typer.Typer) -> None:
    """Add ``hopline budget`` to the ``hopline`` command."""
    app.command(
        name="budget",
        help=(budget_command.__doc__ or "") + "\n\n" + EXAMPLE,
    )(budget_command)
