"""How every ``hopline`` command says what went wrong, beside the command assembler (``cli.py``)
and shared by the parts that define commands.

``UsageError`` (and ``typer.BadParameter``): bad usage, exit status 2. ``ClickException``: a
failure, exit status 1. ``run`` runs a typer app and prints either as one line naming the
command and what was wrong (the ``hopline`` command and ``python -m hopline.collector`` alike).
Parts raise these themselves and never import the command assembler (``hopline.middleware.cli``).
How to install a missing extra is ``contract.install``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import typer

try:  # typer >= 0.29 runs on its own copy of click
    from typer._click.exceptions import ClickException, UsageError
except ImportError:  # older typer runs on click
    from click.exceptions import ClickException, UsageError

__all__ = ["ClickException", "UsageError", "run"]


def _plain_flags(command: Any) -> None:
    """Flags (``--json``) show as plain flags in help, not as ``--json <bool>``."""
    for param in getattr(command, "params", ()):
        if getattr(param, "is_flag", False) and not getattr(param, "count", False):
            param.metavar = ""
    make_help = getattr(command, "get_help_option", None)
    if make_help is not None:  # the help option is made per context, not kept in params

        def plain_help(ctx: Any, make: Any = make_help) -> Any:
            option = make(ctx)
            if option is not None:
                option.metavar = ""
            return option

        command.get_help_option = plain_help
    for sub in getattr(command, "commands", {}).values():
        _plain_flags(sub)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def run(app: typer.Typer, argv: Sequence[str] | None = None, prog_name: str = "hopline") -> int:
    """Run ``app`` on ``argv`` (default ``sys.argv[1:]``); the exit status, errors printed in one line."""
    command = typer.main.get_command(app)
    _plain_flags(command)
    try:
        args = list(argv) if argv is not None else None
        code = command.main(args=args, prog_name=prog_name, standalone_mode=False)
    except UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # bare ``hopline``: the help, as usage
            exc.show()
            return 2
        where = exc.ctx.command_path if exc.ctx is not None else prog_name
        typer.echo(f"{where}: {_one_line(exc.format_message())}", err=True)
        return 2
    except ClickException as exc:  # carries no context: the command is read off the line
        typer.echo(f"{_command_path(argv, command, prog_name)}: {_one_line(exc.format_message())}", err=True)
        return exc.exit_code
    except typer.Abort:
        return 130
    return code if isinstance(code, int) else 0


def _command_path(argv: Sequence[str] | None, command: Any, prog_name: str) -> str:
    """``hopline analyze`` for a failure inside ``analyze`` (the subcommand names given on the line)."""
    words = [prog_name]
    group = command
    for arg in sys.argv[1:] if argv is None else argv:
        sub = getattr(group, "commands", {}).get(arg)
        if sub is None:
            break
        words.append(arg)
        group = sub
    return " ".join(words)
