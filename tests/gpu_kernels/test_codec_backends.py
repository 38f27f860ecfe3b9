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


class _CodeStream(bytes):
    """What nvImageCodec hands back: a buffer with its ``size``."""

    @property
    def size(self) -> int:
        return len(self)


def _fake_nvjpeg(calls: list[tuple[int, float]]) -> types.ModuleType:
    """nvImageCodec whose JPEG "encoder" returns libjpeg-turbo's bytes (so outputs can be compared
    with the CPU pipeline's) and records each call: (images in it, quality)."""
    from gpu_kernels.codec.encode import CpuEncoder
    from gpu_kernels.presets import Preset

    libjpeg = CpuEncoder.encode  # as it is now: the test counts later calls of the CPU encoder
    mod = _fake_nvimgcodec([])
    mod.QualityType = types.SimpleNamespace(QUALITY="quality")  # type: ignore[attr-defined]
    mod.EncodeParams = lambda **kw: types.SimpleNamespace(**kw)  # type: ignore[attr-defined]

    class Encoder:
        def __init__(self, **kwargs: Any) -> None:
            self.kwargs = kwargs

        def encode(self, images: Any, codec: str, *, params: Any, cuda_stream: int = 0) -> Any:
            assert codec == "jpeg" and isinstance(images, list)
            calls.append((len(images), params.quality_value))
            q = int(params.quality_value)
            return [_CodeStream(libjpeg(CpuEncoder(), im, Preset("x", 8, 8, quality=q))) for im in images]

    mod.Encoder = Encoder  # type: ignore[attr-defined]
    return mod


def test_the_device_lane_encodes_large_jpegs_in_one_nvjpeg_call_and_the_output_lane_the_cpu_formats(
        monkeypatch: pytest.MonkeyPatch, catalog: list[Any]) -> None:
    from gpu_kernels.backends import RetouchOptions
    from gpu_kernels.codec import CpuEncoder, make_decoder
    from gpu_kernels.pipeline import ImagePipeline, Job
    from gpu_kernels.presets import Preset, load_presets
    from gpu_kernels.retouch import CpuRetoucher
    from gpu_kernels.spans import SpanRecorder

    calls: list[tuple[int, float]] = []
    monkeypatch.setitem(sys.modules, "nvidia", types.ModuleType("nvidia"))
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", _fake_nvjpeg(calls))
    cpu_encodes: list[str] = []
    real = CpuEncoder.encode

    def counted(self: CpuEncoder, image: Any, preset: Preset) -> bytes:
        cpu_encodes.append(preset.name)
        return real(self, image, preset)

    presets = [*load_presets().resolve(["jd_main", "thumb_webp", "transparent_png"]), Preset("small_jpeg", 300, 300)]
    files = catalog[:3]

    def jobs() -> list[Job]:
        return [Job(f.read_bytes(), presets, RetouchOptions(), SpanRecorder()) for f in files]

    want = ImagePipeline(make_decoder("cpu"), CpuRetoucher(), CpuEncoder()).run_batch(jobs())
    monkeypatch.setattr(CpuEncoder, "encode", counted)
    pipe = ImagePipeline(make_decoder("cpu"), CpuRetoucher(), NvJpegEncoder("gpu"))
    assert [s.name for s in pipe.lane("device")][-1] == "encode" and "encode" in [s.name for s in pipe.lane("output")]
    ctx = pipe.start(jobs())
    pipe.run_lane(ctx, "decode")
    pipe.run_lane(ctx, "device")
    assert calls == [(len(files), 90.0)]  # jd_main (800x800): the batch's images in one call
    assert cpu_encodes == []  # no CPU encode in the device lane
    assert sorted(k[1] for k in ctx.encoded) == ["jd_main"] * len(files)
    pipe.run_lane(ctx, "output")
    got = ctx.finalize()
    assert sorted(set(cpu_encodes)) == ["small_jpeg", "thumb_webp", "transparent_png"]
    assert calls == [(len(files), 90.0)]
    for g, w in zip(got, want, strict=True):
        assert g.ok and w.ok, (g.error, w.error)
        assert [(v.preset, v.data) for v in g.variants] == [(v.preset, v.data) for v in w.variants]
    job = ctx.jobs[0]
    devices = {s.stage: s.device for s in job.spans.spans if s.stage.startswith("encode:")}
    assert devices == {"encode:jd_main": "gpu", "encode:thumb_webp": "cpu", "encode:transparent_png": "cpu",
                       "encode:small_jpeg": "cpu"}
