"""``lightbox produce``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from lightbox.cli.common import PRESETS, Bootstrap, console, err, names, resolve_bootstrap
from streams.settings import Settings


def produce(
    paths: Annotated[list[str] | None, typer.Argument(help="image files, folders (searched recursively) and/or URIs "
                                                          "(s3://, gs://, az://, http(s)://, file://)")] = None,
    manifest: Annotated[list[Path] | None, typer.Option(help="a CSV or JSONL manifest: sku, uri, optional presets, "
                                                               "image_id, merchant_id, background, lighting, "
                                                               "segmentation, priority, sha256 (repeatable)")] = None,
    presets: Annotated[str, typer.Option(help="comma-separated preset names")] = PRESETS,
    bootstrap: Bootstrap = None,
    topic: Annotated[str | None, typer.Option(help="input topic (default: $LIGHTBOX_INPUT_TOPIC)")] = None,
    uri: Annotated[bool, typer.Option("--uri/--inline", help="send local files as file:// URIs instead of "
                                                              "inline bytes")] = False,
    background: Annotated[str, typer.Option(help="white, transparent or keep")] = "white",
    merchant: Annotated[str, typer.Option(help="merchant id")] = "demo-merchant",
) -> None:
    """Publish ProductImageEvents for image files, URIs or a manifest.

    Publish one ProductImageEvent per image file (SKU = file name without suffix), per URI, or per
    manifest row, with a progress bar; waits until the brokers acknowledged every event."""
    from rich.progress import Progress

    from streams.producer import ImageProducer, ManifestError, rows_to_publish

    wanted = names(presets)
    try:
        rows = rows_to_publish(paths or [], manifest or [])
    except (FileNotFoundError, ManifestError) as exc:
        err.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None
    if not rows:
        err.print("[yellow]no image files, URIs or manifest rows given[/]")
        raise typer.Exit(1)
    settings = Settings()

    async def go() -> None:
        async with ImageProducer(resolve_bootstrap(bootstrap), topic or settings.topics.input) as prod:
            futs = []
            with Progress(console=err) as bar:
                task = bar.add_task("publishing", total=len(rows))
                for row, base in rows:
                    ev = prod.event_for_row(row, base=base, presets=wanted, inline=not uri, merchant_id=merchant,
                                            background=background)
                    futs.append(await prod.publish(ev))
                    bar.advance(task)
            await prod.flush(futs)

    try:
        asyncio.run(go())
    except FileNotFoundError as exc:  # a manifest row naming a local file that is not there
        err.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None
    console.print(f"published {len(rows)} events to {topic or settings.topics.input}")
