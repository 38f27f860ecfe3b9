"""rembg as a user runs it, for the peer benchmark. Runs inside rembg's own virtualenv (no
lightbox import): ``new_session("u2netp")`` (weights from ``~/.u2net/u2netp.onnx``), then per
image ``remove(..., bgcolor=white)`` and, per preset, a Pillow thumbnail onto the preset's
white canvas and an encode. Writes ``OUT/<stem>.<preset>.<ext>`` and ``OUT/rembg-stats.json``
(seconds per stage, summed). ``--masks DIR`` also writes rembg's full-size masks
(``session.predict``) as PNG for the IoU check.

    python bench/peer_rembg.py OUT FILE... [--masks DIR]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from PIL import Image
from rembg import new_session, remove

PRESETS = (("taobao_main", 800, 800, "JPEG", 90), ("xiaohongshu_cover", 1080, 1440, "JPEG", 90),
           ("thumb_webp", 400, 400, "WEBP", 80))


def variants(cut: Image.Image, stem: str, out: Path, t: dict[str, float]) -> list[Path]:
    """Each preset of ``cut`` (RGB on white): a Pillow Lanczos thumbnail centred on the preset's
    white canvas, encoded to ``OUT/<stem>.<preset>.<ext>``; seconds added to ``t``."""
    written = []
    for name, w, h, fmt, quality in PRESETS:
        t2 = time.perf_counter()
        thumb = cut.copy()
        thumb.thumbnail((w, h), Image.Resampling.LANCZOS)
        canvas = Image.new("RGB", (w, h), (255, 255, 255))
        canvas.paste(thumb, ((w - thumb.width) // 2, (h - thumb.height) // 2))
        t3 = time.perf_counter()
        t["resize"] += t3 - t2
        written.append(out / f"{stem}.{name}.{'webp' if fmt == 'WEBP' else 'jpg'}")
        canvas.save(written[-1], fmt, quality=quality)
        t["encode"] += time.perf_counter() - t3
    return written


def main(argv: list[str]) -> None:
    masks_dir = None
    if "--masks" in argv:
        k = argv.index("--masks")
        masks_dir = Path(argv[k + 1])
        argv = argv[:k] + argv[k + 2:]
        masks_dir.mkdir(parents=True, exist_ok=True)
    out, files = Path(argv[0]), [Path(a) for a in argv[1:]]
    out.mkdir(parents=True, exist_ok=True)
    session = new_session("u2netp")
    t = dict.fromkeys(("decode", "remove", "resize", "encode"), 0.0)
    for path in files:
        t0 = time.perf_counter()
        img = Image.open(path)
        img.load()
        t1 = time.perf_counter()
        t["decode"] += t1 - t0
        if masks_dir is not None:
            session.predict(img.convert("RGB"))[0].save(masks_dir / f"{path.stem}.png")
            continue
        cut = remove(img, session=session, bgcolor=(255, 255, 255, 255)).convert("RGB")
        t2 = time.perf_counter()
        t["remove"] += t2 - t1
        variants(cut, path.stem, out, t)
    (out / "rembg-stats.json").write_text(json.dumps({"images": len(files), "seconds": t}))


if __name__ == "__main__":
    main(sys.argv[1:])
