"""Findings: typed values from one registry of detectors, decided once before any output.

    ctx = Context(window_s=10.0, scopes=("replica", "service", "model"))
    decided = find(frame, ctx)            # detect_all(frame, ctx), then rank.decide(...)
    decided.findings[0].sentence           # what every output says
    decided.to_json()                      # {"findings": [...], "minor": [...]} of the contract

``model`` holds the types (``Shift``, ``Pitfall``, ``Findings``) and their JSON; ``detector``
what a detector is (``Detector``, ``Context``); ``registry`` the detectors (``REGISTRY``,
``detect_all``); ``rank`` the decisions (relations, users' time, minor, order); ``docs`` the
generated docs/findings.md and docs/findings.schema.json. One module per detector: ``shifts``
(a package: the statistics, scopes, incidents and words of a stage shift) and each pitfall.
"""

from hopline.analyzer.findings.detector import Context, Detector
from hopline.analyzer.findings.model import Consequence, Finding, Findings, Pitfall, Shift
from hopline.analyzer.findings.rank import MINOR_SHARE, decide, find
from hopline.analyzer.findings.registry import REGISTRY, detect_all

__all__ = [
    "MINOR_SHARE",
    "REGISTRY",
    "Consequence",
    "Context",
    "Detector",
    "Finding",
    "Findings",
    "Pitfall",
    "Shift",
    "decide",
    "detect_all",
    "find",
]
