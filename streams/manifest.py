"""Manifests: a list of product images to publish, as CSV or JSON Lines. Pure (no Kafka).

One row per image. Columns / keys (only ``sku`` and ``uri`` are required)::

    sku, uri, presets, background, lighting, segmentation, priority, image_id, merchant_id,
    content_type, sha256, event_id

- ``uri``: ``file://``, ``s3://``, ``gs://``, ``az://``, ``http(s)://``; a plain path is a file
  relative to the manifest's folder (made absolute, as a ``file://`` URI).
- ``presets``: names separated by ``;``, ``|``, spaces or commas (a CSV cell with commas must be
  quoted); in JSON Lines also a list. Empty: the command's default presets.
- Options (``background``, ``lighting``, ``segmentation``) flat, or in JSON Lines also as an
  object under ``options`` (or ``retouch``). Empty: the command's defaults.
- Blank lines and, in CSV, lines starting with ``#`` are skipped; JSON Lines may not hold comments.

The format comes from the suffix (``.csv``; ``.jsonl``/``.ndjson``/``.json``) or ``fmt``. Errors
are :class:`ManifestError` naming the file, the line and the field. :func:`read_manifest` streams
rows (a manifest of millions of lines is never held in memory); :func:`scan_manifest` counts
them and hashes the file in one pass.
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = ["MANIFEST_FIELDS", "ManifestError", "ManifestRow", "ManifestScan", "event_from_row", "read_manifest",
           "scan_manifest"]

MANIFEST_FIELDS = ("sku", "uri", "presets", "background", "lighting", "segmentation", "priority", "image_id",
                   "merchant_id", "content_type", "sha256", "event_id")
URI_SCHEMES = ("file", "s3", "gs", "az", "http", "https")
_OPTIONS = {"background": ("WHITE", "TRANSPARENT", "KEEP"), "lighting": ("AUTO", "OFF"),
            "segmentation": ("AUTO", "MODEL", "CLASSICAL")}
_SPLIT = re.compile(r"[;|,\s]+")
_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
Format = Literal["csv", "jsonl"]


class ManifestError(ValueError):
    """A manifest that cannot be read: names the file, the line and the field."""


@dataclass(frozen=True, slots=True)
class ManifestRow:
    """One image of a manifest. ``index`` counts data rows from 0; ``line`` is the file's line (1-based).
    ``presets`` and the options are ``None`` where the row leaves them to the command's defaults."""

    index: int
    line: int
    sku: str
    uri: str
    presets: tuple[str, ...] | None = None
    background: str | None = None
    lighting: str | None = None
    segmentation: str | None = None
    priority: int = 0
    image_id: str | None = None
    merchant_id: str | None = None
    content_type: str | None = None
    sha256: str | None = None
    event_id: str | None = None


@dataclass(frozen=True, slots=True)
class ManifestScan:
    rows: int
    sha256: str
    size: int


def manifest_format(path: Path, fmt: str | None = None) -> Format:
    name = (fmt or path.suffix.lstrip(".")).lower()
    if name == "csv":
        return "csv"
    if name in ("jsonl", "ndjson", "json"):
        return "jsonl"
    raise ManifestError(f"{path}: cannot tell the manifest format from {path.suffix!r}; use .csv or .jsonl "
                        f"(or give the format)")


def _records(path: Path, fmt: Format) -> Iterator[tuple[int, Mapping[str, Any]]]:
    """(line number, raw record) for every data row."""
    with path.open(newline="", encoding="utf-8") as f:
        if fmt == "jsonl":
            for n, text in enumerate(f, start=1):
                if not text.strip():
                    continue
                try:
                    obj = json.loads(text)
                except json.JSONDecodeError as exc:
                    raise ManifestError(f"{path}:{n}: not a JSON object ({exc.msg} at column {exc.colno})") from None
                if not isinstance(obj, dict):
                    raise ManifestError(f"{path}:{n}: expected a JSON object, got {type(obj).__name__}")
                yield n, obj
            return
        lines = (text for text in f if not text.lstrip().startswith("#"))
        reader = csv.DictReader(lines)
        header = [h.strip().lower() for h in reader.fieldnames or []]
        missing = [c for c in ("sku", "uri") if c not in header]
        if missing:
            raise ManifestError(f"{path}: the CSV header must name {', '.join(missing)} (got {header or 'none'})")
        unknown = [h for h in header if h not in MANIFEST_FIELDS]
        if unknown:
            raise ManifestError(f"{path}: unknown CSV column(s) {', '.join(unknown)}; "
                                f"known: {', '.join(MANIFEST_FIELDS)}")
        reader.fieldnames = header
        for row in reader:
            if not any((v or "").strip() for v in row.values() if isinstance(v, str)):
                continue
            if None in row:
                raise ManifestError(f"{path}:{reader.line_num}: more cells than header columns")
            yield reader.line_num, row


def _text(path: Path, line: int, key: str, value: Any, *, required: bool = False) -> str | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            raise ManifestError(f"{path}:{line}: {key} is required")
        return None
    if not isinstance(value, str | int):
        raise ManifestError(f"{path}:{line}: {key} must be a string, got {type(value).__name__}")
    return str(value).strip()


def _uri(path: Path, line: int, value: str) -> str:
    m = _SCHEME.match(value)
    if m is None:  # a plain path, relative to the manifest's folder
        return (path.parent / value).resolve().as_uri()
    if m.group(1).lower() not in URI_SCHEMES:
        raise ManifestError(f"{path}:{line}: uri scheme {m.group(1)!r} is not one of {', '.join(URI_SCHEMES)}")
    return value


def _presets(path: Path, line: int, value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, list):
        if not all(isinstance(v, str) for v in value):
            raise ManifestError(f"{path}:{line}: presets must be names (strings)")
        names = [v.strip() for v in value]
    elif isinstance(value, str):
        names = _SPLIT.split(value.strip())
    else:
        raise ManifestError(f"{path}:{line}: presets must be a list or a string, got {type(value).__name__}")
    names = [n for n in names if n]
    return tuple(names) or None


def _row(path: Path, index: int, line: int, raw: Mapping[str, Any]) -> ManifestRow:
    raw = {str(k).strip().lower(): v for k, v in raw.items()}
    opts = raw.pop("options", None) or raw.pop("retouch", None)
    if opts is not None:
        if not isinstance(opts, dict):
            raise ManifestError(f"{path}:{line}: options must be an object")
        raw = {**{str(k).lower(): v for k, v in opts.items()}, **{k: v for k, v in raw.items() if v is not None}}
    unknown = [k for k in raw if k not in MANIFEST_FIELDS]
    if unknown:
        raise ManifestError(f"{path}:{line}: unknown field(s) {', '.join(sorted(unknown))}")
    sku = _text(path, line, "sku", raw.get("sku"), required=True)
    uri = _text(path, line, "uri", raw.get("uri"), required=True)
    assert sku is not None and uri is not None
    options: dict[str, str | None] = {}
    for key, allowed in _OPTIONS.items():
        val = _text(path, line, key, raw.get(key))
        if val is not None and val.upper() not in allowed:
            raise ManifestError(f"{path}:{line}: {key} {val!r} is not one of {', '.join(allowed)}")
        options[key] = val.upper() if val else None
    prio_raw = _text(path, line, "priority", raw.get("priority"))
    try:
        priority = int(prio_raw) if prio_raw is not None else 0
    except ValueError:
        raise ManifestError(f"{path}:{line}: priority {prio_raw!r} is not an integer") from None
    if not -(2**31) <= priority < 2**31:
        raise ManifestError(f"{path}:{line}: priority {priority} does not fit in 32 bits")
    return ManifestRow(index=index, line=line, sku=sku, uri=_uri(path, line, uri),
                       presets=_presets(path, line, raw.get("presets")), priority=priority,
                       background=options["background"], lighting=options["lighting"],
                       segmentation=options["segmentation"],
                       **{k: _text(path, line, k, raw.get(k))
                          for k in ("image_id", "merchant_id", "content_type", "sha256", "event_id")})


def read_manifest(path: str | Path, fmt: str | None = None, *, start: int = 0) -> Iterator[ManifestRow]:
    """The rows of a manifest, in file order, from data row ``start`` on (earlier rows are parsed
    only as far as needed to count them)."""
    path = Path(path)
    kind = manifest_format(path, fmt)
    if not path.is_file():
        raise ManifestError(f"{path}: no such manifest file")
    for index, (line, raw) in enumerate(_records(path, kind)):
        if index >= start:
            yield _row(path, index, line, raw)


def scan_manifest(path: str | Path, fmt: str | None = None) -> ManifestScan:
    """Check every row, count them, and hash the file (sha256), in one pass."""
    path = Path(path)
    digest = hashlib.sha256()
    if not path.is_file():
        raise ManifestError(f"{path}: no such manifest file")
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    rows = sum(1 for _ in read_manifest(path, fmt))
    return ManifestScan(rows=rows, sha256=digest.hexdigest(), size=path.stat().st_size)


def event_from_row(row: ManifestRow, *, presets: tuple[str, ...] | list[str], event_id: str,
                   merchant_id: str = "catalog", background: str = "WHITE", lighting: str = "AUTO",
                   segmentation: str = "AUTO", created_at_ms: int) -> dict[str, Any]:
    """The ``ProductImageEvent`` for a row; the row's own presets, options and ids win over these defaults."""
    return {"event_id": row.event_id or event_id, "sku": row.sku,
            "image_id": row.image_id or row.uri.rsplit("/", 1)[-1] or row.sku,
            "merchant_id": row.merchant_id or merchant_id,
            "source": {"uri": row.uri, "sha256": row.sha256}, "content_type": row.content_type,
            "presets": list(row.presets or presets),
            "retouch": {"background": (row.background or background).upper(),
                        "lighting": (row.lighting or lighting).upper(),
                        "segmentation": (row.segmentation or segmentation).upper()},
            "priority": row.priority, "created_at": created_at_ms}
