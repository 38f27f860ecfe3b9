"""Hostile bytes through the event decoder (schemas.codec / schemas.events, and `tail`'s decode_any):
arbitrary bytes and mutated valid events either decode or raise SchemaInvalid, quickly, never anything else."""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import fastavro
import pytest
from fastavro.utils import generate_one
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.codec import load_schema
from schemas.errors import SchemaInvalid
from schemas.events import EventCodecs
from streams.consume import decode_any
from streams.producer import ImageProducer

CODECS = EventCodecs.create()
DECODERS: dict[str, Callable[[bytes], Any]] = {
    "product": CODECS.product.decode, "processed": CODECS.processed.decode,
    "dead_letter": CODECS.dead_letter.decode, "any": lambda b: decode_any(CODECS, b)}
# a hang would never finish an example: the deadline flags a decode that is merely very slow
FUZZ = settings(max_examples=300, deadline=timedelta(seconds=2), suppress_health_check=[HealthCheck.too_slow])


def _valid_records() -> list[bytes]:
    state = random.getstate()
    random.seed(20261130)  # fastavro's generator draws from the global random; keep the corpus fixed
    try:
        out = [CODECS.product.encode(ImageProducer.event({"data": b"\xff\xd8\xff\xe0jpeg"}, sku="SKU-1",
                                                         image_id="i", presets=["jd_main", "taobao_main"])),
               CODECS.product.encode(ImageProducer.event({"uri": "file:///x.jpg", "sha256": None}, sku="SKU-2",
                                                         image_id="j", presets=[]))]
        for codec, name in ((CODECS.product, "product_image_event"), (CODECS.processed, "processed_image_event"),
                            (CODECS.dead_letter, "dead_letter_event")):
            schema = fastavro.parse_schema(load_schema(name))
            out += [codec.encode(generate_one(schema)) for _ in range(4)]
        return out
    finally:
        random.setstate(state)


VALID = _valid_records()


def decode_or_schema_invalid(data: bytes) -> None:
    for name, decode in DECODERS.items():
        try:
            decode(data)
        except SchemaInvalid as exc:
            assert exc.stage in ("deserialize", "tail"), (name, exc.stage)
            assert len(str(exc)) < 1000, (name, str(exc)[:200])  # a reason, not the payload
        except BaseException as exc:  # anything else escaping is the bug under test
            pytest.fail(f"{name} decoder raised {type(exc).__name__}: {exc!s:.200} for {data[:40]!r}")


def zigzag(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


@FUZZ
@given(st.binary(max_size=512))
def test_arbitrary_bytes(data: bytes) -> None:
    decode_or_schema_invalid(data)


@FUZZ
@given(st.sampled_from([1, 2, 3, 4, 0xFFFFFFFF]), st.binary(max_size=512))
def test_arbitrary_body_under_a_known_header(schema_id: int, body: bytes) -> None:
    decode_or_schema_invalid(struct.pack(">bI", 0, schema_id) + body)


MUTATION = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 1 << 16), st.integers(1, 255)),
    st.tuples(st.just("insert"), st.integers(0, 1 << 16), st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("varint"), st.integers(0, 1 << 16),
              st.sampled_from([-(1 << 62), -1, 1 << 31, 1 << 62, (1 << 63) - 1])),
    st.tuples(st.just("delete"), st.integers(0, 1 << 16), st.integers(1, 16)),
    st.tuples(st.just("truncate"), st.integers(0, 1 << 16), st.just(0)),
)


def mutate(data: bytes, ops: list[tuple[str, int, Any]]) -> bytes:
    buf = bytearray(data)
    for op, pos, arg in ops:
        at = pos % (len(buf) + 1)
        if op == "flip" and buf:
            buf[at % len(buf)] ^= arg
        elif op == "insert":
            buf[at:at] = arg
        elif op == "varint":
            buf[at:at] = zigzag(arg)
        elif op == "delete":
            del buf[at:at + arg]
        elif op == "truncate":
            del buf[at:]
    return bytes(buf)


@FUZZ
@given(st.sampled_from(VALID), st.lists(MUTATION, min_size=1, max_size=6))
def test_mutated_valid_events(valid: bytes, ops: list[tuple[str, int, Any]]) -> None:
    decode_or_schema_invalid(mutate(valid, ops))


@pytest.mark.parametrize("data", VALID)
def test_the_valid_corpus_decodes(data: bytes) -> None:
    kind, record = decode_any(CODECS, data)
    assert record == getattr(CODECS, kind).decode(data)


@pytest.mark.parametrize("body", [zigzag(1 << 62), zigzag(-5) + b"abcdef", b"\xff" * 20 + b"\x01",
                                  b"\x02e\x02s\x02i\x02m\x00" + zigzag(1 << 62),  # inline bytes of 2**62
                                  b"\x02e\x02s\x02i\x02m\x00\x02x\x00" + zigzag(1 << 62)])  # 2**62 presets
def test_huge_declared_lengths_and_counts(body: bytes) -> None:
    with pytest.raises(SchemaInvalid):
        CODECS.product.decode(struct.pack(">bI", 0, 1) + body)


def test_not_bytes() -> None:
    with pytest.raises(SchemaInvalid):
        CODECS.product.decode("a str")  # type: ignore[arg-type]
