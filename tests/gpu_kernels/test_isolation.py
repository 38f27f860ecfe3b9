"""One bad image never takes good ones with it: a step whose call raises over a batch is run again
over halves until the error sits on the guilty item alone; its batch-mates go on and come out
byte-identical to a run without it, whatever the batch size and the poison's position."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from gpu_kernels.backends import RetouchOptions
from gpu_kernels.codec import CpuEncoder, make_decoder
from gpu_kernels.pipeline import ImagePipeline, Job, default_stages
from gpu_kernels.presets import Preset
from gpu_kernels.retouch import CpuRetoucher
from gpu_kernels.spans import SpanRecorder
from gpu_kernels.stages import BatchContext, Stage
from gpu_kernels.stages.base import JobResult, run_step
from schemas.errors import ErrorCode, FatalError, LightboxError, TooLarge
from tests.isolation_kit import PoisonStage, photo, poison

SMALL = Preset("iso_small", 96, 96, "jpeg", 80)


def pipeline_with(stage: Stage) -> ImagePipeline:
    dec, ret, enc = make_decoder("cpu"), CpuRetoucher(), CpuEncoder()
    stages = default_stages(dec, ret, enc)
    stages.insert(1, stage)
    return ImagePipeline(dec, ret, enc, stages=stages)


def job(data: bytes) -> Job:
    return Job(data, [SMALL], RetouchOptions(), SpanRecorder())


@pytest.fixture(scope="module")
def goods() -> list[bytes]:
    return [photo(seed) for seed in range(8)]


@pytest.fixture(scope="module")
def alone(goods: list[bytes]) -> list[bytes]:
    """Each good photo's variant, processed in a batch of one."""
    pipe = pipeline_with(PoisonStage())
    out = []
    for g in goods:
        (res,) = pipe.run_batch([job(g)])
        assert res.ok, res.error
        out.append(res.variants[0].data)
    return out


@pytest.mark.parametrize("size", [1, 2, 4, 8])
def test_a_poison_image_in_every_position_fails_alone(size: int, goods: list[bytes], alone: list[bytes]) -> None:
    pipe = pipeline_with(PoisonStage())
    for pos in range(size):
        blobs = [g for g in goods[: size - 1]]
        blobs.insert(pos, poison(pos))
        results = pipe.run_batch([job(b) for b in blobs])
        bad = results[pos]
        assert not bad.ok and bad.error is not None
        assert bad.error.code is ErrorCode.PROCESSING_FAILED and bad.error.stage == "poison"
        assert "ValueError: poisoned call over 1 images" in str(bad.error)  # its own reason, found alone
        good = [r for k, r in enumerate(results) if k != pos]
        assert all(r.ok for r in good), [str(r.error) for r in good]
        # the same bytes as each good photo processed on its own
        assert [r.variants[0].data for r in good] == alone[: size - 1]


class Flaky(Stage):
    """A step raising for every call that holds one of ``bad``; records every call's items."""

    name = "flaky"
    lane = "device"

    def __init__(self, bad: set[int], exc: Exception) -> None:
        self.bad, self.exc = bad, exc
        self.calls: list[list[int]] = []

    def apply(self, ctx: BatchContext, idx: list[int]) -> Sequence[object]:
        self.calls.append(list(idx))
        if self.bad & set(idx):
            raise self.exc
        return [i * 10 for i in idx]

    def keep(self, ctx: BatchContext, i: int, value: object) -> None:
        ctx.memo["flaky", i] = value


def make_ctx(n: int) -> BatchContext:
    return BatchContext([job(b"") for _ in range(n)], [JobResult() for _ in range(n)], lambda: 0)


def run_flaky(n: int, bad: set[int], exc: Exception) -> tuple[BatchContext, Flaky]:
    stage = Flaky(bad, exc)
    ctx = make_ctx(n)
    for step in stage.steps(ctx):
        run_step(ctx, step)
    return ctx, stage


@pytest.mark.parametrize("bad", [{0}, {7}, {3, 4}, {0, 5, 6}, set(range(8))])
def test_bisection_keeps_every_innocent_value(bad: set[int]) -> None:
    ctx, stage = run_flaky(8, bad, RuntimeError("kernel bug"))
    for i in range(8):
        if i in bad:
            err = ctx.results[i].error
            assert err is not None and err.code is ErrorCode.PROCESSING_FAILED and err.stage == "flaky"
            assert str(err).endswith("RuntimeError: kernel bug")
        else:
            assert ctx.results[i].ok and ctx.memo["flaky", i] == i * 10
    # bounded: a binary tree over 8 leaves has at most 15 nodes
    assert len(stage.calls) <= 15 and stage.calls[0] == list(range(8))
    assert ctx.isolation_calls == len(stage.calls) - 1
    # every item's span says the size of the call that settled it
    sizes = [ctx.jobs[i].spans.spans[-1].batch_size for i in range(8)]
    assert all(sizes[i] == 1 for i in bad)


def test_a_lightbox_error_raised_for_a_call_is_isolated_too() -> None:
    ctx, _ = run_flaky(4, {2}, TooLarge("this one is too large"))
    assert [r.ok for r in ctx.results] == [True, True, False, True]
    err = ctx.results[2].error
    assert isinstance(err, LightboxError) and err.code is ErrorCode.TOO_LARGE and err.stage == "flaky"


def test_a_fatal_error_is_not_isolated() -> None:
    with pytest.raises(FatalError):
        run_flaky(4, {1}, FatalError("the store is gone"))


def test_a_wrong_result_count_is_isolated_like_a_raise() -> None:
    class Short(Stage):
        name = "short"
        lane = "device"

        def apply(self, ctx: BatchContext, idx: list[int]) -> Sequence[object]:
            return [1] * (len(idx) - 1) if 5 in idx and len(idx) > 1 else [1] * len(idx)

    ctx = make_ctx(8)
    for step in Short().steps(ctx):
        run_step(ctx, step)
    # the miscount happens only in a batch with item 5: smaller calls settle every item
    assert all(r.ok for r in ctx.results)
    assert ctx.isolation_calls == 6  # [0..3] [4..7] [4,5] [6,7] [4] [5]
