"""s3:// gs:// az:// through obstore (one Rust client for S3, GCS and Azure).

Credentials come from each cloud's standard environment (``AWS_*``, ``GOOGLE_*``, ``AZURE_*``), read by
obstore. Timeouts and bounded retries with exponential backoff and jitter are obstore's own (5xx,
connection errors, timeouts of reads); the byte limit is enforced while the body streams.
"""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import obstore
from obstore.exceptions import BaseError, InvalidPathError, PermissionDeniedError, UnauthenticatedError

from blobio.fetch.errors import Reason, fetch_error
from blobio.fetch.policy import FetchPolicy

__all__ = ["BucketCache", "ListingFailed", "classify", "list_objects", "open_bucket", "read_object"]

STREAM_CHUNK = 256 << 10


def open_bucket(scheme: str, bucket: str, *, endpoint: str | None = None, timeout_s: float = 30.0,
                connect_timeout_s: float = 5.0, retries: int = 3, backoff_s: float = 0.2,
                retry_timeout_s: float | None = None) -> Any:
    """An obstore store for one bucket (``s3``), bucket (``gs``) or container (``az``)."""
    from obstore.store import AzureStore, GCSStore, S3Store

    client: dict[str, Any] = {"timeout": timedelta(seconds=timeout_s),
                              "connect_timeout": timedelta(seconds=connect_timeout_s)}
    retry: dict[str, Any] = {"max_retries": retries,
                             "backoff": {"init_backoff": timedelta(seconds=backoff_s),
                                         "max_backoff": timedelta(seconds=5), "base": 2},
                             "retry_timeout": timedelta(seconds=retry_timeout_s or (timeout_s * (retries + 1)))}
    if scheme == "s3":
        cfg: dict[str, Any] = {}
        if endpoint:
            cfg["endpoint"] = endpoint
            client["allow_http"] = endpoint.startswith("http://")
        return S3Store(bucket, client_options=client, retry_config=retry, **cfg)  # type: ignore[arg-type]
    if scheme == "gs":
        # A GCS emulator over plain http (GOOGLE_ALLOW_HTTP=true, as AWS_ALLOW_HTTP is for S3): the client
        # options given here replace the ones obstore would read from the environment.
        client["allow_http"] = os.environ.get("GOOGLE_ALLOW_HTTP", "").lower() == "true"
        return GCSStore(bucket, client_options=client, retry_config=retry)  # type: ignore[arg-type]
    if scheme == "az":
        return AzureStore(bucket, client_options=client, retry_config=retry)  # type: ignore[arg-type]
    raise ValueError(f"no object store for scheme {scheme!r}")


class BucketCache:
    """One store per (scheme, bucket), built on first use; safe to share between fetch threads."""

    def __init__(self, policy: FetchPolicy) -> None:
        self.policy = policy
        self._stores: dict[tuple[str, str], Any] = {}
        self._lock = threading.Lock()

    def get(self, scheme: str, bucket: str) -> Any:
        key = (scheme, bucket)
        with self._lock:
            if key not in self._stores:
                p = self.policy
                self._stores[key] = open_bucket(scheme, bucket, endpoint=p.s3_endpoint if scheme == "s3" else None,
                                                timeout_s=p.timeout_s, connect_timeout_s=p.connect_timeout_s,
                                                retries=p.retries, backoff_s=p.backoff_s)
            return self._stores[key]


def classify(exc: BaseException) -> Reason:
    """A fetch reason for an obstore (or builtin) error; its message is never echoed (it may hold a body)."""
    if isinstance(exc, FileNotFoundError):
        return "not found"
    if isinstance(exc, PermissionDeniedError | UnauthenticatedError | PermissionError):
        return "denied"
    if isinstance(exc, InvalidPathError | ValueError):
        return "malformed"
    if isinstance(exc, TimeoutError):
        return "timeout"
    text = str(exc)  # obstore's debug text: read for the error kind only, never echoed
    if "kind: Timeout" in text or "TimedOut" in text:
        return "timeout"
    if "kind: Connect" in text or "error sending request" in text:
        return "unreachable"
    return "server error"


def read_object(caches: BucketCache, scheme: str, bucket: str, key: str, shown: str, max_bytes: int) -> bytes:
    """The object's bytes, streamed and cut off past ``max_bytes`` whatever its metadata says."""
    try:
        store = caches.get(scheme, bucket)
        result = obstore.get(store, key)
        size = int(result.meta["size"])
        if size > max_bytes:
            raise fetch_error("too large", f"{shown} is {size} bytes, over the {max_bytes}-byte limit")
        chunks, total = [], 0
        for chunk in result.stream(min_chunk_size=STREAM_CHUNK):
            total += len(chunk)
            if total > max_bytes:
                raise fetch_error("too large", f"{shown} streamed more than the {max_bytes}-byte limit")
            chunks.append(bytes(chunk))
        return b"".join(chunks)
    except (BaseError, OSError, ValueError) as exc:
        reason = classify(exc)
        raise fetch_error(reason, f"{shown} ({type(exc).__name__})") from None


class ListingFailed(Exception):
    """A prefix could not be listed. The text is the reason (:func:`classify`) and the error's
    type, never the store's message (it may hold a response body or a setting)."""


async def list_objects(store: Any, prefix: str | None) -> AsyncIterator[tuple[str, int]]:
    """``(key, size)`` of every object under ``prefix`` (None: the whole bucket) of ``store`` (an
    :func:`open_bucket` store), in the store's order; :class:`ListingFailed` when listing fails."""
    try:
        async for chunk in obstore.list(store, prefix=prefix or None, chunk_size=1000):
            for meta in chunk:
                yield str(meta["path"]), int(meta["size"])
    except (BaseError, OSError) as exc:
        raise ListingFailed(f"{classify(exc)}, {type(exc).__name__}") from None
