"""The ``lightbox`` command. Every subcommand's ``--help`` says what it does and its options.

Settings come from ``LIGHTBOX_*`` environment variables (see ``streams/settings.py``); the
options here override them. One module per command group; each parses its options, calls the
library and prints the result. The pipeline, NumPy, Faust and Kafka are imported inside the
commands that use them, so ``--help`` and option errors stay quick.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Annotated, Any

from lightbox import startup

startup.hold()  # before typer, rich and pydantic: what their imports make outlives the start

import typer  # noqa: E402

from lightbox.cli.common import err  # noqa: E402

__all__ = ["COMMANDS", "app", "app_for", "main", "whole_app"]

def _version(value: bool) -> None:
    if value:
        from lightbox import __version__
        from streams.settings import PIPELINE_VERSION

        typer.echo(f"lightbox {__version__} (pipeline {PIPELINE_VERSION})")
        raise typer.Exit()


def _main(ctx: typer.Context,
          version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="print the version and exit")] = False) -> None:
    """lightbox: marketplace-ready product images from raw supplier photos, as a stream."""
    if ctx.invoked_subcommand not in _OFFLINE:
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


# the order of `lightbox --help`: each command's name, its module under lightbox.cli and the
# module's attribute (a command function, or a Typer of a command group); STORES: one group per
# object store that servers.OBJECT_STORES names. A command's module is imported when it runs.
STORES = "<object stores>"
COMMANDS: tuple[tuple[str, str, str], ...] = (
    ("kafka", "servers", "kafka_app"),
    (STORES, "servers", "OBJECT_STORES"),
    ("toxiproxy", "faults", "toxiproxy_app"),
    ("registry", "registry", "registry_app"),
    ("schemas", "registry", "schemas_app"),
    ("doctor", "doctor", "doctor"),
    ("settings", "settings", "settings"),
    ("worker", "worker", "worker"),
    ("backfill-worker", "worker", "backfill_worker"),
    ("produce", "produce", "produce"),
    ("tail", "events", "tail"),
    ("report", "events", "report"),
    ("process", "process", "process"),
    ("audit", "events", "audit"),
    ("contact-sheet", "process", "contact_sheet"),
    ("quality-report", "process", "quality_report"),
    ("model", "model", "model_app"),
    ("samples", "demo", "samples"),
    ("demo", "demo", "demo"),
    ("replay", "replay", "replay_app"),
    ("redrive", "replay", "redrive"),
)
# commands that never reach a broker: no secured local broker's settings are looked up for them
_OFFLINE = frozenset({"process", "contact-sheet", "quality-report"})


def _new_app() -> typer.Typer:
    made = typer.Typer(help="lightbox: marketplace-ready product images from raw supplier photos, as a stream.",
                       no_args_is_help=True, add_completion=False, rich_markup_mode="markdown")
    made.callback()(_main)
    return made


def _entries(name: str, module: str, attr: str) -> Iterator[tuple[str, Callable[..., Any] | typer.Typer]]:
    """The commands of one ``COMMANDS`` row, its module imported."""
    got = getattr(importlib.import_module(f"lightbox.cli.{module}"), attr)
    if name == STORES:
        from lightbox.cli.servers import object_store_app

        for store in got:
            yield store.command, object_store_app(store)
    else:
        yield name, got


def _add(to: typer.Typer, name: str, what: Callable[..., Any] | typer.Typer) -> None:
    if isinstance(what, typer.Typer):
        to.add_typer(what, name=name)
    else:
        to.command(name)(what)


def whole_app() -> typer.Typer:
    """Every command, in ``COMMANDS``' order (every command module imported)."""
    made = _new_app()
    for row in COMMANDS:
        for name, what in _entries(*row):
            _add(made, name, what)
    return made


def app_for(argv: Sequence[str]) -> typer.Typer:
    """The app that runs ``argv`` (the arguments after ``lightbox``). For a command named first
    (``lightbox process …``) one with the same callback and that command alone: only its module
    is imported, and Typer turns one function into a Click command (~4 ms) instead of every one
    (~45 ms: each signature and its annotations read). Anything else (``--help``, ``--version``,
    an object store's group, an unknown name) gets the whole app."""
    first = argv[0] if argv else ""
    for name, module, attr in COMMANDS:
        if name == first:
            one = _new_app()
            for entry in _entries(name, module, attr):
                _add(one, *entry)
            return one
    return _whole()


def _whole() -> typer.Typer:
    made = globals().get("app")
    if not isinstance(made, typer.Typer):
        made = globals()["app"] = whole_app()
    return made


def __getattr__(name: str) -> Any:
    """``app``: the whole app, made on first use (``from lightbox.cli import app``)."""
    if name == "app":
        return _whole()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
        app_for(sys.argv[1:])()
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
