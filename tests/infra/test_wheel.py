"""The wheel works outside the source checkout: build it, install it into a fresh virtualenv,
and from a temporary folder run ``lightbox --version``, ``doctor``, ``samples`` and a short
end-to-end demo (its own local broker, a worker, a few photos and bad files, every input
accounted for).

The fresh environment is made with uv (a dev dependency): it installs the wheel's
dependencies from PyPI through its cache in seconds, where pip would unpack ~1.5 GB again.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _build_wheel(dest: Path) -> Path:
    """Build the wheel from a copy of the tracked files, so setuptools' build/ and egg-info land
    in a temporary folder, never in the checkout."""
    src = dest / "src"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dest), str(src)],
                   check=True, cwd=dest, timeout=300)
    (wheel,) = dest.glob("lightbox-*.whl")
    return wheel

pytestmark = [pytest.mark.slow, pytest.mark.kafka]


def _uv() -> str:
    found = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
    if not Path(found).exists():
        pytest.skip("uv is not installed (it is a dev dependency: pip install -e '.[dev]')")
    return found


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin/ folder of a fresh virtualenv holding only the built wheel and its dependencies."""
    uv = _uv()
    wheel = _build_wheel(tmp_path_factory.mktemp("dist"))
    venv = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([uv, "venv", "-q", "--seed", "--python", sys.executable, str(venv)], check=True, timeout=120)
    env = {**os.environ, "VIRTUAL_ENV": str(venv)}
    # the documented CPU install: the wheel with its `cpu` extra (the CPU ONNX Runtime)
    subprocess.run([uv, "pip", "install", "-q", f"{wheel}[cpu]"], check=True, env=env, timeout=900,
                   cwd=venv)
    return venv / "bin"


def test_wheel_ships_its_run_time_files(tmp_path: Path) -> None:
    """Every file the code reads at run time is in the wheel, as package data."""
    names = set(zipfile.ZipFile(_build_wheel(tmp_path)).namelist())
    for needed in ("schemas/registry.json", "schemas/product_image_event.avsc", "gpu_kernels/presets.toml",
                   "lightbox/devservers/data/kafka-pom.xml", "lightbox/devservers/data/s3proxy-pom.xml",
                   "lightbox/devservers/triton_serve.py", "lightbox/__init__.py", "blobio/__init__.py"):
        assert needed in names, f"{needed} is not in the wheel"
    assert not any(n.startswith(("tests/", "bench/")) for n in names)


def _run(bin_dir: Path, args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIGHTBOX_KAFKA", "PYTHONPATH", "VIRTUAL_ENV"))}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["COLUMNS"] = "200"
    return subprocess.run([str(bin_dir / "lightbox"), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_installed_commands_run_outside_the_checkout(installed: Path, tmp_path: Path) -> None:
    # the interpreter of the fresh environment must not see the checkout's packages
    probe = subprocess.run([str(installed / "python"), "-c", "import schemas, lightbox; "
                            "print(schemas.__file__); print(lightbox.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, check=True)
    assert str(ROOT) not in probe.stdout and "site-packages" in probe.stdout, probe.stdout

    version = _run(installed, ["--version"], tmp_path)
    assert version.returncode == 0 and version.stdout.startswith("lightbox "), version.stdout + version.stderr

    doctor = _run(installed, ["doctor", "--bootstrap", "127.0.0.1:1"], tmp_path)
    print(doctor.stdout)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "python" in doctor.stdout and "broker" in doctor.stdout

    samples = _run(installed, ["samples", "cat"], tmp_path)
    assert samples.returncode == 0, samples.stdout + samples.stderr
    assert len(list((tmp_path / "cat").rglob("*.jpg"))) >= 4

    demo = _run(installed, ["demo", "--count", "4", "--segmenter", "classical", "--presets", "thumb_webp",
                            "--out", "demo", "--timeout", "240"], tmp_path, timeout=420)
    print(demo.stdout[-3000:])
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert "4 processed" in demo.stdout
    assert len(list((tmp_path / "demo" / "images").iterdir())) == 4
