"""``lightbox process`` (the pipeline offline), ``lightbox contact-sheet`` and ``lightbox quality-report``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from lightbox import startup
from lightbox.cli.common import PRESETS, console, err, names
from lightbox.show import print_latency_table
from schemas import segment_runtimes
from schemas.errors import LightboxError
from streams.settings import Settings


def process(
    paths: Annotated[list[Path], typer.Argument(help="image files and/or folders (searched recursively)")],
    out: Annotated[Path, typer.Option("--out", "-o", help="folder for the variants and results.jsonl")],
    presets: Annotated[str, typer.Option(help="comma-separated preset names")] = PRESETS,
    device: Annotated[str | None, typer.Option(help="auto, cpu or gpu (default: $LIGHTBOX_DEVICE or auto)")] = None,
    batch: Annotated[int | None, typer.Option(help="images per batch (same size class and presets); default 4 "
                                                   "on a GPU, 1 on a CPU (there OpenVINO runs two batches side "
                                                   "by side, and small batches keep the lanes overlapping)")] = None,
    segmenter: Annotated[str | None, typer.Option(help="model, classical or none")] = None,
    runtime: Annotated[str | None, typer.Option(help=f"segment model runtime: {', '.join(segment_runtimes.NAMES)} "
                                                     "(default: $LIGHTBOX_SEGMENT_RUNTIME or auto; `lightbox doctor` "
                                                     "lists those this machine has)")] = None,
    background: Annotated[str, typer.Option(help="white, transparent or keep")] = "white",
    lighting: Annotated[bool, typer.Option("--lighting/--no-lighting", help="lighting correction")] = True,
    table: Annotated[bool, typer.Option("--table/--no-table", help="print the per-stage latency table")] = True,
) -> None:
    """The same pipeline offline, without Kafka: files in, variants out.

    The same pipeline offline, without Kafka: process image files and folders into OUT
    (`<sku>.<preset>.<ext>`) with a progress bar, write OUT/results.jsonl (one line per input,
    dead-letter reasons included) and print the per-stage latency table. Exit code 1 when
    any input became a dead letter."""
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
    wanted = names(presets)
    with err.status("loading the pipeline…"):
        try:  # a model file that is missing, unreadable, or that the runtime cannot load fails here
            # the model compiled beside the imports and the build of the rest of the pipeline
            processor, callers = startup.load_processor(settings, len(files))
        except (LightboxError, OSError) as exc:
            err.print(f"[red]cannot load the pipeline:[/] {escape(str(exc))}", soft_wrap=True)
            raise typer.Exit(2) from None
        startup.settle()  # the pipeline is built: back to the usual garbage collection
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from lightbox.offline import OfflineResult, default_batch, process_files

    err.print(f"{len(files)} files, device {processor.pipeline.device}, model {processor.model_version}")
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[failed]} dead letters"))
    try:
        with Progress(*columns, console=err) as bar:
            task = bar.add_task("processing", total=len(files), failed=0)

            def advance(res: OfflineResult) -> None:
                bar.update(task, advance=1, failed=bar.tasks[0].fields["failed"] + (not res.ok))

            size = batch or default_batch(processor.pipeline.device)
            summary = process_files(files, processor, out, presets=wanted, batch_size=size, background=background,
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


def contact_sheet(
    paths: Annotated[list[Path] | None, typer.Argument(help="image files and/or folders (default: the scikit-image "
                                                            "sample catalog)")] = None,
    out: Annotated[Path, typer.Option(help="PNG to write")] = Path("out/contact-sheet.png"),
    segmenter: Annotated[str, typer.Option(help="model (u2netp) or classical")] = "model",
    limit: Annotated[int, typer.Option(help="at most this many images")] = 24,
) -> None:
    """Before | mask | cutout sheet to check the segmentation by eye.

    Before | mask | cutout on white, one row per image: a sheet to look at the segmentation."""
    from lightbox.contact_sheet import contact_sheet_of_files, contact_sheet_of_samples

    skipped: list[tuple[Path, str]] = []
    try:
        if paths:
            path, rows, skipped = contact_sheet_of_files(paths, out, segmenter=segmenter, limit=limit)
        else:
            path, rows = contact_sheet_of_samples(out, segmenter=segmenter)
    except LightboxError as exc:
        err.print(f"[red]{escape(str(exc))}[/]")
        raise typer.Exit(1) from None
    for f, why in skipped:
        err.print(f"[yellow]skipped {f.name}: {escape(why)}[/]")
    console.print(f"wrote {path} ({rows} rows)")


def quality_report(
    out: Annotated[Path, typer.Argument(help="PNG to write")],
    folder: Annotated[Path | None, typer.Argument(help="photos (default: the sample catalog)")] = None,
    preset: Annotated[str, typer.Option(help="the preset the photos are retouched into")] = "taobao_main",
    limit: Annotated[int, typer.Option(help="at most this many photos")] = 24,
) -> None:
    """Before | mask | after with measures and flags, flagged photos first.

    Each photo through u2netp and the CPU retoucher into one preset, measured (subject share,
    holes, islands, colour cast, border white, fill, enlargement) and flagged where a seller would
    care; the flagged ones come first."""
    from lightbox.quality_report import quality_report_of

    try:
        path, rows = quality_report_of(out, folder, preset=preset, limit=limit)
    except LightboxError as exc:
        err.print(f"[red]{escape(str(exc))}[/]")
        raise typer.Exit(1) from None
    for r in sorted(rows, key=lambda r: (-len(r.flags), r.name)):
        measures = " ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.measures.items())
        console.print(f"{escape(r.name):<40} {', '.join(r.flags) or '-':<28} {measures}", highlight=False,
                      soft_wrap=True)
    console.print(f"wrote {path}")
