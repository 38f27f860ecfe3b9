"""Library for catalog-ingest producers: build and publish ``ProductImageEvent``s.

    async with ImageProducer("127.0.0.1:9092") as p:
        await p.publish(p.event_for_file(Path("SKU-1.jpg"), presets=["jd_main"]))
"""

from __future__ import annotations

import asyncio
import mimetypes
import os
import time
import uuid
from collections.abc import Awaitable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from aiokafka import AIOKafkaProducer

from schemas.events import EventCodecs
from streams.security import client_kwargs, preflight

__all__ = ["IMAGE_SUFFIXES", "ImageProducer", "iter_image_files", "new_traceparent"]

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


def new_traceparent() -> str:
    """A fresh W3C traceparent (version 00, sampled)."""
    return f"00-{os.urandom(16).hex()}-{os.urandom(8).hex()}-01"


class ImageProducer:
    def __init__(self, bootstrap: str, topic: str = "lightbox.images.v1", *,
                 codecs: EventCodecs | None = None, max_request_size: int = 48 << 20,
                 security: Mapping[str, Any] | None = None) -> None:
        """``security``: aiokafka keyword arguments (``streams.security.aiokafka_kwargs``); from the
        ``LIGHTBOX_KAFKA_*`` environment when ``None``."""
        self.topic = topic
        self._bootstrap, self._security = bootstrap, client_kwargs(security)
        self.codecs = codecs or EventCodecs.create()
        self._producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True,
                                          linger_ms=5, max_request_size=max_request_size, **self._security)

    async def __aenter__(self) -> ImageProducer:
        try:
            await preflight(self._bootstrap, self._security)
        except BaseException:
            await self._producer.stop()  # never started; closes it quietly
            raise
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
