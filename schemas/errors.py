"""The project's error types.

Every failure that can reach a dead letter is a :class:`LightboxError` carrying one of the
error codes of ``DeadLetterEvent`` (README, "Events and topics"). Errors from libraries (DALI, OpenCV, Pillow,
onnxruntime, fastavro) are translated at the boundary of the stage that called them.

    LightboxError                 code            retriable
    ├── SchemaInvalid             SCHEMA_INVALID  no
    ├── FetchFailed               FETCH_FAILED    yes (a missing file: no)
    ├── TooLarge                  TOO_LARGE       no
    ├── UnsupportedFormat         UNSUPPORTED_FORMAT no
    ├── DecodeFailed              DECODE_FAILED   no
    ├── UnknownPreset             UNKNOWN_PRESET  no
    ├── ProcessingFailed          PROCESSING_FAILED no
    └── OutputTooLarge            OUTPUT_TOO_LARGE no

    FatalError                    (not a dead letter: the worker leaves its group and exits non-zero)
    ├── StoreUnavailable          the output store stayed unreachable past its retry budget
    └── RegistryRefused           the schema registry refused lightbox's credential (401/403)

    RegistryError                 (a start or a command cannot go on: one line, never a dead letter)
    ├── RegistryRejected          the registry refused one of lightbox's schemas
    └── RegistryUnavailable       the registry stayed unreachable longer than a command waits
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from enum import StrEnum
from typing import TypeVar

__all__ = [
    "DecodeFailed",
    "ErrorCode",
    "FatalError",
    "FetchFailed",
    "LightboxError",
    "OutputTooLarge",
    "ProcessingFailed",
    "RegistryError",
    "RegistryRefused",
    "RegistryRejected",
    "RegistryUnavailable",
    "SchemaInvalid",
    "StoreUnavailable",
    "TooLarge",
    "UnknownPreset",
    "UnsupportedFormat",
    "per_item",
]

T = TypeVar("T")
R = TypeVar("R")


class ErrorCode(StrEnum):
    DECODE_FAILED = "DECODE_FAILED"
    UNSUPPORTED_FORMAT = "UNSUPPORTED_FORMAT"
    TOO_LARGE = "TOO_LARGE"
    SCHEMA_INVALID = "SCHEMA_INVALID"
    FETCH_FAILED = "FETCH_FAILED"
    UNKNOWN_PRESET = "UNKNOWN_PRESET"
    PROCESSING_FAILED = "PROCESSING_FAILED"
    OUTPUT_TOO_LARGE = "OUTPUT_TOO_LARGE"


class LightboxError(Exception):
    """Base of every error that becomes a dead letter. ``stage`` names where it happened."""

    code: ErrorCode = ErrorCode.PROCESSING_FAILED
    retriable: bool = False

    def __init__(self, message: str, *, stage: str = "", retriable: bool | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.stage = stage
        if retriable is not None:
            self.retriable = retriable

    def __str__(self) -> str:
        return f"[{self.code}] {self.stage + ': ' if self.stage else ''}{self.message}"


class SchemaInvalid(LightboxError):
    code = ErrorCode.SCHEMA_INVALID


class FetchFailed(LightboxError):
    code = ErrorCode.FETCH_FAILED
    retriable = True


class TooLarge(LightboxError):
    code = ErrorCode.TOO_LARGE


class UnsupportedFormat(LightboxError):
    code = ErrorCode.UNSUPPORTED_FORMAT


class DecodeFailed(LightboxError):
    code = ErrorCode.DECODE_FAILED


class UnknownPreset(LightboxError):
    code = ErrorCode.UNKNOWN_PRESET


class ProcessingFailed(LightboxError):
    code = ErrorCode.PROCESSING_FAILED


class OutputTooLarge(LightboxError):
    """The processed event would exceed the output topic's ``max.message.bytes`` and no store is
    configured to take the variants out of line."""

    code = ErrorCode.OUTPUT_TOO_LARGE


class FatalError(Exception):
    """The worker cannot go on: it logs one line, leaves its group and exits non-zero, so its
    partitions move to a healthy worker. Never turned into a dead letter."""


class StoreUnavailable(FatalError):
    """The output store stayed unreachable (or unwritable) past its retry budget."""


class RegistryRefused(FatalError):
    """The schema registry refused lightbox's credential (401/403). Not retried: the worker stops."""


class RegistryError(RuntimeError):
    """The schema registry answered, and the answer means lightbox cannot go on as configured."""


class RegistryRejected(RegistryError):
    """The schema registry refused one of lightbox's schemas (incompatible, invalid, not registered)."""


class RegistryUnavailable(RegistryError):
    """The schema registry stayed unreachable (or answered 5xx) for longer than a command waits."""


def per_item(fn: Callable[[T], R], items: Iterable[T]) -> list[R | LightboxError]:
    """``fn`` over ``items``; an item's :class:`LightboxError` takes its place in the result,
    so one bad item never fails its batch-mates."""
    out: list[R | LightboxError] = []
    for item in items:
        try:
            out.append(fn(item))
        except LightboxError as exc:
            out.append(exc)
    return out
