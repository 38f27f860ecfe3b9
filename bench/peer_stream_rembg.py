"""The streaming service a team writes first, as the streaming peer benchmark runs it: an aiokafka
consumer loop around rembg. Runs inside rembg's own virtualenv (rembg 2.0.86 and aiokafka; no
lightbox import).

One consumer in a consumer group reads JSON jobs ``{"id", "path"}`` from the input topic; per
message: Pillow opens the file, ``rembg.remove(..., session=new_session("u2netp"),
bgcolor=white)`` cuts it out, each preset is a Pillow thumbnail on the preset's white canvas,
encoded to ``OUT/<id>.<preset>.<ext>`` (``peer_rembg.variants``, the same code the whole-process
peer runs); then a JSON result ``{"id", "outputs"}`` is produced to the output topic (keyed like
the job, acknowledged by the broker) and the job's offset committed. One message at a time, in
order: the loop a team writes first. The image work runs on a worker thread
(``asyncio.to_thread``), so the consumer's heartbeats go on while a large photo is processed; a
file that fails is answered on the output topic with ``{"id", "error"}`` (the name of the error
only) and committed, so nothing is lost and nothing stuck. SIGTERM stops it after the message
in hand.

    python bench/peer_stream_rembg.py BOOTSTRAP GROUP INPUT_TOPIC OUTPUT_TOPIC OUT
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from peer_rembg import variants  # the same script folder: the whole-process peer's presets and resize
from PIL import Image
from rembg import new_session, remove

WHITE = (255, 255, 255, 255)


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


def main(argv: list[str]) -> None:
    bootstrap, group, input_topic, output_topic, out = argv
    asyncio.run(serve(bootstrap, group, input_topic, output_topic, Path(out)))


if __name__ == "__main__":
    main(sys.argv[1:])
