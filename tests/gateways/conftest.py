"""Fixtures of the gateway tests (helpers live in litellm_testing.py)."""

from __future__ import annotations

from litellm_testing import proxy

__all__ = ["proxy"]
