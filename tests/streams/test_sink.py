"""KafkaSink on a real broker: a send_batch lands each record where the key partitioner puts it, in order."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.partitioner import DefaultPartitioner

from streams.app import ensure_topics
from streams.settings import Settings
from streams.sink import KafkaSink

pytestmark = [pytest.mark.kafka]


@dataclass(frozen=True)
class Out:
    kind: str
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)


async def read_all(s: Settings, topics: list[str], n: int) -> list[tuple[str, int, bytes | None, bytes, list]]:
    consumer = AIOKafkaConsumer(*topics, bootstrap_servers=s.kafka.bootstrap, group_id=None,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    got: list[tuple[str, int, bytes | None, bytes, list]] = []
    try:
        async with asyncio.timeout(60):
            while len(got) < n:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    got += [(r.topic, r.partition, r.key, r.value, list(r.headers)) for r in records]
    finally:
        await consumer.stop()
    return got


def test_a_send_batch_lands_every_record_on_its_key_partition_in_order(settings: Settings) -> None:
    """Records of both kinds, keyed (many per key) and one over the producer's batch size: each is
    acknowledged, lands on the partition the key partitioner picks (as ``send`` would), keeps its
    headers, and records of one key keep their order."""
    s = settings.model_copy(update={"topic_partitions": 4})
    asyncio.run(ensure_topics(s))
    records = [Out("processed", f"SKU-{i % 7}".encode(), f"v{i}".encode(), [("lightbox-source", f"{i}".encode())])
               for i in range(60)]
    records.insert(30, Out("processed", b"SKU-big", b"x" * 40_000))  # larger than one record batch (16 KB)
    records += [Out("dead_letter", f"SKU-{i}".encode(), f"d{i}".encode(), [("h", None)]) for i in range(5)]

    async def go() -> list[BaseException | None]:
        sink = KafkaSink(s.kafka, s.topics, delivery_timeout_s=s.runner.delivery_timeout_s, client_id="t-sink")
        await sink.start()
        try:
            return await sink.send_batch(records)
        finally:
            await sink.stop()

    assert asyncio.run(go()) == [None] * len(records)
    got = asyncio.run(read_all(s, [s.topics.output, s.topics.dlq], len(records)))
    assert len(got) == len(records)
    part = DefaultPartitioner()
    where = {(topic, key, value): p for topic, p, key, value, _ in got}
    for r in records:
        topic = s.topics.output if r.kind == "processed" else s.topics.dlq
        assert where[(topic, r.key, r.value)] == part(r.key, [0, 1, 2, 3], [0, 1, 2, 3])
    headers = {value: h for _, _, _, value, h in got}
    assert headers[b"v7"] == [("lightbox-source", b"7")] and headers[b"d0"] == [("h", b"")]
    for k in range(7):  # one key's records in the order they were handed over
        key = f"SKU-{k}".encode()
        assert [v for t, _, kk, v, _ in got if kk == key and t == s.topics.output] == [
            r.value for r in records if r.key == key and r.kind == "processed"]
