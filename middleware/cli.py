"""The ``hopline`` command: one Typer app assembled from each installed part's subcommands.

Every part registers a ``register(app)`` function under the entry-point group ``hopline.cli``
(see pyproject.toml); a part whose extra is not installed shows up as a command that says which
extra to install.
"""

from __future__ import annotations

from importlib.metadata import entry_points

import typer

app = typer.Typer(
    name="hopline",
    help="Where did this LLM request's time go? Hop timing for client, gateway and engine.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
)


def _missing(part: str, error: Exception) -> None:
    @app.command(name=part, help=f"(unavailable: pip install 'hopline\\[{part}]')")
    def _unavailable() -> None:
        typer.echo(f"hopline {part} needs extra dependencies ({error}); pip install 'hopline[{part}]'", err=True)
        raise typer.Exit(2)


def build() -> typer.Typer:
    for ep in sorted(entry_points(group="hopline.cli"), key=lambda e: e.name):
        try:
            register = ep.load()
        except ImportError as exc:
            _missing(ep.name, exc)
            continue
        register(app)
    return app


def main() -> None:
    build()()


if __name__ == "__main__":
    main()
