"""``lightbox replay ...`` (a backfill at a set rate) and ``lightbox redrive`` (dead letters back to the
input topic)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from lightbox.cli.common import PRESETS, Bootstrap, DryRun, console, err, names, resolve_bootstrap, time_ms
from streams.settings import Settings

replay_app = typer.Typer(help="Publish a backfill to the backfill topic at a set rate, resumably.\n\nFrom a "
                              "manifest, a folder, an object-store prefix, or a range of the input topic. Workers "
                              "give it only spare capacity.",
                         short_help="Publish a backfill to the backfill topic at a set rate, resumably.",
                         no_args_is_help=True)

Rate = Annotated[float | None, typer.Option("--rate", help="images per second (default: as fast as the brokers take)")]
Checkpoint = Annotated[Path | None, typer.Option(help="checkpoint file (default: one per job under the cache "
                                                      "folder, so the same command continues where it stopped)")]
Restart = Annotated[bool, typer.Option("--restart", help="forget the checkpoint and publish everything again")]
TargetTopic = Annotated[str | None, typer.Option("--topic", help="target topic (default: $LIGHTBOX_BACKFILL_TOPIC)")]
Presets = Annotated[str, typer.Option(help="comma-separated preset names for items that name none")]
Background = Annotated[str, typer.Option(help="white, transparent or keep")]
Merchant = Annotated[str, typer.Option(help="merchant id")]


def _defaults(presets: str, background: str, merchant: str) -> Any:
    from lightbox.replay import Defaults

    return Defaults(presets=tuple(names(presets)), background=background.upper(), merchant_id=merchant)


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

            return await run_replay(source, bootstrap=resolve_bootstrap(bootstrap), topic=target, rate=rate,
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
    presets: Presets = PRESETS,
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
    presets: Presets = PRESETS,
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
    presets: Presets = PRESETS,
    background: Background = "white",
    merchant: Merchant = "catalog",
    rate: Rate = None, dry_run: DryRun = False, checkpoint: Checkpoint = None, restart: Restart = False,
    topic: TargetTopic = None, bootstrap: Bootstrap = None,
) -> None:
    """One event per image object under an object-store prefix, its URL as the source URI (workers fetch
    it: their LIGHTBOX_FETCH_ALLOW must name the bucket); SKU = the key's name without suffix. Zero-byte
    objects (folder markers) are left out. Credentials come from the store's standard environment
    (`AWS_*`, `GOOGLE_*`, `AZURE_*`), and LIGHTBOX_S3_ENDPOINT names an S3-compatible server, as for workers.
    The sorted listing is fixed at the first run (kept beside the checkpoint), so a resumed run continues
    without gaps or repeats whatever lands under the prefix meanwhile. (A command of its own rather than
    `replay folder` with a URL: no local paths, no --inline, and a listing that is fixed per job.)"""
    from lightbox.replay import PrefixSource

    _run_replay(lambda: PrefixSource(url, _defaults(presets, background, merchant), pattern=pattern,
                                     endpoint=Settings().fetch.s3_endpoint),
                bootstrap=bootstrap, topic=topic, rate=rate, dry_run=dry_run, checkpoint=checkpoint, restart=restart)


@replay_app.command("topic")
def replay_topic(
    source_topic: Annotated[str | None, typer.Option(help="topic to read (default: $LIGHTBOX_INPUT_TOPIC)")] = None,
    partition: Annotated[list[int] | None, typer.Option(help="only this partition (repeatable)")] = None,
    from_offset: Annotated[int | None, typer.Option(help="first offset, every partition")] = None,
    to_offset: Annotated[int | None, typer.Option(help="end offset (not included), every partition")] = None,
    since: Annotated[str | None, typer.Option(help="first record at or after this time (ISO 8601, UTC if no zone, or "
                                                                  "epoch ms)")]
    = None,
    until: Annotated[str | None, typer.Option(help="stop before the first record at or after this time")] = None,
    rate: Rate = None, dry_run: DryRun = False, checkpoint: Checkpoint = None, restart: Restart = False,
    topic: TargetTopic = None, bootstrap: Bootstrap = None,
) -> None:
    """Re-publish a range of the input topic unchanged (same event ids: the same pipeline and model
    versions give the same output ids and bytes, a new version new ids), each record naming its
    original in a `lightbox-replay-of` header. Unset bounds: from the start, to the end at the first run."""
    from lightbox.replay import TopicSource

    start_ms, end_ms = time_ms(since), time_ms(until)  # a bad time is an option error, before any connection

    def make() -> TopicSource:
        return TopicSource(resolve_bootstrap(bootstrap), source_topic or Settings().topics.input, partitions=partition,
                           start_offset=from_offset, end_offset=to_offset, start_ms=start_ms, end_ms=end_ms)

    _run_replay(make, bootstrap=bootstrap, topic=topic, rate=rate, dry_run=dry_run, checkpoint=checkpoint,
                restart=restart)


# ---------------------------------------------------------------------------------- redrive
def redrive(
    code: Annotated[str | None, typer.Option(help="only these error codes, comma-separated (e.g. FETCH_FAILED)")]
    = None,
    since: Annotated[str | None, typer.Option(help="only dead letters that failed at or after this time (ISO 8601 or "
                                                     "epoch ms)")]
    = None,
    until: Annotated[str | None, typer.Option(help="only dead letters that failed before this time (ISO 8601 "
                                                   "or epoch ms)")] = None,
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
    flt = RedriveFilter(codes=codes, since_ms=time_ms(since), until_ms=time_ms(until), source_topic=source_topic,
                        max_attempts=max_attempts)
    target = topic or settings.topics.input
    res = asyncio.run(run_redrive(resolve_bootstrap(bootstrap), settings.topics.dlq, target, flt, dry_run=dry_run))
    verb = "would redrive" if dry_run else "redrove"
    by_code = ", ".join(f"{c} {n}" for c, n in res.by_code.most_common()) or "none"
    console.print(f"read {res.read} dead letters from {settings.topics.dlq}; {verb} {res.redriven} to {target} "
                  f"({by_code})")
    if res.left_out:
        console.print("left out: " + ", ".join(f"{why} {n}" for why, n in res.left_out.most_common()))
    for where in res.no_value[:10]:
        console.print(f"[yellow]no original value in the dead letter; replay it from {where}[/]")
