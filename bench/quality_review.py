"""``bench_quality.py review``: the real-photo review set through lightbox and rembg, a contact
sheet to judge by eye, and the table of the kept judgements (``bench/review_judgement.toml``).

Per image: lightbox's default path (u2netp, or ``--model FILE``: another U²-Net ONNX file such
as u2net; post-processing, pass (a) on white, ``taobao_main``) run with the code of a checkout
(``--tree``, default this one) in a subprocess, and rembg 2.0.86 (u2netp, in its own
virtualenv: ``bench/peer_rembg.py``) on the same file. The sheet's rows: input | lightbox's
taobao_main | rembg's taobao_main | lightbox's mask over the input (red: dropped, the outline of
rembg's mask in cyan). The table: each output's kept verdict (accept/reject, and why), and
whether lightbox's mask has changed since it was judged (a 24 x 24 fingerprint of the mask kept
with the verdict: below 0.9 IoU with it the row says ``look again``). Framing consistency: each
photo's framings mapped back onto the photo, the masks' IoU where the framings overlap (worst
pair), for lightbox and rembg.

``--template FILE`` writes a judgement file with the current fingerprints and the verdicts kept so
far (new items marked ``"?"``), to be filled in by looking at the sheet.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
JUDGEMENT = ROOT / "bench" / "review_judgement.toml"

PIPELINE = """
import os, sys, time, numpy as np
from gpu_kernels.backends import RetouchOptions
from gpu_kernels.presets import load_presets
from gpu_kernels.retouch import CpuRetoucher
from gpu_kernels.segment import OnnxSegmenter, ensure_u2netp
data = np.load(sys.argv[1])
model = os.environ.get("REVIEW_MODEL") or ensure_u2netp().original
r, out = CpuRetoucher(), {}
preset = load_presets()["taobao_main"]
seg_s = post_s = 0.0
with OnnxSegmenter(model, threads=2) as seg:
    for key in data.files:
        image = data[key]
        t0 = time.perf_counter()
        alpha = np.asarray(seg.segment_batch([image])[0])
        seg_s += time.perf_counter() - t0
        out["alpha_" + key] = alpha
        fixed = r.correct([image], [alpha], RetouchOptions("white"))[0]
        out["shop_" + key] = np.asarray(r.render(fixed, alpha, preset))
out["seconds"] = np.asarray([seg_s / max(1, len(data.files))])
np.savez(sys.argv[2], **out)
"""


def run_lightbox(tree: Path, images: dict[str, np.ndarray], model: Path | None) -> dict[str, np.ndarray]:
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.npz", Path(tmp) / "out.npz"
        np.savez(src, **images)  # type: ignore[arg-type]
        env = dict(os.environ, PYTHONPATH=str(tree), REVIEW_MODEL=str(model or ""))
        subprocess.run([sys.executable, "-c", PIPELINE, str(src), str(dst)], check=True, env=env, cwd=tree)
        with np.load(dst) as out:
            return {k: out[k] for k in out.files}


def run_rembg(images: dict[str, np.ndarray], venv: Path) -> dict[str, np.ndarray]:
    """rembg's full-size masks and taobao_main outputs (``bench/peer_rembg.py`` in its venv),
    kept beside the review photos (``review_set.cache_dir()``) by the inputs' sha256: rembg
    does not change between runs."""
    import hashlib

    from bench.review_set import cache_dir

    h = hashlib.sha256()
    for key, image in images.items():
        h.update(key.encode())
        h.update(image.tobytes())
    cached = cache_dir() / f"rembg-{h.hexdigest()[:16]}.npz"
    if cached.is_file():
        with np.load(cached) as kept:
            return {k: kept[k] for k in kept.files}
    out = _run_rembg(images, venv)
    cached.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(cached, **out)  # type: ignore[arg-type]
    return out


def _run_rembg(images: dict[str, np.ndarray], venv: Path) -> dict[str, np.ndarray]:
    from PIL import Image

    sys.path.insert(0, str(ROOT))
    from bench.bench_peers import model_file, rembg_python

    model_file()  # u2netp verified at ~/.u2net, where rembg looks: nothing downloads
    py = rembg_python(venv)
    out: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for key, image in images.items():
            path = Path(tmp) / "in" / f"{key}.png"
            path.parent.mkdir(exist_ok=True)
            Image.fromarray(image).save(path)
            files.append(str(path))
        peer = str(ROOT / "bench" / "peer_rembg.py")
        subprocess.run([str(py), peer, f"{tmp}/cut", *files, "--masks", f"{tmp}/masks"], check=True,
                       capture_output=True)
        subprocess.run([str(py), peer, f"{tmp}/cut", *files], check=True, capture_output=True)
        for key in images:
            out["alpha_" + key] = np.asarray(Image.open(f"{tmp}/masks/{key}.png").convert("L"))
            out["shop_" + key] = np.asarray(Image.open(f"{tmp}/cut/{key}.taobao_main.jpg").convert("RGB"))
    return out


def fingerprint(alpha: np.ndarray) -> str:
    """The mask (alpha >= 128) at 24 x 24 (area-averaged, >= one half), as hex."""
    small = cv2.resize((alpha >= 128).astype(np.float32), (24, 24), interpolation=cv2.INTER_AREA) >= 0.5
    return np.packbits(small.ravel()).tobytes().hex()


def fingerprint_iou(a: str, b: str) -> float:
    x = np.unpackbits(np.frombuffer(bytes.fromhex(a), np.uint8)).astype(bool)
    y = np.unpackbits(np.frombuffer(bytes.fromhex(b), np.uint8)).astype(bool)
    union = (x | y).sum()
    return 1.0 if union == 0 else float((x & y).sum() / union)


def framing_consistency(items: list[Any], alphas: dict[str, np.ndarray]) -> dict[str, float]:
    """Per photo: the worst IoU, over pairs of its framings, of the masks mapped onto the photo
    and compared where both framings cover it (1.0: the same cut-out wherever they overlap)."""
    from bench.review_set import to_photo

    by_photo: dict[str, list[Any]] = {}
    for it in items:
        by_photo.setdefault(it.photo.name, []).append(it)
    out = {}
    for name, group in by_photo.items():
        shape = (max(i.box[3] for i in group), max(i.box[2] for i in group))
        mapped = [to_photo(i, alphas[i.name], shape) for i in group]
        worst = 1.0
        for j in range(len(mapped)):
            for k in range(j + 1, len(mapped)):
                (ma, ca), (mb, cb) = mapped[j], mapped[k]
                both = ca & cb
                a, b = (ma >= 128) & both, (mb >= 128) & both
                union = (a | b).sum()
                if union:
                    worst = min(worst, float((a & b).sum() / union))
        out[name] = worst
    return out


def overlay(image: np.ndarray, alpha: np.ndarray, peer: np.ndarray | None) -> np.ndarray:
    """The input with what lightbox drops tinted red, and the outline of ``peer`` (rembg's mask) in cyan."""
    a = alpha.astype(np.float32)[..., None] / 255.0
    red = np.array([220, 40, 40], np.float32)
    out = image.astype(np.float32) * (0.35 + 0.65 * a) + red * 0.65 * (1.0 - a)
    out = np.clip(out, 0, 255).astype(np.uint8)
    if peer is not None:
        edge = cv2.morphologyEx((peer >= 128).astype(np.uint8), cv2.MORPH_GRADIENT, np.ones((3, 3), np.uint8))
        out[edge > 0] = (0, 230, 230)
    return out


def tile(img: np.ndarray, size: int) -> np.ndarray:
    h, w = img.shape[:2]
    s = size / max(h, w)
    small = cv2.resize(img[..., :3], (max(1, round(w * s)), max(1, round(h * s))), interpolation=cv2.INTER_AREA)
    out = np.full((size, size, 3), 224, np.uint8)
    y, x = (size - small.shape[0]) // 2, (size - small.shape[1]) // 2
    out[y:y + small.shape[0], x:x + small.shape[1]] = small
    return out


def write_sheets(items: list[Any], lb: dict[str, np.ndarray], rb: dict[str, np.ndarray] | None,
                 verdicts: dict[str, Any], folder: Path, stem: str, per_page: int, size: int) -> list[Path]:
    gap = 6
    paths = []
    for p in range(0, len(items), per_page):
        rows = []
        for it in items[p:p + per_page]:
            peer = None if rb is None else rb["alpha_" + it.name]
            cells = [tile(it.image, size), tile(lb["shop_" + it.name], size),
                     tile(rb["shop_" + it.name], size) if rb is not None else np.full((size, size, 3), 224, np.uint8),
                     tile(overlay(it.image, lb["alpha_" + it.name], peer), size)]
            row = np.full((size, 4 * size + 3 * gap, 3), 255, np.uint8)
            for c, cell in enumerate(cells):
                row[:, c * (size + gap):c * (size + gap) + size] = cell
            v = verdicts.get(it.name, {})
            label = f"{it.name}  lightbox:{v.get('lightbox', '?')}  rembg:{v.get('rembg', '?')}"
            cv2.putText(row, label, (4, 14), cv2.FONT_HERSHEY_SIMPLEX, 0.42, (0, 0, 0), 3, cv2.LINE_AA)
            cv2.putText(row, label, (4, 14), cv2.FONT_HERSHEY_SIMPLEX, 0.42, (255, 255, 255), 1, cv2.LINE_AA)
            rows.append(row)
        sheet = np.full((len(rows) * (size + gap) + gap, rows[0].shape[1] + 2 * gap, 3), 255, np.uint8)
        for k, row in enumerate(rows):
            sheet[gap + k * (size + gap):gap + k * (size + gap) + size, gap:gap + row.shape[1]] = row
        path = folder / f"{stem}-{p // per_page + 1}.png"
        folder.mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(path), cv2.cvtColor(sheet, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_PNG_COMPRESSION, 9])
        paths.append(path)
    return paths


def load_judgement(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    with path.open("rb") as fh:
        return dict(tomllib.load(fh).get("items", {}))


def write_template(path: Path, items: list[Any], lb: dict[str, np.ndarray], kept: dict[str, Any]) -> None:
    def q(s: str) -> str:
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'

    lines = ["# Verdicts on the review set's cut-outs, judged by looking at the contact sheet",
             "# (bench/bench_quality.py review --sheet DIR). lightbox/rembg: accept or reject, *_why: what was seen.",
             "# fingerprint: lightbox's mask when judged (24 x 24); a later run flags rows whose mask moved.", ""]
    for it in items:
        v = kept.get(it.name, {})
        lines.append(f"[items.{q(it.name)}]")
        lines.append(f"class = {q(it.cls)}")
        for who in ("lightbox", "rembg"):
            lines.append(f"{who} = {q(v.get(who, '?'))}")
            lines.append(f"{who}_why = {q(v.get(who + '_why', ''))}")
        lines.append(f"fingerprint = {q(fingerprint(lb['alpha_' + it.name]))}")
        lines.append("")
    path.write_text("\n".join(lines))


def bench_review(tree: Path, model: Path | None, sheet: Path | None, rembg_venv: Path | None,
                 judgement: Path, template: Path | None, per_page: int = 12, size: int = 150) -> None:
    from bench.review_set import review_set

    items = review_set()
    images = {it.name: it.image for it in items}
    lb = run_lightbox(tree, images, model)
    rb = run_rembg(images, rembg_venv) if rembg_venv is not None else None
    kept = load_judgement(judgement)
    print(f"review set: {len(items)} images of {len({i.photo.name for i in items})} photographs; lightbox "
          f"({model.name if model else 'u2netp'}, code of {tree}) segment {float(lb['seconds'][0]) * 1000:.0f} ms "
          "per image (model + post-processing, CPU, 2 threads)")
    print(f"{'image':<24} {'class':<12} {'lightbox':<9} {'rembg':<9} {'moved':>6}  why (lightbox | rembg)")
    counts: dict[str, dict[str, list[int]]] = {}
    for it in items:
        v = kept.get(it.name, {})
        fp = v.get("fingerprint")
        moved = "" if not fp else f"{fingerprint_iou(fp, fingerprint(lb['alpha_' + it.name])):.2f}"
        flag = " look again" if moved and float(moved) < 0.9 else ""
        print(f"{it.name:<24} {it.cls:<12} {v.get('lightbox', '?'):<9} {v.get('rembg', '?'):<9} {moved:>6}{flag}  "
              f"{v.get('lightbox_why', '')} | {v.get('rembg_why', '')}")
        c = counts.setdefault(it.cls, {"lightbox": [0, 0], "rembg": [0, 0]})
        for who in ("lightbox", "rembg"):
            c[who][0] += v.get(who) == "accept"
            c[who][1] += 1
    print(f"\naccepted per class (kept verdicts)\n{'class':<12} {'lightbox':>9} {'rembg':>9}")
    tot = {"lightbox": 0, "rembg": 0}
    for cls, c in counts.items():
        print(f"{cls:<12} {c['lightbox'][0]:>4}/{c['lightbox'][1]:<4} {c['rembg'][0]:>4}/{c['rembg'][1]:<4}")
        for who in tot:
            tot[who] += c[who][0]
    print(f"{'all':<12} {tot['lightbox']:>4}/{len(items):<4} {tot['rembg']:>4}/{len(items):<4}")
    cons = framing_consistency(items, {k[6:]: v for k, v in lb.items() if k.startswith("alpha_")})
    peer = framing_consistency(items, {k[6:]: v for k, v in rb.items() if k.startswith("alpha_")}) if rb else {}
    print("\nframing consistency: worst IoU of the masks where a photo's framings overlap (lightbox / rembg)")
    for name, v in cons.items():
        print(f"  {name:<14} {v:.3f} / {peer.get(name, float('nan')):.3f}")
    print(f"  mean           {np.mean(list(cons.values())):.3f} / "
          f"{np.mean(list(peer.values())) if peer else float('nan'):.3f}")
    if sheet is not None:
        for p in write_sheets(items, lb, rb, kept, sheet.parent, sheet.stem, per_page, size):
            print(f"contact sheet: {p} ({p.stat().st_size / 1e6:.2f} MB)")
    if template is not None:
        write_template(template, items, lb, kept)
        print(f"judgement template: {template}")
