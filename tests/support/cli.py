"""The ``hopline`` command in a child process, as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys


def hopline(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``hopline ARGS…`` with this interpreter; ``env`` defaults to this process's environment.

    A wide terminal and no colours, so that rich neither wraps nor styles the sentences tests look for.
    """
    env = {**(os.environ if env is None else env), "COLUMNS": "250", "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "hopline.middleware.cli", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
