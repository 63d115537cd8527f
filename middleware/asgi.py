"""What the gateway and engine middleware share: ASGI types, request-ID adoption, response watching.

``Exchange`` is the per-request object both pure-ASGI middlewares create in ``__call__`` (never
state on the middleware itself). It is shown every response message as it is forwarded, with a
``perf_counter`` reading (converted to epoch seconds only when an event is emitted), and emits
``<component>.first_token``, ``.last_token`` and ``.error`` (or ``gateway.rejected``). Nothing in
here may raise into the host: the middlewares call it inside ``try`` blocks and count what goes
wrong in the emitter's ``errors``.

``Exchange.send`` is a ready-made ``send`` wrapper (the engine passes it to the app as is): it
observes the message and returns the server's own ``send(message)`` awaitable, so there is no extra
coroutine per chunk. A stream's chunks are parsed on the request path only up to its first token
(that event goes out at once); after it, a chunk costs one ``perf_counter`` and two list appends,
and the kept chunks are read exactly (``StreamReader.feed_batch``) in one batch: on the emitter's
worker when the stream ends (``Emitter.emit_later``, which also builds the final event there:
``last_token``, or the error event of an error inside the 200 stream at that chunk's time), or on
the spot every ``MAX_KEPT_CHUNKS`` chunks and at a client's disconnect, so a request holds at most
that many chunk references and the results are those of reading every chunk as it came.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from time import perf_counter
from typing import Any

from hopline.middleware import clock
from hopline.middleware.contract.events import LEGS, new_request_id, normalize_request_id, trace_id_of
from hopline.middleware.emit import Emitter, get_emitter
from hopline.middleware.log import logger
from hopline.middleware.sse import MAX_JSON_BYTES, StreamReader, error_summary, response_summary

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_CLOCK_OFFSET = clock.OFFSET  # clock.from_perf inlined: epoch seconds = OFFSET + perf_counter()
REQUEST_ID_HEADER = b"x-request-id"
ATTEMPT_HEADER = b"x-hopline-attempt"
LEG_HEADER = b"x-hopline-leg"  # a P/D proxy's leg (contract.LEGS), from GatewayHops.forwarded(leg=...)
_LEGS = {leg.encode(): leg for leg in LEGS}
# The first bytes of the request headers scan_request_headers looks for (x-..., traceparent)
_SCANNED_FIRST = frozenset((REQUEST_ID_HEADER[0], ATTEMPT_HEADER[0], LEG_HEADER[0], b"traceparent"[0]))
MAX_ATTEMPT = 1000
# A stream's chunks kept (after its first token) before they are read on the spot: bounds a
# request's memory to this many chunk references; the result is the same either way.
MAX_KEPT_CHUNKS = 128
# The reader's instants (perf_counter readings) among a stream's last_token attributes
_READER_TIMES = ("max_gap_at", "first_reasoning_at", "first_content_at")


def resolve_emitter(emitter: Emitter | None, owner: str) -> Emitter | None:
    """``emitter``, else the one configured from ``HOPLINE_*``; None (pass-through) if that fails.

    A broken hopline configuration must not stop the host from starting: it is logged and the
    middleware stays out of the way.
    """
    if emitter is not None:
        return emitter
    try:
        return get_emitter()
    except Exception as exc:  # noqa: BLE001 - a broken configuration must not stop the host
        logger.error("hopline_disabled", middleware=owner, error=str(exc))
        return None


def parse_attempt(raw: bytes | str | None) -> int:
    """The ``X-Hopline-Attempt`` value as an int in [0, MAX_ATTEMPT]; 0 when absent or invalid."""
    if raw is None:
        return 0
    try:
        value = int(raw)
    except ValueError:
        return 0
    return value if 0 <= value <= MAX_ATTEMPT else 0


def adopt_request_id(raw: bytes | str | None, where: str) -> str:
    """The incoming request ID in hopline's form, or a fresh one when it is missing or unusable.

    A hostile value (too long, control characters, ...) is replaced and never logged raw: only
    its length is.
    """
    if raw is None:
        return new_request_id()
    rid = normalize_request_id(raw)
    if rid is None:
        logger.warning("request_id_replaced", where=where, reason="invalid", length=len(raw))
        return new_request_id()
    return rid


def read_request_headers(scope: Scope) -> tuple[bytes | None, bytes | None]:
    """The raw ``X-Request-Id`` and ``X-Hopline-Attempt`` values of an ASGI scope."""
    rid, attempt, _, _ = scan_request_headers(scope)
    return rid, attempt


def scan_request_headers(scope: Scope) -> tuple[bytes | None, bytes | None, bytes | None, bytes | None]:
    """The raw ``X-Request-Id``, ``X-Hopline-Attempt`` (the last of each), ``traceparent`` and
    ``X-Hopline-Leg`` (the first of each) values of an ASGI scope, in one pass over its headers.

    ASGI servers hand over header names lower-cased (the spec requires it), so no ``lower()``.
    """
    rid = attempt = traceparent = leg = None
    for name, value in scope.get("headers") or ():
        if not name or name[0] not in _SCANNED_FIRST:  # most headers: one test, not four
            continue
        if name == REQUEST_ID_HEADER:
            rid = value
        elif name == ATTEMPT_HEADER:
            attempt = value
        elif name == b"traceparent":
            if traceparent is None:
                traceparent = value
        elif name == LEG_HEADER and leg is None:
            leg = value
    return rid, attempt, traceparent, leg


def leg_of(raw: bytes | None) -> str | None:
    """A raw ``X-Hopline-Leg`` value as a known leg (``contract.LEGS``); None when absent or unknown."""
    return None if raw is None else _LEGS.get(raw.strip().lower())


def leg_in(scope: Scope) -> str | None:
    """The P/D leg a proxy sent in ``X-Hopline-Leg`` (``prefill`` / ``decode``); None when absent or unknown."""
    return leg_of(scan_request_headers(scope)[3])


def echo_request_id(message: Message, request_id: str) -> None:
    """Put exactly one ``x-request-id: request_id`` into an ``http.response.start`` message, so a
    caller can find its request (``hopline timeline ID``) from the response alone."""
    value = request_id.encode()
    headers = message.get("headers") or ()
    for k, _ in headers:
        if len(k) == 12 and k.lower() == REQUEST_ID_HEADER:
            break
    else:  # the usual case: none there, so no filtering (the same list as below, in one copy)
        message["headers"] = [*headers, (REQUEST_ID_HEADER, value)]
        return
    echoed = [v for k, v in headers if k.lower() == REQUEST_ID_HEADER]
    if echoed == [value]:
        return  # the app already answers with it (vLLM's --enable-request-id-headers): no copy
    headers = [(k, v) for k, v in headers if k.lower() != REQUEST_ID_HEADER]
    headers.append((REQUEST_ID_HEADER, value))
    message["headers"] = headers


def traceparent_in(scope: Scope) -> tuple[str | None, str | None]:
    """The incoming W3C ``traceparent`` (when well formed) and its trace ID, else ``(None, None)``:
    events carry the trace ID (the second join key), a gateway forwards the header unchanged."""
    value = scan_request_headers(scope)[2]
    trace_id = None if value is None else trace_id_of(value)
    return (value.decode("ascii"), trace_id) if trace_id is not None else (None, None)


def with_request_id(scope: Scope, request_id: str, present: bool = True) -> Scope:
    """A shallow copy of ``scope`` whose headers carry exactly one ``x-request-id: request_id``
    (``present`` False: the caller knows the scope has none, so there is nothing to filter out)."""
    if not present:
        return {**scope, "headers": [*(scope.get("headers") or ()), (REQUEST_ID_HEADER, request_id.encode())]}
    headers = [(k, v) for k, v in scope.get("headers") or () if k != REQUEST_ID_HEADER]
    headers.append((REQUEST_ID_HEADER, request_id.encode()))
    new = dict(scope)
    new["headers"] = headers
    return new


_HOP_NAMES: dict[str, tuple[str, str, str, str]] = {}


def _hop_names(component: str) -> tuple[str, str, str, str]:
    """``<component>.first_token`` / ``.last_token`` / ``.error`` / ``.rejected``, built once per component."""
    names = _HOP_NAMES.get(component)
    if names is None:
        names = _HOP_NAMES[component] = tuple(
            f"{component}.{hop}" for hop in ("first_token", "last_token", "error", "rejected")
        )
    return names


class Exchange:
    """One request as one ASGI component sees it: emits its first/last token and its failure.

    ``attempt`` is read at every emission, so a gateway can raise it while forwarding.
    ``rejected`` lists the statuses reported as ``<component>.rejected`` instead of ``.error``.
    """

    __slots__ = (
        "_hop_error",
        "_hop_first",
        "_hop_last",
        "_hop_rejected",
        "_json",
        "_json_size",
        "_kept",
        "_kept_at",
        "_reader",
        "_rejected",
        "attempt",
        "complete",
        "disconnected",
        "downstream",
        "emitter",
        "final",
        "leg",
        "request_id",
        "status",
        "trace_id",
    )

    def __init__(
        self,
        emitter: Emitter,
        component: str,
        request_id: str,
        attempt: int,
        *,
        rejected: frozenset[int] = frozenset(),
        downstream: Send | None = None,
    ) -> None:
        self.emitter = emitter
        self.request_id = request_id
        self.attempt = attempt
        self._hop_first, self._hop_last, self._hop_error, self._hop_rejected = _hop_names(component)
        self._rejected = rejected
        self.status: int | None = None
        self._reader: StreamReader | None = None
        # After a stream's first token: its chunks and their perf_counter readings, read in
        # batches (see send); two flat lists, no tuple (nor anything the GC tracks) per chunk
        self._kept: list[bytes] | None = None
        self._kept_at: list[float] = []
        self._json: list[bytes] | None = None  # a non-streaming body, while under MAX_JSON_BYTES
        self._json_size = 0
        self.complete = False  # the final body message went out
        self.final = False  # a last_token / error / rejected event was emitted
        self.disconnected = False
        self.downstream = downstream  # the server's ``send``, for ``send``
        self.trace_id: str | None = None  # from ``traceparent`` (``traceparent_in``), on every event
        self.leg: str | None = None  # an engine's P/D leg (``leg_in``), on every event

    def emit(self, hop: str, t: float | None = None, **attrs: Any) -> None:
        """Emit ``hop`` at ``perf_counter`` reading ``t`` (default now)."""
        event = {"attempt": self.attempt, **attrs} if attrs else {"attempt": self.attempt}
        if self.trace_id is not None:
            event["trace_id"] = self.trace_id
        if self.leg is not None:
            event["leg"] = self.leg
        self.emitter.emit_attrs(hop, self.request_id, None if t is None else _CLOCK_OFFSET + t, event)

    def send(self, message: Message) -> Awaitable[None]:
        """The ``send`` to give the app: observe ``message``, then forward it to ``downstream``.

        After a stream's first token an ordinary chunk is only kept, with its arrival time (one
        ``perf_counter``, one list append): the kept chunks are read exactly, in order, in one
        batch when the stream ends (on the emitter's worker thread, ``_end_stream``) or when
        ``MAX_KEPT_CHUNKS`` have piled up (here, at once, which bounds a request's memory).
        Errors in the observing are counted, never raised; the server's awaitable is returned as is.
        """
        kept = self._kept
        if kept is not None:  # past a stream's first token: the per-chunk path
            try:
                # only a body message has ``more_body``; one without it (or without ``body``)
                # takes the general path below. Subscripts, not ``get``: fewer instructions
                more, body = message["more_body"], message["body"]
            except Exception:  # noqa: BLE001 - KeyError, or a message that is not a dict
                pass
            else:
                if more:
                    try:
                        kept.append(body)
                        self._kept_at.append(perf_counter())
                        if len(kept) >= MAX_KEPT_CHUNKS:
                            self._read_kept()
                    except Exception:  # noqa: BLE001 - never into the host
                        self.emitter.errors += 1
                    return self.downstream(message)  # type: ignore[misc]
        try:
            if message["type"] == "http.response.body":
                self.on_body(message, perf_counter())
            elif message["type"] == "http.response.start":
                self.on_start(message, perf_counter())
        except Exception:  # noqa: BLE001 - never into the host
            self.emitter.errors += 1
        return self.downstream(message)  # type: ignore[misc]  # set by whoever passes ``send`` on

    def fail(self, error: str, t: float | None = None, status: int | None = None) -> None:
        """Emit the component's error event once (its final word on the request)."""
        if self.final:
            return
        self.final = True
        self._kept = None
        self.emit(self._hop_error, t, **self._error_attrs(error, status))

    def _error_attrs(self, error: str, status: int | None) -> dict[str, Any]:
        """An error event's ``error`` and ``status`` (the response's when not given; none if unknown)."""
        if status is None:
            status = self.status
        return {"error": error} if status is None else {"error": error, "status": status}

    def on_start(self, message: Message, t: float) -> None:
        status = self.status = message.get("status", 200)
        if status >= 400:
            self.final = True
            hop = self._hop_rejected if status in self._rejected else self._hop_error
            self.emit(hop, t, status=status, error=f"http_{status}")
            return
        for name, value in message.get("headers") or ():
            if name.lower() == b"content-type":
                if value[:17] == b"text/event-stream":  # (a slice: cheaper than startswith)
                    self._reader = StreamReader()
                break
        if self._reader is None:
            self._json = []

    def on_body(self, message: Message, t: float) -> None:
        more = message.get("more_body", False)
        if not more:
            self.complete = True
        if self.final or self.disconnected:  # a disconnected request is reported by finish()
            return
        body = message.get("body")
        reader = self._reader
        if reader is not None:
            kept = self._kept
            if kept is not None:  # past the first token: keep, read in a batch (see send)
                kept.append(body or b"")
                self._kept_at.append(t)
                if not more:
                    self._end_stream(t, None)
                elif len(kept) >= MAX_KEPT_CHUNKS:
                    self._read_kept()
                return
            if body and reader.feed(body, t):
                self.emit(self._hop_first, t)
                if more and reader.error is None:
                    self._kept, self._kept_at = [], []
            if reader.error is not None:
                self.fail(reader.error, t, reader.error_status or self.status)
            elif not more:
                self.final = True
                self.emit(self._hop_last, t, **self._last_attrs(reader))
            return
        parts = self._json
        if parts is not None and body:
            self._json_size += len(body)
            if self._json_size > MAX_JSON_BYTES:
                self._json = parts = None
            else:
                parts.append(body)
        if not more:
            body_bytes = b"".join(parts) if parts else b""
            error = error_summary(body_bytes)
            if error is not None:
                self.fail(error, t)
                return
            self.final = True
            self.emit(self._hop_last, t, **response_summary(body_bytes))

    def _last_attrs(self, reader: StreamReader) -> dict[str, Any]:
        """The ``*.last_token`` attributes of a finished stream."""
        attrs = reader.summary()
        for name in _READER_TIMES:
            if name in attrs:
                attrs[name] += _CLOCK_OFFSET
        return attrs

    def _read_kept(self) -> None:
        """Read the kept chunks now (the cap, a disconnect): an error among them is emitted at once."""
        kept, times = self._kept, self._kept_at
        self._kept, self._kept_at = [], []
        reader = self._reader
        if kept and reader is not None:
            error_at = reader.feed_batch(kept, times)
            if error_at is not None:
                self.fail(reader.error, error_at, reader.error_status or self.status)  # type: ignore[arg-type]

    def _end_stream(self, t: float, outcome: tuple[str, int | None] | None) -> None:
        """The stream ended at ``t`` (``outcome`` None: its last chunk went out; else the error
        label and status ``finish`` found): its final event is built on the emitter's worker
        (``_end_event``), which reads the kept chunks first. Nothing here touches them again."""
        self.final = True
        kept, times = self._kept or [], self._kept_at
        self._kept, self._kept_at = None, []
        self.emitter.emit_later(self._end_event, kept, times, t, outcome, self.attempt)

    def _end_event(
        self,
        kept: list[bytes],
        times: list[float],
        t: float,
        outcome: tuple[str, int | None] | None,
        attempt: int,
    ) -> tuple[str, str, float, dict[str, Any]]:
        """(worker side) The kept chunks read exactly, then the stream's final event: the error
        event inside the stream if one came (at its chunk's time), else ``last_token`` at ``t``
        or ``outcome``'s error."""
        reader = self._reader
        assert reader is not None
        error_at = reader.feed_batch(kept, times)
        if error_at is not None:
            hop, t = self._hop_error, error_at
            attrs = self._error_attrs(reader.error, reader.error_status or self.status)  # type: ignore[arg-type]
        elif outcome is None:
            hop, attrs = self._hop_last, self._last_attrs(reader)
        else:
            hop, attrs = self._hop_error, self._error_attrs(*outcome)
        attrs["attempt"] = attempt
        if self.trace_id is not None:
            attrs["trace_id"] = self.trace_id
        if self.leg is not None:
            attrs["leg"] = self.leg
        return hop, self.request_id, _CLOCK_OFFSET + t, attrs

    def on_disconnect(self) -> None:
        """The downstream client went away (``http.disconnect`` before the response finished):
        what was kept is read now, what is sent after it is not read."""
        if not self.complete:
            self.disconnected = True
            if self._kept is not None:
                self._read_kept()
                self._kept = None

    def finish(self, exc: BaseException | None) -> None:
        """After the app returned or raised: report a request that never finished (never raises)."""
        if self.final:
            return
        try:
            if self.disconnected or isinstance(exc, OSError):
                outcome: tuple[str, int | None] = ("disconnected", None)
            elif exc is not None:
                outcome = (_exception_label(exc), self.status if self.status is not None else 500)
            else:
                outcome = ("incomplete", None)
            if self._kept is not None:
                self._end_stream(perf_counter(), outcome)  # an error among the kept chunks wins
            else:
                self.fail(outcome[0], None, outcome[1])
        except Exception:  # noqa: BLE001 - never into the host
            self.emitter.errors += 1


def _exception_label(exc: BaseException) -> str:
    """``exception:ValueError``: the class name only (messages may quote user input)."""
    return f"exception:{type(exc).__name__}"[:64]
