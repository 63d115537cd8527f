"""``hopline demo``: a simulated serving stack with an incident, end to end, then hopline's analysis."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import orjson
import typer
from hopline.demo.scenarios import DEFAULT_SCENARIO, SCENARIOS, matches
from rich.console import Console


def demo(
    seconds: Annotated[
        float, typer.Option(min=10, help="How long traffic runs (the incident comes past the middle).")
    ] = 90,
    scenario: Annotated[
        str, typer.Option(help=f"The incident to inject: {', '.join(SCENARIOS)}.")
    ] = DEFAULT_SCENARIO,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Keep everything here: events, engines' truth logs, report.json, dashboards, logs."
        ),
    ] = None,
    html: Annotated[Path | None, typer.Option(help="Write the HTML report to this file.")] = None,
    json: Annotated[bool, typer.Option("--json", help="Print only the findings JSON on stdout.")] = False,
    seed: Annotated[int | None, typer.Option(help="Seed the traffic and the engines' randomness.")] = None,
) -> None:
    """Run a simulated LLM serving stack with an incident, then show what hopline finds.

    Starts a collector, two simulated engine replicas, a TLS gateway and an OpenAI-SDK load generator.

    Everything runs on 127.0.0.1 in child processes that the demo always stops.

    Mid-run the scenario's incident is injected; at the end the analyzer reads the stored events.

    Example:

        hopline demo --seconds 60 --scenario prefill-regression --html report.html
    """
    from hopline.demo.orchestrate import run_demo

    if scenario not in SCENARIOS:
        raise typer.BadParameter(
            f"unknown scenario {scenario!r}; choose from {', '.join(SCENARIOS)}", param_hint="--scenario"
        )
    chosen = SCENARIOS[scenario]
    console = Console(stderr=json)
    try:
        report = run_demo(chosen, seconds=seconds, out=out, html=html, console=console, seed=seed)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: every process the demo started has been stopped[/yellow]")
        raise typer.Exit(130) from None
    if json:
        typer.echo(orjson.dumps(report).decode())
        return
    from hopline.demo.analysis import print_report

    print_report(report, console)
    findings = report.get("findings") or []
    named = bool(findings) and matches(findings[0], chosen.expect)
    console.print(
        f"\ninjected: {chosen.injected}\n"
        + (
            "[green]the first finding names it[/green]"
            if named
            else "[red]the first finding does not name it[/red]"
        )
    )
    if out is not None:
        console.print(f"events, report.json, dashboards and logs: {out}")
    if html is not None:
        console.print(f"HTML report: {html}")


def register(app: typer.Typer) -> None:
    app.command("demo", help=demo.__doc__)(demo)
