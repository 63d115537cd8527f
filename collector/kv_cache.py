"""``--model-config NAME=PATH`` / ``NAME=layers,kv_heads,head_dim,kv_dtype`` -> KV bytes per token.

The arithmetic (2 x layers x KV heads x head dim x bytes per value, and reading a Hugging Face
``config.json``) is ``hopline.middleware.contract.kv.KVSpec``; this module only parses the command-line form.
"""

from __future__ import annotations

from pathlib import Path

from hopline.middleware.contract.kv import KVConfigError, KVSpec


def parse_model_config(spec: str) -> tuple[str, int]:
    """``NAME=PATH`` (a config.json or its directory) or ``NAME=layers,kv_heads,head_dim,kv_dtype``.

    Returns ``(name, bytes_per_token)``; raises ``ValueError`` naming what was wrong.
    """
    name, sep, value = spec.partition("=")
    if not sep or not name or not value:
        raise ValueError(
            f"--model-config wants NAME=PATH or NAME=layers,kv_heads,head_dim,kv_dtype, got {spec!r}"
        )
    parts = value.split(",")
    try:
        if len(parts) == 4 and all(p.strip().isdigit() for p in parts[:3]):
            layers, kv_heads, head_dim = (int(p) for p in parts[:3])
            kv = KVSpec(layers, kv_heads, head_dim, parts[3].strip())
        else:
            path = Path(value)
            kv = KVSpec.from_config(path / "config.json" if path.is_dir() else path)
    except KVConfigError as exc:
        raise ValueError(f"--model-config {name}: {exc}") from None
    return name, kv.bytes_per_token
