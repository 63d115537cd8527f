"""KV-cache arithmetic: how many bytes a request's attention keys and values occupy on the GPU.

Every token a request holds (prompt plus generated output) keeps one key and one value vector
per layer and per KV head, so

    bytes per token = 2 × layers × KV heads × head dim × bytes per value

(grouped-query attention shares a KV head among several query heads: the KV heads count, not
the attention heads). The KV cache's dtype may differ from the weights' (an FP8 cache beside
BF16 weights), so an explicit KV dtype overrides the model config's.

``KVSpec.from_config`` reads a Hugging Face ``config.json``; ``kv_in_flight`` turns per-request
timelines into each replica's KV footprint over time (a step function: a request holds its
tokens from ``engine.received`` until ``engine.last_token``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

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


class KVConfigError(ValueError):
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


def _token_bytes(timelines: pl.LazyFrame, bytes_per_token: int | Mapping[str, int]) -> pl.LazyFrame:
    """Add ``kv_bytes_per_token``: one number for all, or per ``model`` (unlisted models: null)."""
    if isinstance(bytes_per_token, Mapping):
        table = pl.LazyFrame(
            {"model": list(bytes_per_token), "kv_bytes_per_token": list(bytes_per_token.values())},
            schema={"model": pl.String, "kv_bytes_per_token": pl.Int64},
        )
        return timelines.join(table, on="model", how="left")
    return timelines.with_columns(kv_bytes_per_token=pl.lit(bytes_per_token, dtype=pl.Int64))


def request_kv_bytes(timelines: pl.LazyFrame, bytes_per_token: int | Mapping[str, int]) -> pl.LazyFrame:
    """Add ``kv_tokens`` (prompt + output) and ``kv_bytes``: what each request holds at its end.

    Null when a token count is unknown: a guess would hide the gap.
    """
    return (
        _token_bytes(timelines, bytes_per_token)
        .with_columns(
            kv_tokens=pl.col("prompt_tokens") + pl.col("output_tokens"),
        )
        .with_columns(kv_bytes=pl.col("kv_tokens") * pl.col("kv_bytes_per_token"))
    )


def kv_in_flight(
    timelines: pl.LazyFrame,
    bytes_per_token: int | Mapping[str, int],
    every: str | None = None,
) -> pl.LazyFrame:
    """Each replica's KV bytes and requests in flight over time.

    A request holds its end-of-request KV (prompt + output tokens) from ``engine_received`` to
    ``engine_last``: an upper bound (the cache fills during prefill and grows per output token),
    which is what capacity planning needs. Requests without engine times or token counts are
    left out. The result is a step function: one row per change, ``(replica, time, kv_bytes,
    requests)``, the value holding until the replica's next row. With ``every`` (``"1s"``,
    ``"1m"``) it is resampled to the peak in each window (windows aligned like ``dt.truncate``).
    """
    held = (
        request_kv_bytes(timelines, bytes_per_token)
        .filter(
            pl.col("engine_received").is_not_null()
            & pl.col("engine_last").is_not_null()
            & pl.col("kv_bytes").is_not_null()
        )
        .select("replica", "engine_received", "engine_last", "kv_bytes")
    )
    changes = pl.concat(
        [
            held.select("replica", ts=pl.col("engine_received"), d_bytes=pl.col("kv_bytes"), d_req=pl.lit(1)),
            held.select("replica", ts=pl.col("engine_last"), d_bytes=-pl.col("kv_bytes"), d_req=pl.lit(-1)),
        ]
    )
    steps = (
        changes.group_by("replica", "ts")
        .agg(pl.col("d_bytes").sum(), pl.col("d_req").sum())
        .sort("replica", "ts")
        .select(
            "replica",
            time=pl.from_epoch(
                (pl.col("ts") * 1_000_000).round().cast(pl.Int64), time_unit="us"
            ).dt.replace_time_zone("UTC"),
            kv_bytes=pl.col("d_bytes").cum_sum().over("replica"),
            requests=pl.col("d_req").cum_sum().over("replica"),
        )
    )
    if every is None:
        return steps
    # Each window also starts with the value carried over from before it (a join_asof on a
    # grid of window starts), so a window with no change still reports what was held.
    grid = (
        steps.group_by("replica")
        .agg(time=pl.datetime_range(pl.col("time").min().dt.truncate(every), pl.col("time").max(), every))
        .explode("time")
        .sort("time")
    )
    carried = grid.join_asof(
        steps.sort("time"), on="time", by="replica", strategy="backward", check_sortedness=False
    ).select("replica", "time", pl.col("kv_bytes").fill_null(0), pl.col("requests").fill_null(0))
    return (
        pl.concat([steps, carried])
        .group_by("replica", pl.col("time").dt.truncate(every))
        .agg(pl.col("kv_bytes").max(), pl.col("requests").max())
        .sort("replica", "time")
    )
