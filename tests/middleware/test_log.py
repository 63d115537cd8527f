"""hopline's logger decides its level when configured (or at its first line), never at import."""

from __future__ import annotations

import os
import subprocess
import sys

import orjson


def _stderr_lines(code: str, **env: str) -> list[dict]:
    """Run ``code`` in a fresh interpreter (nothing of hopline imported before it) and parse stderr."""
    clean = {k: v for k, v in os.environ.items() if k != "HOPLINE_LOG_LEVEL"}
    proc = subprocess.run(
        [sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    return [orjson.loads(line) for line in proc.stderr.splitlines()]


def test_level_set_in_the_environment_after_import_is_honoured() -> None:
    lines = _stderr_lines(
        "import os\n"
        "from hopline.middleware.log import logger\n"
        "os.environ['HOPLINE_LOG_LEVEL'] = 'error'\n"  # the host decides after importing hopline
        "logger.warning('held_back')\n"
        "logger.error('shown')\n"
    )
    assert [line["event"] for line in lines] == ["shown"]


def test_configure_sets_the_level_explicitly_over_the_environment() -> None:
    lines = _stderr_lines(
        "from hopline.middleware import log\n"
        "log.logger.info('before')\n"  # first use: HOPLINE_LOG_LEVEL=error from the environment
        "log.configure('debug')\n"
        "log.logger.debug('after', n=1)\n",
        HOPLINE_LOG_LEVEL="error",
    )
    assert [(line["event"], line["level"], line["logger"]) for line in lines] == [("after", "debug", "hopline")]
    assert lines[0]["n"] == 1


def test_unknown_level_names_fall_back_to_info() -> None:
    lines = _stderr_lines(
        "from hopline.middleware.log import logger\nlogger.debug('quiet')\nlogger.info('loud')\n",
        HOPLINE_LOG_LEVEL="chatty",
    )
    assert [line["event"] for line in lines] == ["loud"]
