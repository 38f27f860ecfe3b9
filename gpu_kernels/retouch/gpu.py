"""The GPU backend: :class:`CupyRetoucher`, two CuPy RawKernels (CuPy imported lazily).

* ``lb_correct`` (pass (a)): one thread per 4 pixels of a row; white balance, bilinear Retinex
  gain, tone table, composite, rounding; reads the uint8 image (1, 3 or 4 channels) and the
  alpha (mask, or the image's own 4th channel) once, writes the uint8 output once.
* ``lb_render`` (pass (b)): one launch per preset for a whole batch of images of any sizes (a
  table of device pointers); 16x16 output tiles, each block resamples its tile plus a 1-pixel
  halo into shared memory (area or cubic gather straight from the uint8 source, premultiplied),
  composites onto white (or keeps coverage as alpha), then applies the 3x3 unsharp mask from
  shared memory and writes uint8.

Both kernels are compiled with ``--fmad=false`` and perform the float32 operations of the CPU
twins (:mod:`.correction`, :mod:`.render`) in the same order, so GPU and CPU agree within 1 LSB
(the parameters are estimated on the device by the same array-module-generic code; float64
transcendental functions may differ in the last bit between libraries). No device-to-host copy
happens in ``correct`` or ``render``; only small tables (pointers, shapes, Gaussian matrices) go
host-to-device.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from gpu_kernels.backends import Array, RetouchOptions
from gpu_kernels.presets import Preset
from gpu_kernels.retouch.checks import alpha_source, as_pixels
from gpu_kernels.retouch.composite import cutout_source
from gpu_kernels.retouch.config import RetouchConfig
from gpu_kernels.retouch.correction import ColorPlan, correct_reference, plan_correction
from gpu_kernels.retouch.cpu import Window, effective_background
from gpu_kernels.retouch.geometry import placement, read_window, subject_box
from gpu_kernels.retouch.illumination import gain_columns, gaussian_matrix
from gpu_kernels.retouch.matting_device import decontaminate_batch, decontaminate_device
from gpu_kernels.retouch.render import render_reference
from schemas.errors import LightboxError, ProcessingFailed, per_item

__all__ = ["KERNEL_SOURCE", "CupyRetoucher", "correct_launch", "render_launch"]

KERNEL_SOURCE = r"""
#define LB_TILE 16
#define LB_PX 4
#define LB_HALO (LB_TILE + 2)

extern "C" {

__device__ __forceinline__ unsigned char lb_round(const float v) {
    const float r = fminf(fmaxf(floorf(v + 0.5f), 0.0f), 255.0f);
    return (unsigned char)(int)r;
}

__device__ __forceinline__ float lb_tone(const float v, const float* __restrict__ lut,
                                         const int n, const float scale) {
    const float t = v * scale;
    const int i = min((int)t, n - 2);
    const float f = t - (float)i;
    const float lo = lut[i];
    return lo + f * (lut[i + 1] - lo);
}

// Pass (a): white balance + Retinex gain + tone table + composite. A thread handles LB_PX
// consecutive pixels of one row. mode: 0 keep (RGB out), 1 white (RGB out, needs alpha),
// 2 transparent (RGBA out). gcols: the gain map interpolated along x, (gh, width); row y reads
// it at (y - gorigin) / gstep (see MapGrid); alpha_tab:
// a / 255 for a = 0..255 (the same float32 values as the division).
__global__ void lb_correct(
    const unsigned char* __restrict__ src, const int cin,
    const unsigned char* __restrict__ alpha, const long long alpha_offset, const int alpha_step,
    const int has_alpha, const float* __restrict__ alpha_tab,
    unsigned char* __restrict__ dst, const int mode, const int height, const int width,
    const float* __restrict__ wb,
    const float* __restrict__ gcols, const int has_gain, const int gh, const float gstep,
    const float gorigin,
    const float* __restrict__ lut, const int nlut, const float* __restrict__ lut_scale,
    const int has_lut)
{
    const int y = blockIdx.y * blockDim.y + threadIdx.y;
    const int xs = (blockIdx.x * blockDim.x + threadIdx.x) * LB_PX;
    if (y >= height || xs >= width) return;
    const float* grow0 = gcols;
    const float* grow1 = gcols;
    float fy = 0.0f;
    if (has_gain) {
        const float gy = fminf(fmaxf(((float)y - gorigin) / gstep, 0.0f), (float)(gh - 1));
        const int y0 = (int)gy;
        const int y1 = min(y0 + 1, gh - 1);
        fy = gy - (float)y0;
        grow0 = gcols + (long long)y0 * width;
        grow1 = gcols + (long long)y1 * width;
    }
    const float wb0 = wb[0], wb1 = wb[1], wb2 = wb[2];
    const float wcap = 255.0f * fminf(fminf(wb0, wb1), wb2);
    const float scale = has_lut ? lut_scale[0] : 0.0f;
    const int xe = min(xs + LB_PX, width);
    for (int x = xs; x < xe; ++x) {
        const long long p = (long long)y * width + x;
        const unsigned char* s = src + p * cin;
        float v0, v1, v2;
        if (cin == 1) {
            v0 = (float)s[0]; v1 = v0; v2 = v0;
        } else {
            v0 = (float)s[0]; v1 = (float)s[1]; v2 = (float)s[2];
        }
        v0 = fminf(v0 * wb0, wcap); v1 = fminf(v1 * wb1, wcap); v2 = fminf(v2 * wb2, wcap);
        if (has_gain) {
            const float g = grow0[x] * (1.0f - fy) + grow1[x] * fy;
            v0 = v0 * g; v1 = v1 * g; v2 = v2 * g;
        }
        if (has_lut) {
            v0 = lb_tone(v0, lut, nlut, scale);
            v1 = lb_tone(v1, lut, nlut, scale);
            v2 = lb_tone(v2, lut, nlut, scale);
        }
        if (mode == 1) {
            const float af = alpha_tab[alpha[alpha_offset + p * alpha_step]];
            const float bg = 255.0f * (1.0f - af);
            unsigned char* o = dst + p * 3;
            o[0] = lb_round(v0 * af + bg);
            o[1] = lb_round(v1 * af + bg);
            o[2] = lb_round(v2 * af + bg);
        } else if (mode == 2) {
            unsigned char* o = dst + p * 4;
            o[0] = lb_round(v0);
            o[1] = lb_round(v1);
            o[2] = lb_round(v2);
            o[3] = has_alpha ? alpha[alpha_offset + p * alpha_step] : (unsigned char)255;
        } else {
            unsigned char* o = dst + p * 3;
            o[0] = lb_round(v0);
            o[1] = lb_round(v1);
            o[2] = lb_round(v2);
        }
    }
}

__device__ __forceinline__ float lb_keys(const float d, const float* __restrict__ kc) {
    if (d <= 1.0f) return ((kc[0] * d - kc[1]) * d) * d + 1.0f;
    if (d < 2.0f) return ((kc[2] * d - kc[3]) * d + kc[4]) * d - kc[5];
    return 0.0f;
}

// Tap t of one axis: source index and weight (area filter when shrinking, Keys cubic else).
__device__ __forceinline__ void lb_tap(const int area, const float a, const float b,
                                       const float f0, const float f, const float inv_k,
                                       const int t, const float* __restrict__ kc,
                                       int* idx, float* w) {
    if (area) {
        const float fi = f0 + (float)t;
        const float lo = fmaxf(a, fi);
        const float hi = fminf(b, fi + 1.0f);
        *w = fmaxf(hi - lo, 0.0f) / inv_k;
        *idx = (int)fi;
    } else {
        const float fi = f0 + (float)(t - 1);
        const float d = t == 0 ? 1.0f + f : (t == 1 ? f : (t == 2 ? 1.0f - f : 2.0f - f));
        *w = lb_keys(d, kc);
        *idx = (int)fi;
    }
}

// Premultiplied [r, g, b, coverage] of canvas pixel (X, Y); outside the image is 0.
__device__ void lb_resample(const unsigned char* __restrict__ src, const int h, const int w,
                            const int c, const float inv_k, const float ox, const float oy,
                            const int X, const int Y, const float* __restrict__ kc,
                            float acc[4]) {
    const int area = inv_k > 1.0f;
    const int taps = area ? (int)ceilf(inv_k) + 1 : 4;
    float ax = 0.0f, bx = 0.0f, fx0, fx = 0.0f, ay = 0.0f, by = 0.0f, fy0, fy = 0.0f;
    if (area) {
        ax = ox + (float)X * inv_k; bx = ax + inv_k; fx0 = floorf(ax);
        ay = oy + (float)Y * inv_k; by = ay + inv_k; fy0 = floorf(ay);
    } else {
        const float sx = ox + ((float)X + 0.5f) * inv_k - 0.5f;
        fx0 = floorf(sx); fx = sx - fx0;
        const float sy = oy + ((float)Y + 0.5f) * inv_k - 0.5f;
        fy0 = floorf(sy); fy = sy - fy0;
    }
    acc[0] = 0.0f; acc[1] = 0.0f; acc[2] = 0.0f; acc[3] = 0.0f;
    for (int u = 0; u < taps; ++u) {
        int iy; float wy;
        lb_tap(area, ay, by, fy0, fy, inv_k, u, kc, &iy, &wy);
        if (iy < 0 || iy >= h) continue;
        const unsigned char* row = src + (long long)iy * w * c;
        float r0 = 0.0f, r1 = 0.0f, r2 = 0.0f, r3 = 0.0f;
        for (int t = 0; t < taps; ++t) {
            int ix; float wx;
            lb_tap(area, ax, bx, fx0, fx, inv_k, t, kc, &ix, &wx);
            if (ix < 0 || ix >= w) continue;
            const unsigned char* q = row + (long long)ix * c;
            if (c == 4) {
                const float af = (float)q[3] / 255.0f;
                r0 += wx * ((float)q[0] * af);
                r1 += wx * ((float)q[1] * af);
                r2 += wx * ((float)q[2] * af);
                r3 += wx * af;
            } else if (c == 3) {
                r0 += wx * (float)q[0];
                r1 += wx * (float)q[1];
                r2 += wx * (float)q[2];
                r3 += wx;
            } else {
                const float g = (float)q[0];
                r0 += wx * g; r1 += wx * g; r2 += wx * g;
                r3 += wx;
            }
        }
        acc[0] += wy * r0; acc[1] += wy * r1; acc[2] += wy * r2; acc[3] += wy * r3;
    }
}

#define LB_T(y, x, ch) tile[((y) * LB_HALO + (x)) * 4 + (ch)]

// Pass (b), one block = one 16x16 output tile of image blockIdx.z. Phase 0: every thread
// resamples tile pixels (with a 1-pixel halo, canvas borders replicated) into `tile`: the
// composited value (white) or premultiplied colour (transparent) and the coverage. Phase 1:
// 3x3 unsharp mask from `tile`, rounding, store. The kernel runs phase 0, syncs, phase 1.
__device__ void lb_render_phase(
    const int phase, float* tile,
    const unsigned long long* __restrict__ srcs, const int* __restrict__ dims,
    const float* __restrict__ params, unsigned char* __restrict__ dst,
    const int out_h, const int out_w, const int transparent, const float amount,
    const float* __restrict__ kc)
{
    const int n = blockIdx.z;
    const int bx = blockIdx.x * LB_TILE, by = blockIdx.y * LB_TILE;
    if (phase == 0) {
        const unsigned char* src = (const unsigned char*)srcs[n];
        const int h = dims[3 * n], w = dims[3 * n + 1], c = dims[3 * n + 2];
        const float inv_k = params[3 * n], ox = params[3 * n + 1], oy = params[3 * n + 2];
        for (int k = threadIdx.y * LB_TILE + threadIdx.x; k < LB_HALO * LB_HALO;
             k += LB_TILE * LB_TILE) {
            const int ty = k / LB_HALO, tx = k % LB_HALO;
            const int X = min(max(bx + tx - 1, 0), out_w - 1);
            const int Y = min(max(by + ty - 1, 0), out_h - 1);
            float acc[4];
            lb_resample(src, h, w, c, inv_k, ox, oy, X, Y, kc, acc);
            const float cover = fminf(fmaxf(acc[3], 0.0f), 1.0f);
            if (transparent) {
                LB_T(ty, tx, 0) = acc[0]; LB_T(ty, tx, 1) = acc[1]; LB_T(ty, tx, 2) = acc[2];
            } else {
                const float bg = 255.0f * (1.0f - acc[3]);
                for (int ch = 0; ch < 3; ++ch) {
                    const float raw = acc[ch] + bg;
                    const int product = raw >= 254.5f && fabsf(raw - 255.0f) > 0.01f;
                    LB_T(ty, tx, ch) = product ? 254.0f : fminf(raw, 255.0f);
                }
            }
            LB_T(ty, tx, 3) = cover;
        }
        return;
    }
    const int X = bx + threadIdx.x, Y = by + threadIdx.y;
    if (X >= out_w || Y >= out_h) return;
    const int tx = threadIdx.x + 1, ty = threadIdx.y + 1;
    float v[3];
    for (int ch = 0; ch < 3; ++ch) {
        const float h0 = LB_T(ty - 1, tx - 1, ch) + 2.0f * LB_T(ty - 1, tx, ch)
                         + LB_T(ty - 1, tx + 1, ch);
        const float h1 = LB_T(ty, tx - 1, ch) + 2.0f * LB_T(ty, tx, ch) + LB_T(ty, tx + 1, ch);
        const float h2 = LB_T(ty + 1, tx - 1, ch) + 2.0f * LB_T(ty + 1, tx, ch)
                         + LB_T(ty + 1, tx + 1, ch);
        const float blur = (h0 + 2.0f * h1 + h2) * 0.0625f;
        const float s = LB_T(ty, tx, ch);
        v[ch] = s + amount * (s - blur);
        if (!transparent && s < 254.5f) v[ch] = fminf(v[ch], 254.0f);
    }
    const long long base = (long long)n * out_h * out_w + (long long)Y * out_w + X;
    if (!transparent) {
        unsigned char* o = dst + base * 3;
        o[0] = lb_round(v[0]); o[1] = lb_round(v[1]); o[2] = lb_round(v[2]);
    } else {
        unsigned char* o = dst + base * 4;
        const float cover = LB_T(ty, tx, 3);
        const unsigned char a8 = lb_round(cover * 255.0f);
        for (int ch = 0; ch < 3; ++ch) o[ch] = a8 > 0 ? lb_round(v[ch] / cover) : (unsigned char)0;
        o[3] = a8;
    }
}

// Pass (b): crop + pad + resize + sharpen for a batch of images (blockIdx.z), one preset.
// Block (16, 16, 1); grid (ceil(out_w / 16), ceil(out_h / 16), N).
__global__ void lb_render(
    const unsigned long long* __restrict__ srcs, const int* __restrict__ dims,
    const float* __restrict__ params, unsigned char* __restrict__ dst,
    const int out_h, const int out_w, const int transparent, const float amount,
    const float* __restrict__ kc)
{
    __shared__ float tile[LB_HALO * LB_HALO * 4];
    lb_render_phase(0, tile, srcs, dims, params, dst, out_h, out_w, transparent, amount, kc);
    __syncthreads();
    lb_render_phase(1, tile, srcs, dims, params, dst, out_h, out_w, transparent, amount, kc);
}

}  // extern "C"
"""

_MODES = {"keep": 0, "white": 1, "transparent": 2}
Launch = tuple[tuple[int, int, int], tuple[int, int, int], tuple[Any, ...], Any]


def _checked(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Kernels index arrays as C-contiguous buffers: refuse anything else (a programming error)."""
    for i, a in enumerate(args):
        if hasattr(a, "flags") and not a.flags.c_contiguous:
            raise ValueError(f"kernel argument {i} is not C-contiguous (strides {a.strides})")
    return args


def correct_launch(
    xp: Any, pixels: Any, alpha: Any, own: bool, plan: ColorPlan, background: str,
    dummy_u8: Any, dummy_f32: Any,
) -> Launch:
    """``(grid, block, args, out)`` for ``lb_correct``; ``xp`` allocates ``out`` and the small
    tables (the gain map interpolated along x, ``a / 255``).

    ``pixels``: contiguous ``(H, W, 1|3|4)`` uint8; ``alpha``: the mask (``(H, W)`` uint8), or
    None, or (``own``) the image's 4th channel, read in place. Array-module generic so that
    tests can run the kernel source compiled for the CPU with exactly these arguments.
    """
    h, w, c = pixels.shape
    out = xp.empty((h, w, 4 if background == "transparent" else 3), xp.uint8)
    if alpha is None:
        alpha_arr, offset, step = dummy_u8, 0, 1
    elif own:
        alpha_arr, offset, step = pixels, 3, 4
    else:
        alpha_arr, offset, step = xp.ascontiguousarray(alpha), 0, 1
    alpha_tab = xp.arange(256, dtype=xp.float32) / xp.float32(255)
    gmap, lut, scale = plan.gain_map, plan.lut, plan.lut_scale
    gcols = dummy_f32 if gmap is None else xp.ascontiguousarray(
        gain_columns(xp, gmap, w, plan.grid))
    args = (
        pixels, np.int32(c),
        alpha_arr, np.int64(offset), np.int32(step), np.int32(alpha is not None), alpha_tab,
        out, np.int32(_MODES[background]), np.int32(h), np.int32(w),
        plan.wb,
        gcols, np.int32(gmap is not None), np.int32(1 if gmap is None else gmap.shape[0]),
        np.float32(plan.grid.step_y), np.float32(plan.grid.origin_y),
        dummy_f32 if lut is None else lut, np.int32(1 if lut is None else lut.shape[0]),
        dummy_f32 if scale is None else scale, np.int32(lut is not None),
    )
    grid = (math.ceil(math.ceil(w / 4) / 32), math.ceil(h / 8), 1)
    return grid, (32, 8, 1), _checked(args), out


def render_launch(
    xp: Any, sources: Sequence[tuple[Any, Any]], preset: Preset, coeffs: Any,
    pointer: Callable[[Any], int],
) -> Launch:
    """``(grid, block, args, out)`` for ``lb_render`` over ``sources`` = [(pixels, params)]:
    contiguous ``(h, w, 1|3|4)`` uint8 images and their ``(3,)`` float32 placements.
    ``pointer(array)`` gives an array's address; ``out`` is ``(N, H, W, 3|4)`` uint8."""
    channels = 4 if preset.background == "transparent" else 3
    n = len(sources)
    out = xp.empty((n, preset.height, preset.width, channels), xp.uint8)
    ptrs = xp.asarray(np.array([pointer(p) for p, _ in sources], np.uint64))
    dims = xp.asarray(np.array([p.shape for p, _ in sources], np.int32))
    params = xp.stack([q for _, q in sources])
    args = (ptrs, dims, params, out, np.int32(preset.height), np.int32(preset.width),
            np.int32(channels == 4), np.float32(preset.sharpen), coeffs)
    grid = (math.ceil(preset.width / 16), math.ceil(preset.height / 16), n)
    return grid, (16, 16, 1), _checked(args), out


class CupyRetoucher:
    """Retoucher on CuPy arrays (NumPy inputs are uploaded); same contract as
    :class:`~gpu_kernels.retouch.cpu.CpuRetoucher`, results are CuPy arrays on the current
    device. ``render_batch`` renders many images for one preset in one kernel launch; the
    returned arrays are views of one ``(N, H, W, C)`` buffer."""

    device = "gpu"
    version = "retouch-2"  # the CPU twin's numbers, on the device

    def close(self) -> None:
        """Drop the cached device buffers (the CuPy memory pool keeps them for reuse)."""
        self._matrices.clear()

    def __init__(self, config: RetouchConfig | None = None) -> None:
        try:
            import cupy
        except ImportError as exc:  # the GPU extra is not installed
            raise RuntimeError("CupyRetoucher needs CuPy: pip install 'lightbox[gpu]'") from exc
        self.cp: Any = cupy
        self.config = config or RetouchConfig()
        module = cupy.RawModule(code=KERNEL_SOURCE, options=("--fmad=false",))
        self._correct_kernel = module.get_function("lb_correct")
        self._render_kernel = module.get_function("lb_render")
        self._matrices: dict[tuple[int, float], Any] = {}
        self._coeffs = cupy.asarray(self.config.geometry.cubic_coefficients())
        self._dummy_u8 = cupy.zeros(1, cupy.uint8)
        self._dummy_f32 = cupy.zeros(1, cupy.float32)

    # -- helpers ---------------------------------------------------------------------------
    def _matrix(self, n: int, sigma: float) -> Any:
        key = (n, sigma)
        if key not in self._matrices:
            self._matrices[key] = self.cp.asarray(gaussian_matrix(n, sigma))
        return self._matrices[key]

    def _inputs(self, image: Array, mask: Array | None, stage: str) -> tuple[Any, Any, bool]:
        cp = self.cp
        pixels = cp.ascontiguousarray(as_pixels(cp.asarray(image), stage=stage))
        alpha, own = alpha_source(None if mask is None else cp.asarray(mask), pixels, stage=stage)
        return pixels, alpha, own

    @staticmethod
    def _pointer(array: Any) -> int:
        return int(array.data.ptr)

    def _translate(self, exc: Exception, stage: str) -> LightboxError:
        retriable = isinstance(exc, self.cp.cuda.memory.OutOfMemoryError)
        return ProcessingFailed(f"{type(exc).__name__}: {exc}", stage=stage, retriable=retriable)

    def _cuda_errors(self) -> tuple[type[Exception], ...]:
        cuda = self.cp.cuda
        return (cuda.memory.OutOfMemoryError, cuda.runtime.CUDARuntimeError,
                cuda.driver.CUDADriverError)

    # -- pass (a) --------------------------------------------------------------------------
    def correct(
        self, images: Sequence[Array], masks: Sequence[Array | None], options: RetouchOptions,
        windows: Sequence[Window | None] | None = None,
    ) -> list[Array]:
        def one(item: tuple[Array, Array | None, Window | None, Any]) -> Any:
            try:
                return self.correct_one(item[0], item[1], options, item[2], edged=item[3])
            except self._cuda_errors() as exc:
                raise self._translate(exc, "retouch.correct") from exc

        wins = windows if windows is not None else [None] * len(images)
        edged = self._edge_colours_batch(images, masks, options)
        return per_item(one, zip(images, masks, wins, edged, strict=True))

    def _edge_colours_batch(self, images: Sequence[Array], masks: Sequence[Array | None],
                            options: RetouchOptions) -> list[Any]:
        """:meth:`edge_colours` of each image that has its edge colours fixed, for the batch at
        once (:func:`~gpu_kernels.retouch.matting_device.decontaminate_batch`: one host read of
        the edge boxes, the images of one size as one stack); None where :meth:`correct_one`
        does its own (nothing to fix, or its inputs fail there and it reports it)."""
        out: list[Any] = [None] * len(images)
        picked: list[tuple[int, Any, Any]] = []
        failures: tuple[type[Exception], ...] = (LightboxError, *self._cuda_errors())
        for k, (image, mask) in enumerate(zip(images, masks, strict=True)):
            try:
                pixels, alpha, own = self._inputs(image, mask, "retouch.correct")
            except failures:
                continue
            if self._decontaminates(pixels, alpha, own, options):
                picked.append((k, pixels, alpha))
        if picked:
            try:
                fixed = decontaminate_batch(self.cp, [p for _, p, _ in picked], [a for _, _, a in picked])
            except self._cuda_errors():
                return out  # each image tries again on its own, and reports its own error
            for (k, _, _), pixels in zip(picked, fixed, strict=True):
                out[k] = self.cp.ascontiguousarray(pixels)
        return out

    def correction_window(self, image: Array, mask: Array | None, presets: Sequence[Preset]) -> Window | None:
        """As :meth:`CpuRetoucher.correction_window`; reads the subject box back to the host
        (four integers: the one synchronisation of pass (a), only with the option on)."""
        if not self.config.crop_to_presets or mask is None or not presets:
            return None
        pixels, alpha, own = self._inputs(image, mask, "retouch.correct")
        if alpha is None or own:
            return None
        h, w = pixels.shape[:2]
        box = self.cp.asnumpy(subject_box(self.cp, alpha, h, w, self.config.geometry.mask_threshold))
        win = read_window(box, [(p.width, p.height, p.fill) for p in presets], h, w,
                          self.config.geometry.cubic_coefficients())
        return None if win == (0, 0, w, h) else win

    def plan(self, image: Array, mask: Array | None, options: RetouchOptions) -> ColorPlan:
        """Pass (a)'s parameters for one image, on the device (no host synchronisation)."""
        pixels, alpha, _ = self._inputs(image, mask, "retouch.correct")
        return plan_correction(self.cp, pixels, alpha, options.lighting, self.config, self._matrix)

    def correct_one(self, image: Array, mask: Array | None, options: RetouchOptions,
                    window: Window | None = None, edged: Any = None) -> Any:
        """Pass (a) for one image (fused kernel), or for its ``window``; raises ``ProcessingFailed``.
        ``edged``: the image with its edge colours fixed, when already made (:meth:`correct`
        makes a batch's together)."""
        cp = self.cp
        pixels, alpha, own = self._inputs(image, mask, "retouch.correct")
        plan = plan_correction(cp, pixels, alpha, options.lighting, self.config, self._matrix)
        # whole image: a window sees the same
        pixels = edged if edged is not None else self.edge_colours(pixels, alpha, own, options)
        if window is not None and not own:
            x0, y0, x1, y1 = window
            pixels = cp.ascontiguousarray(pixels[y0:y1, x0:x1])
            alpha = None if alpha is None else alpha[y0:y1, x0:x1]
            plan = plan.shifted(y0, x0)
        background = effective_background(options.background, alpha)
        return self.launch_correct(pixels, alpha, own, plan, background)

    def _decontaminates(self, pixels: Any, alpha: Any, own: bool, options: RetouchOptions) -> bool:
        return not (not self.config.decontaminate or alpha is None or own or pixels.shape[2] != 3
                    or effective_background(options.background, alpha) == "keep")

    def edge_colours(self, pixels: Any, alpha: Any, own: bool, options: RetouchOptions) -> Any:
        """As :meth:`CpuRetoucher.edge_colours`, the same bytes, shaped for the device: the edge's
        crop whole, one host read per image (:mod:`gpu_kernels.retouch.matting_device`)."""
        if not self._decontaminates(pixels, alpha, own, options):
            return pixels
        return self.cp.ascontiguousarray(decontaminate_device(self.cp, pixels, alpha))

    def launch_correct(
        self, pixels: Any, alpha: Any, own: bool, plan: ColorPlan, background: str
    ) -> Any:
        """Run the fused kernel with a given plan (``pixels`` contiguous ``(H, W, C)``)."""
        grid, block, args, out = correct_launch(
            self.cp, pixels, alpha, own, plan, background, self._dummy_u8, self._dummy_f32)
        self._correct_kernel(grid, block, args)
        return out

    def correct_unfused(self, image: Array, mask: Array | None, options: RetouchOptions) -> Any:
        """The unfused chain on the GPU (one CuPy pass per stage), for checks and benchmarks."""
        pixels, alpha, own = self._inputs(image, mask, "retouch.correct")
        plan = plan_correction(self.cp, pixels, alpha, options.lighting, self.config, self._matrix)
        background = effective_background(options.background, alpha)
        pixels = self.edge_colours(pixels, alpha, own, options)
        return correct_reference(self.cp, pixels, alpha, plan, background)

    # -- pass (b) --------------------------------------------------------------------------
    def render(self, image: Array, mask: Array | None, preset: Preset) -> Any:
        """Pass (b) for one image; raises ``ProcessingFailed``."""
        result = self.render_batch([image], [mask], preset)[0]
        if isinstance(result, LightboxError):
            raise result
        return result

    def placement(self, image: Array, mask: Array | None, preset: Preset) -> Any:
        """``(3,)`` float32 ``[inv_k, ox, oy]`` on the device (see :mod:`.geometry`)."""
        pixels, alpha, _ = self._inputs(image, mask, "retouch.render")
        return self._placement(pixels, alpha, preset)

    def _placement(self, pixels: Any, alpha: Any, preset: Preset) -> Any:
        h, w = pixels.shape[:2]
        box = subject_box(self.cp, alpha, h, w, self.config.geometry.mask_threshold)
        return placement(self.cp, box, preset.width, preset.height, preset.fill)

    def render_batch(
        self, images: Sequence[Array], masks: Sequence[Array | None], preset: Preset
    ) -> list[Array]:
        """Pass (b) for many images, one kernel launch; a bad item's error takes its place."""
        cp, stage = self.cp, "retouch.render"
        results: list[Array] = [None] * len(images)
        batch: list[tuple[int, Any, Any]] = []
        for i, (image, mask) in enumerate(zip(images, masks, strict=True)):
            try:
                pixels, alpha, _ = self._inputs(image, mask, stage)
                params = self._placement(pixels, alpha, preset)
                if preset.background == "transparent":  # the subject's alpha, not an opaque white box
                    pixels = cp.ascontiguousarray(cutout_source(cp, pixels, alpha))
                batch.append((i, pixels, params))
            except LightboxError as exc:
                results[i] = exc
        if not batch:
            return results
        try:
            grid, block, args, out = render_launch(
                cp, [(p, q) for _, p, q in batch], preset, self._coeffs, self._pointer)
            self._render_kernel(grid, block, args)
        except self._cuda_errors() as exc:
            err = self._translate(exc, stage)
            for i, _, _ in batch:
                results[i] = err
            return results
        for j, (i, _, _) in enumerate(batch):
            results[i] = out[j]
        return results

    def render_unfused(self, image: Array, mask: Array | None, preset: Preset) -> Any:
        """The unfused chain on the GPU (crop, resize, pad, sharpen as separate CuPy passes)."""
        pixels, alpha, _ = self._inputs(image, mask, "retouch.render")
        params = self.cp.asnumpy(self._placement(pixels, alpha, preset))
        if preset.background == "transparent":
            pixels = cutout_source(self.cp, pixels, alpha)
        return render_reference(self.cp, pixels, params, preset.width, preset.height,
                                preset.background == "transparent", preset.sharpen,
                                self.config.geometry.cubic_coefficients())
