"""Rows and lines of panels on Grafana's 24-column grid, with stable panel ids.

The SDK numbers nothing (rows all serialise ``"id": 0``) and wraps a line only after it
overflows, so a line of 8 + 8 + 12 puts the last panel off the grid. ``Layout`` gives every
panel and row the next id and accepts only lines whose widths sum to 24; positions are then
exactly what the SDK's own auto-placement computes for full lines. Stable ids matter: links
such as ``/d/<uid>?viewPanel=<id>`` and exemplar bookmarks refer to them.
"""

from __future__ import annotations

from typing import Protocol, Self

from grafana_foundation_sdk.builders.dashboard import Dashboard, Row
from grafana_foundation_sdk.models.dashboard import Panel

GRID_COLUMNS = 24


class PanelBuilder(Protocol):
    """What every SDK panel builder (timeseries, heatmap, stat, ...) offers."""

    def id(self, id_val: int) -> Self: ...
    def span(self, w: int) -> Self: ...
    def height(self, h: int) -> Self: ...
    def build(self) -> Panel: ...


class Layout:
    def __init__(self, dashboard: Dashboard) -> None:
        self.dashboard = dashboard
        self._next_id = 1

    def _id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def row(self, title: str, *, repeat: str | None = None) -> Layout:
        """A row header; with ``repeat``, Grafana repeats the row and its panels per variable value."""
        row = Row(title).id(self._id())
        self.dashboard = self.dashboard.with_row(row.repeat(repeat) if repeat else row)
        return self

    def line(self, height: int, *panels: tuple[PanelBuilder, int]) -> Layout:
        """One line of ``(panel, width)``; widths must fill the grid exactly."""
        widths = [width for _, width in panels]
        if sum(widths) != GRID_COLUMNS:
            raise ValueError(f"a line must be {GRID_COLUMNS} columns wide, got {widths}")
        for panel, width in panels:
            self.dashboard = self.dashboard.with_panel(panel.id(self._id()).span(width).height(height))
        return self
