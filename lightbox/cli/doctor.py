"""``lightbox doctor``."""

from __future__ import annotations

import typer
from rich.table import Table

from lightbox.cli.common import Bootstrap, console, resolve_bootstrap


def doctor(bootstrap: Bootstrap = None) -> None:
    """What this installation has and lacks, each with a fix.

    Checks Python, JDK and Maven (for the local broker), DALI, CuPy and the GPU, ONNX Runtime
    providers, the cached model and its checksum, and the broker it would connect to, each with a
    one-line fix. Exits 1 when something required is missing."""
    from rich.markup import escape

    from lightbox.doctor import run_checks

    checks = run_checks(resolve_bootstrap(bootstrap))
    table = Table(box=None, show_header=True, padding=(0, 1))  # three columns: readable at 80 columns
    table.add_column("check", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("detail (and the fix)", overflow="fold")
    colour = {"ok": "green", "warn": "yellow", "missing": "red"}
    for c in checks:
        fix = f"\n[bold]fix:[/] {escape(c.fix)}" if c.fix else ""
        table.add_row(c.name, f"[{colour[c.status]}]{c.status}[/]", escape(c.detail) + fix)
    console.print(table)
    if any(c.status == "missing" for c in checks):
        raise typer.Exit(1)
