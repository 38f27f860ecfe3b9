"""Stage 1: fetch the encoded image of a ProductImageEvent (inline bytes or a URI). Pure."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from schemas.errors import FetchFailed, TooLarge

__all__ = ["fetch_source"]


def fetch_source(source: Mapping[str, Any], *, max_bytes: int, file_roots: Sequence[Path] = ()) -> bytes:
    """The image bytes. ``source`` is the Avro union value: ``{"data": b..}`` or ``{"uri": ..}``.

    ``file://`` URIs are read (inside ``file_roots`` when given); other schemes are refused
    with FETCH_FAILED until their fetchers exist. Size is checked before reading.
    """
    if "data" in source:
        data = source["data"]
        if len(data) > max_bytes:
            raise TooLarge(f"inline image of {len(data)} bytes exceeds the {max_bytes}-byte limit", stage="fetch")
        return bytes(data)
    uri = source.get("uri", "")
    parsed = urlparse(uri)
    if parsed.scheme != "file":
        raise FetchFailed(f"URI scheme {parsed.scheme!r} is not enabled on this worker: {uri!r}",
                          stage="fetch", retriable=False)
    path = Path(unquote(parsed.path))
    if file_roots and not any(path.resolve().is_relative_to(r.resolve()) for r in file_roots):
        raise FetchFailed(f"{uri!r} is outside the allowed file roots", stage="fetch", retriable=False)
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise TooLarge(f"{uri!r} is {size} bytes, over the {max_bytes}-byte limit", stage="fetch")
        data = path.read_bytes()
    except FileNotFoundError:
        raise FetchFailed(f"no such file: {uri!r}", stage="fetch", retriable=False) from None
    except (IsADirectoryError, PermissionError, OSError) as exc:
        raise FetchFailed(f"cannot read {uri!r}: {exc.strerror or exc}", stage="fetch", retriable=False) from None
    expected = source.get("sha256")
    if expected and hashlib.sha256(data).hexdigest() != expected.lower():
        raise FetchFailed(f"sha256 of {uri!r} does not match the event's", stage="fetch", retriable=False)
    return data
