"""Bounded memory of recently seen event keys, to drop duplicates from sink retries.

Two generations of sets: lookups check both, inserts go to the current one, and the current one
becomes the previous one (the old previous is forgotten) when it holds ``dedup_capacity`` keys or is
``dedup_window`` seconds old (checked once per batch, so a generation may exceed
``dedup_capacity`` by one batch). Memory stays under two generations whatever arrives; a retry is recognised
as long as it comes within one generation (seconds to minutes; sink retries come within seconds).

The ingest path asks ``key in keys`` before writing a batch and ``update``s the set only after
the batch is durably stored, both on the writer thread: a key is remembered only once its
event is on disk.
"""

from __future__ import annotations

import time
from collections.abc import Hashable

from hopline.collector.config import CollectorConfig


class RecentKeys:
    def __init__(self, *, dedup_capacity: int, dedup_window: float) -> None:
        self.dedup_capacity = dedup_capacity
        self.dedup_window = dedup_window
        self._current: set[Hashable] = set()
        self._previous: set[Hashable] = set()
        self._started = time.monotonic()

    @classmethod
    def from_config(cls, config: CollectorConfig) -> RecentKeys:
        return cls(dedup_capacity=config.dedup_capacity, dedup_window=config.dedup_window)

    def add(self, key: Hashable) -> bool:
        """Remember ``key``; False when it was already there (a duplicate)."""
        if key in self._current or key in self._previous:
            return False
        self._current.add(key)
        return True

    def __contains__(self, key: Hashable) -> bool:
        return key in self._current or key in self._previous

    def none_of(self, keys: set[Hashable]) -> bool:
        """True when no key of ``keys`` is remembered (one set operation per generation)."""
        return self._current.isdisjoint(keys) and self._previous.isdisjoint(keys)

    def update(self, keys: set[Hashable]) -> None:
        """Remember keys of events just stored."""
        self._current.update(keys)

    def rotate_if_due(self) -> None:
        """Start a new generation when the current one is full or old (call once per batch)."""
        if len(self._current) >= self.dedup_capacity or time.monotonic() - self._started > self.dedup_window:
            self._previous = self._current
            self._current = set()
            self._started = time.monotonic()

    def forget(self, keys: list[Hashable]) -> None:
        """Drop keys again (their events could not be stored, so a retry must be accepted)."""
        for key in keys:
            self._current.discard(key)
            self._previous.discard(key)

    def __len__(self) -> int:
        return len(self._current) + len(self._previous)
