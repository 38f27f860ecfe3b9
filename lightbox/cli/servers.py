"""``lightbox kafka|s3|azure|gcs up|down|status``: the local development servers
(:mod:`lightbox.devservers`)."""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from lightbox.cli.common import console, err

kafka_app = typer.Typer(help="A local Apache Kafka (KRaft) for development and tests; no Docker.",
                        no_args_is_help=True)

InstanceName = Annotated[str | None, typer.Option("--name", help="this local instance's name: its own state, "
                                                  "so tools that use their own names never stop each other's "
                                                  "servers (default: keyed by --data-dir, else 'default')")]


def _instance(name: str | None, data_dir: Path | None) -> str:
    from lightbox.devservers.launch import instance_key

    try:
        return instance_key(name, data_dir)
    except ValueError as exc:
        err.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None


def _others(kind: str, key: str) -> str:
    from lightbox.devservers.launch import states

    names = [k for k in states(kind) if k != key]
    return f" (recorded instances: {', '.join(names)}; pass --name)" if names else ""


def _up(module: str, key: str, address: Callable[[Any], str], starting: str, command: str,
        start: Callable[[], Any]) -> tuple[Any, float] | None:
    """`up` of a local server: None when instance ``key`` already runs (said so, at
    ``address(state)``); else ``start()`` under the ``starting`` spinner, its record saved, and the
    server with the seconds it took. A launch error (each server's is a RuntimeError) exits 1."""
    state = importlib.import_module(module).read_state(key)
    if state is not None and state.alive():
        console.print(f"already running: [bold]{address(state)}[/] (pid {state.pid}, instance {key!r})")
        return None
    t0 = time.monotonic()
    try:
        with console.status(starting):
            server = start()
    except RuntimeError as exc:
        err.print(f"[red]{command} up failed:[/] {exc}")
        raise typer.Exit(1) from None
    server.save_state()
    return server, time.monotonic() - t0


def _down(kind: str, module: str, key: str, noun: str, program: str) -> None:
    """`down` of a local server (Kafka, s3proxy, the emulators): stop the process that instance
    ``key``'s `up` started (pid and start time checked: that very process only), remove its
    temporary data and its record."""
    mod = importlib.import_module(module)
    state = mod.read_state(key)
    if state is None:
        console.print(f"no local {noun} recorded for instance {key!r}{_others(kind, key)}")
        return
    stopped = state.stop()
    mod.clear_state(key)
    if stopped:
        console.print(f"stopped {program} (pid {state.pid}, instance {key!r})")
    else:
        console.print(f"the {noun} of instance {key!r} (pid {state.pid}) was no longer running; nothing "
                      "signalled, its state cleared")


def _status(kind: str, module: str, key: str, address: Callable[[Any], str],
            holds: Callable[[Any], str] | None = None) -> None:
    """`status` of a local server: where instance ``key`` runs (``address(state)``, and
    ``holds(state)``: the buckets or containers it serves), or exit 1 when it does not."""
    state = importlib.import_module(module).read_state(key)
    if state is not None and state.alive():
        held = f"{holds(state)}, " if holds is not None else ""
        console.print(f"running at [bold]{address(state)}[/] (pid {state.pid}, instance {key!r}, {held}"
                      f"data {state.data_dir})")
        return
    console.print(f"not running (instance {key!r}){_others(kind, key)}")
    raise typer.Exit(1)


@kafka_app.command("up")
def kafka_up(port: Annotated[int | None, typer.Option(help="broker port (default: a free one)")] = None,
             data_dir: Annotated[Path | None, typer.Option(help="data folder (default: a new temporary one, "
                                                                    "removed by `down`)")] = None,
             secure: Annotated[bool, typer.Option(help="SASL_SSL with SCRAM-SHA-512: a CA and broker certificate "
                                                       "made at start, a user `lightbox` with a password in a "
                                                       "file")] = False,
             name: InstanceName = None) -> None:
    """Fetch Kafka's jars with Maven (once), format a KRaft log dir and start a broker+controller
    on 127.0.0.1 in the background. Prints the settings a client needs."""
    from lightbox.devservers.kafka_local import LocalKafka

    key = _instance(name, data_dir)
    up = _up("lightbox.devservers.kafka_local", key, lambda state: state.bootstrap,
             "starting Kafka (first run fetches its jars with Maven)…", "kafka",
             lambda: LocalKafka.start(port=port, data_dir=data_dir, secure=secure, name=key))
    if up is None:
        return
    kafka, took = up
    console.print(f"Kafka up at [bold]{kafka.bootstrap}[/] in {took:.1f} s "
                  f"(pid {kafka.pid}, instance {key!r}, log {kafka.log_file})")
    console.print("lightbox commands here find it on their own; for other shells and clients:")
    for key, value in kafka.client_env().items():  # a secure broker: also protocol, user, CA and password files
        console.print(f"export {key}={value}", soft_wrap=True)


DataDirOption = Annotated[Path | None, typer.Option(help="the data folder the instance was started on "
                                                        "(names the instance when --name was not given)")]


@kafka_app.command("down")
def kafka_down(name: InstanceName = None, data_dir: DataDirOption = None) -> None:
    """Stop the broker that this instance's `lightbox kafka up` started (clean shutdown) and remove
    its temporary data. Only that very process is stopped (pid and start time checked)."""
    _down("kafka", "lightbox.devservers.kafka_local", _instance(name, data_dir), "broker", "Kafka")


@kafka_app.command("status")
def kafka_status(name: InstanceName = None, data_dir: DataDirOption = None) -> None:
    """Say whether the local broker is running, and where. Exit code 1 when it is not."""
    _status("kafka", "lightbox.devservers.kafka_local", _instance(name, data_dir), lambda state: state.bootstrap)



@dataclass(frozen=True)
class _ObjectStore:
    """A local object-store server the CLI starts and stops (lightbox/devservers/s3_local.py, azurite_local.py,
    gcs_local.py): its command group, how messages name it, its module and class, what its first
    start does, what it serves (bucket, container) and the kind its instances are recorded under."""

    command: str
    what: str
    help: str
    module: str
    cls: str
    first_run: str
    serves: str
    state_kind: str


def object_store_app(server: _ObjectStore) -> typer.Typer:
    """``up``/``down``/``status`` for a local object-store server. (The options' help is the same for
    every server: the module's postponed annotations are evaluated where ``server`` is not in scope.)"""
    sub = typer.Typer(help=server.help, no_args_is_help=True)
    serves = server.serves + "s"

    @sub.command("up")
    def up(port: Annotated[int | None, typer.Option(help="port (default: a free one)")] = None,
           data_dir: Annotated[Path | None, typer.Option(help="data folder (default: a new temporary one, removed "
                                                               "by `down`)")] = None,
           bucket: Annotated[list[str] | None, typer.Option(help="bucket (S3, GCS) or container (Azure) to "
                                                                 "create (repeat for more)")] = None,
           name: InstanceName = None) -> None:
        """Install the server once, start it on 127.0.0.1 in the background and print the variables a
        client (a worker, `replay prefix`) needs."""
        key = _instance(name, data_dir)
        up = _up(server.module, key, lambda state: state.url, f"starting {server.what} (first run {server.first_run})…",
                 server.command, lambda: getattr(importlib.import_module(server.module), server.cls).start(
                     port=port, data_dir=data_dir, name=key, **{serves: tuple(bucket or ["lightbox"])}))
        if up is None:
            return
        started, took = up
        console.print(f"{server.what} up at [bold]{started.url}[/] in {took:.1f} s (pid "
                      f"{started.pid}, instance {key!r}, {serves} {', '.join(getattr(started, serves))}, "
                      f"log {started.log_file})")
        for var, val in started.env().items():
            console.print(f"export {var}={val}", soft_wrap=True)

    @sub.command("down")
    def down(name: InstanceName = None, data_dir: DataDirOption = None) -> None:
        """Stop the server that this instance's `up` started and remove its temporary data. Only that
        very process is stopped (pid and start time checked)."""
        _down(server.state_kind, server.module, _instance(name, data_dir), "server", server.what)

    @sub.command("status")
    def status(name: InstanceName = None, data_dir: DataDirOption = None) -> None:
        """Say whether this instance's server is running, and where. Exit code 1 when it is not."""
        _status(server.state_kind, server.module, _instance(name, data_dir), lambda state: state.url,
                lambda state: f"{serves} {', '.join(getattr(state, serves))}")

    return sub


OBJECT_STORES = (
    _ObjectStore("s3", "s3proxy", "A local S3-compatible server (s3proxy) for development and tests; no Docker.",
                 "lightbox.devservers.s3_local", "LocalS3", "fetches its jars with Maven", "bucket", "s3"),
    _ObjectStore("azure", "Azurite", "A local Azure Blob Storage emulator (Azurite) for az:// in development, "
                 "demos and tests; no Docker.", "lightbox.devservers.azurite_local", "LocalAzurite",
                 "installs it with npm", "container", "azurite"),
    _ObjectStore("gcs", "fake-gcs-server", "A local Google Cloud Storage emulator (fake-gcs-server) for gs:// in "
                 "development, demos and tests; no Docker.", "lightbox.devservers.gcs_local", "LocalGcs",
                 "builds it with go install", "bucket", "gcs"),
)
