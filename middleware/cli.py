"""The ``hopline`` command: one Typer app assembled from each installed part's subcommands.

Every command has an entry point in the group ``hopline.cli`` (see pyproject.toml), named after
the command, pointing at a ``register(app)`` function, with the extra it needs in brackets:
``analyze = "hopline.analyzer.cli:register [analyzer]"``. On an install without that extra the
command still shows up and says which extra to install. Only a missing third-party package is
reported that way: an ImportError from inside hopline is a bug, and is shown as one.

One error style for every command: one line on standard error, ``hopline COMMAND: what was
wrong``; exit status 2 for bad usage (``UsageError``, ``typer.BadParameter``), 1 for a failure
(``ClickException``), 130 after Ctrl-C. Commands raise those exceptions (``exits.py``, beside this
module: the parts import it, never this one); ``run`` prints them.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points

import typer

from hopline.middleware.contract.install import install_hint
from hopline.middleware.exits import ClickException, run

__all__ = ["build", "main"]

HELP = """Where did this LLM request's time go? Hop timing for client, gateway and engine.

Example: [bold]hopline demo[/bold] (a simulated stack with an incident, analysed), then
[bold]hopline analyze /var/lib/hopline --html report.html[/bold] on your own events.
"""


@dataclass(frozen=True)
class Unavailable:
    """A command that cannot be loaded here, and the one line that says why."""

    command: str
    reason: str  # "needs polars, which is not installed: …/python -m pip install -e '/src/hopline[analyzer]'"
    bug: bool  # an ImportError from inside hopline, not a missing package


def unavailable(ep: EntryPoint, exc: ImportError) -> Unavailable:
    """Why ``ep`` failed to load: a missing third-party package (name the extra) or a bug."""
    missing = (exc.name or "").split(".")[0]
    if missing and missing != "hopline":
        install = install_hint(ep.extras[0]) if ep.extras else f"pip install {missing}"
        return Unavailable(ep.name, f"needs {missing}, which is not installed: {install}", bug=False)
    detail = " ".join(str(exc).split())
    reason = f"cannot be loaded (a bug in hopline): {type(exc).__name__}: {detail}"
    return Unavailable(ep.name, reason, bug=True)


def _add_unavailable(app: typer.Typer, gone: Unavailable) -> None:
    summary = "broken: a bug in hopline" if gone.bug else gone.reason.rpartition(": ")[2]
    # rich markup: "[" would start a style tag
    help_text = f"(unavailable: {summary})".replace("[", "\\[")

    @app.command(
        name=gone.command,
        help=help_text,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        add_help_option=False,
    )
    def _unavailable() -> None:
        raise ClickException(gone.reason)


def build(eps: Iterable[EntryPoint] | None = None) -> typer.Typer:
    """The ``hopline`` app with every command of ``eps`` (default: the installed ``hopline.cli`` group)."""
    app = typer.Typer(
        name="hopline",
        help=HELP,
        no_args_is_help=True,
        add_completion=False,
        rich_markup_mode="rich",
        context_settings={"help_option_names": ["-h", "--help"]},
    )

    def version(value: bool) -> None:
        if value:
            typer.echo(f"hopline {_version()}")
            raise typer.Exit()

    # a group even with one command (typer would make a lone command the whole program)
    @app.callback()
    def _root(
        show_version: bool = typer.Option(
            False, "--version", callback=version, is_eager=True, help="Print hopline's version and exit."
        ),
    ) -> None:
        pass

    for ep in sorted(entry_points(group="hopline.cli") if eps is None else eps, key=lambda e: e.name):
        try:
            register = ep.load()
        except ImportError as exc:
            _add_unavailable(app, unavailable(ep, exc))
            continue
        register(app)
    return app


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hopline")
    except PackageNotFoundError:
        return "unknown (not installed)"


def main() -> None:
    sys.exit(run(build(commands(sys.argv[1:]))))


def commands(argv: list[str]) -> list[EntryPoint]:
    """The entry points to load for ``argv``: the one it names (``hopline analyze …`` imports the
    analyzer, not the demo's OpenAI client and the collector's web stack: ~2 of its ~3 CPU-s of
    start-up), or all of them (top-level help, ``--version``, a name that is no command)."""
    every = list(entry_points(group="hopline.cli"))
    named = [ep for ep in every if argv and ep.name == argv[0]]
    return named or every


if __name__ == "__main__":
    main()
