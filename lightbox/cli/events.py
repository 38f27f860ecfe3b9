"""``lightbox tail``, ``report`` and ``audit``: what the output topics hold."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape

from lightbox.cli.common import Bootstrap, console, err, resolve_bootstrap, time_ms
from lightbox.show import event_table, print_latency_table, save_variants, variant_reader
from streams.settings import Settings


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
        async for kind, ev in read_events(resolve_bootstrap(bootstrap), [topic], from_beginning=from_beginning,
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
        return [ev async for kind, ev in read_events(resolve_bootstrap(bootstrap), [settings.topics.output],
                                                      limit=count, idle_s=idle) if kind == "processed"]

    events = asyncio.run(go())
    if not events:
        err.print(f"no processed events on {settings.topics.output}")
        raise typer.Exit(1)
    print_latency_table(events)
    if png:
        from lightbox.report import draw_stage_chart

        console.print(f"wrote {draw_stage_chart(events, png)}")


def audit(
    bootstrap: Bootstrap = None,
    input_topic: Annotated[list[str] | None, typer.Option(
        "--input-topic", help="input topic(s) to audit (default: the input and backfill topics)")] = None,
    from_offset: Annotated[int | None, typer.Option(help="first input offset, in every partition")] = None,
    to_offset: Annotated[int | None, typer.Option(help="input offsets below this, in every partition")] = None,
    since: Annotated[str | None, typer.Option(help="inputs at or after this time (ISO 8601 or epoch ms)")] = None,
    until: Annotated[str | None, typer.Option(help="inputs before this time (ISO 8601 or epoch ms)")] = None,
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
    report = asyncio.run(run_audit(resolve_bootstrap(bootstrap), topics, [settings.topics.output, settings.topics.dlq],
                                   from_offset=from_offset, to_offset=to_offset,
                                   since_ms=time_ms(since), until_ms=time_ms(until)))
    if as_json:
        console.print_json(json.dumps(report.as_dict()))
    else:
        for line, problem in report.lines():
            console.print(f"[red]{escape(line)}[/]" if problem else escape(line), soft_wrap=True)
    raise typer.Exit(0 if report.ok else 1)
