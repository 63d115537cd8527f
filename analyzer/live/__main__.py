"""``python -m hopline.analyzer.live --follow DIR ...`` runs ``hopline watch`` (the demo starts it
this way: nothing but the ``hopline`` command imports the command assembler)."""

import typer
from hopline.analyzer.live.cli import HELP, watch_command

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
app.command(help=HELP)(watch_command)
app()
