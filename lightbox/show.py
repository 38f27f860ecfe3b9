"""Terminal output shared by the commands: a processed event as a table row, the stage latency
table, and variants saved to a folder."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from schemas.paths import safe_component
from streams.settings import Settings

__all__ = ["event_table", "print_latency_table", "save_variants"]

console = Console()


TAIL_STAGES = ("decode", "segment", "refine", "correct", "render", "encode")  # fetch and produce: see `report`


def event_table(ev: dict[str, Any], *, header: bool) -> Table:
    """One processed event as a table row (fixed widths, so rows printed one by one line up)."""
    from lightbox.report import per_event_stage_ms

    stages = per_event_stage_ms(ev)
    table = Table(show_header=header, box=None, pad_edge=False, collapse_padding=True, padding=(0, 1))
    table.add_column("sku", width=18, no_wrap=True, style="bold")
    table.add_column("variants", width=10, no_wrap=True, overflow="ellipsis")
    for s in TAIL_STAGES:  # milliseconds
        table.add_column(s, justify="right", width=7)
    table.add_column("e2e ms", justify="right", width=6)
    variants = f"{len(ev['variants'])}: " + " ".join(f"{v['width']}" for v in ev["variants"])
    table.add_row(ev["sku"], variants, *(f"{stages.get(s, 0.0):.1f}" for s in TAIL_STAGES),
                  f"{ev['latency_us'] / 1000:.0f}")
    return table


def save_variants(ev: dict[str, Any], folder: Path, reader: Callable[[str, str], bytes] | None = None) -> list[Path]:
    """Write each variant: inline bytes, or the URI's bytes through ``reader(uri, sha256)`` (see
    :func:`variant_reader`); a variant with neither is skipped."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for v in ev["variants"]:
        ext = {"jpeg": "jpg"}.get(v["format"], v["format"])
        path = folder / ".".join(safe_component(part) for part in (ev["sku"], v["preset"], ext))
        if v["data"] is not None:
            path.write_bytes(v["data"])
        elif v["uri"] and reader is not None:
            path.write_bytes(reader(v["uri"], v["sha256"]))
        else:
            continue
        out.append(path)
    return out


def variant_reader(settings: Settings) -> Callable[[str, str], bytes]:
    """Downloads variant URIs under the worker's fetch policy plus the output store's own location
    (``LIGHTBOX_OUTPUT_STORE`` or ``output_dir``), checking each against the event's sha256."""
    from dataclasses import replace

    from agents.wiring import build_fetcher
    from blobio.fetch import Fetcher
    from blobio.store import store_location

    fetcher = build_fetcher(settings.fetch, settings.limits.max_image_bytes)
    allow, roots = store_location(settings.output_store_url())
    policy = replace(fetcher.policy.with_allowed(*allow), file_roots=(*fetcher.policy.file_roots, *roots))
    reader = Fetcher(policy)
    return lambda uri, sha256: reader.fetch({"uri": uri, "sha256": sha256})


def print_latency_table(events: list[dict[str, Any]]) -> None:
    from lightbox.report import stage_table

    rows, e2e = stage_table(events)
    table = Table(title=f"lightbox stage latency over {e2e['n']} processed images")
    for col in ("stage", "mean ms", "p50 ms", "p99 ms", "share", "per image ms"):
        table.add_column(col, justify="left" if col == "stage" else "right")
    for r in rows:
        table.add_row(r.stage, f"{r.mean_ms:.1f}", f"{r.p50_ms:.1f}", f"{r.p99_ms:.1f}", f"{r.share:.0%}",
                      f"{r.per_image_ms:.1f}")
    console.print(table)
    console.print("[dim]ms: how long each image waited on the stage (a batched stage lasts as long as its batch); "
                  "per image: the stage's time divided by its batch size[/]")
    if e2e["n"]:
        console.print(f"end to end (created_at → output): p50 {e2e['p50_ms']:.0f} ms, p99 {e2e['p99_ms']:.0f} ms")
