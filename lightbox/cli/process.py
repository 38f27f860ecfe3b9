"""``lightbox process`` (the pipeline offline) and ``lightbox contact-sheet``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from lightbox.cli.common import console, err
from lightbox.show import print_latency_table
from streams.settings import Settings


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
