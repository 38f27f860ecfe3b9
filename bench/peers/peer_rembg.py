"""rembg as a user runs it, for the peer benchmarks. Runs inside rembg's own virtualenv (no
lightbox import), in one of two shapes:

- a whole process over files (``bench/bench_peers.py``): ``new_session("u2netp")`` (weights from
  ``~/.u2net/u2netp.onnx``), then per image ``remove(..., bgcolor=white)`` and, per preset, a
  Pillow thumbnail onto the preset's white canvas and an encode. Writes
  ``OUT/<stem>.<preset>.<ext>`` and ``OUT/rembg-stats.json`` (seconds per stage, summed).
  ``--masks DIR`` also writes rembg's full-size masks (``session.predict``) as PNG for the IoU
  check.
- ``serve``: the streaming service a team writes first (``bench/bench_stream_peers.py``; needs
  aiokafka in the same virtualenv), an aiokafka consumer loop around the same code. One consumer
  in a consumer group reads JSON jobs ``{"id", "path"}`` from the input topic; per message the
  file is cut out and its presets written as above (``OUT/<id>.<preset>.<ext>``), then a JSON
  result ``{"id", "outputs"}`` is produced to the output topic (keyed like the job, acknowledged
  by the broker) and the job's offset committed. One message at a time, in order: the loop a
  team writes first. The image work runs on a worker thread (``asyncio.to_thread``), so the
  consumer's heartbeats go on while a large photo is processed; a file that fails is answered on
  the output topic with ``{"id", "error"}`` (the name of the error only) and committed, so
  nothing is lost and nothing stuck. SIGTERM stops it after the message in hand; it writes
  ``OUT/stream-rembg-stats.json``.

    python bench/peers/peer_rembg.py OUT FILE... [--masks DIR]
    python bench/peers/peer_rembg.py serve BOOTSTRAP GROUP INPUT_TOPIC OUTPUT_TOPIC OUT
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
WHITE = (255, 255, 255, 255)


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
        cut = remove(img, session=session, bgcolor=WHITE).convert("RGB")
        t2 = time.perf_counter()
        t["remove"] += t2 - t1
        variants(cut, path.stem, out, t)
    (out / "rembg-stats.json").write_text(json.dumps({"images": len(files), "seconds": t}))


# --- serve: the streaming service ------------------------------------------------------------
def process(session: object, path: str, stem: str, out: Path, t: dict[str, float]) -> list[str]:
    t0 = time.perf_counter()
    img = Image.open(path)
    img.load()
    t1 = time.perf_counter()
    t["decode"] += t1 - t0
    cut = remove(img, session=session, bgcolor=WHITE).convert("RGB")
    t["remove"] += time.perf_counter() - t1
    return [str(p) for p in variants(cut, stem, out, t)]


async def serve(bootstrap: str, group: str, input_topic: str, output_topic: str, out: Path) -> None:
    import asyncio
    import signal

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    out.mkdir(parents=True, exist_ok=True)
    session = new_session("u2netp")
    t = dict.fromkeys(("decode", "remove", "resize", "encode"), 0.0)
    consumer = AIOKafkaConsumer(input_topic, bootstrap_servers=bootstrap, group_id=group,
                                enable_auto_commit=False, auto_offset_reset="earliest")
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await consumer.start()
    await producer.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    done = 0
    try:
        while not stop.is_set():
            batches = await consumer.getmany(timeout_ms=200, max_records=1)
            for records in batches.values():
                for msg in records:
                    job = json.loads(msg.value)
                    try:
                        outputs = await asyncio.to_thread(process, session, job["path"], job["id"], out, t)
                        result = {"id": job["id"], "outputs": outputs}
                    except Exception as exc:
                        result = {"id": job["id"], "error": type(exc).__name__}
                    await producer.send_and_wait(output_topic, json.dumps(result).encode(), key=msg.key)
                    await consumer.commit()
                    done += 1
    finally:
        await consumer.stop()
        await producer.stop()
        (out / "stream-rembg-stats.json").write_text(json.dumps({"images": done, "seconds": t}))


def serve_main(argv: list[str]) -> None:
    import asyncio

    bootstrap, group, input_topic, output_topic, out = argv
    asyncio.run(serve(bootstrap, group, input_topic, output_topic, Path(out)))


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve_main(sys.argv[2:])
    else:
        main(sys.argv[1:])
