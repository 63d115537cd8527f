"""``hopline collector``: run the collector (FastAPI on uvicorn, a single process)."""

from __future__ import annotations

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
from hopline.middleware.cli import UsageError, run
from hopline.middleware.durations import parse_duration

EXAMPLE = """
Example:

    hopline collector --port 9400 --data-dir /var/lib/hopline --token "$HOPLINE_TOKEN" \\
        --model-config llama-3-8b=/models/llama-3-8b/config.json --retention 14d \\
        --tail '/var/log/hopline/events.ndjson*'

Then point services at it with HOPLINE_SINK=http://HOST:9400 (and HOPLINE_TOKEN), and Prometheus
at http://HOST:9400/metrics (with --enable-feature=exemplar-storage for request_id exemplars).
"""


def collector_config(
    data_dir: Path,
    *,
    token: str | None = None,
    model_config: Iterable[str] = (),
    retention: str = "14d",
    tail: Iterable[str] = (),
    fsync: str = "batch",
    fsync_interval: str = "1s",
    max_body: int = 8 * 1024 * 1024,
    grace: str = "2s",
    ttl: str = "15m",
    max_open: int = 100_000,
) -> CollectorConfig:
    """The ``CollectorConfig`` the command line describes (durations as text, ``--model-config`` specs);
    ``ValueError`` naming the option that was wrong."""
    return CollectorConfig(
        data_dir=data_dir,
        token=token or None,
        kv_bytes_per_token=dict(parse_model_config(spec) for spec in model_config),
        retention_s=parse_duration(retention),
        tail=tuple(tail),
        fsync=fsync,
        fsync_interval_s=parse_duration(fsync_interval),
        max_body_bytes=max_body,
        grace_s=parse_duration(grace),
        ttl_s=parse_duration(ttl),
        max_open_requests=max_open,
    )


def collector(
    data_dir: Annotated[
        Path, typer.Option("--data-dir", help="Where events are stored (DIR/events/date=…/hour=…).")
    ],
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 9400,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="HOPLINE_TOKEN", help="Bearer token POST /v1/events requires.", show_default=False
        ),
    ] = None,
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
    log_level: Annotated[str, typer.Option(help="uvicorn's log level.")] = "warning",
) -> None:
    """Run the collector: ingest hop events, join them, expose /metrics, store events durably."""
    try:
        config = collector_config(
            data_dir,
            token=token,
            model_config=model_config or (),
            retention=retention,
            tail=tail or (),
            fsync=fsync,
            fsync_interval=fsync_interval,
            max_body=max_body,
            grace=grace,
            ttl=ttl,
            max_open=max_open,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    uvicorn.run(
        create_app(config),
        host=host,
        port=port,
        workers=1,
        log_level=log_level,
        timeout_graceful_shutdown=10,
    )


def register(app: typer.Typer) -> None:
    """Add the ``collector`` command to the ``hopline`` command."""
    app.command(name="collector", help=(collector.__doc__ or "") + "\n\n" + EXAMPLE)(collector)


def main() -> None:
    """``python -m hopline.collector ...``: the same command on its own (same error style)."""
    app = typer.Typer(add_completion=False)
    register(app)
    sys.exit(run(app, prog_name="hopline collector"))
