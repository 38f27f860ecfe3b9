"""``lightbox registry up|down|status`` (a local Apicurio Registry) and ``lightbox schemas
register|check`` (lightbox's schemas, or a producer's, against a Confluent-compatible registry)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from lightbox.cli.common import console, err
from lightbox.cli.servers import DataDirOption, InstanceName, _down, _instance, _status, _up

__all__ = ["registry_app", "schemas_app"]

registry_app = typer.Typer(help="A local Confluent-compatible schema registry (Apicurio Registry) for development "
                                "and tests; no Docker.", no_args_is_help=True)
schemas_app = typer.Typer(help="lightbox's schemas in a schema registry (LIGHTBOX_SCHEMA_REGISTRY_URL): register "
                               "them, or check a producer's schema before it ships.", no_args_is_help=True)

MODULE = "lightbox.devservers.registry_local"


@registry_app.command("up")
def registry_up(port: Annotated[int | None, typer.Option(help="HTTP port (default: a free one)")] = None,
                data_dir: Annotated[Path | None, typer.Option(help="data folder: its database keeps subjects and "
                                                                   "ids across restarts (default: a new temporary "
                                                                   "one, removed by `down`)")] = None,
                name: InstanceName = None) -> None:
    """Fetch Apicurio Registry with Maven (once), start it on 127.0.0.1 in the background with
    canonical hashing and BACKWARD compatibility, and print the LIGHTBOX_SCHEMA_REGISTRY_URL to set."""
    from lightbox.devservers.registry_local import LocalRegistry

    key = _instance(name, data_dir)
    up = _up(MODULE, key, lambda state: state.api_url,
             "starting Apicurio Registry (the first run fetches it with Maven)…", "registry",
             lambda: LocalRegistry.start(port=port, data_dir=data_dir, name=key))
    if up is None:
        return
    reg, took = up
    console.print(f"schema registry up at [bold]{reg.api_url}[/] in {took:.1f} s (pid {reg.pid}, "
                  f"instance {key!r}, BACKWARD, log {reg.log_file})")
    console.print("point lightbox (worker, produce, tail, ...) and your clients at it:")
    for k, v in reg.env().items():
        console.print(f"export {k}={v}", soft_wrap=True)


@registry_app.command("down")
def registry_down(name: InstanceName = None, data_dir: DataDirOption = None) -> None:
    """Stop the registry this instance's `lightbox registry up` started (that very process only)
    and remove its temporary data."""
    _down("registry", MODULE, _instance(name, data_dir), "schema registry", "the schema registry")


@registry_app.command("status")
def registry_status(name: InstanceName = None, data_dir: DataDirOption = None) -> None:
    """Say whether the local registry runs, and its URL. Exit code 1 when it does not."""
    _status("registry", MODULE, _instance(name, data_dir), lambda state: state.api_url)


Kind = Annotated[str, typer.Option(help="which lightbox event the file is a version of: product (the input), "
                                        "processed or dead_letter")]
Topic = Annotated[str | None, typer.Option(help="the topic it is written to (default: the configured input, "
                                                "output or dead-letter topic of the kind)")]


def _settings_and_store() -> tuple[Any, Any]:
    from streams.registry import RegistrySchemaStore
    from streams.settings import Settings

    settings = Settings()
    if not settings.schema_registry.url:
        err.print("[red]LIGHTBOX_SCHEMA_REGISTRY_URL is not set[/] (start one with `lightbox registry up`)")
        raise typer.Exit(2)
    try:
        return settings, RegistrySchemaStore(settings.schema_registry, patience_s=30.0)
    except ValueError as exc:
        err.print(f"[red]schema registry settings:[/] {exc}")
        raise typer.Exit(2) from None


def _subject(settings: Any, kind: str, topic: str | None, full_name: str) -> str:
    from streams.registry import subject_name

    where = {"product": settings.topics.input, "processed": settings.topics.output, "dead_letter": settings.topics.dlq}
    if kind not in where:
        err.print(f"[red]--kind must be one of {', '.join(where)}[/]")
        raise typer.Exit(2)
    return subject_name(settings.schema_registry.subject_strategy, topic or where[kind], full_name)


def _load(path: Path) -> dict[str, Any]:
    try:
        schema = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        err.print(f"[red]{path}: not a readable Avro schema (JSON): {exc}[/]")
        raise typer.Exit(2) from None
    if not isinstance(schema, dict):
        err.print(f"[red]{path}: expected a record schema (a JSON object)[/]")
        raise typer.Exit(2)
    return schema


def _fail(exc: Exception) -> typer.Exit:
    err.print(f"[red]{type(exc).__name__}:[/] {exc}")
    return typer.Exit(1)


@schemas_app.command("register")
def schemas_register(schema: Annotated[Path | None, typer.Argument(help="an .avsc file; default: lightbox's own "
                                                                        "three schemas")] = None,
                     kind: Kind = "product", topic: Topic = None) -> None:
    """Register lightbox's schemas under their subjects (TopicNameStrategy: <topic>-value; or by record
    name, LIGHTBOX_SCHEMA_REGISTRY_SUBJECT_STRATEGY=record), with BACKWARD set on each subject that
    has no level of its own; or register one file as a new version of a lightbox event."""
    from schemas.codec import load_schema
    from schemas.events import SUBJECTS
    from streams.registry import RegistryError, RegistryRefused

    settings, store = _settings_and_store()
    todo = ([(k, load_schema(stem), full) for k, (stem, full) in SUBJECTS.items()] if schema is None
            else [(kind, (s := _load(schema)), f"{s.get('namespace', '')}.{s.get('name', '')}".lstrip("."))])
    for k, body, full in todo:
        subject = _subject(settings, k, topic if schema is not None else None, full)
        try:
            sid = store.register(subject, body)
        except (RegistryError, RegistryRefused) as exc:
            raise _fail(exc) from None
        console.print(f"{full}: id {sid} under {subject!r} ({store.compatibility(subject) or 'global level'})")


@schemas_app.command("check")
def schemas_check(schema: Annotated[Path, typer.Argument(help="the producer's .avsc (a new version of a lightbox "
                                                               "event)")],
                  kind: Kind = "product", topic: Topic = None) -> None:
    """Check a producer's schema before it ships: lightbox can read records written with it (same
    record name; every field lightbox reads is there with the same type, or has a default) and the
    registry accepts it under the topic's subject (its compatibility test). Exit 1 when either fails."""
    from schemas.codec import IncompatibleSchema, check_backward, load_schema
    from schemas.events import SUBJECTS
    from streams.registry import RegistryError, RegistryRefused

    body = _load(schema)
    if kind not in SUBJECTS:
        err.print(f"[red]--kind must be one of {', '.join(SUBJECTS)}[/]")
        raise typer.Exit(2)
    stem, full = SUBJECTS[kind]
    ours = load_schema(stem)
    theirs = f"{body.get('namespace', '')}.{body.get('name', '')}".lstrip(".")
    problems = []
    if theirs != full:
        problems.append(f"the record is {theirs!r}; lightbox reads {full!r}")
    else:
        try:
            check_backward(body, ours)  # lightbox's reader on records written with the producer's schema
        except IncompatibleSchema as exc:
            problems.append(f"lightbox cannot read records written with it: {exc}")
    settings, store = _settings_and_store()
    subject = _subject(settings, kind, topic, full)
    try:
        ok, messages = store.check(subject, body)
    except (RegistryError, RegistryRefused) as exc:
        raise _fail(exc) from None
    if not ok:
        problems.append(f"the registry refuses it under {subject!r}: " + ("; ".join(messages) or "incompatible"))
    if problems:
        for p in problems:
            err.print(f"[red]✗[/] {p}")
        raise typer.Exit(1)
    console.print(f"✓ {schema}: lightbox reads it, and the registry accepts it under {subject!r}")
