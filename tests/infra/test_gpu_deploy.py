"""What the GPU deployment needs before its first image: CUDA 13 wheels only, the driver's video
capability in the container, and `make image` saying what it lacks instead of failing midway."""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def _gpu_extra() -> dict[str, Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {(r := Requirement(s)).name: r for s in project["optional-dependencies"]["gpu"]}


def test_the_gpu_extra_admits_only_cuda13_builds_and_brings_cupys_headers() -> None:
    gpu = _gpu_extra()
    ort = gpu["onnxruntime-gpu"].specifier
    assert not ort.contains(Version("1.30.0")) and ort.contains(Version("1.31.1"))  # 1.31: the CUDA 13 builds
    cupy = gpu["cupy-cuda13x"]
    assert "ctk" in cupy.extras  # the CUDA headers NVRTC needs for CuPy's run-time kernels
    assert not cupy.specifier.contains(Version("13.6.0"))


def test_the_gpu_image_asks_the_container_toolkit_for_the_video_capability() -> None:
    text = (ROOT / "infra" / "Dockerfile.gpu").read_text()
    caps = re.search(r"NVIDIA_DRIVER_CAPABILITIES=([\w,]+)", text)
    assert caps is not None and {"compute", "utility", "video"} <= set(caps.group(1).split(","))
    assert "580" in text  # the driver floor is written where the image is described


def test_make_image_without_registry_or_debootstrap_says_what_to_install(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text("#!/bin/sh\nexit 1\n")  # no registry answers: nothing can be pulled
    docker.chmod(0o755)
    path = f"{bin_dir}:" + ":".join(p for p in os.environ["PATH"].split(":")
                                     if not (Path(p) / "debootstrap").exists())
    run = subprocess.run(["bash", str(ROOT / "infra" / "images" / "build.sh"), "cpu"], cwd=ROOT,
                         env={**os.environ, "PATH": path}, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    assert "apt-get install debootstrap" in run.stderr and "command not found" not in run.stderr
