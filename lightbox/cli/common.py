"""What every command module shares: the consoles, the ``--bootstrap`` option and where a command's
broker is, and the options that several commands take."""

from __future__ import annotations

import os
from typing import Annotated

import typer
from rich.console import Console

from streams.settings import DEFAULT_PRESETS, Settings

__all__ = ["PRESETS", "Bootstrap", "DryRun", "console", "err", "names", "resolve_bootstrap", "time_ms"]

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
    return Settings().kafka.bootstrap


DryRun = Annotated[bool, typer.Option("--dry-run", help="count what would be published; publish nothing")]
PRESETS = ",".join(DEFAULT_PRESETS)  # the --presets default of every command that publishes or processes


def names(text: str) -> list[str]:
    """A comma-separated option as a list (blanks left out)."""
    return [p.strip() for p in text.split(",") if p.strip()]


def time_ms(text: str | None) -> int | None:
    """Epoch milliseconds from an ISO 8601 time (UTC when no zone is given; ``Z`` allowed) or a
    number of epoch milliseconds; None for None."""
    if text is None:
        return None
    if text.isdigit():
        return int(text)
    from datetime import UTC, datetime

    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise typer.BadParameter(f"{text!r} is not a time: ISO 8601 (e.g. 2026-11-30T10:00:00Z) or epoch ms") from None
    return int((when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp() * 1000)
