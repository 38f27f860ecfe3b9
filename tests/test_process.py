"""Records in, one output per record out: the agent's pure part on the real CPU pipeline."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from PIL import Image

from agents.process import BatchProcessor, InRecord, OutRecord, Prepared
from agents.wiring import build_processor
from schemas.events import EventCodecs
from streams.producer import ImageProducer
from streams.settings import Settings

PRESETS = ["jd_main", "thumb_webp"]


@pytest.fixture(scope="module")
def processor(tmp_path_factory: pytest.TempPathFactory, catalog_dir: Path) -> BatchProcessor:
    return build_processor(Settings(device="cpu", segmenter="classical", file_roots=[catalog_dir],
                                    data_dir=tmp_path_factory.mktemp("d"), max_pixels=40_000_000))


def record(value: bytes | None, offset: int = 0) -> InRecord:
    return InRecord("lightbox.images.v1", 0, offset, value, key=b"SKU",
                    headers=[("traceparent", b"00-" + b"a" * 32 + b"-" + b"b" * 16 + b"-01"), ("other", b"x")])


def event_bytes(path: Path | None = None, *, source: dict | None = None, presets: list[str] = PRESETS) -> bytes:
    ev = ImageProducer.event(source or {"data": path.read_bytes()}, sku="SKU", image_id="i", presets=presets)  # type: ignore[union-attr]
    return EventCodecs.create().product.encode(ev)


def run_all(processor: BatchProcessor, records: list[InRecord]) -> list[OutRecord]:
    """prepare + run in one batch, outputs in input order (as the agent pairs them)."""
    prepared = [processor.prepare(r) for r in records]
    jobs = [p for p in prepared if isinstance(p, Prepared)]
    ran = iter(processor.run(jobs))
    return [p if isinstance(p, OutRecord) else next(ran) for p in prepared]


def decode(out: OutRecord) -> dict:
    codecs = EventCodecs.create()
    return (codecs.processed if out.kind == "processed" else codecs.dead_letter).decode(out.value)


def test_good_images_yield_every_variant_with_spans(processor: BatchProcessor, catalog: list[Path]) -> None:
    outs = run_all(processor, [record(event_bytes(p), i) for i, p in enumerate(catalog[:4])])
    assert [o.kind for o in outs] == ["processed"] * 4
    for out in outs:
        ev = decode(out)
        assert [(v["preset"], v["width"], v["height"]) for v in ev["variants"]] == [
            ("jd_main", 800, 800), ("thumb_webp", 400, 400)]
        for v in ev["variants"]:
            img = Image.open(io.BytesIO(v["data"]))
            assert img.size == (v["width"], v["height"]) and img.format == {"jpeg": "JPEG", "webp": "WEBP"}[v["format"]]
            assert v["size"] == len(v["data"])
        stages = {s["stage"] for s in ev["spans"]}
        assert {"fetch", "decode", "correct", "preset:jd_main", "encode:jd_main", "preset:thumb_webp",
                "encode:thumb_webp", "produce"} <= stages
        assert all(s["duration_us"] > 0 for s in ev["spans"])
        assert dict(out.headers)["traceparent"].startswith(b"00-") and "other" not in dict(out.headers)


def test_replay_gives_the_same_event_id_and_bytes(processor: BatchProcessor, catalog: list[Path]) -> None:
    value = event_bytes(catalog[0])
    a, b = (decode(run_all(processor, [record(value, n)])[0]) for n in (1, 2))
    assert a["event_id"] == b["event_id"]
    assert [v["sha256"] for v in a["variants"]] == [v["sha256"] for v in b["variants"]]
    assert [v["data"] for v in a["variants"]] == [v["data"] for v in b["variants"]]


BAD = {
    "empty.jpg": "DECODE_FAILED",
    "truncated.jpg": "DECODE_FAILED",
    "notes-as-image.jpg": "UNSUPPORTED_FORMAT",
    "pixel-bomb.png": "TOO_LARGE",
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_files_become_dead_letters_and_batch_mates_survive(
        processor: BatchProcessor, catalog: list[Path], bad_files: dict[str, Path], name: str) -> None:
    records = [record(event_bytes(catalog[1]), 0), record(event_bytes(bad_files[name]), 1),
               record(event_bytes(catalog[2]), 2)]
    outs = run_all(processor, records)
    assert [o.kind for o in outs] == ["processed", "dead_letter", "processed"]
    dead = decode(outs[1])
    assert dead["error_code"] == BAD[name] == outs[1].error_code
    assert dead["original"]["offset"] == 1 and dead["original"]["value"] == records[1].value
    assert dead["message"] and dead["stage"]


@pytest.mark.parametrize("make, code, stage", [
    (lambda p: event_bytes(p, presets=["jd_main", "no_such_preset"]), "UNKNOWN_PRESET", "presets"),
    (lambda p: event_bytes(source={"uri": "file:///nonexistent/lightbox/x.jpg", "sha256": None}),
     "FETCH_FAILED", "fetch"),
    (lambda p: event_bytes(source={"uri": p.with_name("missing.jpg").as_uri(), "sha256": None}),
     "FETCH_FAILED", "fetch"),  # inside the roots, not there
    (lambda p: event_bytes(source={"uri": "file:///etc/passwd", "sha256": None}), "FETCH_FAILED", "fetch"),
    (lambda p: b"this record is not Avro", "SCHEMA_INVALID", "deserialize"),
    (lambda p: b"\x00\x00\x00\x01\x2c" + b"\x00" * 10, "SCHEMA_INVALID", "deserialize"),
])
def test_bad_events_become_dead_letters_before_any_work(
        processor: BatchProcessor, catalog: list[Path], make, code: str, stage: str) -> None:  # type: ignore[no-untyped-def]
    outs = run_all(processor, [record(make(catalog[0]), 5), record(event_bytes(catalog[3]), 6)])
    assert [o.kind for o in outs] == ["dead_letter", "processed"]
    dead = decode(outs[0])
    assert (dead["error_code"], dead["stage"]) == (code, stage)
    assert dict(outs[0].headers)["lightbox-error"] == code.encode()


def test_unknown_preset_message_names_it(processor: BatchProcessor, catalog: list[Path]) -> None:
    out = run_all(processor, [record(event_bytes(catalog[0], presets=["tmall_xl"]))])[0]
    assert "'tmall_xl'" in decode(out)["message"]


def test_uri_source_is_fetched_from_file(processor: BatchProcessor, catalog: list[Path]) -> None:
    out = run_all(processor, [record(event_bytes(source={"uri": catalog[5].as_uri(), "sha256": None}))])[0]
    assert out.kind == "processed"


def test_output_dir_turns_variants_into_content_addressed_uris(catalog: list[Path], tmp_path: Path) -> None:
    proc = build_processor(Settings(device="cpu", segmenter="none", output_dir=tmp_path / "cdn"))
    ev = decode(run_all(proc, [record(event_bytes(catalog[0]))])[0])
    for v in ev["variants"]:
        assert v["data"] is None and v["uri"].startswith("file://") and v["sha256"] in v["uri"]
        assert Path(v["uri"][len("file://"):]).stat().st_size == v["size"]


def test_shape_class_bins_resolution_and_preset_set(processor: BatchProcessor, catalog: list[Path]) -> None:
    from agents.process import resolution_bin

    assert [resolution_bin(w, h) for w, h in ((800, 600), (1024, 10), (1025, 900), (3000, 4000), (6000, 4000))] == [
        0, 0, 1, 2, 3]
    a = processor.prepare(record(event_bytes(catalog[0])))
    b = processor.prepare(record(event_bytes(catalog[0], presets=["jd_main"])))
    assert isinstance(a, Prepared) and isinstance(b, Prepared)
    assert a.shape_class[0] == b.shape_class[0] == resolution_bin(a.info.width, a.info.height)
    assert a.shape_class != b.shape_class  # another preset set, another bucket
    assert a.nbytes == a.info.width * a.info.height * (4 if a.info.has_alpha else 3)


def test_header_guards_run_before_batching(processor: BatchProcessor, bad_files: dict[str, Path]) -> None:
    """A pixel bomb is refused when the record is prepared: it never takes a batch slot."""
    out = processor.prepare(record(event_bytes(bad_files["pixel-bomb.png"])))
    assert isinstance(out, OutRecord) and out.error_code == "TOO_LARGE"
