"""KV-cache arithmetic: how many bytes a request's attention keys and values occupy on the GPU.

Every token a request holds (prompt plus generated output) keeps one key and one value vector
per layer and per KV head, so

    bytes per token = 2 × layers × KV heads × head dim × bytes per value

(grouped-query attention shares a KV head among several query heads: the KV heads count, not
the attention heads). The KV cache's dtype may differ from the weights' (an FP8 cache beside
BF16 weights), so an explicit KV dtype overrides the model config's.

``KVSpec.from_config`` reads a Hugging Face ``config.json``. Plain arithmetic with no heavy imports, so that the collector (KV gauge), the
analyzer (``--kv-config``, ``hopline budget``) and the demo's simulated engines share it without
importing each other; the analyzer's ``kv_in_flight`` turns it into each replica's footprint over time.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hopline.middleware.contract.errors import HoplineError

# Bytes per stored value, by the names people write (torch dtype names, vLLM's --kv-cache-dtype).
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4,
    "float32": 4,
    "float": 4,
    "bf16": 2,
    "bfloat16": 2,
    "fp16": 2,
    "float16": 2,
    "half": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
    "uint8": 1,
    "int4": 0.5,
    "fp4": 0.5,
}


class KVConfigError(HoplineError, ValueError):
    """A model description the KV arithmetic cannot use; the message says which field and why."""


def dtype_bytes(dtype: str) -> float:
    """Bytes per value for a dtype name (``bf16``, ``torch.bfloat16``, ``fp8`` …)."""
    if not isinstance(dtype, str) or not dtype.strip():
        raise KVConfigError(f"dtype must be a name such as bf16, fp16, fp32, fp8 or int8, got {dtype!r}")
    key = dtype.strip().lower().removeprefix("torch.")
    if key not in DTYPE_BYTES:
        known = ", ".join(sorted(DTYPE_BYTES))
        raise KVConfigError(f"unknown dtype {dtype!r}; known: {known}")
    return DTYPE_BYTES[key]


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise KVConfigError(f"{name} must be a positive integer, got {value!r}")
    return value


@dataclass(frozen=True)
class KVSpec:
    """The four numbers that size a model's KV cache."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: str

    def __post_init__(self) -> None:
        _positive_int("layers", self.layers)
        _positive_int("kv_heads", self.kv_heads)
        _positive_int("head_dim", self.head_dim)
        dtype_bytes(self.dtype)

    @property
    def bytes_per_token(self) -> int:
        """2 (key and value) × layers × KV heads × head dim × bytes per value."""
        return int(2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes(self.dtype))

    def bytes_for(self, tokens: int) -> int:
        """The KV bytes of ``tokens`` tokens held at once."""
        return tokens * self.bytes_per_token

    @classmethod
    def from_config(cls, config: Mapping[str, Any] | str | Path, kv_dtype: str | None = None) -> KVSpec:
        """Read a Hugging Face ``config.json`` (a path or the decoded dict).

        ``num_key_value_heads`` defaults to ``num_attention_heads`` (no grouped-query attention)
        and ``head_dim`` to ``hidden_size / num_attention_heads``. Multimodal configs keep the
        language model under ``text_config``, which is used when present. ``kv_dtype`` (vLLM's
        ``--kv-cache-dtype``) overrides ``torch_dtype`` / ``dtype``.
        """
        source = "config"
        if isinstance(config, (str, Path)):
            source = str(config)
            try:
                config = json.loads(Path(config).read_text())
            except OSError as exc:
                raise KVConfigError(f"cannot read model config {source}: {exc.strerror or exc}") from exc
            except json.JSONDecodeError as exc:
                raise KVConfigError(f"model config {source} is not JSON: {exc}") from exc
        if not isinstance(config, Mapping):
            raise KVConfigError(f"model config {source} must be a JSON object, got {type(config).__name__}")
        if isinstance(config.get("text_config"), Mapping):
            config = {**config, **config["text_config"]}

        def field(name: str) -> Any:
            if config.get(name) is None:
                raise KVConfigError(f"model config {source} has no {name}")
            return config[name]

        layers = _positive_int("num_hidden_layers", field("num_hidden_layers"))
        if config.get("num_key_value_heads") is not None:
            kv_heads = _positive_int("num_key_value_heads", config["num_key_value_heads"])
        else:
            kv_heads = _positive_int("num_attention_heads", field("num_attention_heads"))
        if config.get("head_dim") is not None:
            head_dim = _positive_int("head_dim", config["head_dim"])
        else:
            hidden = _positive_int("hidden_size", field("hidden_size"))
            heads = _positive_int("num_attention_heads", field("num_attention_heads"))
            if hidden % heads:
                raise KVConfigError(
                    f"model config {source}: hidden_size {hidden} is not a multiple of "
                    f"num_attention_heads {heads}; give head_dim"
                )
            head_dim = hidden // heads
        dtype = kv_dtype or config.get("torch_dtype") or config.get("dtype")
        if dtype is None:
            raise KVConfigError(f"model config {source} has no torch_dtype or dtype; give the KV dtype")
        return cls(layers, kv_heads, head_dim, str(dtype))
