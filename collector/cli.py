"""``hopline collector``: run the collector (FastAPI on uvicorn, a single process)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from hopline.collector.config import FSYNC_POLICIES, CollectorConfig
from hopline.middleware.durations import parse_duration

EXAMPLE = """
Example:

    hopline collector --port 9400 --data-dir /var/lib/hopline --token "$HOPLINE_TOKEN" \\
        --model-config llama-3-8b=/models/llama-3-8b/config.json --retention 14d \\
        --tail '/var/log/hopline/events.ndjson*'

Then point services at it with HOPLINE_SINK=http://HOST:9400 (and HOPLINE_TOKEN), and Prometheus
at http://HOST:9400/metrics (with --enable-feature=exemplar-storage for request_id exemplars).
"""


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
    import uvicorn
    from hopline.collector.app import create_app
    from hopline.collector.kv_cache import parse_model_config
    from hopline.middleware.spans import parse_resource_map

    if fsync not in FSYNC_POLICIES:
        raise typer.BadParameter(f"use one of {', '.join(FSYNC_POLICIES)}", param_hint="--fsync")
    try:
        kv = dict(parse_model_config(spec) for spec in model_config or ())
        config = CollectorConfig(
            data_dir=data_dir,
            host=host,
            port=port,
            token=token or None,
            kv_bytes_per_token=kv,
            retention_s=parse_duration(retention),
            tail=tuple(tail or ()),
            fsync=fsync,
            fsync_interval_s=parse_duration(fsync_interval),
            max_body_bytes=max_body,
            grace_s=parse_duration(grace),
            ttl_s=parse_duration(ttl),
            max_open_requests=max_open,
            otlp_resource=dict(parse_resource_map(spec) for spec in otlp_resource or ()),
            otlp_export=otlp_export,
        )
    except ValueError as exc:
        typer.echo(f"hopline collector: {exc}", err=True)
        raise typer.Exit(2) from None
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
    """``python -m hopline.collector ...``: the same command on its own."""
    app = typer.Typer(add_completion=False)
    register(app)
    app()
