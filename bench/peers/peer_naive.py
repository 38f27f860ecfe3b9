"""The naive script a team writes first, as the peer benchmark runs it (standalone: Pillow,
NumPy, OpenCV and ONNX Runtime only, no lightbox import).

Per image: Pillow decodes once for the mask and once more per preset; u2netp on ONNX Runtime
at batch 1 (default session options); float composite on white; crop to the largest
contour's box; Pillow Lanczos resize onto the preset's canvas; encode. Writes
``OUT/<stem>.<preset>.<ext>`` and ``OUT/naive-stats.json`` (seconds per stage, summed over
the images). ``--masks DIR`` also writes each full-size mask as PNG (for the IoU check).

    python bench/peers/peer_naive.py MODEL OUT FILE... [--masks DIR]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import onnxruntime as ort
from PIL import Image

PRESETS = (("taobao_main", 800, 800, "JPEG", 90, 0.80), ("xiaohongshu_cover", 1080, 1440, "JPEG", 90, 0.75),
           ("thumb_webp", 400, 400, "WEBP", 80, 0.85))
MEAN, STD = np.array([0.485, 0.456, 0.406], np.float32), np.array([0.229, 0.224, 0.225], np.float32)


def load(path: Path) -> Image.Image:
    return Image.open(path).convert("RGB")


def mask_of(session: ort.InferenceSession, img: Image.Image) -> np.ndarray:
    small = np.asarray(img.resize((320, 320), Image.Resampling.LANCZOS), np.float32) / 255.0
    x = ((small - MEAN) / STD).transpose(2, 0, 1)[None].astype(np.float32)
    out = session.run(None, {session.get_inputs()[0].name: x})[0][0, 0]
    out = (out - out.min()) / max(float(out.max() - out.min()), 1e-6)
    m = Image.fromarray((out * 255).astype(np.uint8)).resize(img.size, Image.Resampling.LANCZOS)
    return np.asarray(m)


def main(argv: list[str]) -> None:
    masks_dir = None
    if "--masks" in argv:
        k = argv.index("--masks")
        masks_dir = Path(argv[k + 1])
        argv = argv[:k] + argv[k + 2:]
        masks_dir.mkdir(parents=True, exist_ok=True)
    model, out, files = argv[0], Path(argv[1]), [Path(a) for a in argv[2:]]
    out.mkdir(parents=True, exist_ok=True)
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    t = dict.fromkeys(("decode", "segment", "composite", "crop_resize", "encode"), 0.0)

    def lap(stage: str, t0: float) -> float:
        now = time.perf_counter()
        t[stage] += now - t0
        return now

    for path in files:
        t0 = time.perf_counter()
        img = load(path)
        t0 = lap("decode", t0)
        alpha = mask_of(session, img)
        t0 = lap("segment", t0)
        if masks_dir is not None:
            Image.fromarray(alpha).save(masks_dir / f"{path.stem}.png")
            t0 = time.perf_counter()
        for name, w, h, fmt, quality, fill in PRESETS:
            t0 = time.perf_counter()
            rgb = np.asarray(load(path), np.float32)  # the script decodes again for every preset
            t0 = lap("decode", t0)
            a = (alpha.astype(np.float32) / 255.0)[..., None]
            comp = (rgb * a + 255.0 * (1.0 - a)).astype(np.uint8)
            t0 = lap("composite", t0)
            contours, _ = cv2.findContours((alpha > 127).astype(np.uint8), cv2.RETR_EXTERNAL,
                                           cv2.CHAIN_APPROX_SIMPLE)
            if contours:
                x, y, bw, bh = cv2.boundingRect(max(contours, key=cv2.contourArea))
                comp = comp[y:y + bh, x:x + bw]
            subject = Image.fromarray(comp)
            s = min(w * fill / subject.width, h * fill / subject.height)
            subject = subject.resize((max(1, round(subject.width * s)), max(1, round(subject.height * s))),
                                     Image.Resampling.LANCZOS)
            canvas = Image.new("RGB", (w, h), (255, 255, 255))
            canvas.paste(subject, ((w - subject.width) // 2, (h - subject.height) // 2))
            t0 = lap("crop_resize", t0)
            canvas.save(out / f"{path.stem}.{name}.{'webp' if fmt == 'WEBP' else 'jpg'}", fmt, quality=quality)
            lap("encode", t0)
    (out / "naive-stats.json").write_text(json.dumps({"images": len(files), "seconds": t}))


if __name__ == "__main__":
    main(sys.argv[1:])
