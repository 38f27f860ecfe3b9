"""Fetch and store throughput through a real S3 (s3proxy on its filesystem backend), images/s and MB/s.

Usage (from the repository root)::

    PYTHONPATH=. .venv/bin/python bench/bench_objstore.py [--n 48] [--threads 1 4] [--rounds 3] [--out PATH]

Starts s3proxy (or uses ``LIGHTBOX_S3_ENDPOINT`` with ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` and
an existing bucket ``LIGHTBOX_S3_BUCKET``), uploads the sample catalog (``lightbox.samples``: JPEG, PNG,
WebP at catalog sizes), then times, side by side in alternating rounds:

- fetch: the worker's :class:`~blobio.fetch.Fetcher` reading every ``s3://`` URI (byte limit and
  allow-list checks included), with 1 and more threads (the prepare lane's pool); baseline: the same
  Fetcher reading the same files through ``file://`` from local disk.
- store: :class:`~blobio.store.ObjectOutputStore` writing each image as a new content-addressed
  variant (HEAD + PUT), then again (a replay: HEAD only); baseline: the same store class on a local folder.

Prints best-of-rounds img/s and MB/s per case and writes them as JSON. On a shared machine the
figures move with the load; the JSON records the 1-minute load average.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from blobio.fetch import Fetcher, FetchPolicy
from blobio.store import ObjectOutputStore, make_store, variant_key
from lightbox.samples import make_catalog


def timed(fn: Callable[[Any], Any], items: Sequence[Any], threads: int) -> float:
    t0 = time.perf_counter()
    if threads == 1:
        for it in items:
            fn(it)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(fn, items))
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=48, help="images")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("out/bench/objstore.json"))
    args = ap.parse_args()

    local_s3 = None
    if os.environ.get("LIGHTBOX_S3_ENDPOINT"):
        endpoint, bucket = os.environ["LIGHTBOX_S3_ENDPOINT"], os.environ.get("LIGHTBOX_S3_BUCKET", "lightbox-test")
    else:
        from lightbox.devservers.s3_local import LocalS3

        local_s3 = LocalS3.start(buckets=("lightbox-bench",), heap="512m")
        endpoint, bucket = local_s3.endpoint, "lightbox-bench"
        os.environ.update(local_s3.env())
    try:
        work = Path(tempfile.mkdtemp(prefix="lightbox-bench-objstore-"))
        files = make_catalog(work / "catalog", args.n)
        blobs = [f.read_bytes() for f in files]
        total_mb = sum(map(len, blobs)) / 1e6
        run = uuid.uuid4().hex[:8]
        policy = FetchPolicy(max_bytes=64 << 20, file_roots=(work,), allow=(f"s3://{bucket}",), s3_endpoint=endpoint)
        fetcher = Fetcher(policy)
        up = make_store(f"s3://{bucket}/in-{run}", _Cfg(endpoint))
        assert isinstance(up, ObjectOutputStore)
        s3_uris = [up.put(variant_key(f.stem, "src", hashlib.sha256(b).hexdigest(), f.suffix[1:]), b,
                          "application/octet-stream") for f, b in zip(files, blobs, strict=True)]
        file_uris = [f.resolve().as_uri() for f in files]
        for uris in (s3_uris, file_uris):  # warm both paths (connection pool, page cache); check the bytes
            assert [fetcher.fetch({"uri": u}) for u in uris] == blobs

        cases: dict[str, list[float]] = {}
        for r in range(args.rounds):
            for threads in args.threads:
                cases.setdefault(f"fetch s3 x{threads}", []).append(
                    timed(lambda u: fetcher.fetch({"uri": u}), s3_uris, threads))
                cases.setdefault(f"fetch file x{threads}", []).append(
                    timed(lambda u: fetcher.fetch({"uri": u}), file_uris, threads))
                for name, url in (("s3", f"s3://{bucket}/out-{run}-{r}-{threads}"),
                                  ("file", (work / f"out-{r}-{threads}").as_uri())):
                    store = make_store(url, _Cfg(endpoint))
                    assert store is not None
                    # each image as a new variant: its key is its content's sha256
                    keyed = [(variant_key(f"SKU-{i}", "bench", hashlib.sha256(b).hexdigest(), "jpeg"), b)
                             for i, b in enumerate(blobs)]
                    cases.setdefault(f"store {name} x{threads}", []).append(
                        timed(lambda kb, s=store: s.put(kb[0], kb[1], "image/jpeg"), keyed, threads))
                    again = make_store(url, _Cfg(endpoint))  # a replay from a fresh worker: HEAD finds each
                    assert again is not None
                    cases.setdefault(f"store {name} replay x{threads}", []).append(
                        timed(lambda kb, s=again: s.put(kb[0], kb[1], "image/jpeg"), keyed, threads))
        results = {}
        print(f"{args.n} images, {total_mb:.1f} MB ({total_mb / args.n * 1000:.0f} KB each), best of {args.rounds}; "
              f"endpoint {endpoint}")
        print(f"{'case':28s} {'img/s':>8s} {'MB/s':>8s}")
        for case, secs in cases.items():
            best = min(secs)
            results[case] = {"img_per_s": args.n / best, "mb_per_s": total_mb / best, "seconds": secs}
            print(f"{case:28s} {args.n / best:8.1f} {total_mb / best:8.1f}")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"n": args.n, "mb": total_mb, "load1": os.getloadavg()[0],
                                        "cases": results}, indent=2))
    finally:
        if local_s3 is not None:
            local_s3.stop()


class _Cfg:
    def __init__(self, endpoint: str) -> None:
        self.s3_endpoint = endpoint
        self.timeout_s = 30.0
        self.retries = 3


if __name__ == "__main__":
    main()
