"""Helpers for the fault suite (tests/agents/test_faults.py): small real photos, a planned publish onto
chosen partitions, `lightbox worker` processes, committed offsets, the audit, and the table row
each scenario records.

Everything talks to a real broker; nothing here is a fake.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaConnectionError, KafkaError
from PIL import Image

from lightbox.audit import AuditReport, run_audit
from lightbox.demo import WorkerProcess
from lightbox.samples import make_bad_inputs, make_catalog
from schemas.events import EventCodecs
from streams.consume import RawRecord, read_records
from streams.producer import ImageProducer, new_traceparent
from streams.settings import Settings

MAX_SIDE = 640
PRESETS_TOML = """\
# Small presets so a CPU worker keeps up in the fault suite.
[fault_main]
width = 192
height = 192
format = "jpeg"
quality = 85
fill = 0.8

[fault_alt]
width = 144
height = 192
format = "webp"
quality = 80
fill = 0.75
"""
MAIN = ["fault_main"]
BOTH = ["fault_main", "fault_alt"]
# bad inputs: a file from make_bad_inputs, or one of these made here
EXTRA_BAD = ("unknown-preset", "missing-file", "not-avro")


def make_fault_catalog(root: Path, count: int = 64) -> tuple[list[Path], dict[str, Path], Path]:
    """``count`` real photos (skimage, via make_catalog) downscaled to <= 640 px, the bad inputs,
    and a presets file with two small presets."""
    good = make_catalog(root / "good", count)
    for path in good:
        with Image.open(path) as im:
            im.load()
            fmt = im.format or "JPEG"
            small = im.copy()
        small.thumbnail((MAX_SIDE, MAX_SIDE), Image.Resampling.LANCZOS)
        small.save(path, format=fmt, **({"quality": 88} if fmt in ("JPEG", "WEBP") else {}))
    bad = make_bad_inputs(root / "bad")
    presets = root / "presets.toml"
    presets.write_text(PRESETS_TOML)
    return good, bad, presets


# -- publishing --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Item:
    """One input to publish: an image (path, presets) or a bad input (its name)."""

    name: str
    path: Path | None = None
    presets: tuple[str, ...] = tuple(MAIN)
    bad: bool = False


@dataclass(frozen=True)
class Placed:
    partition: int
    offset: int
    item: Item


def images(paths: Iterable[Path], presets: Sequence[str] = MAIN, prefix: str = "") -> list[Item]:
    return [Item(prefix + p.stem, p, tuple(presets)) for p in paths]


def bad_items(bad: dict[str, Path]) -> list[Item]:
    return [Item(n, p, bad=True) for n, p in sorted(bad.items())] + [Item(n, bad=True) for n in EXTRA_BAD]


async def publish(bootstrap: str, topic: str, plan: Sequence[tuple[int | None, Item]],
                  codecs: EventCodecs | None = None) -> list[Placed]:
    """Publish each item (onto its partition, or by key when None); return where each landed."""
    codecs = codecs or EventCodecs.create()
    prod = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5,
                            max_request_size=48 << 20)
    await prod.start()
    try:
        futs = []
        for part, item in plan:
            value = _value(codecs, item)
            headers = [("traceparent", new_traceparent().encode())]
            futs.append(await prod.send(topic, value, key=item.name.encode(), partition=part, headers=headers))
        metas = await asyncio.gather(*futs)
    finally:
        await prod.stop()
    return [Placed(m.partition, m.offset, item) for m, (_, item) in zip(metas, plan, strict=True)]


def _value(codecs: EventCodecs, item: Item) -> bytes:
    if item.name == "not-avro":
        return b'{"sku": "json, not avro"}'
    if item.name == "missing-file":
        ev = ImageProducer.event({"uri": "file:///no/such/dir/x.jpg", "sha256": None}, sku=item.name,
                                 image_id="x.jpg", presets=MAIN)
    elif item.name == "unknown-preset":
        ev = ImageProducer.event({"data": b"\xff\xd8\xff"}, sku=item.name, image_id="x.jpg",
                                 presets=["no_such_preset"])
    else:
        assert item.path is not None
        ev = ImageProducer.event({"data": item.path.read_bytes()}, sku=item.name, image_id=item.path.name,
                                 presets=list(item.presets))
    return codecs.product.encode(ev)


def spread(items: Sequence[Item], partitions: int = 4) -> list[tuple[int | None, Item]]:
    """Round-robin over the partitions."""
    return [(i % partitions, it) for i, it in enumerate(items)]


# -- the broker's view -------------------------------------------------------------------------
async def committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """The group's committed offset per partition of ``topic`` (absent: nothing committed)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        await admin.start()
        offsets = await admin.list_consumer_group_offsets(group)
    except KafkaError as exc:  # the coordinator is still loading, or the broker restarts: nothing known yet
        if exc.retriable or isinstance(exc, KafkaConnectionError):
            return {}
        raise
    finally:
        await admin.close()
    return {tp.partition: meta.offset for tp, meta in offsets.items() if tp.topic == topic and meta.offset >= 0}


async def group_members(s: Settings) -> int:
    """Members of the group once it is stable (0 while it rebalances or does not exist)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=s.kafka.bootstrap)
    try:
        await admin.start()
        groups = await admin.describe_consumer_groups([s.kafka.group_id])
    except KafkaError as exc:
        if exc.retriable or isinstance(exc, KafkaConnectionError):
            return 0
        raise
    finally:
        await admin.close()
    group = groups[0].to_object()["groups"][0]
    return len(group["members"]) if group["state"] == "Stable" else 0


async def create_topics(bootstrap: str, topics: dict[str, dict[str, str]], partitions: int = 4) -> None:
    """Create topics with configs (e.g. a small ``max.message.bytes``) before a worker does."""
    from aiokafka.admin import NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(t, partitions, 1, topic_configs=cfg) for t, cfg in topics.items()])
    finally:
        await admin.close()


def outputs(s: Settings) -> list[RawRecord]:
    return asyncio.run(read_records(s.kafka.bootstrap, [s.topics.output, s.topics.dlq]))


def audit(s: Settings) -> AuditReport:
    t = s.topics
    return asyncio.run(run_audit(s.kafka.bootstrap, [t.input, t.backfill], [t.output, t.dlq]))


def wait_for(cond: Callable[[], Any], timeout_s: float, what: str, every_s: float = 0.5,
             alive: Callable[[], bool] | None = None) -> Any:
    """Poll ``cond`` until it returns something truthy; fail with ``what`` after ``timeout_s``."""
    end = time.monotonic() + timeout_s
    while True:
        got = cond()
        if got:
            return got
        if alive is not None and not alive():
            owner = getattr(alive, "__self__", None)
            tail = owner.log_tail(30) if isinstance(owner, WorkerProcess) else ""
            raise AssertionError(f"gave up waiting for {what}: the worker exited; its log ends:\n{tail}")
        if time.monotonic() > end:
            raise AssertionError(f"gave up waiting for {what} after {timeout_s:.0f} s")
        time.sleep(every_s)


def ends_of(placed: Sequence[Placed]) -> dict[int, int]:
    """The log end (next offset) per partition after a publish."""
    ends: dict[int, int] = {}
    for pl in placed:
        ends[pl.partition] = max(ends.get(pl.partition, 0), pl.offset + 1)
    return ends


def wait_drained(s: Settings, ends: dict[int, int], timeout_s: float, alive: Callable[[], bool] | None = None
                 ) -> dict[int, int]:
    """Wait until the group has committed every partition up to ``ends``: the workers have done
    (and acknowledged) all they will ever do with these inputs."""
    def done() -> dict[int, int] | None:
        got = asyncio.run(committed(s.kafka.bootstrap, s.kafka.group_id, s.topics.input))
        return got if all(got.get(p, 0) >= end for p, end in ends.items()) else None

    result: dict[int, int] = wait_for(done, timeout_s, f"the group to commit up to {ends}", alive=alive)
    return result


# -- workers -----------------------------------------------------------------------------------
def worker_env(s: Settings, presets: Path, **extra: str) -> dict[str, str]:
    env = {"LIGHTBOX_KAFKA_BOOTSTRAP": s.kafka.bootstrap, "LIGHTBOX_GROUP_ID": s.kafka.group_id,
           "LIGHTBOX_INPUT_TOPIC": s.topics.input, "LIGHTBOX_OUTPUT_TOPIC": s.topics.output,
           "LIGHTBOX_DLQ_TOPIC": s.topics.dlq, "LIGHTBOX_BACKFILL_TOPIC": s.topics.backfill,
           "LIGHTBOX_DATA_DIR": str(s.worker.data_dir), "LIGHTBOX_DEVICE": "cpu", "LIGHTBOX_SEGMENTER": "classical",
           "LIGHTBOX_PRESETS_FILE": str(presets), "LIGHTBOX_SESSION_TIMEOUT_S": "6",
           "OMP_NUM_THREADS": "1",
           # the backfill process's metrics default to the worker's port + 1, which another test's
           # ephemeral port may hold: none unless a test names one
           "LIGHTBOX_BACKFILL_METRICS_PORT": "0"}
    env.update({k if k.startswith(("LIGHTBOX_", "OMP_")) else f"LIGHTBOX_{k.upper()}": v for k, v in extra.items()})
    return env


class Worker(WorkerProcess):
    """A ``lightbox worker`` child process, with its peak RSS sampled while the test waits."""

    peak_rss: int = 0

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def rss(self) -> int:
        """Resident set size in bytes (0 once gone)."""
        try:
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
                    self.peak_rss = max(self.peak_rss, rss)
                    return rss
        except OSError:
            pass
        return 0

    def bytes_read(self) -> int:
        """Bytes the process has read through read(2)/recv(2), sockets included (``rchar``)."""
        try:
            for line in Path(f"/proc/{self.pid}/io").read_text().splitlines():
                if line.startswith("rchar:"):
                    return int(line.split()[1])
        except OSError:
            pass
        return 0

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def terminate(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)

    def exit_code(self, timeout_s: float) -> int | None:
        """Wait up to ``timeout_s`` for the process to end; its exit code, or None if it runs on."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout_s)
        except Exception:  # subprocess.TimeoutExpired
            return None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


# -- the scenario table ------------------------------------------------------------------------
@dataclass
class Row:
    scenario: str
    inputs: int = 0
    processed: int = 0
    dead_letters: int = 0
    missing: int = 0
    duplicates: int = 0
    identical: bool = True
    recover_s: float | None = None
    notes: dict[str, Any] = field(default_factory=dict)

    def fill(self, rep: AuditReport) -> Row:
        self.inputs, self.processed, self.dead_letters = rep.inputs, rep.processed, rep.dead_letters
        self.missing, self.duplicates, self.identical = len(rep.missing), rep.duplicates, rep.duplicates_identical
        return self

    def save(self) -> None:
        """Append to ``$LIGHTBOX_FAULT_TABLE`` (JSON lines) when set; always print."""
        line = json.dumps(asdict(self))
        print(f"fault-row {line}")
        path = os.environ.get("LIGHTBOX_FAULT_TABLE")
        if path:
            with open(path, "a") as f:
                f.write(line + "\n")
