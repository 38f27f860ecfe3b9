"""Rehearsal of the GPU validation run where it will run: no network, only the packages of a stock
PyTorch GPU image, plus the folder the run brings (bench/gpu/suite.py pack).

Here there is no GPU, so the run takes its CPU mode, but every step goes through: a module the run
imports that is neither stock nor in the folder, or any download, fails it. The stock set is
numpy, Pillow, OpenCV and ONNX Runtime with their own dependencies (and torch, torchvision and
CuPy where this Python has them); a fresh virtualenv sees only those and the folder."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.gpu.suite import copy_installed  # noqa: E402

STOCK_ROOTS = ("numpy", "pillow", "opencv-python-headless", "onnxruntime", "torch", "torchvision", "cupy-cuda13x")


def _stock_dists() -> list[md.Distribution]:
    from packaging.requirements import Requirement

    seen: dict[str, md.Distribution] = {}
    todo = list(STOCK_ROOTS)
    while todo:
        name = todo.pop()
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        if dist.metadata["Name"].lower() in seen:
            continue
        seen[dist.metadata["Name"].lower()] = dist
        todo += [Requirement(r).name for r in dist.requires or [] if "extra ==" not in r]
    return list(seen.values())


def _network_off() -> list[str]:
    """A prefix that runs a command in a network namespace of its own (only loopback), or [] where
    this machine cannot make one."""
    if shutil.which("unshare") is None:
        return []
    probe = subprocess.run(["unshare", "-n", "true"], capture_output=True, timeout=10)
    return ["unshare", "-n"] if probe.returncode == 0 else []


@pytest.fixture(scope="module")
def stock_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv on the base interpreter, with the stock packages only."""
    root = tmp_path_factory.mktemp("stock")
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True,  # type: ignore[attr-defined]
                   timeout=120)
    stock = root / "stock"
    copy_installed(_stock_dists(), stock)
    site = next((root / "venv" / "lib").glob("python3*/site-packages"))
    (site / "stock.pth").write_text(f"{stock}\n")
    return root / "venv" / "bin" / "python"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run's folder as bench/gpu/suite.py pack makes it (from this Python's packages: no download)."""
    out = tmp_path_factory.mktemp("folder")
    subprocess.run([sys.executable, str(ROOT / "bench" / "gpu" / "suite.py"), "pack", str(out), "--from-installed",
                    "--no-model"], check=True, timeout=120, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    from gpu_kernels.segment.fetch_model import ensure_u2netp

    model = Path(ensure_u2netp().batched).parent  # fetched here, before the run: the run itself is offline
    (out / "model").mkdir()
    for name in ("u2netp.onnx", "u2netp.batched.onnx", "u2netp.batched.json"):
        os.symlink(model / name, out / "model" / name)
    return out


def _suite(python: Path, folder: Path, out: Path, *, timeout: int) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "HOME": str(out.parent), "PYTHON": str(python), "E2E_N": "4", "LANG": "C.UTF-8"}
    return subprocess.run([*_network_off(), "bash", str(ROOT / "bench" / "gpu" / "suite.sh"), str(folder), str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_stock_image_lacks_lightboxs_dependencies(stock_python: Path) -> None:
    """The rehearsal's premise: without the folder, the run's imports fail (fastavro is no stock package)."""
    run = subprocess.run([str(stock_python), "-c", "import numpy, cv2, onnxruntime; import fastavro"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and "fastavro" in run.stderr


def test_a_missing_dependency_stops_the_run_at_preflight_with_one_line(stock_python: Path, folder: Path,
                                                                       tmp_path: Path) -> None:
    thin = tmp_path / "thin"
    shutil.copytree(folder, thin, symlinks=True)
    shutil.rmtree(thin / "site" / "fastavro")
    run = _suite(stock_python, thin, tmp_path / "out", timeout=120)
    assert run.returncode == 1, run.stdout[-2000:]
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("== preflight")]
    assert len(lines) == 1 and "'fastavro' is missing" in lines[0], run.stdout[-2000:]
    assert "== e2e" not in run.stdout  # nothing runs after a failed preflight
    assert (tmp_path / "out" / "gpu_suite.json").is_file()  # the report still says what happened


@pytest.mark.slow
def test_the_run_goes_through_offline_on_a_stock_image_plus_its_folder(stock_python: Path, folder: Path,
                                                                       tmp_path: Path) -> None:
    if os.geteuid() == 0:
        assert _network_off(), "as root the rehearsal runs without a network (unshare -n)"
    out = tmp_path / "out"
    run = _suite(stock_python, folder, out, timeout=400)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["gpu_suite.json", "gpu_suite.png", "gpu_suite.tar.gz"]
    report = json.loads((out / "gpu_suite.json").read_text())
    assert report["mode"] == "cpu"
    summary = report["summary"]
    for name in ("preflight", "e2e", "model"):  # the steps that run in CPU mode ran, none cut or failed
        assert summary[name]["status"] == "ok", (name, summary[name], run.stdout[-3000:])
    assert summary["parity"]["status"] in ("ok", "exit 5"), summary["parity"]  # 5: every GPU test skipped
    e2e = [r for r in report["rows"]["e2e"] if r["kind"] == "row"]
    assert e2e and all(r["processed"] > 0 and r["dead_letters"] == 0 for r in e2e), e2e
    assert all(r["segment_runtime"].startswith("u2netp@") for r in e2e)  # the model made the masks
    model_rows = [r for r in report["rows"]["model"] if r["kind"] == "row"]
    assert {r["precision"] for r in model_rows} == {"fp32", "fp16"}, model_rows
    assert (out / "gpu_suite.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with tarfile.open(out / "gpu_suite.tar.gz") as tar:
        names = {Path(n).name for n in tar.getnames()}
    assert {"gpu_suite.json", "gpu_suite.png", "gpu_suite.rows.jsonl", "e2e.log", "model.log"} <= names
