"""The stage list: the framework records spans and per-item errors for any stage added with one
line, an exception in one stage fails only its items, and lanes follow the encoder's device."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from gpu_kernels.backends import Encoder, RetouchOptions
from gpu_kernels.codec import CpuEncoder, make_decoder
from gpu_kernels.pipeline import ImagePipeline, Job, default_stages, light_batch
from gpu_kernels.presets import Preset, load_presets
from gpu_kernels.retouch import CpuRetoucher
from gpu_kernels.spans import SpanRecorder
from gpu_kernels.stages import BatchContext, Stage, Step
from schemas.errors import ErrorCode, ProcessingFailed, TooLarge


class Probe(Stage):
    """A new stage as a user would write one: counts pixels of the corrected image, refuses one size."""

    name = "probe"
    lane = "output"  # after correct, which runs in the output lane on the CPU

    def __init__(self, refuse_width: int) -> None:
        self.refuse_width = refuse_width

    def apply(self, ctx: BatchContext, idx: list[int]) -> Sequence[object]:
        out: list[object] = []
        for i in idx:
            img = ctx.corrected[i]
            out.append(TooLarge("refused on purpose") if img.shape[1] == self.refuse_width else int(img.size))
        return out

    def keep(self, ctx: BatchContext, i: int, value: Any) -> None:
        ctx.memo["probe", i] = value


class Boom(Stage):
    """Raises (not a LightboxError) in the step of one preset only."""

    name = "boom"
    lane = "output"

    def __init__(self, preset: str) -> None:
        self.preset = preset

    def steps(self, ctx: BatchContext) -> Iterable[Step]:
        for p in ctx.presets():
            yield Step(f"boom:{p.name}", "cpu", ctx.asking(p), lambda ix, p=p: self._run(p, ix),  # type: ignore[misc]
                       lambda i, v: None)

    def _run(self, preset: Preset, idx: list[int]) -> list[object]:
        if preset.name == self.preset:
            raise RuntimeError("kernel bug")
        return [None] * len(idx)


def cpu_pipeline(*extra: tuple[int, Stage], encoder: Encoder | None = None) -> ImagePipeline:
    enc = encoder or CpuEncoder()
    stages = default_stages(make_decoder("cpu"), CpuRetoucher(), enc)
    for at, stage in extra:
        stages.insert(at, stage)  # the one line that adds a stage
    return ImagePipeline(make_decoder("cpu"), CpuRetoucher(), enc, stages=stages)


def jobs_for(files: list[Path], *preset_sets: list[Preset]) -> list[Job]:
    return [Job(f.read_bytes(), ps, RetouchOptions(), SpanRecorder()) for f, ps in zip(files, preset_sets, strict=True)]


def names(stages: Sequence[Stage]) -> list[str]:
    return [s.name for s in stages]


def test_a_stage_added_with_one_line_gets_spans_and_per_item_errors(catalog: list[Path]) -> None:
    thumb = load_presets().resolve(["thumb_webp"])
    jobs = jobs_for(catalog[:3], thumb, thumb, thumb)
    widths = [make_decoder("cpu").decode_batch([j.data], max_side=400)[0].shape[1] for j in jobs]
    assert len(set(widths)) == 3, "the test needs three different widths"
    pipe = cpu_pipeline((4, Probe(refuse_width=widths[1])))  # after correct, before render
    results = pipe.run_batch(jobs)
    assert [r.ok for r in results] == [True, False, True]
    err = results[1].error
    assert err is not None and err.code is ErrorCode.TOO_LARGE and err.stage == "probe"  # the framework named it
    assert results[1].variants == []
    for k in (0, 2):
        probe = [s for s in jobs[k].spans.spans if s.stage == "probe"]
        assert len(probe) == 1 and probe[0].batch_size == 3 and probe[0].duration_us >= 1
        assert [v.preset for v in results[k].variants] == ["thumb_webp"]
    # the failed item got its probe span too, and no span of any later stage
    assert [s.stage for s in jobs[1].spans.spans] == ["decode", "correct", "probe"]
    # later stages ran over the two survivors only
    render = next(s for s in jobs[0].spans.spans if s.stage == "preset:thumb_webp")
    assert render.batch_size == 2
    pipe.close()


def test_an_exception_in_one_stage_fails_only_its_items(catalog: list[Path]) -> None:
    book = load_presets()
    a, b = book.resolve(["thumb_webp"]), book.resolve(["thumb_webp", "jd_main"])
    jobs = jobs_for(catalog[:4], a, b, a, b)
    pipe = cpu_pipeline((5, Boom("jd_main")))
    results = pipe.run_batch(jobs)
    assert [r.ok for r in results] == [True, False, True, False]
    for k in (1, 3):
        err = results[k].error
        assert isinstance(err, ProcessingFailed) and err.stage == "boom:jd_main" and "RuntimeError" in err.message
    assert all(r.variants and r.quality is not None for r in (results[0], results[2]))
    pipe.close()


def test_a_stage_whose_planning_raises_fails_the_live_items_not_the_worker(catalog: list[Path]) -> None:
    class BadPlan(Stage):
        name = "bad_plan"
        lane = "output"

        def steps(self, ctx: BatchContext) -> Iterable[Step]:
            raise KeyError("no such thing")

    jobs = jobs_for(catalog[:2], *[load_presets().resolve(["thumb_webp"])] * 2)
    results = cpu_pipeline((99, BadPlan())).run_batch(jobs)
    assert all(r.error is not None and r.error.stage == "bad_plan" for r in results)


def test_quality_is_a_stage_with_its_own_span(catalog: list[Path]) -> None:
    jobs = jobs_for(catalog[:2], *[load_presets().resolve(["jd_main"])] * 2)
    results = cpu_pipeline().run_batch(jobs)
    for job, res in zip(jobs, results, strict=True):
        (q,) = [s for s in job.spans.spans if s.stage == "quality"]
        assert q.batch_size == 2 and q.device == "cpu"
        assert res.quality is not None and 0 < res.quality.background_whiteness <= 1


class FakeGpuEncoder:
    """Only what the lane assignment reads: a device named "gpu". Never encodes."""

    device = "gpu"
    version = "fake-gpu-1"

    def encode(self, image: Any, preset: Preset) -> bytes:
        raise AssertionError("not used in this test")

    def close(self) -> None:
        pass


def test_encode_runs_in_the_device_lane_for_a_gpu_encoder_and_the_output_lane_for_the_cpu_one() -> None:
    cpu = cpu_pipeline()
    assert names(cpu.lane("decode")) == ["decode"]
    # all CPU: the device thread only runs the model; refine, correct, render, shadow and encode
    # run in the output threads
    assert names(cpu.lane("device")) == ["segment"]
    assert names(cpu.lane("output"))[:5] == ["refine", "correct", "preset", "shadow", "encode"]
    assert "quality" in names(cpu.lane("output"))
    gpu = cpu_pipeline(encoder=FakeGpuEncoder())
    assert isinstance(FakeGpuEncoder(), Encoder)
    # a GPU encoder: the canvas stays in the device lane, render and shadow before encode there
    assert names(gpu.lane("device")) == ["segment", "refine", "correct", "preset", "shadow", "encode"]
    assert "encode" not in names(gpu.lane("output")) and "quality" in names(gpu.lane("output"))
    assert names(cpu.stages) == names(gpu.stages)
    canvas = ("refine", "correct", "preset", "shadow", "encode")
    assert {s.name: s.lane for s in cpu.stages if s.name not in canvas} == {
        s.name: s.lane for s in gpu.stages if s.name not in canvas}


def test_a_list_that_goes_back_to_an_earlier_lane_is_refused() -> None:
    class Late(Stage):
        name = "late"
        lane = "decode"

    with pytest.raises(ValueError, match="'late'"):
        cpu_pipeline((99, Late()))


def test_lanes_run_separately_and_the_device_lane_does_no_cpu_encode(catalog: list[Path]) -> None:
    pipe = cpu_pipeline()
    jobs = jobs_for(catalog[:2], *[load_presets().resolve(["thumb_webp"])] * 2)
    ctx = pipe.start(jobs)
    pipe.run_lane(ctx, "decode")
    assert sorted(ctx.images) == [0, 1] and not ctx.corrected
    pipe.run_lane(ctx, "device")
    assert sorted(ctx.masks) == [0, 1] and not ctx.corrected and not ctx.rendered  # correct: output lane on the CPU
    assert not any(s.stage.startswith(("encode:", "preset:")) for s in jobs[0].spans.spans)
    pipe.run_lane(ctx, "output")
    results = ctx.finalize()
    assert all(r.ok and r.variants[0].data[:4] == b"RIFF" for r in results)  # WebP
    assert isinstance(ctx.rendered[0, "thumb_webp"], np.ndarray)


class Overlap(Stage):
    """Output lane: how many batches are inside this stage at once (the most seen), and, with
    ``meet``, a barrier two batches must reach together (proof that they ran side by side)."""

    name = "overlap"
    lane = "output"

    def __init__(self, meet: threading.Barrier | None = None) -> None:
        self.meet, self.inside, self.most = meet, 0, 0
        self.lock = threading.Lock()

    def apply(self, ctx: BatchContext, idx: list[int]) -> Sequence[object]:
        with self.lock:
            self.inside += 1
            self.most = max(self.most, self.inside)
        try:
            if self.meet is not None:
                self.meet.wait()
            else:
                time.sleep(0.2)  # room for a second batch to come in, if the lane let it
        finally:
            with self.lock:
                self.inside -= 1
        return [None] * len(idx)

    def keep(self, ctx: BatchContext, i: int, value: Any) -> None:
        pass


def noise_images(count: int, side: int, fmt: str = "JPEG") -> list[bytes]:
    rng = np.random.default_rng(side)
    out = []
    for _ in range(count):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(buf, format=fmt)
        out.append(buf.getvalue())
    return out


def run_side_by_side(pipe: ImagePipeline, batches: list[list[Job]]) -> list[list[Any]]:
    ctxs = [pipe.start(jobs) for jobs in batches]
    for ctx in ctxs:
        pipe.run_lane(ctx, "decode")
        pipe.run_lane(ctx, "device")
    with ThreadPoolExecutor(len(ctxs)) as pool:
        done = list(pool.map(lambda c: pipe.run_lane(c, "output").finalize(), ctxs))
    return done


def test_light_batches_take_the_output_lane_one_at_a_time_and_heavier_ones_side_by_side() -> None:
    # two threads running small images' many small NumPy calls only hand the GIL to each other
    tiny = Preset("tiny", 64, 64, fill=1.0, sharpen=0.0)
    thumb = load_presets()["thumb_webp"]  # a 400x400 canvas: pixel work, which releases the GIL
    blobs = noise_images(2, 64)

    def batch(preset: Preset) -> list[Job]:
        return [Job(b, [preset], RetouchOptions(background="keep"), SpanRecorder()) for b in blobs[:2]]

    light = Overlap()
    pipe = cpu_pipeline((99, light))
    ctx = pipe.start(batch(tiny))
    pipe.run_lane(ctx, "decode")
    assert light_batch(ctx)
    results = run_side_by_side(pipe, [batch(tiny), batch(tiny), batch(tiny)])
    assert light.most == 1
    assert all(r.ok and r.variants[0].width == 64 for res in results for r in res)

    heavy = Overlap(threading.Barrier(2, timeout=30))  # breaks (and fails the items) unless both meet
    pipe = cpu_pipeline((99, heavy))
    results = run_side_by_side(pipe, [batch(thumb), batch(thumb)])
    assert heavy.most == 2
    assert all(r.ok and r.variants[0].width == 400 for res in results for r in res)

    # one large image makes the batch heavy (a PNG: a JPEG would be decoded at the preset's scale),
    # and an item that already failed does not count
    big = pipe.start([Job(noise_images(1, 512, "PNG")[0], [tiny], RetouchOptions(background="keep"), SpanRecorder()),
                      *batch(tiny)])
    pipe.run_lane(big, "decode")
    assert big.images[0].shape[:2] == (512, 512) and not light_batch(big)
    big.fail(0, TooLarge("left the batch"), "test")
    assert light_batch(big)
