"""``lightbox worker`` and ``lightbox backfill-worker``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from lightbox import startup
from lightbox.cli.common import Bootstrap, resolve_bootstrap
from streams.settings import Settings


def worker(
    bootstrap: Bootstrap = None,
    device: Annotated[str | None, typer.Option(help="auto, cpu or gpu (default: $LIGHTBOX_DEVICE or auto)")] = None,
    max_batch: Annotated[int | None, typer.Option(help="largest micro-batch")] = None,
    segmenter: Annotated[str | None, typer.Option(help="model, classical or none")] = None,
    output_dir: Annotated[Path | None, typer.Option(help="write variants as content-addressed files here and "
                                                            "put file:// URIs in events instead of bytes")] = None,
    loglevel: Annotated[str | None, typer.Option("--loglevel", "-l", help="log level (default: $LIGHTBOX_LOG_LEVEL "
                                                                           "or warning)")] = None,
) -> None:
    """Run one worker in the consumer group (one per GPU).

    Consumes ProductImageEvents and publishes one ProcessedImageEvent or DeadLetterEvent per input.
    SIGTERM/Ctrl-C: in-flight work finishes and is committed, exit 0. Exit 70 when the worker cannot
    go on (fail-stop: it leaves the group first, so its partitions move at once)."""
    overrides: dict[str, Any] = {"kafka_bootstrap": resolve_bootstrap(bootstrap)}
    for key, val in (("device", device), ("max_batch", max_batch), ("segmenter", segmenter),
                     ("output_dir", output_dir)):
        if val is not None:
            overrides[key] = val
    from agents.worker import run_worker

    startup.settle()  # a long run: the usual garbage collection from here on

    settings = Settings(**overrides)
    raise typer.Exit(run_worker(settings, overrides, loglevel or settings.observe.log_level))


def backfill_worker(
    bootstrap: Bootstrap = None,
    loglevel: Annotated[str | None, typer.Option("--loglevel", "-l", help="log level (default: $LIGHTBOX_LOG_LEVEL "
                                                                           "or warning)")] = None,
) -> None:
    """Run the backfill tier alone, beside the live workers.

    Consumes the backfill topic (group `<group id>.backfill`) and publishes its outputs, at a CPU
    priority LIGHTBOX_BACKFILL_NICE lower and (Linux, unless LIGHTBOX_BACKFILL_SCHED_IDLE=false) only
    on cores nothing else wants, with no live input. `lightbox worker` starts one itself on a CPU
    worker on Linux (LIGHTBOX_BACKFILL_PROCESS=auto, the default; true/false force it), shares its
    live work with it, and stops it on its way out; its metrics are on the worker's port + 1.
    SIGTERM/Ctrl-C: in-flight work finishes and is committed, exit 0; exit 70 on a fail-stop."""
    from agents.worker import run_backfill_worker

    startup.settle()  # a long run: the usual garbage collection from here on

    settings = Settings(kafka_bootstrap=resolve_bootstrap(bootstrap))
    raise typer.Exit(run_backfill_worker(settings, loglevel or settings.observe.log_level))
