"""Repository-wide test settings.

The real-vLLM tests find the engine venv and tiny model at ``$HOPLINE_VLLM_DIR``; ``.ci/setup``
builds them at ``<repo>/.vllm``, which is the default here so the README's test command needs no
environment variable.

``tests/`` is put on ``sys.path`` so that every test folder imports the shared helpers as
``support`` (tests/support/), whichever folder pytest was started on.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HOPLINE_VLLM_DIR", str(Path(__file__).resolve().parents[1] / ".vllm"))

sys.path.insert(0, str(Path(__file__).resolve().parent))
