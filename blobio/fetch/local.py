"""file:// fetch: regular files under configured roots only, read through a byte limit.

Never trusts ``stat`` for size (``/dev/zero`` and ``/proc`` files report 0); opens non-blocking so a FIFO
cannot hang the fetch, then refuses anything that is not a regular file; refuses /proc, /sys and /dev
even when a root contains them; resolves symlinks before the root check, and opens with O_NOFOLLOW.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from blobio.fetch.errors import Reason, fetch_error
from blobio.fetch.policy import FetchPolicy

__all__ = ["read_file_uri"]

PSEUDO_FILESYSTEMS = (Path("/proc"), Path("/sys"), Path("/dev"))
CHUNK = 1 << 20


def _under(path: Path, root: Path) -> bool:
    return path == root or path.is_relative_to(root)


def read_file_uri(path_text: str, shown: str, policy: FetchPolicy) -> bytes:
    """The bytes of the file at ``path_text`` (already percent-decoded); ``shown`` names it in errors."""
    if not policy.file_roots:
        raise fetch_error("denied", f"{shown}: file:// is disabled on this worker (LIGHTBOX_FILE_ROOTS names "
                                    "the folders it may read)")
    if not path_text.startswith("/"):
        raise fetch_error("malformed", f"{shown}: a file:// URI needs an absolute path")
    try:
        path = Path(os.path.realpath(path_text))  # symlinks resolved: where the bytes really are
    except (OSError, ValueError):
        raise fetch_error("malformed", f"{shown}: the path cannot be resolved") from None
    roots = [Path(os.path.realpath(r)) for r in policy.file_roots]
    if not any(_under(path, r) for r in roots):
        raise fetch_error("denied", f"{shown} is outside the allowed file roots")
    if any(_under(path, p) for p in PSEUDO_FILESYSTEMS):
        raise fetch_error("denied", f"{shown}: /proc, /sys and /dev are never read")
    try:  # refuse a non-regular file before open (opening a socket fails, a device may block) ...
        _require_regular(os.stat(path, follow_symlinks=False).st_mode, shown)
    except FileNotFoundError:
        raise fetch_error("not found", f"no such file: {shown}") from None
    except PermissionError:
        raise fetch_error("denied", f"cannot open {shown}: permission denied") from None
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise fetch_error("not found", f"no such file: {shown}") from None
    except OSError as exc:
        reason: Reason = "denied" if isinstance(exc, PermissionError) else "unreadable"
        raise fetch_error(reason, f"cannot open {shown}: {exc.strerror or type(exc).__name__}") from None
    try:
        _require_regular(os.fstat(fd).st_mode, shown)  # ... and after: what was opened is what counts
        opened = _fd_path(fd)  # a folder swapped for a symlink between the check and the open: caught here
        if opened is not None and not any(_under(opened, r) for r in roots):
            raise fetch_error("denied", f"{shown} is outside the allowed file roots")
        os.set_blocking(fd, True)
        return _read_limited(fd, shown, policy.max_bytes)
    finally:
        os.close(fd)


def _fd_path(fd: int) -> Path | None:
    """Where an open file really is (Linux); None where the system cannot say."""
    try:
        return Path(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        return None


def _require_regular(mode: int, shown: str) -> None:
    if stat.S_ISREG(mode):
        return
    kind = next((k for test, k in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                                   (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                                   (stat.S_ISLNK, "a symlink")) if test(mode)), "not a regular file")
    raise fetch_error("denied", f"{shown} is {kind}; only regular files are read")


def _read_limited(fd: int, shown: str, max_bytes: int) -> bytes:
    """Read until EOF, refusing at ``max_bytes + 1`` bytes whatever the file claims to hold."""
    chunks: list[bytes] = []
    total = 0
    while True:
        try:
            chunk = os.read(fd, min(CHUNK, max_bytes + 1 - total))
        except OSError as exc:
            raise fetch_error("unreadable", f"cannot read {shown}: {exc.strerror or type(exc).__name__}") from None
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        if total > max_bytes:
            raise fetch_error("too large", f"{shown} holds more than the {max_bytes}-byte limit")
