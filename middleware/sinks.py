"""Where emitted events go: ``stdout``, ``file:PATH``, ``http(s)://HOST:PORT``, ``null``, ``memory``.

A sink receives batches of event dicts from the emitter's background thread (or from a blocking
``Emitter.flush``/``close``), never from a request path, and one batch at a time. ``write``
serializes the batch and returns how many of its events it had to drop: it never raises for an
I/O problem (it counts and logs through hopline's private logger instead).

File sink rotation scheme (what ``hopline collector --tail 'PATH*'`` follows):

* ``PATH`` is the live file; events are appended as NDJSON, one ``write(2)`` per batch. When the
  disk fails mid-write, the complete lines stay, and the next batch starts on a fresh line so the
  torn one stands alone (a reader rejects that one line).
* Before a batch is written, the live file is rotated when the batch would take it past
  ``max_bytes`` (a single batch larger than that goes alone into a fresh file), or when the UTC
  hour has changed since the live file was started. Rotation renames ``PATH`` to
  ``PATH.YYYYMMDDHH.NNNN``: the UTC hour the file was started in and a four-digit sequence number
  within that hour, from ``0000``. Names therefore sort chronologically, and a rename never
  replaces an existing file (the next free number is taken).
* A rotated file is never opened for writing again. A tailer finishes the file it has open
  (found again under its rotated name), then reads the sorted rotated names it has not read,
  then the live ``PATH``.
* Rotation happens at the first write of a new hour, so a quiet hour produces no file.
* One writer per file: processes forked from one server (gunicorn, uvicorn ``--workers``) should
  put ``{pid}`` in the path (``file:/var/log/hopline/events.{pid}.ndjson``); it is replaced by
  the writing process's ID, also in a child forked after the sink was built.
"""

from __future__ import annotations

import os
import random
import re
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import httpx
import orjson

from hopline.middleware import clock
from hopline.middleware.contract.events import dumps
from hopline.middleware.log import warn_throttled

Event = dict[str, Any]


class Sink(Protocol):
    """What the emitter drives. ``write`` returns the number of events of ``batch`` it dropped."""

    def write(self, batch: list[Event]) -> int | None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


class Encoded:
    """A batch as NDJSON in one buffer, and where each line starts (``bounds[i]`` to
    ``bounds[i + 1]`` is line ``i``), so a batch can be split without serializing it again.

    Lines are appended to one ``bytearray`` as they are produced: each orjson output is freed at
    once. Holding a thousand of them in a list first costs several times the serialization
    itself (allocator churn; see bench/README.md).
    """

    __slots__ = ("bounds", "data", "dropped")

    def __init__(self, batch: list[Event]) -> None:
        data = bytearray()
        bounds = [0]
        for event in batch:
            try:
                data += dumps(event)
            except (TypeError, orjson.JSONEncodeError) as exc:  # a middleware bug: lose this event only
                warn_throttled("unserializable_event", "event_not_serializable", hop=event.get("hop"), error=str(exc))
                continue
            bounds.append(len(data))
        self.data = data
        self.bounds = bounds
        self.dropped = len(batch) - (len(bounds) - 1)  # events that could not be serialized

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def body(self, start: int, stop: int) -> bytes:
        """Lines ``start`` to ``stop`` (exclusive) as one bytes object."""
        return bytes(memoryview(self.data)[self.bounds[start] : self.bounds[stop]])


class StdoutSink:
    """NDJSON on standard output (the stream current at each write, so test runners can capture it)."""

    def write(self, batch: list[Event]) -> int:
        encoded = Encoded(batch)
        try:
            out = sys.stdout
            buffer = getattr(out, "buffer", None)
            if buffer is not None:
                out.flush()  # keep order with text the host printed
                buffer.write(encoded.data)
                buffer.flush()
            else:
                out.write(encoded.data.decode())
                out.flush()
        except (OSError, ValueError) as exc:  # closed or broken stdout
            warn_throttled("stdout_write_failed", "sink_write_failed", sink="stdout", error=str(exc))
            return len(batch)
        return encoded.dropped

    def flush(self) -> None:
        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            pass

    def close(self) -> None:
        self.flush()

    def __repr__(self) -> str:
        return "StdoutSink()"


class MemorySink:
    """Keeps events in a list (tests and embedding; no ``emitter.stats`` reports by default)."""

    reports_stats = False

    def __init__(self) -> None:
        self.events: list[Event] = []

    def write(self, batch: list[Event]) -> int:
        self.events.extend(batch)
        return 0

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"MemorySink({len(self.events)} events)"


class NullSink:
    """Discards every event and reports it dropped (``HOPLINE_SINK=null``; also what a misconfigured
    ``HOPLINE_SINK`` falls back to, so the drop counters show that nothing is shipped)."""

    reports_stats = False

    def write(self, batch: list[Event]) -> int:
        return len(batch)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return "NullSink()"


# --- file ---------------------------------------------------------------------------------------

DEFAULT_MAX_BYTES = 64 * 1024 * 1024


def hour_label(epoch_seconds: float) -> str:
    """``YYYYMMDDHH`` of the UTC hour containing ``epoch_seconds`` (the rotated-file name part)."""
    return datetime.fromtimestamp(epoch_seconds, tz=timezone.utc).strftime("%Y%m%d%H")


def rotated_name(path: str, hour: str, number: int) -> str:
    """The name the live file ``path`` gets when it is rotated: ``PATH.YYYYMMDDHH.NNNN``."""
    return f"{path}.{hour}.{number:04d}"


class FileSink:
    """Appends NDJSON to a file and rotates it by size and by UTC hour (scheme: module docstring).

    ``now`` gives the epoch time used to decide the hour (tests inject a clock instead of waiting
    an hour). A write that fails (unwritable path, full disk) drops the batch, counts it and is
    retried with a fresh open at the next batch; events never pile up here.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        now: Callable[[], float] = clock.now,
    ) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        self.template = os.fspath(path)
        if not self.template:
            raise ValueError("file sink needs a path: file:PATH")
        self.max_bytes = max_bytes
        self._now = now
        self._fd: int | None = None
        self._size = 0
        self._hour = ""
        self._torn = False  # the last write stopped inside a line: start the next with a newline

    @property
    def path(self) -> str:
        """The live file's path (``{pid}`` replaced by this process's ID)."""
        return self.template.replace("{pid}", str(os.getpid()))

    def write(self, batch: list[Event]) -> int:
        encoded = Encoded(batch)
        if not encoded:
            return encoded.dropped
        payload = encoded.data
        try:
            self._prepare(len(payload))
            prefix = b"\n" if self._torn else b""
            data = prefix + payload if prefix else payload
            written = self._write_all(data)
        except OSError as exc:
            warn_throttled("file_write_failed", "sink_write_failed", sink=repr(self), error=str(exc))
            return len(batch)
        if written < len(data):  # the disk failed mid-batch: keep the complete lines, count the rest
            self._torn = not data[:written].endswith(b"\n")
            complete = payload[: max(written - len(prefix), 0)].count(b"\n")
            return len(batch) - complete
        self._torn = False
        return encoded.dropped

    def _prepare(self, incoming: int) -> None:
        """Open the live file if needed and rotate it first when this write calls for it."""
        if self._fd is None:
            self._open()
        hour = hour_label(self._now())
        if self._size and (hour != self._hour or self._size + incoming > self.max_bytes):
            try:
                self._rotate()
            except OSError as exc:  # keep appending to the live file rather than lose events
                warn_throttled("file_rotate_failed", "sink_rotate_failed", sink=repr(self), error=str(exc))
            self._open()

    def _open(self) -> None:
        path = self.path
        directory = os.path.dirname(path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        st = os.fstat(fd)
        self._fd = fd
        self._size = st.st_size
        # A live file left by an earlier run belongs to the hour it was last written in.
        self._hour = hour_label(st.st_mtime if st.st_size else self._now())

    def _rotate(self) -> None:
        path = self.path
        self._close_fd()
        number = 0
        while os.path.exists(rotated_name(path, self._hour, number)):
            number += 1
        os.rename(path, rotated_name(path, self._hour, number))
        self._torn = False

    def _write_all(self, data: bytes) -> int:
        """Write ``data`` with as few syscalls as the OS allows; on error, close so the next batch
        reopens (the path may have become writable) and return what got written."""
        assert self._fd is not None
        view = memoryview(data)
        written = 0
        try:
            while written < len(data):
                written += os.write(self._fd, view[written:])
        except OSError as exc:
            self._close_fd()
            if written == 0:
                raise
            warn_throttled("file_write_failed", "sink_write_failed", sink=repr(self), error=str(exc))
        self._size += written
        return written

    def _close_fd(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.close(fd)
            except OSError:
                pass

    def flush(self) -> None:
        """Nothing to do: every batch reaches the OS in ``write`` (no user-space buffer)."""

    def close(self) -> None:
        self._close_fd()

    def after_fork_in_child(self) -> None:
        """Forget the parent's file descriptor; the child opens its own (``{pid}`` expanded anew)."""
        self._close_fd()
        self._torn = False

    def __repr__(self) -> str:
        return f"FileSink({self.template!r})"


# --- http ---------------------------------------------------------------------------------------

EVENTS_PATH = "/v1/events"
_HEADER_TOKEN = re.compile(r"[\x21-\x7e]+")  # what a Bearer value can carry as is
RETRY_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})


def events_url(url: str) -> str:
    """The collector's ingest URL: ``http://HOST:PORT`` gets ``/v1/events``; a full URL ending in
    ``/v1/events`` is kept. Raises ``ValueError`` naming what is wrong otherwise."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"collector URL must be http(s)://HOST[:PORT][/v1/events], got {url!r}")
    path = parts.path.rstrip("/")
    if not path:
        path = EVENTS_PATH
    elif not path.endswith(EVENTS_PATH):
        raise ValueError(f"collector URL path must be empty or end in {EVENTS_PATH}, got {url!r}")
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def _redacted(url: str) -> str:
    """``url`` without user:password, for logs."""
    parts = urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))


class HttpSink:
    """POSTs NDJSON batches to the collector's ``/v1/events``.

    * ``Content-Type: application/x-ndjson``; ``Authorization: Bearer TOKEN`` when a token is set.
    * Connection errors, timeouts, 408/425/429 and 5xx are retried with jittered exponential
      backoff (``Retry-After`` honoured), for at most ``retry_budget`` seconds per batch; then the
      batch is dropped and counted. Meanwhile the emitter's buffer keeps its capacity and drops
      what does not fit, so a dead collector costs bounded memory.
    * 413: the batch is split in halves, recursively; a single event answered 413 is dropped.
    * Other 4xx (400, 401, 403, 415…): retrying cannot help; the batch is dropped and logged.
    * A 2xx answer ``{"accepted", "duplicates", "rejected": [{"line", "error"}]}``: rejected lines
      count as drops and are logged (throttled).

    Events keep their ``eid`` across retries and splits, so the collector drops duplicates of a
    batch it stored but whose answer was lost.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout: float = 5.0,
        retry_budget: float = 10.0,
        backoff: tuple[float, float] = (0.1, 2.0),
        verify: Any = True,
    ) -> None:
        self.url = events_url(url)
        if token and not _HEADER_TOKEN.fullmatch(token):
            position = next(i for i, ch in enumerate(token, 1) if not _HEADER_TOKEN.fullmatch(ch))
            raise ValueError(  # the token itself is a secret: say where, not what
                "HOPLINE_TOKEN must be printable ASCII without spaces (it is sent in an HTTP "
                f"Authorization header); character {position} of {len(token)} is not"
            )
        self.retry_budget = retry_budget
        self.backoff = backoff
        self.verify = verify
        self._headers = {"Content-Type": "application/x-ndjson", "User-Agent": "hopline"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._timeouts = httpx.Timeout(timeout, connect=min(timeout, 2.0)).as_dict()
        self._transport: httpx.HTTPTransport | None = None
        self._deadline: float | None = None  # monotonic; set by the emitter on shutdown
        self._interrupt = threading.Event()
        self.posts = 0  # HTTP requests made (tests and debugging)

    # The emitter calls this when it closes: no retry may last past ``deadline``.
    def set_deadline(self, deadline: float) -> None:
        self._deadline = deadline
        self._interrupt.set()

    def write(self, batch: list[Event]) -> int:
        encoded = Encoded(batch)
        if not encoded:
            return encoded.dropped
        deadline = time.monotonic() + self.retry_budget
        if self._deadline is not None:
            deadline = min(deadline, self._deadline)
        return encoded.dropped + self._post(encoded, 0, len(encoded), deadline)

    def _post(self, encoded: Encoded, start: int, stop: int, deadline: float) -> int:
        """Send lines ``start`` to ``stop`` of ``encoded``; return how many were dropped."""
        count = stop - start
        delay = self.backoff[0]
        while True:
            try:
                response = self._send(encoded.body(start, stop))
            except httpx.HTTPError as exc:  # connection refused, timeouts, protocol errors
                problem = f"{type(exc).__name__}: {exc}"
                retry_after = None
            else:
                self.posts += 1
                status = response.status_code
                if 200 <= status < 300:
                    return self._rejected(response, count)
                if status == 413:
                    if count == 1:
                        warn_throttled(
                            "http_413_single", "event_too_large", sink=repr(self),
                            bytes=encoded.bounds[stop] - encoded.bounds[start],
                        )
                        return 1
                    half = start + count // 2
                    return self._post(encoded, start, half, deadline) + self._post(encoded, half, stop, deadline)
                if status not in RETRY_STATUSES:
                    warn_throttled(
                        f"http_{status}", "collector_refused_batch", sink=repr(self), status=status,
                        events=count, answer=response.text[:200],
                    )
                    return count
                problem = f"HTTP {status}"
                retry_after = _retry_after(response)
            wait = random.uniform(delay / 2, delay) if retry_after is None else retry_after
            if self._deadline is not None:  # the emitter is closing
                deadline = min(deadline, self._deadline)
            if time.monotonic() + wait > deadline:
                warn_throttled(
                    "http_gave_up", "collector_unreachable_batch_dropped", sink=repr(self),
                    events=count, error=problem,
                )
                return count
            self._sleep(wait)
            delay = min(delay * 2, self.backoff[1])

    def _sleep(self, seconds: float) -> None:
        """Back off, waking early when the emitter sets a shutdown deadline."""
        end = time.monotonic() + seconds
        while True:
            if self._deadline is not None:
                end = min(end, self._deadline)
            left = end - time.monotonic()
            if left <= 0:
                return
            self._interrupt.wait(left)
            self._interrupt.clear()

    def _rejected(self, response: httpx.Response, count: int) -> int:
        """How many lines the collector's 2xx answer rejected (``rejected_total`` when it listed
        only the first ones), logged with the first reason."""
        try:
            answer = response.json()
            rejected = answer.get("rejected") or []
            rejected_count = int(answer.get("rejected_total") or len(rejected))
        except (ValueError, TypeError, AttributeError):
            warn_throttled("http_bad_answer", "collector_answer_not_understood", sink=repr(self))
            return 0
        if not rejected_count:
            return 0
        first = rejected[0] if isinstance(rejected, list) and rejected and isinstance(rejected[0], dict) else {}
        warn_throttled(
            "http_rejected", "collector_rejected_events", sink=repr(self), rejected=rejected_count,
            events=count, first_line=first.get("line"), first_error=str(first.get("error"))[:200],
        )
        return min(rejected_count, count)

    def _send(self, body: bytes) -> httpx.Response:
        """One POST through httpx's transport directly: ``httpx.Client`` would log every request
        at INFO on the ``httpx`` logger, i.e. into the host's logs, once per batch."""
        if self._transport is None:
            self._transport = httpx.HTTPTransport(verify=self.verify)
        request = httpx.Request(
            "POST", self.url, content=body, headers=self._headers, extensions={"timeout": self._timeouts}
        )
        response = self._transport.handle_request(request)
        try:
            response.read()
        finally:
            response.close()
        return response

    def flush(self) -> None:
        """Nothing buffered here: ``write`` returns once the batch is answered or given up."""

    def close(self) -> None:
        if self._transport is not None:
            transport, self._transport = self._transport, None
            transport.close()

    def after_fork_in_child(self) -> None:
        """Forget the parent's pooled connections (closing them here would disturb the parent)."""
        self._transport = None
        self._interrupt = threading.Event()

    def __repr__(self) -> str:
        return f"HttpSink({_redacted(self.url)!r})"


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after", "")
    try:
        return max(0.0, min(float(value), 60.0))
    except ValueError:
        return None


# --- choosing a sink ------------------------------------------------------------------------------

SINK_SPECS = (
    "stdout, file:PATH, http(s)://HOST:PORT[/v1/events] (several, comma-separated, to shard over "
    "collectors), null or memory"
)


def make_sink(spec: str | None, *, token: str | None = None) -> Sink:
    """Build a sink from a ``HOPLINE_SINK``-style spec (None means stdout).

    ``token`` is the collector's bearer token for http(s) sinks; default ``HOPLINE_TOKEN``.
    Several collector URLs separated by commas build a ``sharded_sink.ShardedHttpSink``: each
    request's events go to the one collector a rendezvous hash of its request ID picks.
    Raises ``ValueError`` naming the spec when it is not one of ``SINK_SPECS``.
    """
    spec = "stdout" if spec is None else spec.strip()
    if spec == "stdout":
        return StdoutSink()
    if spec == "memory":
        return MemorySink()
    if spec == "null":
        return NullSink()
    if spec.startswith("file:"):
        path = spec[len("file:"):]
        if path.startswith("//"):  # file:///var/log/x -> /var/log/x
            path = path[2:]
        return FileSink(path)
    if spec.startswith(("http://", "https://")):
        token = token if token is not None else os.environ.get("HOPLINE_TOKEN")
        urls = [url.strip() for url in spec.split(",")]
        if len(urls) == 1:
            return HttpSink(spec, token=token)
        if not all(urls):
            raise ValueError(f"empty collector URL in {spec!r}: separate http(s) URLs with single commas")
        from hopline.middleware.sharded_sink import ShardedHttpSink  # it builds on HttpSink, above

        return ShardedHttpSink(urls, token=token)
    raise ValueError(f"unknown sink {spec!r}: use {SINK_SPECS}")


__all__ = [
    "FileSink",
    "HttpSink",
    "MemorySink",
    "NullSink",
    "Sink",
    "StdoutSink",
    "Encoded",
    "events_url",
    "hour_label",
    "make_sink",
    "rotated_name",
]
