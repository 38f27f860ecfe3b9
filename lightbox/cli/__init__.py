"""The ``lightbox`` command. Every subcommand's ``--help`` says what it does and its options.

Settings come from ``LIGHTBOX_*`` environment variables (see ``streams/settings.py``); the
options here override them. One module per command group; each parses its options, calls the
library and prints the result. The pipeline, NumPy, Faust and Kafka are imported inside the
commands that use them, so ``--help`` and option errors stay quick.
"""

from __future__ import annotations

import gc
import os
from typing import Annotated

from lightbox import startup

startup.hold()  # before typer, rich and pydantic: what their imports make outlives the start

import typer  # noqa: E402

from lightbox.cli import (  # noqa: E402
    demo,
    doctor,
    events,
    faults,
    model,
    process,
    produce,
    registry,
    replay,
    servers,
    settings,
    worker,
)
from lightbox.cli.common import err  # noqa: E402

__all__ = ["app", "main"]

app = typer.Typer(help="lightbox: marketplace-ready product images from raw supplier photos, as a stream.",
                  no_args_is_help=True, add_completion=False, rich_markup_mode="markdown")


def _version(value: bool) -> None:
    if value:
        from lightbox import __version__
        from streams.settings import PIPELINE_VERSION

        typer.echo(f"lightbox {__version__} (pipeline {PIPELINE_VERSION})")
        raise typer.Exit()


@app.callback()
def _main(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="print the version and exit")] = False) -> None:
    """lightbox: marketplace-ready product images from raw supplier photos, as a stream."""
    _local_secure_env()


def _local_secure_env() -> None:
    """With no broker named, a secured broker from `lightbox kafka up --secure` is used as the plain one
    is: its protocol, user, CA and password file are set for this command (what was set is kept)."""
    if "LIGHTBOX_KAFKA_BOOTSTRAP" in os.environ:
        return
    from lightbox.devservers.kafka_local import read_state

    state = read_state()
    if state is not None and state.secure and state.alive():
        for key, value in state.client_env().items():
            os.environ.setdefault(key, value)


# the order of `lightbox --help`
app.add_typer(servers.kafka_app, name="kafka")
for _store in servers.OBJECT_STORES:
    app.add_typer(servers.object_store_app(_store), name=_store.command)
app.add_typer(faults.toxiproxy_app, name="toxiproxy")
app.add_typer(registry.registry_app, name="registry")
app.add_typer(registry.schemas_app, name="schemas")
app.command()(doctor.doctor)
app.command()(settings.settings)
app.command()(worker.worker)
app.command("backfill-worker")(worker.backfill_worker)
app.command()(produce.produce)
app.command()(events.tail)
app.command()(events.report)
app.command()(process.process)
app.command()(events.audit)
app.command("contact-sheet")(process.contact_sheet)
app.command("quality-report")(process.quality_report)
app.add_typer(model.model_app, name="model")
app.command()(demo.samples)
app.command()(demo.demo)
app.add_typer(replay.replay_app, name="replay")
app.command()(replay.redrive)


def main() -> None:
    gc.freeze()  # the CLI's modules live as long as the process: later collections need not walk them
    # (the collection thresholds stay raised until the command has built what it keeps: see
    # lightbox.startup; a command that never says so keeps them, and its cycles are still collected)
    import logging

    # The retouch twins' small matrix products gain nothing from BLAS threads and lose a lot when
    # those threads fight the decode and device threads for the cores (must precede numpy's import).
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

    # aiokafka warns about topics that do not exist *yet* (they are created a moment later)
    logging.getLogger("aiokafka").setLevel(logging.ERROR)
    from schemas.errors import RegistryError, RegistryRefused
    from streams.security import KafkaSecurityError

    try:
        app()
    except KafkaSecurityError as exc:  # a refused password, an untrusted certificate, a missing setting
        err.print(f"[red]kafka security:[/] {exc}", soft_wrap=True)
        raise SystemExit(2) from None
    except (RegistryError, RegistryRefused) as exc:  # refused credential, rejected schema, registry away
        err.print(f"[red]schema registry:[/] {exc}", soft_wrap=True)
        raise SystemExit(2) from None
    finally:
        # The command is over and closed what it opened; the interpreter's last full collection at
        # exit would walk every object the imports made (docs/performance.md: fcca375) only to
        # free memory the exit frees anyway. Frozen objects are skipped (atexit handlers still run).
        gc.freeze()
