"""``hopline collector``: run the collector (FastAPI on uvicorn, a single process).

The command's options are made from the settings declared in ``config.py`` (one declaration per
setting: option, environment variable, config-file key, default, validation, help); nothing here
names a setting.
"""

from __future__ import annotations

import inspect
import os
import socket
import sys
import tomllib
from dataclasses import MISSING, Field
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperCommand

# imported here, not lazily: without the `collector` extra (fastapi, uvicorn, prometheus_client)
# this module fails to load and `hopline` lists the command with the extra to install
import uvicorn
from hopline.collector.app import connection_limits, create_app
from hopline.collector.config import CollectorConfig, Setting, settings
from hopline.middleware.exits import ClickException, UsageError, run
from hopline.middleware.http_limits import listening_socket

# "\b": click prints the next paragraph as written (each line fits in 80 columns)
EXAMPLE = """
Example:

\b
    hopline collector --port 9400 --data-dir /var/lib/hopline \\
        --token "$HOPLINE_TOKEN" --read-token "$HOPLINE_READ_TOKEN" \\
        --model-config llama-3-8b=/models/llama-3-8b/config.json \\
        --retention 14d --tail '/var/log/hopline/events.ndjson*'

Then point services at it with HOPLINE_SINK=http://HOST:9400 (and HOPLINE_TOKEN), and Prometheus
at http://HOST:9400/metrics (with --enable-feature=exemplar-storage for request_id exemplars, and the
read token, or the token, as its bearer credentials). Every option can also be set by its
environment variable or in a --config file.
"""


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
    return listening_socket(host, port)


KEYWORD = inspect.Parameter.KEYWORD_ONLY


def _option(f: Field, s: Setting) -> inspect.Parameter:
    """The typer option of one declared setting: its flag, environment variable, help and default
    (the default as a user writes it: ``from_options`` parses every value the same way)."""
    option = typer.Option(
        s.option,
        envvar=s.env,
        show_envvar=True,
        help=s.help + (f" One of: {', '.join(s.choices)}." if s.choices else ""),
        show_default=s.show is not None,
        metavar=s.value_name or None,
        min=s.min,
        max=s.max,
    )
    if s.kind is bool:  # a flag
        return inspect.Parameter(f.name, KEYWORD, annotation=Annotated[bool, option], default=f.default)
    if f.default is MISSING and f.default_factory is MISSING:
        return inspect.Parameter(f.name, KEYWORD, annotation=Annotated[s.kind, option])  # required
    kind = list[s.kind] if s.repeat else s.kind
    default = None if s.show is None else s.kind(s.show)
    return inspect.Parameter(f.name, KEYWORD, annotation=Annotated[kind | None, option], default=default)


def _config_file(ctx: typer.Context, path: Path | None) -> Path | None:
    """``--config FILE``: a TOML file of settings (keys: the options without dashes) becomes the
    command's defaults, below the command line and the environment."""
    if path is None:
        return None
    try:
        table = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise typer.BadParameter(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    names = {s.key: f.name for f, s in settings()}
    unknown = sorted(set(table) - set(names))
    if unknown:
        raise typer.BadParameter(f"{path}: unknown setting {unknown[0]!r} (the keys are {', '.join(names)})")
    ctx.default_map = {**(ctx.default_map or {}), **{names[key]: value for key, value in table.items()}}
    return path


CONFIG_OPTION = inspect.Parameter(
    "config_file",
    inspect.Parameter.KEYWORD_ONLY,
    annotation=Annotated[
        Path | None,
        typer.Option(
            "--config",
            envvar="HOPLINE_CONFIG",
            show_envvar=True,
            is_eager=True,
            callback=_config_file,
            help="A TOML file of settings, keyed by option name without dashes (grace = \"5s\"); the "
            "command line and the environment override it.",
        ),
    ],
    default=None,
)


def _refuse_empty_environment(ctx: typer.Context) -> None:
    """An empty environment variable reaches click as "not given": refuse it (HOPLINE_TOKEN= must
    not run the collector without auth)."""
    for f, s in settings():
        source = ctx.get_parameter_source(f.name)
        given = source is not None and source.name == "COMMANDLINE"
        if not given and s.env in os.environ and not os.environ[s.env].strip():
            raise UsageError(f"{s.env} is set but empty: give a value, or unset it")


def collector(ctx: typer.Context, **given: Any) -> None:
    """Run the collector: ingest hop events, join them, expose /metrics, store events durably."""
    _refuse_empty_environment(ctx)
    given.pop("config_file", None)
    try:
        config = CollectorConfig.from_options(given)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    sock = check_can_start(config, config.host, config.port)
    app = create_app(config)
    limits = connection_limits(app.state.collector)
    server = uvicorn.Server(
        uvicorn.Config(app, http=limits.protocol(), log_level=config.log_level, timeout_graceful_shutdown=10)
    )
    server.run(sockets=[sock])


# the command's options, derived from the declarations (typer reads the signature)
collector.__signature__ = inspect.Signature(
    [
        inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context),
        *(_option(f, s) for f, s in settings()),
        CONFIG_OPTION,
    ]
)


class PlainHelp(TyperCommand):
    """click's own help layout for this command: rich's option table cuts long words ("HOPLINE_READ_TOK…")
    and wraps the example mid-line at 80 or 100 columns; click wraps words whole."""

    def format_help(self, ctx: typer.Context, formatter: Any) -> None:
        super(TyperCommand, self).format_help(ctx, formatter)


def register(app: typer.Typer) -> None:
    """Add the ``collector`` command to the ``hopline`` command."""
    app.command(name="collector", cls=PlainHelp, help=(collector.__doc__ or "") + "\n\n" + EXAMPLE)(collector)


def main() -> None:
    """``python -m hopline.collector ...``: the same command on its own (same error style)."""
    app = typer.Typer(add_completion=False)
    register(app)
    sys.exit(run(app, prog_name="hopline collector"))
