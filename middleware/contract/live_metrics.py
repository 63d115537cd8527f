"""The names of ``hopline watch``'s findings series, shared by its ``/metrics`` (the analyzer's
live detector) and the generated dashboards (the "Findings now" table, the onset annotation).

``hopline_live_finding{kind, stage, scope_key, scope_value, direction}``: one series per firing
incident, its factor as the value (a pitfall: 1); see ``hopline.analyzer.live.metrics``.
"""

from __future__ import annotations

FINDING = "hopline_live_finding"
FINDING_LABELS = ("kind", "stage", "scope_key", "scope_value", "direction")
