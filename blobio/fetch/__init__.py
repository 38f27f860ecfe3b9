"""Stage 1: fetch the encoded image of a ProductImageEvent (inline bytes or a URI).

Closed by default (see :mod:`blobio.fetch.policy`): ``file://`` only under configured roots,
``s3://`` ``gs://`` ``az://`` only for allow-listed buckets (obstore), ``http(s)://`` only for
allow-listed hosts and never to private or metadata addresses. Every failure is ``FETCH_FAILED`` with
a reason first in the message: not found, denied, timeout, too large, malformed, unreachable, server
error. Messages never quote bytes that were read. Runs in the prepare lane's CPU threads.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from blobio.fetch.errors import fetch_error, show_uri
from blobio.fetch.local import read_file_uri
from blobio.fetch.objects import BucketCache, read_object
from blobio.fetch.policy import FetchPolicy
from blobio.fetch.web import Resolver, fetch_http, system_resolver
from schemas.errors import TooLarge

__all__ = ["FetchPolicy", "Fetcher", "fetch_source", "split_uri"]

MAX_URI_CHARS = 4096


def split_uri(uri: str) -> tuple[str, str, str]:
    """(scheme, host or bucket, percent-decoded path) of a URI, or FETCH_FAILED "malformed"."""
    shown = show_uri(uri)
    if not isinstance(uri, str) or not uri:
        raise fetch_error("malformed", "the event's URI is empty")
    if len(uri) > MAX_URI_CHARS:
        raise fetch_error("malformed", f"{shown}: URI longer than {MAX_URI_CHARS} characters")
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in uri):
        raise fetch_error("malformed", f"{shown}: URI holds spaces or control characters")
    try:
        parts = urlsplit(uri)
        path = unquote(parts.path, errors="strict")
    except (ValueError, UnicodeError):
        raise fetch_error("malformed", f"{shown} is not a valid URI") from None
    if "\x00" in path or any(ord(c) < 0x20 for c in path):
        raise fetch_error("malformed", f"{shown}: the path holds a NUL or control character")
    return parts.scheme.lower(), parts.netloc, path


class Fetcher:
    """Fetches sources under one :class:`FetchPolicy`. Built once per worker; thread-safe."""

    def __init__(self, policy: FetchPolicy, *, resolver: Resolver = system_resolver) -> None:
        self.policy = policy
        self.resolver = resolver
        self._buckets = BucketCache(policy)

    def fetch(self, source: Mapping[str, Any]) -> bytes:
        """The image bytes. ``source`` is the Avro union value: ``{"data": b..}`` or ``{"uri": .., "sha256": ..}``."""
        max_bytes = self.policy.max_bytes
        if "data" in source:
            data = source["data"]
            if len(data) > max_bytes:
                raise TooLarge(f"inline image of {len(data)} bytes exceeds the {max_bytes}-byte limit", stage="fetch")
            return bytes(data)
        uri = source.get("uri") or ""
        data = self.fetch_uri(uri)
        expected = source.get("sha256")
        if expected and hashlib.sha256(data).hexdigest() != str(expected).lower():
            raise fetch_error("mismatch", f"sha256 of {show_uri(uri)} does not match the event's")
        return data

    def fetch_uri(self, uri: str) -> bytes:
        scheme, netloc, path = split_uri(uri)
        shown = show_uri(uri)
        if scheme == "file":
            if netloc not in ("", "localhost"):
                raise fetch_error("denied", f"{shown}: file:// URIs name no host (or localhost)")
            return read_file_uri(path, shown, self.policy)
        if scheme in ("s3", "gs", "az"):
            bucket, key = netloc, path.lstrip("/")
            if not bucket or not key:
                raise fetch_error("malformed", f"{shown}: expected {scheme}://bucket/key")
            if not self.policy.allows_bucket(scheme, bucket):
                raise fetch_error("denied", f"{shown}: bucket {scheme}://{bucket} is not in the fetch allow-list "
                                            "(LIGHTBOX_FETCH_ALLOW)")
            return read_object(self._buckets, scheme, bucket, key, shown, self.policy.max_bytes)
        if scheme in ("http", "https"):
            return fetch_http(uri, self.policy, self.resolver)
        raise fetch_error("denied", f"{shown}: URI scheme {scheme!r} is not supported")


def fetch_source(source: Mapping[str, Any], *, max_bytes: int, file_roots: Sequence[Path] = ()) -> bytes:
    """One fetch under a policy of file roots only (no remote hosts); workers hold a :class:`Fetcher`."""
    return Fetcher(FetchPolicy(max_bytes=max_bytes, file_roots=tuple(file_roots))).fetch(source)
