"""``hopline demo``: a simulated serving stack with an incident, end to end, then hopline's analysis."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from hopline.analyzer.live.alertmanager import check_urls
from hopline.analyzer.live.cli import ENV_ALERTMANAGER, alertmanager_urls
from hopline.middleware.exits import UsageError
from hopline.demo.orchestrate import TRUSTED_LAG_MS, DemoRun
from hopline.middleware.exits import UsageError
from hopline.demo.scenarios import DEFAULT_SCENARIO, SCENARIOS, Scenario, alert_matches, matches
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
            help="Keep everything here: events, the simulator's logs, report.json, dashboards, logs "
            "(without it, a temporary folder is used and deleted)."
        ),
    ] = None,
    html: Annotated[Path | None, typer.Option(help="Write the HTML report to this file.")] = None,
    json: Annotated[bool, typer.Option("--json", help="Print only the findings JSON on stdout.")] = False,
    seed: Annotated[int | None, typer.Option(help="Seed the traffic and the engines' randomness.")] = None,
    alertmanager: Annotated[
        list[str] | None,
        typer.Option(
            help=f"Also send the live alerts to this Alertmanager (repeatable; else ${ENV_ALERTMANAGER}, "
            "comma-separated)."
        ),
    ] = None,
) -> None:
    """Run a simulated LLM serving stack with an incident, then show what hopline finds.

    Starts a collector, two simulated engine replicas, a TLS gateway and an OpenAI-SDK load generator.

    Everything runs on 127.0.0.1 in child processes that the demo always stops.

    Mid-run the scenario's incident is injected; as it starts, `hopline watch` on the stored events
    prints the alert Alertmanager receives (with --alertmanager URL it sends it there too); at the
    end the analyzer reads the stored events.

    Example:

        hopline demo --seconds 60 --scenario prefill-regression --html report.html
    """
    from hopline.demo.orchestrate import run_demo

    if scenario not in SCENARIOS:
        raise typer.BadParameter(
            f"unknown scenario {scenario!r}; choose from {', '.join(SCENARIOS)}", param_hint="--scenario"
        )
    try:  # refused as hopline watch refuses it, before anything starts
        urls = check_urls(alertmanager_urls(alertmanager))
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    chosen = SCENARIOS[scenario]
    console = Console(stderr=json)
    if seconds < chosen.min_seconds:
        console.print(
            f"[yellow]--seconds {seconds:g} is too short for {chosen.name}: its incident has too few requests "
            f"to be told apart from noise; use --seconds {chosen.min_seconds:g} or more[/yellow]"
        )
    try:
        run = run_demo(
            chosen,
            seconds=seconds,
            out=out,
            html=html,
            console=console,
            seed=seed,
            alertmanager=urls,
        )
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: every process the demo started has been stopped[/yellow]")
        raise typer.Exit(130) from None
    report = run.report
    if json:
        run_facts = {
            "scenario": chosen.name,
            "loop_lag_p99_ms": run.reported_lag_ms,
            "trusted": run.trusted,  # False: the machine was too busy for its timings (see closing_lines)
        }
        typer.echo(orjson.dumps({**report, "demo": run_facts}).decode())
    else:
        from hopline.demo.analysis import print_report

        print_report(run.analysis, console, run.folder)
        named = named_line(report.get("findings") or [], chosen, seconds)
        console.print(f"\ninjected: {chosen.injected}\n{named}")
    for line in closing_lines(run, html, chosen.expect):
        console.print(line, highlight=False)


def named_line(findings: list[dict[str, Any]], chosen: Scenario, seconds: float) -> str:
    """Whether the analysis named the injected incident: by its first finding, by a later one, or
    not at all (and then whether the run was shorter than the scenario needs)."""
    if findings and matches(findings[0], chosen.expect):
        return "[green]the first finding names it[/green]"
    later = next((i for i, f in enumerate(findings[1:], 2) if matches(f, chosen.expect)), None)
    if later is not None:
        return f"[yellow]finding {later} names it, not the first[/yellow]"
    short = (
        f": --seconds {seconds:g} is under the {chosen.min_seconds:g} s it needs"
        if seconds < chosen.min_seconds
        else ": rerun it longer (--seconds) or on a quieter machine"
    )
    if not findings:
        return f"[red]no finding: the analysis did not see it{short}[/red]"
    return f"[red]no finding names it{short}[/red]"


def closing_lines(run: DemoRun, html: Path | None, expect: dict[str, Any] | None = None) -> list[str]:
    """What to do next: what fired live (the alert of the injected incident, ``expect``: the
    scenario's), one request to look at, where the files are (or that they are gone), and whether
    the machine was too busy for the timings to be trusted."""
    lines = []
    if not run.trusted:
        lines.append(
            f"[yellow]warning: this machine was too busy to trust the timings: the load generator's event "
            f"loop ran up to {run.reported_lag_ms:,.1f} ms late (p99; over {TRUSTED_LAG_MS:g} ms). Rerun on a "
            "quieter machine.[/yellow]"
        )
    firing = [a for a in run.live_alerts if not a["alert"].get("endsAt")]
    injected = [a for a in firing if expect is not None and alert_matches(a["alert"], expect)]
    if injected:  # the page the injected incident raised, whatever fired before it
        first = injected[0]
        lines.append(
            f"live: {len(firing)} alert{'s' if len(firing) != 1 else ''} fired while it ran, the injected "
            f"incident's {first['seconds_since_onset']:.0f} s after its onset: "
            f"{first['alert']['annotations']['summary']}"
        )
    elif firing:
        # the page that matters: the first critical one that is a change (not a standing warning)
        first = min(
            firing,
            key=lambda a: (a["alert"]["labels"].get("severity") != "critical", a["alert"]["labels"].get("standing") == "true"),
        )
        said = "the first" if first is firing[0] else "the first critical one"
        none = ", none for the injected incident;" if expect is not None else ","
        lines.append(
            f"live: {len(firing)} alert{'s' if len(firing) != 1 else ''} fired while it ran{none} {said} "
            f"{first['seconds_since_onset']:.0f} s after its onset: {first['alert']['annotations']['summary']}"
        )
    else:
        lines.append("live: no alert fired while it ran")
    if run.folder is not None:
        lines.append(f"events, report.json, dashboards and logs: {run.folder} (hopline analyze {run.folder} gives this report)")
        if run.example_request:
            lines.append(f"one request of the incident, hop by hop: hopline timeline {run.example_request} {run.folder}")
    else:
        lines.append("the run's folder (events, logs) has been deleted; keep it with --out DIR")
        if run.example_request:
            lines.append(f"one request of the incident: {run.example_request} (with --out DIR: hopline timeline ID DIR)")
    if html is not None:
        lines.append(f"HTML report: {html}")
    return lines


def register(app: typer.Typer) -> None:
    app.command("demo", help=demo.__doc__)(demo)
