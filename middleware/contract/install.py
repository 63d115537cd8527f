"""The command that adds an extra (``analyzer``, ``otlp``, …) to this Python's hopline, said by
every part that finds one missing: the ``hopline`` command for a command it cannot load, the OTLP
exporter for its packages.
"""

from __future__ import annotations

import json
import shlex
import sys
from importlib.metadata import distributions
from pathlib import Path
from typing import Any


def install_hint(
    extra: str, installed_from: dict[str, Any] | None = None, python: str = sys.executable
) -> str:
    """The command that adds ``extra`` to this Python's hopline, from where hopline came from:
    hopline is on no package index, so ``pip install 'hopline[analyzer]'`` would find nothing.

    ``installed_from``: pip's record of the install (PEP 610 ``direct_url.json``; default: read
    from the installed distribution): a clone (``-e`` when editable), a wheel or a repository URL.
    A source tree run without an install names the tree; otherwise the clone's path is a placeholder.
    """
    from urllib.parse import urlparse  # only on this path: not on every command's start
    from urllib.request import url2pathname

    info = _direct_url() if installed_from is None else installed_from
    pip = f"{shlex.quote(python)} -m pip install"
    url = str(info.get("url", ""))
    if url.startswith("file://"):
        where = shlex.quote(f"{url2pathname(urlparse(url).path)}[{extra}]")
        return f"{pip} -e {where}" if info.get("dir_info", {}).get("editable") else f"{pip} {where}"
    if url:
        vcs = info.get("vcs_info", {}).get("vcs")
        return (
            f"{pip} {shlex.quote(f'hopline[{extra}] @ {vcs}+{url}' if vcs else f'hopline[{extra}] @ {url}')}"
        )
    tree = Path(__file__).resolve().parents[2]  # middleware/contract/install.py in a clone
    if installed_from is None and (tree / "pyproject.toml").is_file() and (tree / "middleware").is_dir():
        return f"{pip} {shlex.quote(f'{tree}[{extra}]')}"
    return f"{pip} '/path/to/hopline[{extra}]' (the clone, or a wheel built from it: see its README, Install)"


def _direct_url() -> dict[str, Any]:
    """pip's ``direct_url.json`` of the installed hopline ({} when none says where it came from)."""
    for dist in distributions(name="hopline"):  # a source tree's hopline.egg-info can come first
        text = dist.read_text("direct_url.json")
        if text:
            try:
                return json.loads(text)
            except ValueError:
                return {}
    return {}
