"""``hopline collector``: run the collector (FastAPI on uvicorn, a single process)."""

from __future__ import annotations

import errno
import os
import socket
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated

import typer

# imported here, not lazily: without the `collector` extra (fastapi, uvicorn, prometheus_client)
# this module fails to load and `hopline` lists the command with the extra to install
import uvicorn
from hopline.collector.app import create_app
from hopline.collector.config import CollectorConfig
from hopline.collector.kv_cache import parse_model_config
from hopline.middleware.contract.exits import ClickException, UsageError, run
from hopline.middleware.contract.durations import parse_duration
from hopline.middleware.contract.spans import parse_resource_map

EXAMPLE = """
Example:

    hopline collector --port 9400 --data-dir /var/lib/hopline --token "$HOPLINE_TOKEN" \\
        --read-token "$HOPLINE_READ_TOKEN" \\
        --model-config llama-3-8b=/models/llama-3-8b/config.json --retention 14d \\
        --tail '/var/log/hopline/events.ndjson*'

Then point services at it with HOPLINE_SINK=http://HOST:9400 (and HOPLINE_TOKEN), and Prometheus
at http://HOST:9400/metrics (with --enable-feature=exemplar-storage for request_id exemplars, and the
read token, or the token, as its bearer credentials).
"""


def collector_config(
    data_dir: Path,
    *,
    token: str | None = None,
    read_token: str | None = None,
    open_reads: bool = False,
    model_config: Iterable[str] = (),
    retention: str = "14d",
    tail: Iterable[str] = (),
    fsync: str = "batch",
    fsync_interval: str = "1s",
    max_body: int = 8 * 1024 * 1024,
    grace: str = "2s",
    ttl: str = "15m",
    max_open: int = 100_000,
    max_open_bytes: int = 256 * 1024 * 1024,
    finished_cache: int = 10_000,
    recent_requests: int = 100_000,
    dedup_capacity: int = 500_000,
    dedup_window: str = "10m",
    otlp_resource: Iterable[str] = (),
    otlp_export: str | None = None,
) -> CollectorConfig:
    """The ``CollectorConfig`` the command line describes (durations as text, ``--model-config`` specs);
    ``ValueError`` naming the option that was wrong."""
    return CollectorConfig(
        data_dir=data_dir,
        token=token,
        read_token=read_token,
        open_reads=open_reads,
        kv_bytes_per_token=dict(parse_model_config(spec) for spec in model_config),
        retention_s=parse_duration(retention),
        tail=tuple(tail),
        fsync=fsync,
        fsync_interval_s=parse_duration(fsync_interval),
        max_body_bytes=max_body,
        grace_s=parse_duration(grace),
        ttl_s=parse_duration(ttl),
        max_open_requests=max_open,
        max_open_bytes=max_open_bytes,
        completed_cache=finished_cache,
        recent_requests=recent_requests,
        dedup_capacity=dedup_capacity,
        dedup_window_s=parse_duration(dedup_window),
        otlp_resource=dict(parse_resource_map(spec) for spec in otlp_resource),
        otlp_export=otlp_export,
    )


def check_can_start(config: CollectorConfig, host: str, port: int) -> socket.socket:
    """Bind the port and make sure the data directory is usable, before anything says "started":
    ``ClickException`` (exit 1) naming what is wrong. Returns the listening socket."""
    try:
        config.data_dir.mkdir(parents=True, exist_ok=True)
        probe = config.data_dir / ".hopline-write-check"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        raise ClickException(f"cannot use --data-dir {config.data_dir}: {exc.strerror or exc}") from exc
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        why = "it is in use" if exc.errno == errno.EADDRINUSE else exc.strerror or str(exc)
        raise ClickException(f"cannot listen on {host}:{port}: {why}") from exc
    sock.set_inheritable(True)
    return sock


def collector(
    data_dir: Annotated[
        Path, typer.Option("--data-dir", help="Where events are stored (DIR/events/date=…/hour=…).")
    ],
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to listen on (0: any free port).")] = 9400,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="HOPLINE_TOKEN",
            help="Bearer token POST /v1/events requires (GET /metrics and /v1/requests too, unless "
            "--read-token or --open-reads). An empty one is refused.",
            show_default=False,
        ),
    ] = None,
    read_token: Annotated[
        str | None,
        typer.Option(
            envvar="HOPLINE_READ_TOKEN",
            help="Bearer token GET /metrics and /v1/requests accept (besides --token, which they "
            "require when set). /healthz stays open.",
            show_default=False,
        ),
    ] = None,
    open_reads: Annotated[
        bool, typer.Option(help="Leave /metrics and /v1/requests open even with --token.")
    ] = False,
    model_config: Annotated[
        list[str] | None,
        typer.Option(
            "--model-config",
            help="NAME=PATH (a Hugging Face config.json) or NAME=layers,kv_heads,head_dim,kv_dtype, for the "
            "KV-cache gauge. Repeatable.",
        ),
    ] = None,
    retention: Annotated[
        str, typer.Option(help="Delete stored hours older than this (e.g. 36h, 14d).")
    ] = "14d",
    tail: Annotated[
        list[str] | None,
        typer.Option(
            help="Follow NDJSON files written by the file sink, e.g. '/var/log/hopline/events.ndjson*'. Repeatable."
        ),
    ] = None,
    fsync: Annotated[
        str,
        typer.Option(
            help="batch: fsync every batch before acknowledging it; interval: write before acknowledging, "
            "fsync every --fsync-interval; none: write only."
        ),
    ] = "batch",
    fsync_interval: Annotated[str, typer.Option(help="fsync period of --fsync interval.")] = "1s",
    max_body: Annotated[int, typer.Option(help="Largest request body accepted, in bytes (413 above).")] = 8
    * 1024
    * 1024,
    grace: Annotated[
        str, typer.Option(help="Wait this long for late hops once a request's final hops arrived.")
    ] = "2s",
    ttl: Annotated[
        str, typer.Option(help="An unfinished request expires this long after its last event.")
    ] = "15m",
    max_open: Annotated[
        int, typer.Option(help="Most requests joined at once (the least recently active is evicted).")
    ] = 100_000,
    max_open_bytes: Annotated[
        int, typer.Option(help="Most estimated bytes of events held by open requests (oldest evicted).")
    ] = 256 * 1024 * 1024,
    finished_cache: Annotated[
        int, typer.Option(help="Finished requests kept for GET /v1/requests/{id}.")
    ] = 10_000,
    recent_requests: Annotated[
        int,
        typer.Option(
            min=1,
            help="Finished requests kept in brief (~350 bytes each) for GET /v1/requests?since=…&slowest=N.",
        ),
    ] = 100_000,
    dedup_capacity: Annotated[
        int, typer.Option(help="Event keys per dedup generation (two are kept): retries within it are dropped.")
    ] = 500_000,
    dedup_window: Annotated[str, typer.Option(help="A dedup generation older than this is forgotten.")] = "10m",
    otlp_resource: Annotated[
        list[str] | None,
        typer.Option(
            "--otlp-resource",
            help="FIELD=ATTR[,ATTR…]: read service, replica or model of OTLP spans from these resource "
            "attributes, e.g. replica=k8s.pod.name. Repeatable.",
        ),
    ] = None,
    otlp_export: Annotated[
        str | None,
        typer.Option(
            "--otlp-export",
            help="Send each finished request as a trace (root + one span per stage) to this OTLP/HTTP "
            "traces URL, e.g. http://tempo:4318/v1/traces.",
            show_default=False,
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn's log level.")] = "warning",
) -> None:
    """Run the collector: ingest hop events, join them, expose /metrics, store events durably."""
    # an empty environment variable reaches us as "no option": refuse it rather than run without auth
    for var, value in (("HOPLINE_TOKEN", token), ("HOPLINE_READ_TOKEN", read_token)):
        if value is None and var in os.environ and not os.environ[var].strip():
            raise UsageError(f"{var} is set but empty: give a real token, or unset it")
    try:
        config = collector_config(
            data_dir,
            token=token,
            read_token=read_token,
            open_reads=open_reads,
            model_config=model_config or (),
            retention=retention,
            tail=tail or (),
            fsync=fsync,
            fsync_interval=fsync_interval,
            max_body=max_body,
            grace=grace,
            ttl=ttl,
            max_open=max_open,
            max_open_bytes=max_open_bytes,
            finished_cache=finished_cache,
            recent_requests=recent_requests,
            dedup_capacity=dedup_capacity,
            dedup_window=dedup_window,
            otlp_resource=otlp_resource or (),
            otlp_export=otlp_export,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    sock = check_can_start(config, host, port)
    server = uvicorn.Server(
        uvicorn.Config(create_app(config), log_level=log_level, timeout_graceful_shutdown=10)
    )
    server.run(sockets=[sock])


def register(app: typer.Typer) -> None:
    """Add the ``collector`` command to the ``hopline`` command."""
    app.command(name="collector", help=(collector.__doc__ or "") + "\n\n" + EXAMPLE)(collector)


def main() -> None:
    """``python -m hopline.collector ...``: the same command on its own (same error style)."""
    app = typer.Typer(add_completion=False)
    register(app)
    sys.exit(run(app, prog_name="hopline collector"))
