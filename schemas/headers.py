"""Kafka header names lightbox reads and writes, and their parsing. Pure."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["ATTEMPTS_HEADER", "attempts_of"]

#: how many times this input has been tried, this time included (set by ``lightbox redrive``)
ATTEMPTS_HEADER = "lightbox-attempts"


def attempts_of(headers: Iterable[tuple[str, bytes | None]] | None) -> int:
    """The attempt an input record is on: its ``lightbox-attempts`` header (a positive integer
    below 2**31), else 1."""
    for key, value in headers or ():
        if key == ATTEMPTS_HEADER and value:
            try:
                n = int(value.decode("ascii"))
            except (UnicodeDecodeError, ValueError):
                return 1
            return n if 1 <= n < 2**31 else 1
    return 1
