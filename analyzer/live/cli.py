"""``hopline watch``: live detection on event time, alerts to Alertmanager, findings over HTTP."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer
from hopline.analyzer.io import ScanReport
from hopline.analyzer.live.alertmanager import AlertSender
from hopline.analyzer.live.detector import LiveConfig, LiveDetector
from hopline.analyzer.live.feed import Tail, replay
from hopline.analyzer.live.watch import STATE_NAME, SentState, Watch
from hopline.analyzer.live.windowed import CollectorFeed, WindowDetector
from hopline.analyzer.windows import WindowsError
from hopline.middleware.contract.rules import scope_sources
from hopline.middleware.contract.units import parse_duration
from hopline.middleware.exits import ClickException, UsageError
from hopline.middleware.http_limits import ConnectionLimits, listening_socket

HELP = """Watch hop events as they come and raise the findings of `hopline analyze` while they happen.

Replay a recorded log as fast as it goes (event time, never the wall clock):
[bold]hopline watch --replay /var/log/hopline/ --window 10s[/bold]

Follow the collector's store (or a file sink's NDJSON) and alert through Alertmanager:
[bold]hopline watch --follow /var/lib/hopline --alertmanager http://alertmanager:9093 --listen 0.0.0.0:9800 --read-token "$HOPLINE_READ_TOKEN"[/bold]

At hundreds of requests/s and more, analyse a fixed sixteenth of the requests (chosen by request ID):
[bold]hopline watch --follow /var/lib/hopline --sample 0.0625 --horizon 10m[/bold]

Across collectors on several machines, read their window summaries over HTTP (the cost follows windows x scope values, not requests):
[bold]hopline watch --collector http://c1:9400 --collector http://c2:9400 --collector-token "$HOPLINE_COLLECTOR_READ_TOKEN" --alertmanager http://alertmanager:9093[/bold]

Each alert is printed as Alertmanager receives it, with the event-time seconds since its onset:
[2026-01-05T10:06:40Z +40s since onset] FIRING HoplineShift{severity=critical, direction=up, stage=queue, replica=r2, model=llama-3.1-8b}: queue time tripled at 10:06 on replica r2 (p50 39 → 126 ms); ...
"""
ENV_ALERTMANAGER = "HOPLINE_ALERTMANAGER_URL"
# A detection step runs Python between its polars calls; the server's thread waits for the GIL at
# each of the few hand-overs a request needs, and CPython hands it over only every switch interval
# (5 ms by default). 0.5 ms, as the collector's (collector/app.py), keeps /v1/findings prompt.
SWITCH_INTERVAL_S = 0.0005


def alertmanager_urls(given: list[str] | None) -> list[str]:
    """``--alertmanager`` (repeatable), else ``HOPLINE_ALERTMANAGER_URL`` (comma-separated)."""
    raw = given or [u for u in os.environ.get(ENV_ALERTMANAGER, "").split(",")]
    return [u.strip() for u in raw if u.strip()]


def state_path(given: str | None, follow: list[Path] | None) -> Path | None:
    """``--state FILE`` ('' : none); not given: for --follow DIR, ``DIR/.hopline-watch-state.json``
    when DIR is a writable folder, else none (a replay remembers nothing unless told)."""
    if given is not None:
        return Path(given) if given else None
    if follow and follow[0].is_dir() and os.access(follow[0], os.W_OK):
        return follow[0] / STATE_NAME
    return None


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--listen wants HOST:PORT, e.g. 127.0.0.1:9800, got {text!r}")
    return host.strip("[]") or "127.0.0.1", int(port)  # no host: loopback, never every interface


@contextlib.contextmanager
def serving(
    watch: Watch, listen: str | None, read_token: str | None = None, limits: ConnectionLimits | None = None
) -> Iterator[None]:
    """``GET /v1/findings`` and ``/metrics`` on ``listen`` in a thread, while the block runs, with
    ``limits`` on its connections (``middleware/http_limits.py``; default: its defaults)."""
    if listen is None:
        yield
        return
    import uvicorn
    from hopline.analyzer.live.server import FindingsApp

    host, port = parse_listen(listen)
    sock = listening_socket(host, port)  # a port in use: one line, exit 1, before anything runs
    limits = limits or ConnectionLimits()
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(min(switch_interval, SWITCH_INTERVAL_S))
    app = FindingsApp(watch, read_token, limits)
    server = uvicorn.Server(
        uvicorn.Config(app, host=host, port=port, http=limits.protocol(), log_level="warning")
    )
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="hopline-watch-http", daemon=True
    )
    thread.start()
    try:
        yield
    finally:
        server.should_exit = True
        thread.join(timeout=5)
        sock.close()
        sys.setswitchinterval(switch_interval)


def printer():
    def out(line: str) -> None:
        print(line, flush=True)

    return out


def run_replay(watch: Watch, paths: list[Path], every_s: float) -> ScanReport:
    report = ScanReport()
    for batch in replay(paths, every_s, report):
        watch.detector.feed(batch)
    watch.detector.flush()
    return report


def run_follow(watch: Watch, paths: list[Path], poll_s: float, until_quiet_s: float | None = None) -> None:
    """Feed what the files grow by; with ``until_quiet_s``, stop once nothing new came for that
    long (wall clock, counted from the first event) and finish the stream (``LiveDetector.drain``)."""
    tail = Tail(paths, sample=watch.detector.config.sample)
    last_news: float | None = None
    while True:
        batch = tail.poll()
        watch.detector.events_not_sampled += tail.not_sampled
        watch.follow_failures = tail.failures
        tail.not_sampled = 0
        if batch.height:
            watch.detector.feed(batch)
            last_news = time.monotonic()
        elif until_quiet_s is not None and last_news is not None and time.monotonic() - last_news >= until_quiet_s:
            watch.detector.drain()
            return
        else:
            time.sleep(poll_s)


def collector_urls(given: list[str] | None) -> list[str]:
    """``--collector`` (repeatable, each may be comma-separated): base URLs, http(s) only."""
    urls = [u.strip() for g in given or [] for u in g.split(",") if u.strip()]
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--collector wants a collector's base URL, e.g. http://c1:9400, got {url!r}")
    return urls


def run_collectors(watch: Watch, poll_s: float, until_quiet_s: float | None = None) -> None:
    """Poll the collectors' windows and step on what they served; with ``until_quiet_s``, stop
    once no new window part came for that long (wall clock, counted from the first) and finish
    (``WindowDetector.drain``)."""
    detector = watch.detector
    last_news: float | None = None
    while True:
        before = detector.feed.series.requests
        detector.poll()
        if detector.feed.series.requests != before:
            last_news = time.monotonic()
        elif until_quiet_s is not None and last_news is not None and time.monotonic() - last_news >= until_quiet_s:
            detector.drain()
            return
        time.sleep(poll_s)


State = Annotated[
    str | None,
    typer.Option(
        help="Remember what was sent to Alertmanager in this JSON file, so that a restarted watch, "
        "replaying the store, never pages again for an incident it already sent resolved ('' : "
        f"none; default: none for --replay, --follow DIR's DIR/{STATE_NAME} when DIR is writable).",
    ),
]
UntilQuiet = Annotated[
    str | None,
    typer.Option(
        help="--follow, --collector: stop once nothing new came for this long, and finish as a replay does "
        "(time runs on without events; what fires resolves once its scope stays quiet)."
    ),
]
Hold = Annotated[
    str | None,
    typer.Option(help="A finding must be found this long before it fires (Prometheus' for:; default 2 windows)."),
]
Settle = Annotated[
    str, typer.Option(help="Wait this long (event time) after a request's final hop for its stragglers.")
]
Lateness = Annotated[
    str, typer.Option(help="Event time trails the newest event by this much (late events, skewed clocks).")
]
MaxConnections = Annotated[
    int,
    typer.Option(
        min=1,
        help="--listen: most connections open at once (one beyond is closed as it opens); lowered to "
        "leave 256 descriptors of the open-files limit (ulimit -n) to the follower's files.",
    ),
]
HeaderTimeout = Annotated[
    str,
    typer.Option(
        help="--listen: close a connection whose request line and headers are not complete this long "
        "after it opened (or after the first byte of its next request)."
    ),
]
Future = Annotated[
    str,
    typer.Option(
        help="--follow: drop (and count) events dated more than this ahead of this host's clock, so "
        "that no sender's wrong clock moves event time, and send Alertmanager no time later than the "
        "clock plus this (--replay has no wall clock: neither applies)."
    ),
]


def live_config(
    by: str,
    window: str,
    horizon: str,
    recent: str,
    settle: str,
    lateness: str,
    hold: str | None,
    sample: float = 1.0,
    future: str | None = None,
) -> LiveConfig:
    """The detector's settings from the options (ValueError: which one is wrong); ``future``:
    --follow's bound on events ahead of the wall clock (None: a replay)."""
    dims = tuple(d.strip() for d in by.split(",") if d.strip())
    scope_sources(dims)
    return LiveConfig(
        window_s=parse_duration(window),
        horizon_s=parse_duration(horizon),
        recent_s=parse_duration(recent),
        settle_s=parse_duration(settle),
        lateness_s=parse_duration(lateness),
        hold_s=parse_duration(hold) if hold is not None else None,
        scopes=dims,
        sample=sample,
        future_s=parse_duration(future) if future is not None else None,
    )


def watch_command(
    replay_paths: Annotated[
        list[Path] | None,
        typer.Option(
            "--replay",
            help="Replay these event files or folders (NDJSON, Parquet, the store) as fast as possible.",
        ),
    ] = None,
    follow: Annotated[
        list[Path] | None,
        typer.Option(
            help="Follow NDJSON as it grows: the collector's store folder (--data-dir) or a file sink's files."
        ),
    ] = None,
    collector: Annotated[
        list[str] | None,
        typer.Option(
            help="Read these collectors' window summaries (GET /v1/windows) over HTTP and detect on them "
            "(repeatable, or comma-separated): one watcher for every shard; --window must be theirs.",
        ),
    ] = None,
    collector_token: Annotated[
        str | None,
        typer.Option(
            envvar="HOPLINE_COLLECTOR_READ_TOKEN",
            help="--collector: send 'Authorization: Bearer <token>' (the collectors' --read-token).",
        ),
    ] = None,
    alertmanager: Annotated[
        list[str] | None,
        typer.Option(help=f"Alertmanager base URL (repeatable; else ${ENV_ALERTMANAGER}, comma-separated)."),
    ] = None,
    listen: Annotated[
        str | None,
        typer.Option(help="Serve GET /v1/findings?since=… and /metrics on HOST:PORT (PORT alone: loopback)."),
    ] = None,
    read_token: Annotated[
        str | None,
        typer.Option(
            envvar="HOPLINE_READ_TOKEN",
            help="--listen's endpoints need 'Authorization: Bearer <token>' (findings name requests, "
            "scopes and the store's path): set it whenever HOST is not loopback.",
        ),
    ] = None,
    window: Annotated[
        str, typer.Option(help="Analysis window; a step runs every window of event time.")
    ] = "10s",
    horizon: Annotated[str, typer.Option(help="Finished requests kept for the analysis (by start).")] = "30m",
    recent: Annotated[
        str, typer.Option(help="Only a finding whose onset is this recent opens an incident.")
    ] = "5m",
    by: Annotated[
        str, typer.Option(help="Scopes searched, as hopline analyze --by.")
    ] = "replica,model,service",
    resend: Annotated[
        str, typer.Option(help="Re-send firing alerts this often (below Alertmanager's resolve_timeout).")
    ] = "1m",
    poll: Annotated[str, typer.Option(help="--follow: how often to look for new lines; --collector: to ask for new windows.")] = "1s",
    until_quiet: UntilQuiet = None,
    state: State = None,
    hold: Hold = None,
    settle: Settle = "5s",
    lateness: Lateness = "5s",
    future: Future = "1m",
    max_connections: MaxConnections = 100,
    header_timeout: HeaderTimeout = "10s",
    json_out: Annotated[
        bool, typer.Option("--json", help="Print each alert as the JSON Alertmanager receives.")
    ] = False,
    sample: Annotated[
        float,
        typer.Option(
            help="Analyse this fraction of the requests (the same ones on every watcher, by request ID): "
            "for hundreds of requests/s and more; a finding's counts are then the sample's."
        ),
    ] = 1.0,
) -> None:
    if sum(map(bool, (replay_paths, follow, collector))) != 1:
        raise UsageError("give --replay PATH or --follow PATH or --collector URL (one of them)")
    try:
        urls_in = collector_urls(collector)
        if urls_in and sample != 1.0:
            raise ValueError("--sample is for --replay and --follow: --collector reads every request's windows")
        bound = future if follow else None  # a replay has no wall clock
        cfg = live_config(by, window, horizon, recent, settle, lateness, hold, sample, bound)
        urls = alertmanager_urls(alertmanager)
        sender = AlertSender(urls, resend_s=parse_duration(resend), ahead_s=cfg.future_s) if urls else None
        poll_s = parse_duration(poll)
        quiet_s = parse_duration(until_quiet) if until_quiet is not None else None
        if listen is not None:
            parse_listen(listen)
        limits = ConnectionLimits(max_connections, parse_duration(header_timeout))
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    paths = list(replay_paths or follow or [])
    if urls_in:
        feed = CollectorFeed(urls_in, token=collector_token, warn=lambda line: print(line, file=sys.stderr, flush=True))
        detector = WindowDetector(feed, cfg)
        watch = Watch(detector, sender=sender, out=printer(), store=None, json_out=json_out)  # type: ignore[arg-type]
    else:
        watch = Watch(LiveDetector(cfg), sender=sender, out=printer(), store=str(paths[0]), json_out=json_out)
    watch.state = SentState.load(state_path(state, follow))
    if sender is not None:
        sender.start()
    undelivered = 0
    try:
        with serving(watch, listen, read_token, limits):
            if replay_paths:
                report = run_replay(watch, paths, cfg.every_s)
                if not report.events:
                    raise ClickException(f"no hop events in {', '.join(map(str, paths))}")
                summary(watch, report)
            elif urls_in:
                run_collectors(watch, poll_s, quiet_s)
            else:
                run_follow(watch, paths, poll_s, quiet_s)
    except FileNotFoundError as exc:
        raise UsageError(str(exc)) from exc
    except WindowsError as exc:
        raise ClickException(str(exc)) from exc
    except KeyboardInterrupt:
        pass
    finally:
        if sender is not None:
            sender.close()
            undelivered = watch.finish()
    if urls_in:
        detector.feed.close()
    if undelivered and (replay_paths or quiet_s is not None):  # it finished by itself: say it failed
        raise ClickException(
            f"{undelivered} alert{'s' if undelivered != 1 else ''} reached no Alertmanager "
            f"({', '.join(sender.stats.last_error) if sender else ''}): see above"
        )


def summary(watch: Watch, report: ScanReport) -> None:
    d = watch.detector
    fired = len(d.incidents())
    print(
        f"replayed {report.events:,} events: {d.finished_requests:,} requests, {d.steps:,} steps, "
        f"{fired} incident{'s' if fired != 1 else ''}",
        file=sys.stderr,
    )


def register(app: typer.Typer) -> None:
    """Add ``hopline watch`` to the ``hopline`` command."""
    app.command(name="watch", help=HELP)(watch_command)
