"""The CPU session's optimised graph, kept in the model cache: the masks of a session loaded from
it are the masks of a session that optimised the model itself, byte for byte; its key changes
with everything the graph depends on; a kept graph that does not load is made again."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpu_kernels.segment import onnx_runner
from gpu_kernels.segment.onnx_runner import OnnxSegmenter, compiled_path, cpu_session_options
from gpu_kernels.segment.runtime import gate_images


@pytest.fixture(scope="module")
def images() -> list[np.ndarray]:
    """Three photographs and two composites of the gate set."""
    every = gate_images()
    return [every[0], every[2], every[4], every[8], every[13]]


def masks(seg: OnnxSegmenter, images: list[np.ndarray]) -> list[bytes]:
    out = seg.segment_batch(images)
    return [np.asarray(m).tobytes() for m in out]


def test_a_kept_graph_gives_the_same_masks_byte_for_byte(u2netp: Any, images: list[np.ndarray],
                                                       tmp_path: Path) -> None:
    plain = OnnxSegmenter(u2netp.batched, threads=2, keep_compiled=False)
    first = OnnxSegmenter(u2netp.batched, threads=2, compiled_dir=tmp_path)  # optimises, keeps the graph
    kept = compiled_path(u2netp.batched, cpu_session_options(2), tmp_path)
    assert first.compiled_from is None and kept.is_file()
    assert sorted(tmp_path.iterdir()) == [kept, kept.with_name(kept.name + ".sha256")]  # no temporary file left
    again = OnnxSegmenter(u2netp.batched, threads=2, compiled_dir=tmp_path)
    assert again.compiled_from == kept
    expected = masks(plain, images)
    assert masks(first, images) == expected
    assert masks(again, images) == expected
    assert any(m.count(255) for m in expected)  # the photos have a subject: the comparison means something


def test_the_key_changes_with_the_model_runtime_options_and_cpu(u2netp: Any, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    opts = cpu_session_options(2)
    base = compiled_path(u2netp.batched, opts, tmp_path)
    assert base == compiled_path(u2netp.batched, cpu_session_options(2), tmp_path)
    assert base.parent == tmp_path and base.name.startswith("u2netp.batched.")
    other_model = tmp_path / "u2netp.batched.onnx"
    data = bytearray(u2netp.batched.read_bytes())
    data[-1] ^= 1
    other_model.write_bytes(bytes(data))
    assert compiled_path(other_model, opts, tmp_path).name != base.name
    assert compiled_path(u2netp.batched, cpu_session_options(1), tmp_path) != base
    spinning = cpu_session_options(2)
    spinning.add_session_config_entry("session.intra_op.allow_spinning", "1")
    assert compiled_path(u2netp.batched, spinning, tmp_path) != base
    monkeypatch.setattr(onnx_runner, "cpu_flags_line", lambda: "flags : fpu sse2")
    assert compiled_path(u2netp.batched, opts, tmp_path) != base
    monkeypatch.undo()
    import onnxruntime

    monkeypatch.setattr(onnxruntime, "__version__", "0.0.1")
    assert compiled_path(u2netp.batched, opts, tmp_path) != base


@pytest.mark.parametrize("damage", ["cut short", "one byte changed", "no checksum"])
def test_a_kept_graph_that_is_damaged_is_made_again(u2netp: Any, images: list[np.ndarray], tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture, damage: str) -> None:
    OnnxSegmenter(u2netp.batched, threads=2, compiled_dir=tmp_path)
    kept = compiled_path(u2netp.batched, cpu_session_options(2), tmp_path)
    data = bytearray(kept.read_bytes())
    if damage == "cut short":  # as by a full disk
        kept.write_bytes(bytes(data[:100_000]))
    elif damage == "one byte changed":  # a weight: the file still loads, its masks would differ
        data[len(data) // 2] ^= 0x40
        kept.write_bytes(bytes(data))
    else:
        kept.with_name(kept.name + ".sha256").unlink()
    with caplog.at_level(logging.WARNING, logger=onnx_runner.__name__):
        seg = OnnxSegmenter(u2netp.batched, threads=2, compiled_dir=tmp_path)
    assert seg.compiled_from is None
    assert any("did not load" in r.getMessage() for r in caplog.records)
    plain = OnnxSegmenter(u2netp.batched, threads=2, keep_compiled=False)
    assert masks(seg, images[:2]) == masks(plain, images[:2])
    assert OnnxSegmenter(u2netp.batched, threads=2, compiled_dir=tmp_path).compiled_from == kept  # made again


def test_a_cache_that_cannot_be_written_is_not_used(u2netp: Any, tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    seg = OnnxSegmenter(u2netp.batched, threads=2, compiled_dir=blocked / "onnxruntime")
    assert seg.compiled_from is None and blocked.is_file()
    assert seg.segment_batch([np.zeros((32, 32, 3), np.uint8)])[0].shape == (32, 32)


def test_the_kept_graph_is_per_model_file(u2netp: Any, tmp_path: Path) -> None:
    """The original (fixed batch) and the batched model keep one graph each."""
    model = tmp_path / "models" / "u2netp.onnx"
    model.parent.mkdir()
    shutil.copy(u2netp.original, model)
    OnnxSegmenter(model, threads=2, compiled_dir=tmp_path / "kept")
    OnnxSegmenter(u2netp.batched, threads=2, compiled_dir=tmp_path / "kept")
    assert len(list((tmp_path / "kept").glob("*.onnx"))) == 2
    assert len(list((tmp_path / "kept").glob("*.onnx.sha256"))) == 2
