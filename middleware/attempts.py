"""Which attempt a request is on, handed from the engine middleware to the vLLM stat logger.

vLLM gives a stat logger no request headers, so the failover attempt a gateway sent in
``X-Hopline-Attempt`` reaches ``engine.stats`` through an ``AttemptRegistry`` that both hold: the
middleware notes attempts > 0, the stat logger looks them up. vLLM constructs both itself (the
middleware with the app alone, the stat logger with its config), so by default both take the
same process-wide ``ATTEMPTS``, as prometheus_client's collectors default to its ``REGISTRY``;
pass one explicitly (``attempts=``) to either when embedding or testing.

A registry remembers nothing until a stat logger ``attach``es to it: an engine without hopline's
stat logger keeps no table.
"""

from __future__ import annotations

CAPACITY = 10_000


class AttemptRegistry:
    """request_id -> (attempt, P/D leg), bounded; same process and event loop as its users.

    Past ``capacity`` entries the oldest are forgotten (their stats then say attempt 0, no leg).
    An entry is kept after use because ``n > 1`` finishes one request several times.
    """

    __slots__ = ("_attempts", "attached", "capacity")

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self.attached = False
        self._attempts: dict[str, tuple[int, str | None]] = {}

    def attach(self) -> None:
        """A stat logger will ask: from now on attempts are remembered."""
        self.attached = True

    def note(self, request_id: str, attempt: int, leg: str | None = None) -> None:
        """Remember that ``request_id`` is on ``attempt`` (and P/D ``leg``) for its coming ``engine.stats``."""
        if (attempt <= 0 and leg is None) or not self.attached:
            return
        attempts = self._attempts
        attempts.pop(request_id, None)
        attempts[request_id] = (attempt, leg)
        while len(attempts) > self.capacity:
            del attempts[next(iter(attempts))]

    def get(self, request_id: str) -> int | None:
        """The attempt noted for ``request_id`` (None: attempt 0, the default)."""
        found = self._attempts.get(request_id)
        return found[0] if found is not None and found[0] > 0 else None

    def leg(self, request_id: str) -> str | None:
        """The P/D leg noted for ``request_id`` (None: not a leg of a disaggregated request)."""
        found = self._attempts.get(request_id)
        return None if found is None else found[1]

    def __len__(self) -> int:
        return len(self._attempts)


ATTEMPTS = AttemptRegistry()
