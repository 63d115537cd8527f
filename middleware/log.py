"""hopline's own logging: a private structlog logger that never configures the host.

``structlog.configure`` is never called; the logger is wrapped explicitly with its own
processors and writes JSON lines to stderr, so a host that configured structlog or stdlib
logging its own way keeps exactly that.
"""

from __future__ import annotations

import sys

import orjson
import structlog

logger = structlog.wrap_logger(
    structlog.PrintLogger(sys.stderr),
    processors=[
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.JSONRenderer(serializer=lambda obj, **kw: orjson.dumps(obj).decode()),
    ],
    context_class=dict,
    cache_logger_on_first_use=True,
).bind(logger="hopline")
