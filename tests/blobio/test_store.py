"""Claim-check outputs: content-addressed, idempotent writes to a real S3 (s3proxy) and a folder; hostile
SKUs stay inside the prefix; a store that refuses writes is StoreUnavailable; the processor puts URIs in
events and keeps bytes inline only under the threshold."""

from __future__ import annotations

import hashlib
import io
import time
import uuid
from pathlib import Path
from typing import Any

import obstore
import pytest
from PIL import Image

from agents.process import InRecord, Prepared
from agents.wiring import build_processor
from blobio.store import make_store, variant_key
from schemas.errors import FatalError, StoreUnavailable
from schemas.events import EventCodecs
from schemas.paths import safe_component
from streams.producer import ImageProducer
from streams.settings import Settings

DATA = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8
SHA = hashlib.sha256(DATA).hexdigest()


@pytest.mark.parametrize("sku", ["../../etc/passwd", "..", ".", "a/b", "a\\b", "", "\x00x", "SKU 1/../..", "é"])
def test_hostile_skus_become_one_safe_component(sku: str) -> None:
    seg = safe_component(sku)
    assert seg and "/" not in seg and "\\" not in seg and not seg.startswith(".") and len(seg) <= 100
    key = variant_key(sku, "jd_main", SHA, "jpeg")
    assert key.endswith(f"/jd_main/{SHA}.jpg") and key.count("/") == 2 and ".." not in key.split("/")


def test_sanitized_skus_that_look_alike_stay_apart() -> None:
    assert safe_component("a/b") != safe_component("a_b") and safe_component("SKU-1") == "SKU-1"


def test_keys_must_be_content_addressed() -> None:
    with pytest.raises(ValueError):
        variant_key("sku", "jd_main", "not-a-sha", "jpeg")


def test_file_store_writes_once_and_returns_the_same_uri(tmp_path: Path) -> None:
    store = make_store((tmp_path / "cdn").as_uri())
    assert store is not None
    key = variant_key("../SKU-1", "jd_main", SHA, "png")
    uri = store.put(key, DATA, "image/png")
    path = Path(uri.removeprefix("file://"))
    assert path.read_bytes() == DATA and path.is_relative_to(tmp_path / "cdn")
    mtime = path.stat().st_mtime_ns
    again = make_store((tmp_path / "cdn").as_uri())  # a new worker (no memory of the first write)
    assert again is not None and again.put(key, DATA, "image/png") == uri
    assert path.stat().st_mtime_ns == mtime  # not rewritten


def test_s3_store_is_content_addressed_and_idempotent(s3_env: Any) -> None:
    prefix = f"out-{uuid.uuid4().hex[:8]}"
    store = make_store(f"s3://{s3_env.bucket}/{prefix}", Settings(s3_endpoint=s3_env.endpoint).store)
    assert store is not None
    key = variant_key("SKU-9", "thumb_webp", SHA, "webp")
    uri = store.put(key, DATA, "image/webp")
    assert uri == f"s3://{s3_env.bucket}/{prefix}/SKU-9/thumb_webp/{SHA}.webp"
    client = s3_env.client()
    got = obstore.get(client, f"{prefix}/SKU-9/thumb_webp/{SHA}.webp")
    assert bytes(got.bytes()) == DATA and got.attributes.get("Content-Type") == "image/webp"
    etag = got.meta["e_tag"]
    for _ in range(3):  # replays: same key, nothing new written
        assert store.put(key, DATA, "image/webp") == uri
    other = make_store(f"s3://{s3_env.bucket}/{prefix}", Settings(s3_endpoint=s3_env.endpoint).store)
    assert other is not None and other.put(key, DATA, "image/webp") == uri
    listed = [m["path"] for batch in obstore.list(client, prefix=prefix) for m in batch]
    assert listed == [f"{prefix}/SKU-9/thumb_webp/{SHA}.webp"]
    assert obstore.head(client, listed[0])["e_tag"] == etag


def test_a_store_that_refuses_writes_is_fatal(s3_env: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(s3_endpoint=s3_env.endpoint, store_retries=1, store_timeout_s=2).store
    missing = make_store(f"s3://no-such-bucket-{uuid.uuid4().hex[:6]}/p", settings)
    assert missing is not None
    with pytest.raises(StoreUnavailable) as info:
        missing.put(variant_key("s", "jd_main", SHA, "jpeg"), DATA, "image/jpeg")
    assert isinstance(info.value, FatalError) and "not found" in str(info.value)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    denied = make_store(f"s3://{s3_env.bucket}/p", settings)
    assert denied is not None
    with pytest.raises(StoreUnavailable, match="denied"):
        denied.put(variant_key("s", "jd_main", SHA, "jpeg"), DATA, "image/jpeg")
    down = make_store("s3://lightbox-test/p", Settings(s3_endpoint="http://127.0.0.1:1", store_retries=1,
                                                        store_timeout_s=2).store)
    assert down is not None
    with pytest.raises(StoreUnavailable, match="unreachable"):
        down.put(variant_key("s", "jd_main", SHA, "jpeg"), DATA, "image/jpeg")


def test_bad_store_urls_are_configuration_errors() -> None:
    for url in ("ftp://x/y", "file://host/x", "s3:///prefix"):
        with pytest.raises(ValueError):
            make_store(url)
    assert make_store(None) is None and make_store("") is None


def _run(settings: Settings, image: Path, sku: str) -> dict[str, Any]:
    proc = build_processor(settings)
    codecs = EventCodecs.create()
    ev = ImageProducer.event({"data": image.read_bytes()}, sku=sku, image_id="i", presets=["jd_main", "thumb_webp"])
    prepared = proc.prepare(InRecord("t", 0, 0, codecs.product.encode(ev), key=sku.encode()))
    assert isinstance(prepared, Prepared)
    out = proc.run([prepared])[0]
    assert out.kind == "processed"
    return codecs.processed.decode(out.value)


def test_processor_writes_variants_to_s3_before_the_event(s3_env: Any, catalog: list[Path]) -> None:
    prefix = f"proc-{uuid.uuid4().hex[:8]}"
    base = {"device": "cpu", "segmenter": "none", "s3_endpoint": s3_env.endpoint,
            "output_store": f"s3://{s3_env.bucket}/{prefix}"}
    ev = _run(Settings(**base), catalog[0], "../../SKU/evil")
    client = s3_env.client()
    for v in ev["variants"]:
        assert v["data"] is None and v["uri"].startswith(f"s3://{s3_env.bucket}/{prefix}/")
        key = v["uri"].removeprefix(f"s3://{s3_env.bucket}/")
        ext = {"jpeg": "jpg"}.get(v["format"], v["format"])
        assert key.split("/")[1] == safe_component("../../SKU/evil") and key.endswith(f"/{v['sha256']}.{ext}")
        data = bytes(obstore.get(client, key).bytes())
        assert hashlib.sha256(data).hexdigest() == v["sha256"] and len(data) == v["size"]
        assert Image.open(io.BytesIO(data)).size == (v["width"], v["height"])
    # under the inline threshold, bytes travel too (and the URI stays)
    small = _run(Settings(**base, inline_max_bytes=10 << 20), catalog[0], "SKU-inline")
    assert all(v["data"] is not None and v["uri"] for v in small["variants"])
    assert [v["sha256"] for v in small["variants"]] == [v["sha256"] for v in ev["variants"]]


def test_a_store_that_is_down_is_waited_for_and_a_refusal_is_not(s3_env: Any, proxies: Any) -> None:
    """Given a waiter (a worker's dependencies), a put whose store is unreachable past the client's
    retries does not raise: it reports the outage and tries again with backoff until the store
    answers, then writes. A refusal (no such bucket) still raises at once, saying waiting cannot fix it."""
    from concurrent.futures import ThreadPoolExecutor

    from agents.dependencies import Backoff, Dependencies

    upstream = s3_env.endpoint.removeprefix("http://")
    proxy = proxies.create(f"s3-{uuid.uuid4().hex[:6]}", upstream)
    settings = Settings(s3_endpoint=f"http://{proxy.address}", store_retries=0, store_timeout_s=1).store
    deps = Dependencies(Backoff(0.05, 0.2))
    prefix = f"wait-{uuid.uuid4().hex[:8]}"
    store = make_store(f"s3://{s3_env.bucket}/{prefix}", settings, deps)
    assert store is not None
    key = variant_key("s", "jd_main", SHA, "jpeg")
    proxy.disable()  # the link is down: connections refused
    name = f"output store s3://{s3_env.bucket}/{prefix}"
    with ThreadPoolExecutor(1) as pool:
        try:
            put = pool.submit(store.put, key, DATA, "image/jpeg")
            for _ in range(300):
                if (name in deps.down() and deps.down()[name].attempts >= 3) or put.done():
                    break
                time.sleep(0.1)
            assert not put.done(), put.exception()
            assert deps.waiting and "unreachable" in deps.describe()
        finally:
            proxy.enable()
        uri = put.result(timeout=60)
    assert not deps.waiting and deps.outages_seen == 1
    assert uri.endswith(f"{prefix}/{key}") and bytes(obstore.get(s3_env.client(), f"{prefix}/{key}").bytes()) == DATA
    missing = make_store(f"s3://no-such-bucket-{uuid.uuid4().hex[:6]}/p", settings, deps)
    assert missing is not None
    with pytest.raises(StoreUnavailable, match="waiting cannot fix this: check that the bucket"):
        missing.put(key, DATA, "image/jpeg")
    assert not deps.waiting
