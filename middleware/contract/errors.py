"""``HoplineError``: the one base of the errors hopline raises for a user to catch.

Each keeps the built-in base it had (an invalid event is still a ``ValueError``), so code that
caught those goes on working; ``except HoplineError`` catches any of them::

    from hopline.middleware.contract.errors import HoplineError

    try:
        validate_event(event)
    except HoplineError as exc:  # EventError, RecordError, TimelinesError, ...
        ...

Errors of a command's usage are typer's (``middleware/exits.py``): they end the command, not a caller.
"""

from __future__ import annotations


class HoplineError(Exception):
    """An error hopline raises on purpose, with a message that says what was wrong."""
