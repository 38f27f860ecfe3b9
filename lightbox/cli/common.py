"""What every command module shares: the consoles, the ``--bootstrap`` option and where a command's
broker is, and the options that several commands take."""

from __future__ import annotations

import os
from typing import Annotated

import typer
from rich.console import Console

__all__ = ["Bootstrap", "DryRun", "console", "err", "resolve_bootstrap"]

console = Console()
err = Console(stderr=True)

Bootstrap = Annotated[str | None, typer.Option("--bootstrap", "-b", help="Kafka bootstrap servers "
                      "(default: $LIGHTBOX_KAFKA_BOOTSTRAP, else the broker `lightbox kafka up` started)")]


def resolve_bootstrap(explicit: str | None) -> str:
    if explicit:
        return explicit
    if "LIGHTBOX_KAFKA_BOOTSTRAP" in os.environ:
        return os.environ["LIGHTBOX_KAFKA_BOOTSTRAP"]
    from lightbox.devservers.kafka_local import read_state

    state = read_state()
    if state is not None and state.alive():
        return state.bootstrap
    from streams.settings import Settings

    return Settings().kafka.bootstrap


DryRun = Annotated[bool, typer.Option("--dry-run", help="count what would be published; publish nothing")]
