"""Claim-check outputs: variants written to an object store, events carry their URI, sha256 and size.

``LIGHTBOX_OUTPUT_STORE`` is ``s3://bucket/prefix``, ``gs://bucket/prefix``, ``az://container/prefix``
or ``file:///path``. Keys are content-addressed, ``prefix/sku/preset/sha256.ext`` with each part
sanitized by ``schemas.paths.safe_component``, so a replay writes the same key with the same bytes:
:meth:`OutputStore.put` skips a key that already holds an object of that size, and a concurrent
duplicate write stores identical bytes.
Transient failures are retried by obstore with backoff. Past that budget, a store given a
:class:`Waiter` reports the outage to it and tries again after the backoff it sets, without end
(a store that is down is waited for, never a reason to stop); without one, or on a refusal that
waiting cannot fix (credentials denied, no such bucket, a local folder that cannot be written),
``put`` raises :class:`~schemas.errors.StoreUnavailable` and the worker stops.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

import obstore
from obstore.exceptions import BaseError

from blobio.fetch.objects import classify, open_bucket
from schemas.errors import StoreUnavailable
from schemas.paths import safe_component

__all__ = [
    "TRANSIENT",
    "ObjectOutputStore",
    "OutputStore",
    "StoreSettings",
    "Waiter",
    "content_type",
    "make_store",
    "store_location",
    "variant_key",
]

EXTENSIONS = {"jpeg": "jpg"}
#: failure kinds (:func:`blobio.fetch.objects.classify`) that waiting can fix: the store is down or slow
TRANSIENT = frozenset({"timeout", "unreachable", "server error"})
#: what to do about the kinds that waiting cannot fix
ADVICE = {"denied": "check the store's credentials and the bucket's policy",
          "not found": "check that the bucket (container) exists",
          "malformed": "check the store URL and prefix"}
CONTENT_TYPES = {"jpeg": "image/jpeg", "png": "image/png", "webp": "image/webp"}


class OutputStore(Protocol):
    def put(self, key: str, data: bytes, content_type: str) -> str:
        """Write ``data`` at ``key`` (under the store's prefix) unless already there; return its URI."""
        ...

    def close(self) -> None: ...


class Waiter(Protocol):
    """Told when a dependency is unreachable and when it answers again (``agents.dependencies``)."""

    def failed(self, name: str, reason: str) -> float:
        """Record a failed attempt; the seconds to wait before the next one."""
        ...

    def sleep(self, seconds: float) -> bool:
        """Wait; False when the worker is stopping (give up)."""
        ...

    def reached(self, name: str) -> None: ...


class StoreSettings(Protocol):
    """The settings :func:`make_store` reads (``streams.settings.Settings().store`` has them)."""

    @property
    def s3_endpoint(self) -> str | None: ...
    @property
    def timeout_s(self) -> float: ...
    @property
    def retries(self) -> int: ...


def variant_key(sku: str, preset: str, sha256: str, fmt: str) -> str:
    """``sku/preset/sha256.ext``: the content-addressed key of one variant (the store adds its prefix)."""
    if not re.fullmatch(r"[0-9a-f]{64}", sha256):
        raise ValueError(f"variant sha256 {sha256!r} is not 64 hex digits")
    ext = safe_component(EXTENSIONS.get(fmt, fmt))
    return f"{safe_component(sku)}/{safe_component(preset)}/{sha256}.{ext}"


def _check_key(key: str) -> str:
    parts = key.split("/")
    if not key or any(p != safe_component(p) for p in parts):
        raise ValueError(f"store key {key!r} has an unsafe segment (build keys with variant_key)")
    return key


class ObjectOutputStore:
    """An :class:`OutputStore` on an obstore store (S3, GCS, Azure or a local folder)."""

    def __init__(self, store: Any, uri_base: str, prefix: str = "", *, name: str | None = None,
                 content_types: bool = True, waiter: Waiter | None = None) -> None:
        self._store = store
        self.waiter = waiter  # None: a store past its retries stops the worker (a local folder, a tool)
        self._content_types = content_types  # a local folder keeps no attributes
        self.uri_base = uri_base.rstrip("/")
        self.prefix = "/".join(safe_component(p) for p in prefix.strip("/").split("/") if p)
        self.name = name or uri_base
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def put(self, key: str, data: bytes, content_type: str) -> str:
        path = "/".join(p for p in (self.prefix, _check_key(key)) if p)
        uri = f"{self.uri_base}/{path}"
        with self._lock:
            if path in self._seen:
                return uri
        what = f"output store {self.name}"
        while True:
            try:
                self._write(path, data, content_type)
                break
            except (BaseError, OSError, ValueError, NotImplementedError) as exc:
                reason = classify(exc)
                if self.waiter is None or reason not in TRANSIENT:
                    advice = ADVICE.get(reason)
                    raise StoreUnavailable(
                        f"{what}: cannot write {path!r} ({reason}, {type(exc).__name__})"
                        + (f"; waiting cannot fix this: {advice}" if advice else "")) from None
                if not self.waiter.sleep(self.waiter.failed(what, reason)):
                    raise StoreUnavailable(f"{what}: stopped while waiting for it ({reason})") from None
        if self.waiter is not None:
            self.waiter.reached(what)
        self._remember(path)
        return uri

    def _write(self, path: str, data: bytes, content_type: str) -> None:
        try:
            if int(obstore.head(self._store, path)["size"]) == len(data):
                return  # already written (a replay, or another worker): same key, same bytes
        except FileNotFoundError:
            pass
        attrs = {"Content-Type": content_type} if self._content_types else None
        obstore.put(self._store, path, data, attributes=attrs, use_multipart=False)

    def _remember(self, path: str) -> None:
        with self._lock:
            if len(self._seen) > 100_000:
                self._seen.clear()
            self._seen.add(path)

    def get(self, key: str) -> bytes:
        """The bytes at ``key`` under the prefix (tests, tools)."""
        path = "/".join(p for p in (self.prefix, key) if p)
        return bytes(obstore.get(self._store, path).bytes())

    def close(self) -> None:
        """Nothing to release: obstore's client pools close with the store object."""


def make_store(url: str | None, options: StoreSettings | None = None,
               waiter: Waiter | None = None) -> OutputStore | None:
    """The output store named by ``url`` (None: no store). Configuration errors raise ValueError; a
    folder that cannot be created raises StoreUnavailable. ``waiter``: an object store (not a local
    folder) that stays unreachable past its retries is waited for through it."""
    if not url:
        return None
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    timeout = options.timeout_s if options else 30.0
    retries = options.retries if options else 5
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"output store {url!r}: a file:// store names no host")
        from obstore.store import LocalStore

        root = Path(unquote(parts.path)).resolve()
        try:  # fail at start, not at the first output
            root.mkdir(parents=True, exist_ok=True)
            local = LocalStore(root, mkdir=True)
        except (OSError, BaseError) as exc:
            raise StoreUnavailable(f"output store {url!r} is not writable ({type(exc).__name__})") from None
        return ObjectOutputStore(local, root.as_uri(), name=url, content_types=False)
    if scheme in ("s3", "gs", "az"):
        bucket = parts.netloc
        if not bucket:
            raise ValueError(f"output store {url!r}: expected {scheme}://bucket/prefix")
        endpoint = options.s3_endpoint if options and scheme == "s3" else None
        store = open_bucket(scheme, bucket, endpoint=endpoint, timeout_s=timeout, retries=retries,
                            retry_timeout_s=timeout * (retries + 1))
        return ObjectOutputStore(store, f"{scheme}://{bucket}", parts.path, name=url, waiter=waiter)
    raise ValueError(f"output store {url!r}: scheme must be s3, gs, az or file")


def store_location(url: str | None) -> tuple[list[str], list[Path]]:
    """(fetch allow-list entries, file roots) that let a reader download what the store at ``url`` wrote."""
    if not url:
        return [], []
    parts = urlsplit(url)
    if parts.scheme == "file":
        return [], [Path(unquote(parts.path)).resolve()]
    return [f"{parts.scheme}://{parts.netloc}"], []


def content_type(fmt: str) -> str:
    return CONTENT_TYPES.get(fmt, "application/octet-stream")
