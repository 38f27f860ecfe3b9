"""The nvJPEG encoder asks nvImageCodec for the backend kinds its JPEG encoder registers as.

nvImageCodec itself needs a GPU; here a stand-in module records what the encoder asks for (the
module boundary only: the selection code that runs is the encoder's own)."""

from __future__ import annotations

import sys
import types
from enum import Enum
from typing import Any

import pytest

from gpu_kernels.codec.encode import NvJpegEncoder


class _Kind(Enum):
    CPU_ONLY = 0
    GPU_ONLY = 1
    HYBRID_CPU_GPU = 2
    HW_GPU_ONLY = 3


def _fake_nvimgcodec(made: list[dict[str, Any]]) -> types.ModuleType:
    mod = types.ModuleType("nvidia.nvimgcodec")
    for kind in _Kind:
        setattr(mod, kind.name, kind)
    mod.Backend = lambda kind, **_: ("backend", kind)  # type: ignore[attr-defined]

    def encoder(**kwargs: Any) -> object:
        made.append(kwargs)
        return object()

    mod.Encoder = encoder  # type: ignore[attr-defined]
    mod.ChromaSubsampling = types.SimpleNamespace(CSS_444=444, CSS_422=422, CSS_420=420)  # type: ignore[attr-defined]
    return mod


def test_the_jpeg_encoder_admits_the_hybrid_kind_nvjpeg_registers_as(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[dict[str, Any]] = []
    monkeypatch.setitem(sys.modules, "nvidia", types.ModuleType("nvidia"))
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", _fake_nvimgcodec(made))
    NvJpegEncoder("gpu", device_id=0)
    kinds = {kind for _, kind in made[0]["backends"]}
    assert _Kind.HYBRID_CPU_GPU in kinds  # nvJPEG's CUDA encoder: without it no encoder matches
    assert _Kind.GPU_ONLY in kinds
    assert _Kind.CPU_ONLY not in kinds  # host encodes go through CpuEncoder, not nvImageCodec


def test_without_nvimagecodec_the_gpu_encoder_encodes_on_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    from gpu_kernels.codec.encode import CpuEncoder
    from gpu_kernels.presets import load_presets

    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", None)  # import fails as where it is not installed
    enc = NvJpegEncoder("gpu")
    assert enc.version == "host-encode-1"
    image = np.random.default_rng(0).integers(0, 256, (900, 800, 3), dtype=np.uint8)  # > gpu_min_pixels
    preset = next(p for p in load_presets().values() if p.format == "jpeg")
    assert enc.encode(image, preset) == CpuEncoder().encode(image, preset)


def _fake_dali(made: list[dict[str, Any]]) -> dict[str, types.ModuleType]:
    """``nvidia.dali`` as far as ``DecoderChain._build`` goes: the Pipeline's arguments recorded."""

    class Pipeline:
        def __init__(self, **kwargs: Any) -> None:
            made.append(kwargs)

        def __enter__(self) -> Pipeline:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def set_outputs(self, *outputs: object) -> None:
            pass

        def build(self) -> None:
            pass

    fn = types.ModuleType("nvidia.dali.fn")
    fn.external_source = lambda **kwargs: "encoded"  # type: ignore[attr-defined]
    fn.decoders = types.SimpleNamespace(image=lambda *a, **kwargs: "images")  # type: ignore[attr-defined]
    fn.resize = lambda *a, **kwargs: "resized"  # type: ignore[attr-defined]
    dtypes = types.ModuleType("nvidia.dali.types")
    for name in ("UINT8", "FLOAT", "RGB", "INTERP_LINEAR"):
        setattr(dtypes, name, name)
    pipeline = types.ModuleType("nvidia.dali.pipeline")
    pipeline.Pipeline = Pipeline  # type: ignore[attr-defined]
    return {"nvidia": types.ModuleType("nvidia"), "nvidia.dali": types.ModuleType("nvidia.dali"),
            "nvidia.dali.fn": fn, "nvidia.dali.types": dtypes, "nvidia.dali.pipeline": pipeline}


@pytest.mark.parametrize(("cores", "want"), [(16, 8), (5, 5), (1, 1)])
def test_the_gpu_decoder_s_cpu_threads_follow_the_cores_the_process_may_use(
        monkeypatch: pytest.MonkeyPatch, cores: int, want: int) -> None:
    from gpu_kernels.codec import DecoderChain, decode_threads

    made: list[dict[str, Any]] = []
    for name, mod in _fake_dali(made).items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(cores)))
    assert decode_threads("gpu") == want
    dec = DecoderChain("gpu")
    dec._build(resized=False)
    assert made[-1]["num_threads"] == want  # DALI's pipeline threads: the hybrid nvJPEG's host half
    assert DecoderChain("gpu", num_threads=3).num_threads == 3  # set by the caller: kept
    assert DecoderChain("cpu").num_threads == 2  # a CPU worker's cores also run the model: unchanged
