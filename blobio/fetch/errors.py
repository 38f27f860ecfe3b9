"""Fetch failures as FETCH_FAILED dead letters with a reason. Messages name the URI (query string
dropped) and the reason, never bytes that were read."""

from __future__ import annotations

from typing import Literal

from schemas.errors import FetchFailed

__all__ = ["Reason", "fetch_error", "show_uri"]

Reason = Literal["not found", "denied", "timeout", "too large", "malformed", "unreachable", "server error",
                 "unreadable", "mismatch"]
RETRIABLE: frozenset[str] = frozenset({"timeout", "unreachable", "server error"})
SHOWN_CHARS = 200


def fetch_error(reason: Reason, message: str) -> FetchFailed:
    """``FETCH_FAILED`` whose message starts with the reason; retriable only for transient ones."""
    return FetchFailed(f"{reason}: {message}", stage="fetch", retriable=reason in RETRIABLE)


def show_uri(uri: str) -> str:
    """The URI as error messages show it: without query or fragment (signed URLs carry secrets there),
    control characters escaped, cut to 200 characters."""
    cut = uri.split("?", 1)[0].split("#", 1)[0]
    text = repr(cut[:SHOWN_CHARS])
    return text + ("…" if len(cut) > SHOWN_CHARS else "")
