"""What every `zoo` command module shares: the Typer app, the consoles, common options and
output helpers. `zoo.cli` and `zoo.cli_bench` both register commands on `app`; neither
imports the other's commands."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table


app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="A plugin-based model zoo: train, export, verify, serve and benchmark models.")
# Piped output (CI logs, files) gets wide tables rather than rich's 80-column default.
out = Console(width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, soft_wrap=True)  # an error stays one line, however long

JSON = typer.Option(False, "--json", help="Print JSON for scripts instead of a table.")
REPOSITORY = typer.Option(Path("exports"), "--repository", "-r", help="The model repository (export directory).")


def _emit_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str))


def given_options(ctx: typer.Context) -> list:
    """The command's parameters given on the command line (not left at their defaults)."""
    return [p for p in ctx.command.params if getattr(ctx.get_parameter_source(p.name), "name", "") == "COMMANDLINE"]


def _csv(text: str, option: str, what: str = "value", kind: type = str) -> list:
    """OPTION's comma-separated `text` as a list of `kind`: [] when it names nothing (`,`),
    for the caller to refuse in its own words; else `zoo.bench.options.items`' reading
    (a usage error for an empty item in a list, a value not of `kind`, one named twice)."""
    from .bench.options import items

    return [] if not text.replace(",", "").strip() else items(option, text, what, kind)


def _table(columns: list[str], rows: list[list[Any]], title: str | None = None) -> None:
    table = Table(*columns, title=title)
    for row in rows:
        table.add_row(*("" if v is None else escape(str(v)) for v in row))
    out.print(table)


def _artifact_path(artifact: str, repository: Path) -> Path:
    path = Path(artifact)
    return path if path.exists() or path.is_absolute() or "/" in artifact else repository / artifact
