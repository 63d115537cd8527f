"""``hopline watch --listen``: a tiny ASGI app, ``GET /v1/findings?since=…`` and ``GET /metrics``.

``/v1/findings`` answers the findings JSON of the offline contract (``requests``, ``window_s``,
``findings``) where each finding carries its incident's ``state`` (firing / resolved),
``onset``, ``first_seen``, ``last_seen``, ``ends_at`` (ISO-8601 UTC, event time), ``severity``,
``side``, ``pages`` (false: ``standing``, or ``late``: the measuring side's own lateness),
``alert_summary`` (the sentence it paged with), ``co_movers`` and ``examples``; ``since`` (ISO-8601 or Unix seconds) keeps the firing ones and those seen at or
after it. ``event_time`` is the detector's last step; ``events_from_future`` the events it dropped
as dated ahead (``detector``'s module doc: ahead of the wall clock, or a leap no other request
confirmed).
"""

from __future__ import annotations

import hmac
from urllib.parse import parse_qs

import orjson
from hopline.analyzer.live.metrics import build_registry
from hopline.analyzer.live.watch import Watch
from hopline.analyzer.findings.model import iso_utc
from hopline.middleware.contract.units import to_epoch
from hopline.middleware.http_limits import ConnectionLimits
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest


def findings_body(watch: Watch, since: float | None) -> bytes:
    """The answer's JSON. The incidents were serialized by the step that made them
    (``Watch.published``): a request only reads five counters and joins bytes, so that it needs the
    GIL, which a detection step holds between its polars calls, for microseconds."""
    with watch.lock:
        published = watch.published
    keep = [p.body for p in published if since is None or p.firing or p.last_seen >= since]
    detector = watch.detector
    horizon = detector.horizon
    head = orjson.dumps(
        {
            "requests": 0 if horizon is None else horizon.height,
            "window_s": detector.config.window_s,
            "horizon_s": detector.config.horizon_s,
            "event_time": None if detector.now is None else iso_utc(detector.now),
            "events_from_future": detector.events_from_future,
            "findings": [],
        }
    )
    return head[: -len(b"[]}")] + b"[" + b",".join(keep) + b"]}"


def findings_answer(watch: Watch, since: float | None) -> dict:
    """``findings_body``, parsed."""
    return orjson.loads(findings_body(watch, since))


class FindingsApp:
    """The ASGI app (HTTP; lifespan answered, nothing to start). With ``read_token`` (``hopline
    watch --read-token``), both endpoints need ``Authorization: Bearer <read_token>``, as the
    collector's read endpoints do: findings name request IDs, scope values and the store's path."""

    def __init__(
        self, watch: Watch, read_token: str | None = None, limits: ConnectionLimits | None = None
    ) -> None:
        self.watch = watch
        self.registry = build_registry(watch, limits)
        self.tokens = (read_token,) if read_token else ()

    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        headers = dict(scope.get("headers") or [])
        authorization = headers.get(b"authorization", b"").decode("latin-1")
        if not self.allowed(authorization):
            status, body, kind = 401, b'{"error": "needs Authorization: Bearer <--read-token>"}', "application/json"
        else:
            status, body, kind = self.route(scope)
        extra = [(b"www-authenticate", b"Bearer")] if status == 401 else []
        await send(
            {"type": "http.response.start", "status": status, "headers": [(b"content-type", kind.encode()), *extra]}
        )
        await send({"type": "http.response.body", "body": body})

    def allowed(self, authorization: str) -> bool:
        """No token, or ``Bearer <token>`` (compared in constant time)."""
        if not self.tokens:
            return True
        scheme, _, given = authorization.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self.tokens[0].encode())

    def route(self, scope: dict) -> tuple[int, bytes, str]:
        path, method = scope["path"], scope["method"]
        if method != "GET":
            return 405, b'{"error": "only GET"}', "application/json"
        if path == "/metrics":
            return 200, generate_latest(self.registry), CONTENT_TYPE_LATEST
        if path == "/v1/findings":
            query = parse_qs(scope.get("query_string", b"").decode())
            try:
                since = to_epoch(query["since"][0]) if "since" in query else None
            except ValueError as exc:
                return 400, orjson.dumps({"error": f"since: {exc}"}), "application/json"
            return 200, findings_body(self.watch, since), "application/json"
        return 404, b'{"error": "not found: GET /v1/findings?since=... or /metrics"}', "application/json"
