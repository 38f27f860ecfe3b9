"""``lightbox settings``."""

from __future__ import annotations

import os
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from lightbox.cli.common import console, err


def settings(
    markdown: Annotated[bool, typer.Option("--markdown", help="print the reference as Markdown (what "
                                           "docs/settings.md holds; `make docs` writes it) and no values")] = False,
    changed: Annotated[bool, typer.Option("--changed", help="only the settings set in the environment or .env")]
    = False,
    env_file: Annotated[str, typer.Option("--env-file", help="the .env file to read, as every command does")]
    = ".env",
) -> None:
    """Every LIGHTBOX_* setting: its value in effect and where it came from (environment, .env or
    default), its default and its meaning. Secrets and credentials in URLs are masked.

    Exits 2 naming the variable when a value is invalid, as a worker would refuse it.

    --markdown prints the reference that docs/settings.md holds, with the variables read outside
    the settings (local development servers, Triton's environment)."""
    from dotenv import dotenv_values
    from pydantic import ValidationError

    from lightbox.settings_reference import in_effect
    from lightbox.settings_reference import markdown as reference
    from streams.settings import Settings

    if markdown:
        typer.echo(reference(), nl=False)
        return
    try:
        current = Settings(_env_file=env_file)
    except ValidationError as e:
        flat = set(Settings.flat_names())
        for problem in e.errors():
            name = str(problem["loc"][0]) if problem["loc"] else ""
            where = f"LIGHTBOX_{name.upper()}" if name in flat else ".".join(str(p) for p in problem["loc"])
            err.print(f"[red]invalid setting[/] {escape(where)}: {escape(problem['msg'])}")
        err.print("fix it in the environment or the .env file; `lightbox settings --markdown` lists every setting")
        raise typer.Exit(2) from None
    dotenv = dotenv_values(env_file) if os.path.isfile(env_file) else {}
    # explicit widths: Rich folds a long value at a width wider than the one it then crops to
    width = max(console.width, 60)
    name_w = min(60, max(42, width // 2))
    value_w = width - name_w - 11 - 6  # 11: "environment"; 6: the columns' padding
    table = Table(box=None, show_header=True, padding=(0, 1))
    table.add_column("variable (meaning; default)", overflow="fold", width=name_w)
    table.add_column("from", no_wrap=True, width=11)
    table.add_column("in effect", overflow="fold", width=value_w)
    section = ""
    for row, value, source in in_effect(current, os.environ, dotenv):
        if changed and source == "default":
            continue
        if row.sections[0] != section:
            section = row.sections[0]
            table.add_row(f"[bold]{section}[/]", "", "")
        colour = "" if source == "default" else "[cyan]"
        table.add_row(f"{row.variable}\n[dim]{escape(row.meaning)}; default: {escape(row.default)}[/]",
                      source, colour + escape(value))
    console.print(table)
