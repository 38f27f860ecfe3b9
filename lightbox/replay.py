"""``lightbox replay``: publish a backfill to the backfill topic at a set rate, resumably.

Sources (each yields items in a fixed order, so a job can stop and continue):

- :class:`ManifestSource` — a CSV or JSON Lines manifest (``streams.producer.read_manifest``, the
  reader ``lightbox produce`` uses): one event per row.
- :class:`FolderSource` — image files under a folder, sorted by path: one event per file
  (``file://`` URIs by default, inline bytes on request).
- :class:`PrefixSource` — image objects under an object-store prefix (``s3://`` ``gs://`` ``az://``,
  listed through :func:`blobio.fetch.objects.list_objects`), sorted by key: one event per object
  with its URL as ``source.uri`` (workers fetch it themselves). The sorted listing is fixed at the
  first run, in a file beside the checkpoint.
- :class:`TopicSource` — an offset or time range of the input topic: each record is re-published
  unchanged (same value, so the same ``event_id``: with the same pipeline and model versions the
  outputs get the same ids and bytes, and downstream dedupes; with a new version, new ids), with a
  ``lightbox-replay-of: topic:partition:offset`` header naming the original.

Every published record carries ``lightbox-replay-job`` (the job id: a hash of the source and the
target topic) and ``lightbox-replay-position`` (``part:seq``: the item's place in its source — the
row or file index in part 0, or the source partition and offset; records of earlier versions carry
it as ``lightbox-replay-seq``, which is still read).

Resume, without gaps or repeats. The checkpoint file (JSON, replaced atomically) keeps per part
the first ``seq`` not yet acknowledged by the brokers (every item before it is), the plan fixed
at the first run (rows, files, a prefix's sorted listing — in a file beside the checkpoint — or the
concrete offset ranges a time range resolved to), and per target partition the offset from which
records of this job past the cursor may sit. Running the same command again reads the target
topic from there, skips the items it finds (published after the last checkpoint, before the stop —
a ``kill -9`` included) and publishes the rest.

Pacing: a :class:`~lightbox.ratelimit.TokenBucket` (images per second); ``dry_run`` counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import tempfile
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from lightbox.ratelimit import TokenBucket
from schemas.events import EventCodecs
from streams import clients
from streams.registry import default_codecs
from streams.settings import DEFAULT_PRESETS

__all__ = ["REPLAY_JOB_HEADER", "REPLAY_OF_HEADER", "REPLAY_POSITION_HEADER", "REPLAY_SEQ_HEADER", "Checkpoint",
           "Defaults", "FolderSource", "ManifestSource", "PrefixSource", "ReplayError", "ReplayItem", "ReplayProgress",
           "ReplayResult", "ReplaySource", "TopicSource", "default_checkpoint", "job_id", "replay_position",
           "run_replay"]

REPLAY_JOB_HEADER = "lightbox-replay-job"
REPLAY_POSITION_HEADER = "lightbox-replay-position"
REPLAY_SEQ_HEADER = "lightbox-replay-seq"  # the position header of earlier versions: read, no longer written
REPLAY_OF_HEADER = "lightbox-replay-of"
CHECKPOINT_VERSION = 1
_NS = uuid.UUID("1b0f1c7e-5d0a-4f43-8d5e-3c9a4b2e7f61")
Headers = list[tuple[str, bytes]]
Plan = dict[str, Any]


class ReplayError(RuntimeError):
    """A replay that cannot start or go on (a checkpoint of another job, a source that changed)."""


@dataclass(frozen=True, slots=True)
class ReplayItem:
    part: int
    seq: int
    key: bytes | None
    value: bytes
    headers: Headers = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Defaults:
    """Presets and options for items that do not name their own."""

    presets: tuple[str, ...] = DEFAULT_PRESETS
    merchant_id: str = "catalog"
    background: str = "WHITE"
    lighting: str = "AUTO"
    segmentation: str = "AUTO"

    def spec(self) -> dict[str, Any]:
        return {"presets": list(self.presets), "merchant_id": self.merchant_id, "background": self.background.upper(),
                "lighting": self.lighting.upper(), "segmentation": self.segmentation.upper()}


class ReplaySource(Protocol):
    def spec(self) -> dict[str, Any]:
        """What identifies the job (JSON-able); part of the job id."""
        ...

    async def plan(self, state: Path | None = None) -> Plan:
        """Fixed at the first run and kept in the checkpoint; holds ``total``. ``state``: the
        checkpoint file, beside which a source may keep what the plan is too big to hold (None: a
        dry run, which writes nothing)."""
        ...

    def items(self, job: str, plan: Plan, cursor: Mapping[int, int]) -> AsyncIterator[ReplayItem]:
        """The items from ``cursor`` on (per part, the first seq to publish), in order."""
        ...


def job_id(spec: Mapping[str, Any], topic: str) -> str:
    text = json.dumps({"spec": spec, "topic": topic}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def _event_id(job: str, part: int, seq: int) -> str:
    """Deterministic: the same job publishes the same event ids on any run."""
    return str(uuid.uuid5(_NS, f"{job}|{part}|{seq}"))


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _traceparent() -> bytes:
    from streams.producer import new_traceparent

    return new_traceparent().encode()


def _named_item(codecs: EventCodecs, d: Defaults, job: str, index: int, name: str,
                source: dict[str, Any]) -> ReplayItem:
    """The event for an image file or object called ``name`` (SKU: its stem), keyed by SKU, with the
    job's fixed event id (:meth:`streams.producer.ImageProducer.event` builds it, as for ``produce``)."""
    import mimetypes
    from pathlib import PurePosixPath

    from streams.producer import ImageProducer

    sku = PurePosixPath(name).stem
    ev = ImageProducer.event(source, sku=sku, image_id=name, presets=d.presets, merchant_id=d.merchant_id,
                             content_type=mimetypes.guess_type(name)[0], background=d.background,
                             lighting=d.lighting, segmentation=d.segmentation, event_id=_event_id(job, 0, index))
    return ReplayItem(0, index, sku.encode(), codecs.product.encode(ev), [("traceparent", _traceparent())])


# ------------------------------------------------------------------------------------ sources
def _backfill_topic() -> str:
    from streams.settings import Settings

    return Settings().topics.backfill


class ManifestSource:
    """A catalog manifest, read with :func:`streams.producer.read_manifest` (the reader ``lightbox
    produce`` uses): one event per row, ``file://`` URIs for local paths (never inline bytes)."""

    def __init__(self, path: Path, defaults: Defaults, *, codecs: EventCodecs | None = None) -> None:
        from streams.producer import read_manifest

        self.path, self.defaults = path.resolve(), defaults
        if not self.path.is_file():
            raise ReplayError(f"{path}: no such manifest file")
        self.codecs = codecs or default_codecs(product_topic=_backfill_topic())
        digest = hashlib.sha256()
        with self.path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        self._sha256 = digest.hexdigest()
        self._rows = sum(1 for _ in read_manifest(self.path))  # checks every row before anything is sent

    def spec(self) -> dict[str, Any]:
        return {"kind": "manifest", "path": str(self.path), "sha256": self._sha256, **self.defaults.spec()}

    async def plan(self, state: Path | None = None) -> Plan:
        return {"total": self._rows}

    async def items(self, job: str, plan: Plan, cursor: Mapping[int, int]) -> AsyncIterator[ReplayItem]:
        from streams.producer import ImageProducer, read_manifest

        d, start = self.defaults, cursor.get(0, 0)
        for index, row in enumerate(read_manifest(self.path)):
            if index < start:
                continue
            ev = ImageProducer.event_for_row(row, base=self.path.parent, presets=d.presets, inline=False,
                                             merchant_id=d.merchant_id, background=d.background)
            ev["event_id"] = _event_id(job, 0, index)
            yield ReplayItem(0, index, row.sku.encode(), self.codecs.product.encode(ev),
                             [("traceparent", _traceparent())])


class FolderSource:
    def __init__(self, folder: Path, defaults: Defaults, *, inline: bool = False,
                 codecs: EventCodecs | None = None) -> None:
        from streams.producer import iter_image_files

        self.folder, self.defaults, self.inline = folder.resolve(), defaults, inline
        if not self.folder.is_dir():
            raise ReplayError(f"{folder}: not a folder")
        self.codecs = codecs or default_codecs(product_topic=_backfill_topic())
        self.files = list(iter_image_files([self.folder]))
        listing = hashlib.sha256()
        for f in self.files:
            listing.update(f"{f.relative_to(self.folder)}\0{f.stat().st_size}\n".encode())
        self._listing = listing.hexdigest()

    def spec(self) -> dict[str, Any]:
        return {"kind": "folder", "path": str(self.folder), "listing": self._listing, "inline": self.inline,
                **self.defaults.spec()}

    async def plan(self, state: Path | None = None) -> Plan:
        return {"total": len(self.files)}

    async def items(self, job: str, plan: Plan, cursor: Mapping[int, int]) -> AsyncIterator[ReplayItem]:
        for index in range(cursor.get(0, 0), len(self.files)):
            f = self.files[index]
            source: dict[str, Any] = {"data": f.read_bytes()} if self.inline else {"uri": f.as_uri(), "sha256": None}
            yield _named_item(self.codecs, self.defaults, job, index, f.name, source)


class PrefixSource:
    """Image objects under an object-store prefix (``s3://bucket/prefix/``, ``gs://…``, ``az://container/…``).

    The store is opened as the workers' fetcher opens it (:func:`blobio.fetch.objects.open_bucket`:
    credentials from the cloud's standard environment, ``endpoint`` for an S3-compatible server). The
    prefix names whole path segments (``photos/2024`` lists ``photos/2024/…``, not ``photos/2024-01/…``).
    Kept: objects with an image suffix (:data:`streams.producer.IMAGE_SUFFIXES`, any case), or those
    matching ``pattern`` instead (``fnmatch``; a pattern without ``/`` is matched against the key's
    name, one with ``/`` against the key below the prefix); never zero-byte objects (folder markers)
    or keys ending in ``/``.

    The listing is sorted by key and fixed at the first run: the keys go to ``<checkpoint>.keys``
    (one JSON string a line, written once, its sha256 in the plan), so a resumed run publishes the
    same items in the same order whatever was added to or removed from the prefix since. One event
    per key, ``source.uri`` the object's URL (no bytes), SKU the name without suffix."""

    def __init__(self, url: str, defaults: Defaults, *, pattern: str | None = None, endpoint: str | None = None,
                 codecs: EventCodecs | None = None) -> None:
        from urllib.parse import unquote, urlsplit

        from blobio.fetch.objects import open_bucket
        from blobio.fetch.policy import BUCKET_SCHEMES

        parts = urlsplit(url)
        self.scheme, self.bucket = parts.scheme.lower(), parts.netloc
        if self.scheme not in BUCKET_SCHEMES or not self.bucket or parts.query or parts.fragment:
            raise ReplayError(f"{url!r} is not an object-store prefix: expected s3://bucket/prefix/, "
                              "gs://bucket/prefix/ or az://container/prefix/")
        self.prefix = unquote(parts.path).strip("/")
        self.pattern = pattern or None
        self.endpoint = endpoint if self.scheme == "s3" else None
        self.defaults = defaults
        self.codecs = codecs or default_codecs(product_topic=_backfill_topic())
        self._keys: list[str] | None = None
        try:
            self.store = open_bucket(self.scheme, self.bucket, endpoint=self.endpoint)
        except Exception as exc:  # obstore's configuration errors; their text may hold settings
            raise ReplayError(f"{self.url}: cannot open the store ({type(exc).__name__})") from None

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.prefix}{'/' if self.prefix else ''}"

    def spec(self) -> dict[str, Any]:
        return {"kind": "prefix", "url": self.url, "pattern": self.pattern, "endpoint": self.endpoint,
                **self.defaults.spec()}

    def object_url(self, key: str) -> str:
        """``scheme://bucket/key``, the key percent-encoded (the fetcher decodes it)."""
        from urllib.parse import quote

        return f"{self.scheme}://{self.bucket}/{quote(key, safe='/')}"

    def wanted(self, key: str, size: int) -> bool | None:
        """True: an image to publish; False: not an image (or not matching); None: a folder marker."""
        import fnmatch
        from pathlib import PurePosixPath

        from streams.producer import IMAGE_SUFFIXES

        if size == 0 or key.endswith("/"):
            return None
        name = PurePosixPath(key).name
        if self.pattern is None:
            return PurePosixPath(name).suffix.lower() in IMAGE_SUFFIXES
        below = key[len(self.prefix):].lstrip("/") if self.prefix else key
        return fnmatch.fnmatchcase(below if "/" in self.pattern else name, self.pattern)

    async def _list(self) -> tuple[list[str], int, int]:
        """(sorted image keys, objects left out, folder markers) under the prefix."""
        from blobio.fetch.objects import ListingFailed, list_objects

        keys: list[str] = []
        other = markers = 0
        try:
            async for key, size in list_objects(self.store, self.prefix):
                keep = self.wanted(key, size)
                if keep:
                    keys.append(key)
                elif keep is None:
                    markers += 1
                else:
                    other += 1
        except ListingFailed as exc:  # says why, never the store's message
            raise ReplayError(f"{self.url}: cannot list the prefix ({exc})") from None
        keys.sort()  # code-point order, which is the UTF-8 byte order S3 lists in; fixed whatever the store does
        return keys, other, markers

    async def plan(self, state: Path | None = None) -> Plan:
        keys, other, markers = await self._list()
        if not keys:
            raise ReplayError(f"{self.url}: no image objects under the prefix ({other} other objects, {markers} "
                              f"empty ones{'; --pattern ' + repr(self.pattern) if self.pattern else ''})")
        self._keys = keys
        note = f"left out {other} non-image object(s) and {markers} empty one(s) (folder markers)"
        plan: Plan = {"total": len(keys), "first": keys[0], "last": keys[-1], "note": note, "listing": None}
        if state is not None:
            listing = state.with_name(state.name + ".keys")
            plan["listing"], plan["listing_sha256"] = str(listing), _write_lines(listing, keys)
        return plan

    def _listed(self, plan: Plan) -> list[str]:
        """The keys fixed at the first run (from the listing file on a resumed run)."""
        if plan.get("listing") is None:
            if self._keys is None:
                raise ReplayError(f"{self.url}: the plan holds no listing")
            return self._keys
        path = Path(plan["listing"])
        try:
            text = path.read_bytes()
        except OSError as exc:
            raise ReplayError(f"{path}: the listing of this job's first run cannot be read ({type(exc).__name__}); "
                              "--restart lists the prefix again") from None
        if hashlib.sha256(text).hexdigest() != plan.get("listing_sha256"):
            raise ReplayError(f"{path}: the listing of this job's first run has changed; --restart lists the prefix "
                              "again")
        keys = [str(json.loads(line)) for line in text.decode().splitlines()]
        if len(keys) != plan["total"]:
            raise ReplayError(f"{path}: {len(keys)} keys, the plan says {plan['total']}")
        return keys

    async def items(self, job: str, plan: Plan, cursor: Mapping[int, int]) -> AsyncIterator[ReplayItem]:
        from pathlib import PurePosixPath

        keys = self._listed(plan)
        for index in range(cursor.get(0, 0), len(keys)):
            key = keys[index]
            source = {"uri": self.object_url(key), "sha256": None}
            yield _named_item(self.codecs, self.defaults, job, index, PurePosixPath(key).name, source)


def _write_lines(path: Path, keys: Sequence[str]) -> str:
    """Write one JSON string a line, atomically; return the file's sha256."""
    body = "".join(json.dumps(k) + "\n" for k in keys).encode()
    _write_durably(path, body)
    return hashlib.sha256(body).hexdigest()


def _write_durably(path: Path, body: bytes) -> None:
    """Replace ``path`` with ``body`` all at once (a temporary file, fsync, rename): a crash leaves the
    old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class TopicSource:
    """A range of ``topic``: per partition from ``start`` to ``end`` (exclusive), given as offsets
    (``*_offset``, the same for every partition) or times (``*_ms``: the first record at or after
    it). Unset: from the beginning, to the end at the first run."""

    def __init__(self, bootstrap: str, topic: str, *, partitions: Sequence[int] | None = None,
                 start_offset: int | None = None, end_offset: int | None = None,
                 start_ms: int | None = None, end_ms: int | None = None,
                 security: Mapping[str, Any] | None = None) -> None:
        if start_offset is not None and start_ms is not None:
            raise ReplayError("give a start offset or a start time, not both")
        if end_offset is not None and end_ms is not None:
            raise ReplayError("give an end offset or an end time, not both")
        self.bootstrap, self.topic = bootstrap, topic
        self.partitions = sorted(set(partitions)) if partitions else None
        self.start_offset, self.end_offset, self.start_ms, self.end_ms = start_offset, end_offset, start_ms, end_ms
        self.security = security

    def spec(self) -> dict[str, Any]:
        return {"kind": "topic", "topic": self.topic, "partitions": self.partitions,
                "start_offset": self.start_offset, "end_offset": self.end_offset,
                "start_ms": self.start_ms, "end_ms": self.end_ms}

    async def plan(self, state: Path | None = None) -> Plan:
        from aiokafka import TopicPartition

        known = await _partitions(self.bootstrap, self.security, self.topic)
        if not known:
            raise ReplayError(f"topic {self.topic!r} does not exist on {self.bootstrap}")
        wanted = self.partitions or sorted(known)
        unknown = [p for p in wanted if p not in known]
        if unknown:
            raise ReplayError(f"topic {self.topic!r} has no partition(s) {unknown} (it has {sorted(known)})")
        async with clients.consumer(self.bootstrap, security=self.security) as consumer:
            tps = [TopicPartition(self.topic, p) for p in wanted]
            first = await consumer.beginning_offsets(tps)
            last = await consumer.end_offsets(tps)

            async def at_time(ms: int | None, offset: int | None, default: Mapping[Any, int]) -> dict[Any, int]:
                if offset is not None:
                    return {tp: min(max(offset, first[tp]), last[tp]) for tp in tps}
                if ms is None:
                    return dict(default)
                found = await consumer.offsets_for_times({tp: ms for tp in tps})
                return {tp: (found[tp].offset if found.get(tp) is not None else last[tp]) for tp in tps}

            start = await at_time(self.start_ms, self.start_offset, first)
            end = await at_time(self.end_ms, self.end_offset, last)
        ranges = {str(tp.partition): [start[tp], max(start[tp], end[tp])] for tp in tps}
        return {"ranges": ranges, "total": sum(e - s for s, e in ranges.values())}

    async def items(self, job: str, plan: Plan, cursor: Mapping[int, int]) -> AsyncIterator[ReplayItem]:
        from aiokafka import TopicPartition

        todo = {int(p): (max(s, cursor.get(int(p), s)), e) for p, (s, e) in plan["ranges"].items()}
        todo = {p: r for p, r in todo.items() if r[0] < r[1]}
        if not todo:
            return
        async with clients.consumer(self.bootstrap, security=self.security) as consumer:
            tps = {p: TopicPartition(self.topic, p) for p in todo}
            consumer.assign(list(tps.values()))
            for p, (s, _) in todo.items():
                consumer.seek(tps[p], s)
            while todo:
                batch = await consumer.getmany(*[tps[p] for p in todo], timeout_ms=500, max_records=200)
                for tp, records in batch.items():
                    for r in records:
                        span = todo.get(tp.partition)
                        if span is None or r.offset >= span[1]:
                            continue
                        kept = [(k, bytes(v or b"")) for k, v in (r.headers or ())
                                if k not in (REPLAY_JOB_HEADER, REPLAY_POSITION_HEADER, REPLAY_SEQ_HEADER,
                                             REPLAY_OF_HEADER, "traceparent",
                                             "tracestate")]
                        of = f"{tp.topic}:{tp.partition}:{r.offset}".encode()
                        yield ReplayItem(tp.partition, r.offset, r.key, r.value or b"",
                                         [*kept, ("traceparent", _traceparent()), (REPLAY_OF_HEADER, of)])
                for p in list(todo):  # done once the position passed the end (gaps, compaction)
                    if await consumer.position(tps[p]) >= todo[p][1]:
                        del todo[p]


async def _partitions(bootstrap: str, security: Mapping[str, Any] | None, topic: str) -> set[int] | None:
    """The topic's partitions, from a fresh metadata request (None: no such topic)."""
    from streams.clients import topic_partitions

    found = (await topic_partitions(bootstrap, [topic], security)).get(topic)
    return set(found) if found else None


# ------------------------------------------------------------------------------------ progress
class ReplayProgress:
    """Per part, which items the brokers acknowledged; pure.

    ``cursor[part]``: every item of the part before it is acknowledged (or was found published).
    ``scan_from[partition]``: on the target topic, no record of this job past the cursor sits
    below it (a partition's records keep their send order: idempotent producer)."""

    def __init__(self, cursor: Mapping[int, int] | None = None, scan_from: Mapping[int, int] | None = None) -> None:
        self.cursor: dict[int, int] = dict(cursor or {})
        self.scan_from: dict[int, int] = dict(scan_from or {})
        self.done = 0
        self._parts: dict[int, OrderedDict[int, bool]] = {}
        self._uncovered: dict[tuple[int, int], tuple[int, int]] = {}  # acked past the cursor: where
        self._covered_end: dict[int, int] = {}

    @property
    def pending(self) -> int:
        return sum(sum(1 for d in q.values() if not d) for q in self._parts.values())

    def sent(self, part: int, seq: int) -> None:
        self._parts.setdefault(part, OrderedDict())[seq] = False

    def acked(self, part: int, seq: int, where: tuple[int, int] | None = None) -> None:
        """``where``: (partition, offset) the record got; ``None`` for an item found already published."""
        queue = self._parts[part]
        if queue.get(seq, True):
            raise ValueError(f"ReplayProgress.acked: part {part} seq {seq} was not sent or is acknowledged already")
        queue[seq] = True
        self.done += 1
        if where is not None:
            self._uncovered[(part, seq)] = where
        while queue:
            head, ok = next(iter(queue.items()))
            if not ok:
                break
            queue.popitem(last=False)
            self.cursor[part] = head + 1
            at = self._uncovered.pop((part, head), None)
            if at is not None:
                self._covered_end[at[0]] = max(self._covered_end.get(at[0], -1), at[1] + 1)

    def snapshot_scan_from(self) -> dict[int, int]:
        """Per target partition: records past the cursor (acknowledged or still in flight) sit at or after it."""
        out = dict(self.scan_from)
        for partition, end in self._covered_end.items():
            out[partition] = max(out.get(partition, end), end)
        for partition, offset in self._uncovered.values():
            out[partition] = min(out.get(partition, offset), offset)
        return out


@dataclass
class Checkpoint:
    job: str
    topic: str
    spec: dict[str, Any]
    plan: Plan
    cursor: dict[int, int] = field(default_factory=dict)
    scan_from: dict[int, int] = field(default_factory=dict)
    published: int = 0
    complete: bool = False

    @classmethod
    def load(cls, path: Path) -> Checkpoint | None:
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, json.JSONDecodeError) as exc:
            raise ReplayError(f"{path}: cannot read the checkpoint ({type(exc).__name__})") from None
        if raw.get("version") != CHECKPOINT_VERSION:
            raise ReplayError(f"{path}: checkpoint version {raw.get('version')!r} is not {CHECKPOINT_VERSION}")
        return cls(job=raw["job"], topic=raw["topic"], spec=raw["spec"], plan=raw["plan"],
                   cursor={int(k): int(v) for k, v in raw["cursor"].items()},
                   scan_from={int(k): int(v) for k, v in raw["scan_from"].items()},
                   published=int(raw["published"]), complete=bool(raw["complete"]))

    def save(self, path: Path) -> None:
        body = {"version": CHECKPOINT_VERSION, "job": self.job, "topic": self.topic, "spec": self.spec,
                "plan": self.plan, "cursor": {str(k): v for k, v in sorted(self.cursor.items())},
                "scan_from": {str(k): v for k, v in sorted(self.scan_from.items())},
                "published": self.published, "complete": self.complete, "updated_ms": _now_ms()}
        _write_durably(path, json.dumps(body, indent=1).encode())


def default_checkpoint(job: str) -> Path:
    from lightbox.devservers.kafka_local import cache_dir

    return cache_dir() / "replay" / f"{job}.json"


@dataclass
class ReplayResult:
    job: str
    total: int
    published: int  # over every run of the job, this one included
    this_run: int
    skipped: int  # found already published past the checkpoint (after an interruption)
    complete: bool
    checkpoint: Path | None
    dry_run: bool = False
    note: str | None = None  # what the source left out (e.g. non-image objects under a prefix)


def replay_position(headers: Mapping[str, bytes]) -> tuple[int, int] | None:
    """``(part, seq)`` of a replayed record from its headers (the current header, else the one of
    earlier versions), or None when it has neither or it does not parse."""
    raw = headers.get(REPLAY_POSITION_HEADER) or headers.get(REPLAY_SEQ_HEADER)
    part, sep, seq = (raw or b"").decode(errors="replace").partition(":")
    if not sep or not part.isdigit() or not seq.isdigit():
        return None
    return int(part), int(seq)


async def _already_published(bootstrap: str, security: Mapping[str, Any] | None, topic: str, job: str,
                             scan_from: Mapping[int, int]) -> tuple[set[tuple[int, int]], dict[int, int]]:
    """(part, seq) of this job's records on ``topic`` from ``scan_from`` to the end, and the end
    offset of every partition of ``topic`` now."""
    from aiokafka import TopicPartition

    found: set[tuple[int, int]] = set()
    known = await _partitions(bootstrap, security, topic)
    if not known:
        raise ReplayError(f"target topic {topic!r} does not exist on {bootstrap} (`lightbox worker` creates it)")
    async with clients.consumer(bootstrap, security=security) as consumer:
        tps = {p: TopicPartition(topic, p) for p in sorted(known)}
        end_offsets = await consumer.end_offsets(list(tps.values()))
        ends = {p: end_offsets[tp] for p, tp in tps.items()}
        todo = {p for p in tps if scan_from.get(p, ends[p]) < ends[p]}
        if todo:
            consumer.assign([tps[p] for p in todo])
            for p in todo:
                consumer.seek(tps[p], scan_from[p])
        while todo:
            batch = await consumer.getmany(*[tps[p] for p in todo], timeout_ms=500, max_records=500)
            for records in batch.values():
                for r in records:
                    headers = dict(r.headers or ())
                    if headers.get(REPLAY_JOB_HEADER) == job.encode() and (at := replay_position(headers)):
                        found.add(at)
            for p in list(todo):
                if await consumer.position(tps[p]) >= ends[p]:
                    todo.discard(p)
    return found, ends


async def run_replay(source: ReplaySource, *, bootstrap: str, topic: str, rate: float | None = None,
                     checkpoint: Path | None = None, restart: bool = False, dry_run: bool = False,
                     security: Mapping[str, Any] | None = None, max_in_flight: int = 256,
                     checkpoint_every_s: float = 1.0, stop: asyncio.Event | None = None,
                     on_progress: Callable[[int, int], None] | None = None,
                     clock: Callable[[], float] = time.monotonic,
                     sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> ReplayResult:
    """Publish ``source`` to ``topic`` (see the module docstring). ``checkpoint``: the file (default
    :func:`default_checkpoint`); ``restart`` forgets it. ``stop`` set: finish what is in flight,
    save the checkpoint and return (``complete`` False). ``on_progress(done, total)``."""
    spec = source.spec()
    job = job_id(spec, topic)
    path = checkpoint or default_checkpoint(job)
    ckpt = None if restart else Checkpoint.load(path)
    if ckpt is not None and ckpt.job != job:
        raise ReplayError(f"{path} is the checkpoint of another replay job ({ckpt.job}, to {ckpt.topic}; this one is "
                          f"{job}): the source or the options differ. Use another --checkpoint, or --restart")
    if ckpt is None:
        ckpt = Checkpoint(job=job, topic=topic, spec=spec, plan=await source.plan(None if dry_run else path))
    total = int(ckpt.plan["total"])
    if dry_run or ckpt.complete:
        return ReplayResult(job, total, ckpt.published, 0, 0, ckpt.complete, path, dry_run=dry_run,
                            note=ckpt.plan.get("note"))

    from streams.clients import new_producer

    skip, ends = await _already_published(bootstrap, security, topic, job, ckpt.scan_from)
    # what this run publishes lands past today's end: scan from there after an interruption
    progress = ReplayProgress(ckpt.cursor, {p: ckpt.scan_from.get(p, end) for p, end in ends.items()})
    base = ckpt.published
    bucket = TokenBucket(rate, clock=clock) if rate else None
    slots = asyncio.Semaphore(max_in_flight)
    failure: list[BaseException] = []
    sends: set[asyncio.Future[Any]] = set()
    last_save = clock()

    def save(complete: bool = False) -> None:
        ckpt.cursor, ckpt.scan_from = dict(progress.cursor), progress.snapshot_scan_from()
        ckpt.published, ckpt.complete = base + progress.done, complete
        ckpt.save(path)

    def report() -> None:
        if on_progress is not None:
            on_progress(base + progress.done, total)

    def on_sent(part: int, seq: int, fut: asyncio.Future[Any]) -> None:
        slots.release()
        sends.discard(fut)
        if fut.cancelled() or fut.exception() is not None:
            failure.append(fut.exception() or asyncio.CancelledError())
            return
        meta = fut.result()
        progress.acked(part, seq, (meta.partition, meta.offset))
        report()

    save()  # the plan (a time range's offsets) is fixed from now on
    producer = await new_producer(bootstrap, security)
    await producer.start()
    skipped, exhausted = 0, True
    try:
        async for item in source.items(job, ckpt.plan, ckpt.cursor):
            if failure:
                raise failure[0]
            if stop is not None and stop.is_set():
                exhausted = False
                break
            progress.sent(item.part, item.seq)
            if (item.part, item.seq) in skip:
                progress.acked(item.part, item.seq)
                skipped += 1
                report()
                continue
            if bucket is not None:
                wait = bucket.take()
                if wait > 0:
                    await sleep(wait)
            await slots.acquire()
            headers = [*item.headers, (REPLAY_JOB_HEADER, job.encode()),
                       (REPLAY_POSITION_HEADER, f"{item.part}:{item.seq}".encode())]
            fut = await producer.send(topic, item.value, key=item.key, headers=headers)
            sends.add(fut)
            fut.add_done_callback(lambda f, part=item.part, seq=item.seq: on_sent(part, seq, f))
            if clock() - last_save >= checkpoint_every_s:
                save()
                last_save = clock()
        await producer.flush()
        if sends:
            await asyncio.gather(*list(sends), return_exceptions=True)
        if failure:
            raise failure[0]
        save(complete=exhausted and progress.pending == 0)
        return ReplayResult(job, total, base + progress.done, progress.done - skipped, skipped,
                            ckpt.complete, path, note=ckpt.plan.get("note"))
    except BaseException:
        with contextlib.suppress(Exception):
            save()  # what the brokers acknowledged so far
        raise
    finally:
        await producer.stop()
