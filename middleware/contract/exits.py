"""How every ``hopline`` command says what went wrong, shared by the parts that define commands.

``UsageError`` (and ``typer.BadParameter``): bad usage, exit status 2. ``ClickException``: a
failure, exit status 1. ``run`` runs a typer app and prints either as one line naming the
command and what was wrong (the ``hopline`` command and ``python -m hopline.collector`` alike).
Parts raise these themselves and never import the command assembler (``hopline.middleware.cli``).
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Sequence
from importlib.metadata import distributions
from pathlib import Path
from typing import Any

import typer

try:  # typer >= 0.29 runs on its own copy of click
    from typer._click.exceptions import ClickException, UsageError
except ImportError:  # older typer runs on click
    from click.exceptions import ClickException, UsageError

__all__ = ["ClickException", "UsageError", "install_hint", "run"]


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


def install_hint(
    extra: str, installed_from: dict[str, Any] | None = None, python: str = sys.executable
) -> str:
    """The command that adds ``extra`` to this Python's hopline, from where hopline came from:
    hopline is on no package index, so ``pip install 'hopline[analyzer]'`` would find nothing.

    ``installed_from``: pip's record of the install (PEP 610 ``direct_url.json``; default: read
    from the installed distribution): a clone (``-e`` when editable), a wheel or a repository URL.
    A source tree run without an install names the tree; otherwise the clone's path is a placeholder.
    """
    from urllib.parse import urlparse  # only on this path: not on every command's start
    from urllib.request import url2pathname

    info = _direct_url() if installed_from is None else installed_from
    pip = f"{shlex.quote(python)} -m pip install"
    url = str(info.get("url", ""))
    if url.startswith("file://"):
        where = shlex.quote(f"{url2pathname(urlparse(url).path)}[{extra}]")
        return f"{pip} -e {where}" if info.get("dir_info", {}).get("editable") else f"{pip} {where}"
    if url:
        vcs = info.get("vcs_info", {}).get("vcs")
        return (
            f"{pip} {shlex.quote(f'hopline[{extra}] @ {vcs}+{url}' if vcs else f'hopline[{extra}] @ {url}')}"
        )
    tree = Path(__file__).resolve().parents[2]  # middleware/contract/exits.py in a clone
    if installed_from is None and (tree / "pyproject.toml").is_file() and (tree / "middleware").is_dir():
        return f"{pip} {shlex.quote(f'{tree}[{extra}]')}"
    return f"{pip} '/path/to/hopline[{extra}]' (the clone, or a wheel built from it: see its README, Install)"


def _direct_url() -> dict[str, Any]:
    """pip's ``direct_url.json`` of the installed hopline ({} when none says where it came from)."""
    for dist in distributions(name="hopline"):  # a source tree's hopline.egg-info can come first
        text = dist.read_text("direct_url.json")
        if text:
            try:
                return json.loads(text)
            except ValueError:
                return {}
    return {}
