"""Library for catalog-ingest producers: build and publish ``ProductImageEvent``s.

    async with ImageProducer("127.0.0.1:9092") as p:
        await p.publish(p.event_for_file(Path("SKU-1.jpg"), presets=["jd_main"]))
"""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import json
import mimetypes
import os
import time
import uuid
from collections.abc import Awaitable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import unquote, urlsplit

from schemas.events import EventCodecs
from streams.security import client_kwargs

__all__ = ["IMAGE_SUFFIXES", "ImageProducer", "ManifestError", "ManifestRow", "iter_image_files", "new_traceparent",
           "read_manifest", "rows_to_publish", "sku_from_uri"]

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp"}


def iter_image_files(paths: Iterable[str | Path]) -> Iterator[Path]:
    """Files given directly (any name), and image files (by suffix) found under folders, sorted."""
    for p in map(Path, paths):
        if p.is_dir():
            yield from sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES)
        elif p.exists():
            yield p
        else:
            raise FileNotFoundError(f"no such file or folder: {p}")


class ManifestError(ValueError):
    """A manifest row that cannot become an event; the message names the file and line."""


@dataclass(frozen=True)
class ManifestRow:
    """One image of a catalog manifest. ``source`` is a URI, or a local path relative to the manifest."""

    sku: str
    source: str
    presets: tuple[str, ...] | None = None
    image_id: str | None = None
    merchant_id: str | None = None
    background: str | None = None
    lighting: str | None = None
    segmentation: str | None = None
    priority: int | None = None
    sha256: str | None = None

    @property
    def is_uri(self) -> bool:
        return "://" in self.source


MANIFEST_FIELDS = {f.name for f in dataclasses.fields(ManifestRow)} | {"uri", "path", "merchant"}


def _row(raw: dict[str, Any], where: str) -> ManifestRow:
    unknown = sorted(k for k in raw if k not in MANIFEST_FIELDS and k)
    if unknown:
        raise ManifestError(f"{where}: unknown column(s) {', '.join(map(repr, unknown))}")
    vals = {k: (v.strip() if isinstance(v, str) else v) for k, v in raw.items() if v not in (None, "")}
    sku, source = vals.get("sku"), vals.get("uri") or vals.get("path") or vals.get("source")
    if not sku or not isinstance(sku, str):
        raise ManifestError(f"{where}: no sku")
    if not source or not isinstance(source, str):
        raise ManifestError(f"{where}: no uri")
    presets = vals.get("presets")
    if isinstance(presets, str):
        presets = [p for p in presets.replace("|", ";").replace(",", ";").replace(" ", ";").split(";") if p]
    if presets is not None and not (isinstance(presets, list) and all(isinstance(p, str) for p in presets)):
        raise ManifestError(f"{where}: presets must be names (a list, or separated by ; or |)")
    try:
        priority = int(vals["priority"]) if "priority" in vals else None
    except (TypeError, ValueError):
        raise ManifestError(f"{where}: priority {vals['priority']!r} is not an integer") from None
    text = {k: str(vals[k]) for k in ("image_id", "background", "lighting", "segmentation", "sha256") if k in vals}
    return ManifestRow(sku=sku, source=source, presets=tuple(presets) if presets else None, priority=priority,
                       merchant_id=vals.get("merchant_id") or vals.get("merchant"), **text)


def read_manifest(path: Path) -> Iterator[ManifestRow]:
    """Rows of a CSV (header: sku, uri, then any of presets, image_id, merchant_id, background, lighting,
    segmentation, priority, sha256) or JSON Lines manifest (``.jsonl``/``.ndjson``: one object per line,
    same keys; presets may be a list). Blank lines and lines starting with ``#`` are skipped."""
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        with path.open(encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip() or line.lstrip().startswith("#"):
                    continue
                try:
                    raw = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ManifestError(f"{path.name} line {n}: not JSON ({exc.msg})") from None
                if not isinstance(raw, dict):
                    raise ManifestError(f"{path.name} line {n}: expected an object")
                yield _row(raw, f"{path.name} line {n}")
        return
    with path.open(encoding="utf-8", newline="") as fh:
        reader = csv.DictReader(line for line in fh if not line.lstrip().startswith("#"))
        if not reader.fieldnames or "sku" not in reader.fieldnames:
            raise ManifestError(f"{path.name}: a CSV manifest needs a header with sku and uri")
        for n, raw in enumerate(reader, 2):
            yield _row({k.strip(): v for k, v in raw.items() if k}, f"{path.name} line {n}")


def sku_from_uri(uri: str) -> str:
    """The default SKU of a bare URI: its last path segment without the suffix."""
    name = unquote(urlsplit(uri).path.rstrip("/").rsplit("/", 1)[-1])
    return name.rsplit(".", 1)[0] if "." in name else name or "image"


def new_traceparent() -> str:
    """A fresh W3C traceparent (version 00, sampled)."""
    return f"00-{os.urandom(16).hex()}-{os.urandom(8).hex()}-01"


def rows_to_publish(paths: Sequence[str], manifests: Sequence[Path] = ()) -> list[tuple[ManifestRow, Path]]:
    """What ``lightbox produce`` publishes: one row per image file under the local ``paths`` (SKU =
    the file name without suffix), per URI among them, and per row of each manifest; each with
    the folder its relative paths start from. Raises ``FileNotFoundError`` or :class:`ManifestError`."""
    local = [p for p in paths if "://" not in p]
    rows = [(ManifestRow(sku=f.stem, source=str(f.resolve())), f.parent) for f in iter_image_files(local)]
    rows += [(ManifestRow(sku=sku_from_uri(u), source=u), Path.cwd()) for u in paths if "://" in u]
    for m in manifests:
        rows += [(row, m.parent) for row in read_manifest(m)]
    return rows


class ImageProducer:
    def __init__(self, bootstrap: str, topic: str = "lightbox.images.v1", *,
                 codecs: EventCodecs | None = None, max_request_size: int = 48 << 20,
                 security: Mapping[str, Any] | None = None) -> None:
        """``security``: aiokafka keyword arguments (``streams.security.aiokafka_kwargs``); from the
        ``LIGHTBOX_KAFKA_*`` environment when ``None``."""
        self.topic = topic
        self._bootstrap, self._security = bootstrap, client_kwargs(security)
        self._max_request_size = max_request_size
        from streams.registry import default_codecs

        self.codecs = codecs or default_codecs(product_topic=topic)
        self._producer: Any = None

    async def __aenter__(self) -> ImageProducer:
        from streams.clients import new_producer  # here: the file helpers above serve `process` without Kafka

        self._producer = await new_producer(self._bootstrap, self._security, max_request_size=self._max_request_size)
        await self._producer.start()
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self._producer.stop()

    def event_for_file(self, path: Path, *, presets: Sequence[str], inline: bool = True,
                       merchant_id: str = "demo-merchant", sku: str | None = None,
                       background: str = "WHITE", lighting: str = "AUTO", priority: int = 0) -> dict[str, Any]:
        """An event for one file; SKU from the file name (its stem) unless given."""
        source: dict[str, Any] = ({"data": path.read_bytes()} if inline
                                  else {"uri": path.resolve().as_uri(), "sha256": None})
        return self.event(source, sku=sku or path.stem, image_id=path.name, presets=presets,
                          merchant_id=merchant_id, content_type=mimetypes.guess_type(path.name)[0],
                          background=background, lighting=lighting, priority=priority)

    @staticmethod
    def event_for_row(row: ManifestRow, *, base: Path, presets: Sequence[str], inline: bool = True,
                      merchant_id: str = "demo-merchant", background: str = "WHITE") -> dict[str, Any]:
        """An event for one manifest row; the row's own values win over the defaults given here."""
        if row.is_uri:
            source: dict[str, Any] = {"uri": row.source, "sha256": row.sha256}
            name = unquote(urlsplit(row.source).path.rsplit("/", 1)[-1])
        else:
            path = (base / row.source).resolve()
            source = {"data": path.read_bytes()} if inline else {"uri": path.as_uri(), "sha256": row.sha256}
            name = path.name
        return ImageProducer.event(source, sku=row.sku, image_id=row.image_id or name, presets=row.presets or presets,
                          merchant_id=row.merchant_id or merchant_id, content_type=mimetypes.guess_type(name)[0],
                          background=row.background or background, lighting=row.lighting or "AUTO",
                          segmentation=row.segmentation or "AUTO", priority=row.priority or 0)

    @staticmethod
    def event(source: dict[str, Any], *, sku: str, image_id: str, presets: Sequence[str],
              merchant_id: str = "demo-merchant", content_type: str | None = None,
              background: str = "WHITE", lighting: str = "AUTO", priority: int = 0,
              event_id: str | None = None, segmentation: str = "AUTO") -> dict[str, Any]:
        return {"event_id": event_id or str(uuid.uuid4()), "sku": sku, "image_id": image_id,
                "merchant_id": merchant_id, "source": source, "content_type": content_type,
                "presets": list(presets), "retouch": {"background": background.upper(), "lighting": lighting.upper(),
                            "segmentation": segmentation.upper()},
                "priority": priority, "created_at": time.time_ns() // 1_000_000}

    async def publish(self, event: dict[str, Any], *, traceparent: str | None = None) -> Awaitable[Any]:
        """Queue one event (keyed by SKU); returns the broker-ack future (await it, or gather many)."""
        headers = [("traceparent", (traceparent or new_traceparent()).encode())]
        fut: Awaitable[Any] = await self._producer.send(
            self.topic, self.codecs.product.encode(event), key=event["sku"].encode(), headers=headers)
        return fut

    async def publish_raw(self, value: bytes, key: bytes | None = None) -> Awaitable[Any]:
        """Send bytes as they are (tests and tools that need a record that is not Avro)."""
        fut: Awaitable[Any] = await self._producer.send(self.topic, value, key=key)
        return fut

    async def flush(self, futures: Iterable[Awaitable[Any]]) -> None:
        await asyncio.gather(*futures)
