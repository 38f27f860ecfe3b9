"""File names and object-store key parts built from event fields (SKU, preset, format). Pure.

An event field is untrusted text: ``"../../etc/cron.d/x"``, ``"a/b"``, ``"\\x00"``, ``""`` or a
10 kB string are all valid Avro strings. :func:`safe_component` turns any of them into one path
component that cannot leave the folder it is joined to:

- only ``A-Z a-z 0-9 . _ -`` (anything else, separators and NUL included, becomes ``_``);
- no ``..`` anywhere, no leading or trailing ``.`` (so never ``.``, ``..`` or a hidden file, and
  components joined with ``.`` never form ``..``);
- never empty, at most ``max_len`` characters;
- stable: the same input always gives the same output, on any machine;
- a value that is already safe comes back unchanged; one that had to be changed gets a short
  sha256 suffix of the original, so two different hostile values do not collide
  (``"a/b"`` and ``"a_b"`` stay apart).
"""

from __future__ import annotations

import hashlib
import re

__all__ = ["MAX_COMPONENT", "safe_component"]

MAX_COMPONENT = 100
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
_DOTS = re.compile(r"\.{2,}")
_SAFE = re.compile(r"[A-Za-z0-9_-]([A-Za-z0-9._-]*[A-Za-z0-9_-])?")
_DIGEST = 10  # hex characters of the suffix


def safe_component(value: str, *, max_len: int = MAX_COMPONENT) -> str:
    """``value`` as one safe path component (see the module docstring for the rules)."""
    if max_len < _DIGEST + 2:
        raise ValueError(f"max_len must be at least {_DIGEST + 2}, got {max_len}")
    if len(value) <= max_len and _SAFE.fullmatch(value) and ".." not in value:
        return value
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:_DIGEST]
    cleaned = _DOTS.sub(lambda m: "_" * len(m.group()), _UNSAFE.sub("_", value))
    if cleaned.startswith("."):
        cleaned = "_" + cleaned[1:]
    head = cleaned[: max_len - _DIGEST - 1].rstrip(".")
    return f"{head}-{digest}" if head else f"_-{digest}"
