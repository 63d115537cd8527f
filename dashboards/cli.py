"""``hopline dashboards build``: write Grafana dashboards, provisioning, Prometheus config and rules."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

# imported here, not lazily: without the `dashboards` extra (grafana-foundation-sdk, pyyaml) this
# module fails to load and `hopline` lists the command with the extra to install
from . import kubernetes
from .build import write
from .provisioning import COLLECTOR_URL
from .rules import DEFAULT_THRESHOLDS, Thresholds

_DEFAULTS = DEFAULT_THRESHOLDS


def _vllm_targets(specs: list[str]) -> dict[str, str]:
    targets = {}
    for spec in specs:
        replica, sep, address = spec.partition("=")
        if not sep or not replica or not address:
            raise typer.BadParameter(
                f"{spec!r}: expected REPLICA=HOST:PORT, e.g. r1=10.0.0.5:8000", param_hint="--vllm"
            )
        targets[replica] = address
    return targets


def build(
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory to write into (created if missing).")],
    collector_url: Annotated[
        str,
        typer.Option(
            help="The collector's URL as the browser reaches it: exemplar request IDs link to "
            "COLLECTOR_URL/v1/requests/<id>."
        ),
    ] = COLLECTOR_URL,
    vllm: Annotated[
        list[str],
        typer.Option(
            help="A vLLM server for Prometheus to scrape, as REPLICA=HOST:PORT (repeatable); REPLICA is "
            "the name its hopline middleware reports (HOPLINE_REPLICA)."
        ),
    ] = [],  # noqa: B006 (typer)
    queue_factor: Annotated[
        float, typer.Option(help="Alert when queue time p50 is this many times what it was an hour ago.")
    ] = _DEFAULTS.queue_factor,
    queue_floor: Annotated[
        float, typer.Option(help="...and above this many seconds.")
    ] = _DEFAULTS.queue_floor_s,
    ttft_gap: Annotated[
        float,
        typer.Option(
            help="Alert when client TTFT p90 exceeds engine TTFT p90 by more than this many seconds."
        ),
    ] = _DEFAULTS.ttft_gap_s,
    error_ratio: Annotated[
        float, typer.Option(help="Alert when more than this share of requests does not end ok.")
    ] = _DEFAULTS.error_ratio,
    source: Annotated[
        Path | None,
        typer.Option(
            help="The hopline checkout docker compose builds the collector from (its Dockerfile); "
            "default: the checkout hopline runs from, else $HOPLINE_SOURCE at compose time."
        ),
    ] = None,
) -> None:
    """Write hopline's Grafana dashboards, Prometheus rules and a docker-compose stack to OUT.

    Example:

        hopline dashboards build --out ./hopline-grafana --vllm r1=10.0.0.5:8000 --ttft-gap 0.3
        cd hopline-grafana && docker compose up
    """
    thresholds = Thresholds(
        queue_factor=queue_factor, queue_floor_s=queue_floor, ttft_gap_s=ttft_gap, error_ratio=error_ratio
    )
    if source is not None and not (source / "Dockerfile").is_file():
        raise typer.BadParameter(f"{source} has no Dockerfile: give a hopline checkout", param_hint="--source")
    for path in write(
        out,
        collector_url=collector_url,
        vllm_targets=_vllm_targets(vllm),
        thresholds=thresholds,
        source=None if source is None else str(source.resolve()),
    ):
        typer.echo(path)


def kubernetes_manifests(
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Directory to write into (created if missing).")
    ] = Path("deploy/kubernetes/overlays/kube-prometheus-stack"),
    queue_factor: Annotated[float, typer.Option(help="As in `build`.")] = _DEFAULTS.queue_factor,
    queue_floor: Annotated[float, typer.Option(help="As in `build`.")] = _DEFAULTS.queue_floor_s,
    ttft_gap: Annotated[float, typer.Option(help="As in `build`.")] = _DEFAULTS.ttft_gap_s,
    error_ratio: Annotated[float, typer.Option(help="As in `build`.")] = _DEFAULTS.error_ratio,
) -> None:
    """Write the rules as a PrometheusRule and the dashboards as ConfigMaps for Grafana's sidecar
    (labelled grafana_dashboard: "1") to OUT, for kube-prometheus-stack.

    Example (from a checkout, rewriting the overlay's generated files):

        hopline dashboards kubernetes --out deploy/kubernetes/overlays/kube-prometheus-stack
    """
    thresholds = Thresholds(
        queue_factor=queue_factor, queue_floor_s=queue_floor, ttft_gap_s=ttft_gap, error_ratio=error_ratio
    )
    for path in kubernetes.write(out, thresholds):
        typer.echo(path)


def register(app: typer.Typer) -> None:
    group = typer.Typer(
        help="Grafana dashboards and Prometheus rules for hopline's metrics.", no_args_is_help=True
    )
    group.command("build", help=build.__doc__)(build)
    group.command("kubernetes", help=kubernetes_manifests.__doc__)(kubernetes_manifests)
    app.add_typer(group, name="dashboards")
