"""What a restarted collector rebuilds from its own store, and what it says it could not (issue 36).

A collector killed (``kill -9``, OOM, a crash) loses what it held in memory: the window summaries
not served yet (``windows.py``: a window is served ``window_settle`` after its end) and the join
state of the requests in flight (their earlier hops). Its store (``store.py``) still has every
event it acknowledged. So at start, before it answers (uvicorn serves once the lifespan has
started), ``rebuild`` reads the store back from the first window not served before the restart,
less ``REPLAY_MARGIN_S`` (the earlier hops of requests that started a little before it), and
joins those events again:

- finished requests go into their windows, unless their window was served before the restart
  (``served_through``, from ``DIR/windows.settled``, which the running collector rewrites each
  time a newer window gets its first part): the watcher would take a new part of such a window as
  requests it has not seen, so those are left out and counted (``served_before``);
- requests in flight at the restart stay open with their stored hops (their TTL counted from
  their newest event), so the hops sent after the restart complete them;
- their events' keys are remembered for deduplication, so a sender's retry of an event stored
  just before the kill is not stored twice.

What is replayed is not observed again on the Prometheus series (a restart resets the counters
and Prometheus takes the new values as increases: requests counted before the kill would be
counted twice), nor exported again (``--otlp-export``); the engine-load gauges do follow the
requests in flight. ``hopline_collector_restart_requests{state}``, ``_restart_events`` and
``_restart_seconds`` say what the rebuild did and what it cost; what it cannot give back is said
there too: ``partial`` counts the requests finished after the restart without some of the hops
they had before it (hops older than the replay's start, or never stored).

Not recovered: rows of windows served before the restart that were not folded yet (a late part
is folded every ``LATE_FOLD_INTERVAL_S``: the requests that finished in the last seconds before
the kill into an already served window), and a compacted hour (Parquet, ``compact_delay`` after
the hour ended) is not read back: a collector down longer than that across an hour boundary
rebuilds only what the open hour's NDJSON holds. ``DIR/windows.settled`` is written without
fsync: after a power loss it may be older than what was served.
"""

from __future__ import annotations

import math
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from hopline.collector.store import HOUR, NDJSON_NAME, hour_dir, parse_hour_dir
from hopline.middleware.contract import EMITTER_STATS_HOP
from hopline.middleware.log import logger

if TYPE_CHECKING:
    from hopline.collector.app import Collector

SETTLED_NAME = "windows.settled"
REPLAY_MARGIN_S = 120.0  # read back this much before the first window not served
SEEK_SLACK_S = 300.0  # how far out of ts order stored lines may be (the seek's margin)
SEEK_GRAIN = 64 * 1024  # bisect the file down to this many bytes
READ_CHUNK = 8 * 1024 * 1024  # bytes of NDJSON parsed at a time


@dataclass
class Rebuilt:
    """What the start-up rebuild did (``rebuild``)."""

    since: float = math.nan  # the events read back have ts from this on
    events: int = 0
    rebuilt: int = 0  # finished requests put back into windows not served before the restart
    rejoined: int = 0  # requests in flight at the restart, open again
    served_before: int = 0  # finished requests of windows served before the restart, left out
    seconds: float = 0.0


def read_settled(data_dir: Path) -> float | None:
    """The start of the newest window served before the restart, or None (no file, or unreadable)."""
    try:
        return float(orjson.loads((Path(data_dir) / SETTLED_NAME).read_bytes())["settled_through"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def settled_writer(data_dir: Path):
    """``WindowSummaries.on_settled``: rewrite ``DIR/windows.settled`` (a temporary file renamed over
    it, so a kill mid-write leaves the old one). A failure is one log line: the store, not this
    file, is what must be durable."""
    path = Path(data_dir) / SETTLED_NAME
    temporary = path.with_suffix(".tmp")

    def write(start: float) -> None:
        try:
            temporary.write_bytes(orjson.dumps({"settled_through": start}))
            os.replace(temporary, path)
        except OSError as exc:
            logger.warning("windows_settled_not_written", path=str(path), error=str(exc))

    return write


def _ts(line: bytes) -> float | None:
    try:
        return float(orjson.loads(line)["ts"])
    except (ValueError, KeyError, TypeError):
        return None


def _first_offset(f, size: int, ts: float) -> int:
    """An offset of ``f`` (a line start) before every line whose ts is ``ts`` or later, found by
    bisection on the lines' ts (the store appends in ingest order, about ts order)."""
    lo, hi = 0, size
    while hi - lo > SEEK_GRAIN:
        mid = (lo + hi) // 2
        f.seek(mid)
        f.readline()  # the rest of a line cut in the middle
        line = f.readline()
        at = _ts(line) if line.endswith(b"\n") else None
        if at is not None and at < ts:
            lo = mid
        else:
            hi = mid
    if lo:
        f.seek(lo)
        f.readline()
        return f.tell()
    return 0


def stored_since(root: Path, since: float):
    """The store's NDJSON lines (complete ones, in chunks of whole lines) of the hours that may hold
    events with ts ``since`` or later, each file from the bisected offset (some earlier lines come
    too: the caller keeps ts >= since)."""
    seek = since - SEEK_SLACK_S
    found = (parse_hour_dir(p) for p in Path(root).glob("date=*/hour=*"))
    hours = sorted(h for h in found if h is not None and h + HOUR > seek)
    for hour in hours:
        path = hour_dir(Path(root), hour) / NDJSON_NAME
        try:
            f = open(path, "rb")  # noqa: SIM115 - closed below, read in chunks
        except OSError:
            continue
        with f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):  # not the store's file (a device: /dev/full reads forever)
                continue
            size = info.st_size
            offset = _first_offset(f, size, seek)
            f.seek(offset)
            rest = b""
            # up to the size at open: what is appended later is not read (nothing is, before the
            # collector answers; a file that grows here is not the collector's own)
            while offset < size and (chunk := f.read(min(READ_CHUNK, size - offset))):
                offset += len(chunk)
                data = rest + chunk
                cut = data.rfind(b"\n") + 1
                if cut:
                    yield data[:cut]
                rest = data[cut:]
            # a torn last line (a kill mid-write, never acknowledged) is left out


class _Muted:
    """The recorder the join sees while the store is read back: finished and given-up requests are
    not observed again (their counts were exposed before the restart); the rest (scope caps, engine
    load) goes to the collector's recorder."""

    def __init__(self, recorder: Any) -> None:
        self._recorder = recorder

    def request(self, *args: Any, **kwargs: Any) -> None:
        pass

    def incomplete(self, *args: Any, **kwargs: Any) -> None:
        pass

    def closed_incomplete(self, *args: Any, **kwargs: Any) -> None:
        pass

    def partial(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._recorder, name)


def rebuild(c: Collector, now: float | None = None) -> Rebuilt:
    """Read the store back into the join and the windows (module doc); set the restart metrics."""
    started = time.perf_counter()
    now = time.time() if now is None else now
    config, joiner, windows = c.config, c.joiner, c.joiner.windows
    done = Rebuilt()
    settled = read_settled(config.data_dir)
    if windows is not None:
        first = windows.width * (int(settled // windows.width) + 1) if settled is not None else now - (
            windows.settle_s + 2 * windows.width
        )
        done.since = max(first, now - config.window_keep) - REPLAY_MARGIN_S
        if settled is not None:
            windows.served_through = int(settled // windows.width)
            windows.settled_through = settled
    else:
        done.since = now - REPLAY_MARGIN_S
    recorder, on_finish = joiner.recorder, joiner.on_finish
    joiner.recorder, joiner.on_finish = _Muted(recorder), None
    newest: dict[str, float] = {}
    try:
        for data in stored_since(c.store.root, done.since):
            parsed = c.ingestor.parse(data, "ndjson")
            keep = [i for i, ev in enumerate(parsed.events) if ev["ts"] >= done.since]
            if not keep:
                continue
            events = [parsed.events[i] for i in keep]
            sizes = [parsed.sizes[i] for i in keep]
            c.ingestor.dedup.update({parsed.keys[i] for i in keep})
            done.events += len(events)
            # emitters' health reports are no requests (and were exposed before the restart)
            joined = [ev for ev in events if ev["hop"] != EMITTER_STATS_HOP]
            if len(joined) != len(events):
                sizes = [s for ev, s in zip(events, sizes, strict=True) if ev["hop"] != EMITTER_STATS_HOP]
            joiner.add(joined, sizes)
            for ev in joined:
                rid = ev["request_id"]
                if ev["ts"] > newest.get(rid, -math.inf):
                    newest[rid] = ev["ts"]
        joiner.finish_all()  # complete before the restart: finished now, into their windows
        # the TTL of what is still open runs from its newest event, as it did before the restart
        clock_now = joiner.clock()
        by_age = sorted(joiner.open.items(), key=lambda item: newest.get(item[0], now))
        for rid, req in by_age:
            req.last_seen = clock_now - max(0.0, now - newest.get(rid, now))
            joiner.open.move_to_end(rid)
        while joiner.sweep(clock_now):  # those that had expired before the restart
            pass
    finally:
        joiner.recorder, joiner.on_finish = recorder, on_finish
        if windows is not None:
            windows.served_through = None
    done.rejoined = len(joiner.open)
    if windows is not None:
        for window in windows.windows.values():
            window.rebuilt = window.requests
            done.rebuilt += window.requests
        done.served_before = windows.served_again
        windows.on_settled = settled_writer(config.data_dir)
    done.seconds = time.perf_counter() - started
    m = recorder.m
    for state in ("rebuilt", "rejoined", "served_before"):
        m.restart_requests.labels(state=state).set(getattr(done, state))
    m.restart_events.set(done.events)
    m.restart_seconds.set(done.seconds)
    return done
