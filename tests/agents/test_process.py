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
    assert a.nbytes == a.info.decoded_nbytes >= a.info.width * a.info.height * (4 if a.info.has_alpha else 3)


def test_header_guards_run_before_batching(processor: BatchProcessor, bad_files: dict[str, Path]) -> None:
    """A pixel bomb is refused when the record is prepared: it never takes a batch slot."""
    out = processor.prepare(record(event_bytes(bad_files["pixel-bomb.png"])))
    assert isinstance(out, OutRecord) and out.error_code == "TOO_LARGE"


# -- lanes ---------------------------------------------------------------------------------------
def test_lanes_one_at_a_time_give_what_run_gives(processor: BatchProcessor, catalog: list[Path]) -> None:
    from agents.process import BatchState

    recs = [record(event_bytes(p), i) for i, p in enumerate(catalog[:2])]
    prepared = [processor.prepare(r) for r in recs]
    assert all(isinstance(p, Prepared) for p in prepared)
    state = processor.decode(prepared)  # type: ignore[arg-type]
    assert isinstance(state, BatchState) and len(state) == 2 and state.items == prepared
    state = processor.device(state)
    outs = processor.output(state)
    assert [o.kind for o in outs] == ["processed"] * 2 and [o.source.offset for o in outs] == [0, 1]
    stages = [s["stage"] for s in decode(outs[0])["spans"]]
    assert stages.index("preset:jd_main") < stages.index("encode:jd_main") < stages.index("quality") < stages.index(
        "produce")


def test_a_batch_level_exception_in_the_device_lane_dead_letters_the_batch(
        processor: BatchProcessor, catalog: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    prepared = [processor.prepare(record(event_bytes(p), i)) for i, p in enumerate(catalog[:3])]
    state = processor.decode(prepared)  # type: ignore[arg-type]

    def broken(ctx, lane):  # type: ignore[no-untyped-def]
        raise RuntimeError("device lost")

    monkeypatch.setattr(processor.pipeline, "run_lane", broken)
    state = processor.device(state)  # never raises
    monkeypatch.undo()
    outs = processor.output(state)
    assert [(o.kind, o.error_code, o.source.offset) for o in outs] == [
        ("dead_letter", "PROCESSING_FAILED", k) for k in range(3)]
    dead = decode(outs[0])
    assert dead["stage"] == "device" and "RuntimeError: device lost" in dead["message"]


def test_an_unwritable_output_dir_is_fatal_not_a_dead_letter(catalog: list[Path], tmp_path: Path) -> None:
    from schemas.errors import StoreUnavailable

    blocker = tmp_path / "not-a-dir"
    blocker.write_bytes(b"")
    with pytest.raises(StoreUnavailable, match="not writable"):  # found at start
        build_processor(Settings(device="cpu", segmenter="none", output_dir=blocker))
    cdn = tmp_path / "cdn"
    proc = build_processor(Settings(device="cpu", segmenter="none", output_dir=cdn))
    prepared = proc.prepare(record(event_bytes(catalog[0])))
    assert isinstance(prepared, Prepared)
    state = proc.device(proc.decode([prepared]))
    cdn.rmdir()
    cdn.write_bytes(b"")  # the folder becomes unwritable while the worker runs
    with pytest.raises(StoreUnavailable, match="cannot write"):
        proc.output(state)


# -- prepare never raises ------------------------------------------------------------------------
def test_a_nul_byte_in_a_file_path_is_a_fetch_failed_dead_letter(processor: BatchProcessor) -> None:
    out = processor.prepare(record(event_bytes(source={"uri": "file:///tmp/a\x00b.jpg", "sha256": None})))
    assert isinstance(out, OutRecord) and out.error_code == "FETCH_FAILED"
    dead = decode(out)
    assert dead["stage"] == "fetch" and dead["message"].startswith("malformed:")


def _garbage_records():  # type: ignore[no-untyped-def]
    from hypothesis import strategies as st

    codecs = EventCodecs.create()
    uri = st.one_of(st.text(max_size=40), st.builds(lambda t: "file:///" + t, st.text(max_size=30)),
                    st.sampled_from(["file:///dev/zero", "file:///proc/self/mem", "file:///", "file://host/x",
                                     "file:///%00", "s3://b/k", "http://127.0.0.1:1/x"]))
    source = st.one_of(st.builds(lambda d: {"data": d}, st.binary(max_size=64)),
                       st.builds(lambda u, h: {"uri": u, "sha256": h}, uri, st.one_of(st.none(), st.text(max_size=8))))
    presets = st.lists(st.one_of(st.sampled_from(PRESETS), st.text(max_size=10)), max_size=3)
    avro = st.builds(lambda s, p, sku, bg: codecs.product.encode(
        ImageProducer.event(s, sku=sku, image_id="i", presets=p, background=bg)),
        source, presets, st.text(max_size=10), st.sampled_from(["WHITE", "TRANSPARENT", "KEEP"]))
    framed = st.builds(lambda body: b"\x00\x00\x00\x00\x01" + body, st.binary(max_size=80))
    value = st.one_of(st.none(), st.binary(max_size=80), framed, avro)
    header = st.tuples(st.text(max_size=12), st.one_of(st.none(), st.binary(max_size=12)))
    headers = st.one_of(st.none(), st.lists(header, max_size=3))
    return st.builds(InRecord, st.text(min_size=1, max_size=20), st.integers(0, 2**31 - 1), st.integers(0, 2**63 - 1),
                     value, st.one_of(st.none(), st.binary(max_size=16)), headers,
                     st.one_of(st.none(), st.integers(0, 2**62)))


def test_prepare_never_raises_on_garbage(tmp_path_factory: pytest.TempPathFactory) -> None:
    from hypothesis import HealthCheck, given, settings

    root = tmp_path_factory.mktemp("roots")
    proc = build_processor(Settings(device="cpu", segmenter="none", file_roots=[root]))

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(_garbage_records())
    def check(rec: InRecord) -> None:
        out = proc.prepare(rec)
        if isinstance(out, OutRecord):
            assert out.kind == "dead_letter" and out.source is rec
            dead = decode(out)
            assert dead["original"]["offset"] == rec.offset and dead["original"]["value"] == rec.value
            assert dead["error_code"] == out.error_code
        else:
            assert isinstance(out, Prepared)

    check()


# -- output size ---------------------------------------------------------------------------------
def _sizes(outs: list[OutRecord]) -> int:
    from streams.records import payload_size

    return payload_size(outs[0].value, outs[0].key, outs[0].headers)


def test_an_event_over_the_limit_without_a_store_is_output_too_large(
        processor: BatchProcessor, catalog: list[Path]) -> None:
    rec = record(event_bytes(catalog[0]))
    full = _sizes(run_all(processor, [rec]))
    prepared = processor.prepare(rec)
    out = processor.run([prepared], max_record_bytes=full - 64)[0]  # type: ignore[list-item]
    assert (out.kind, out.error_code) == ("dead_letter", "OUTPUT_TOO_LARGE")
    dead = decode(out)
    assert dead["error_code"] == "OUTPUT_TOO_LARGE" and dead["stage"] == "produce"
    import re

    # sizes vary by a few bytes between runs (span durations and latency are varints)
    said = re.fullmatch(r"processed event of (\d+) bytes exceeds the output limit of (\d+) bytes "
                        r"\(variants: jd_main (\d+) B, thumb_webp (\d+) B\); configure an output store .*",
                        dead["message"])
    assert said is not None, dead["message"]
    assert int(said[2]) == full - 64 and abs(int(said[1]) - full) < 32 < int(said[3]) + int(said[4]) < full
    # with room for that jitter it goes through
    prepared = processor.prepare(rec)
    assert processor.run([prepared], max_record_bytes=full + 32)[0].kind == "processed"  # type: ignore[list-item]


def test_an_event_over_the_limit_moves_its_largest_variants_to_the_store(catalog: list[Path], tmp_path: Path) -> None:
    import hashlib

    from blobio.store import make_store

    proc = build_processor(Settings(device="cpu", segmenter="classical"))
    proc.store, proc.offload = make_store((tmp_path / "cdn").as_uri()), "oversize"
    rec = record(event_bytes(catalog[0]))
    inline = run_all(proc, [rec])[0]
    ev = decode(inline)
    assert all(v["data"] is not None and v["uri"] is None for v in ev["variants"])  # fits: nothing moved
    assert not any((tmp_path / "cdn").rglob("*"))  # nothing written
    big = max(ev["variants"], key=lambda v: v["size"])
    small = min(ev["variants"], key=lambda v: v["size"])
    limit = _sizes([inline]) - big["size"] // 2  # moving the big one is enough
    out = proc.run([proc.prepare(rec)], max_record_bytes=limit)[0]  # type: ignore[list-item]
    assert out.kind == "processed" and _sizes([out]) <= limit
    moved = {v["preset"]: v for v in decode(out)["variants"]}
    assert moved[big["preset"]]["data"] is None and moved[big["preset"]]["uri"].startswith("file://")
    stored = Path(moved[big["preset"]]["uri"][len("file://"):]).read_bytes()
    assert hashlib.sha256(stored).hexdigest() == big["sha256"] and len(stored) == big["size"]
    assert moved[small["preset"]]["data"] == small["data"]  # the small one stays inline
    # a limit no event can meet even with every variant out of line: OUTPUT_TOO_LARGE, sizes given
    out = proc.run([proc.prepare(rec)], max_record_bytes=100)[0]  # type: ignore[list-item]
    assert out.error_code == "OUTPUT_TOO_LARGE" and "limit of 100 bytes" in decode(out)["message"]
