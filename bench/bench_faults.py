"""Network faults: a `lightbox worker` under a steady mixed stream at about half its capacity, with a
real fault proxy (Toxiproxy) between it and every server it talks to — the Kafka broker, the S3
store (s3proxy) its variants go to, the HTTP origin its fetched images come from and the schema
registry (Apicurio Registry) its inputs' schemas come from. One fault at a time on one link; the
fault is healed and the stream goes on until every input is accounted for.

The stream: good photos inline, good photos fetched from the HTTP origin, and bad files (dead
letters by design), every variant written out of line to S3 (claim-check). Photos are
scikit-image's, downscaled to at most 640 px (``lightbox.samples.make_catalog``).

The registry link: only the registry cells' worker reads its inputs through a registry (the other
cells use the packaged schemas). Its inputs are framed with registry ids; from the fault's start on,
the producer writes a compatible next version of the input schema (registered just before), whose
id the worker has not seen: it must ask the registry, through the fault.

The faults (``--faults``; each on the links where it applies, ``--links``):

    latency_500      latency 500 ms ± 200 ms, both directions
    latency_5s       latency 5 s
    bandwidth_32k    32 KB/s each way (not the registry: its requests and answers are a few KB)
    reset_peer       every connection reset (TCP RST) as it carries data, for a few seconds
    timeout          a blackhole (bytes in, nothing out) for the fault time, then healed
    down             the link down (connections cut, new ones refused) for the fault time, then up
    limit_data       each connection cut after N bytes, mid-request, for the fault time: on the
                     broker 2 KB sent by the worker (its produce requests of outputs and claim
                     checks, and its fetches), on S3 64 KB sent (variant uploads), on the origin
                     64 KB received (image downloads); not the registry (one small request)
    flap             the broker link down and up every 5 s for the fault time (broker only)

Per cell (fault × link), from the worker's outputs, its ``/readyz`` and its RSS sampled every
0.5 s and ``lightbox audit`` over the cell's topics:

    lost                 inputs with neither output nor dead letter (audit; must be 0)
    duplicates           extra outputs, and whether they are byte-identical (audit)
    dead_letters_fault   dead letters of good inputs, by code (a fetch from an origin that is down
                         is FETCH_FAILED by design: the origin is the input's, not a dependency)
    detect_s             fault start to the first /readyz 503 (None: stayed ready)
    not_ready_s          seconds /readyz answered 503; ready_after_heal: 200 again at the end
    heal_first_output_s  heal to the first output appended after it
    heal_drained_s       heal to every input published before the heal having its output
    rss_steady_mb / rss_peak_mb   median RSS before the fault / highest after it (worker + children)
    in_flight_peak       the most inputs the worker held at once (its ``lightbox_in_flight`` gauge)
    connects             connections the worker opened to the faulted link's proxy while the fault was
                         on (sampled every 0.5 s, so a lower bound): the reconnects a cut caused
    stall_s              the longest time inputs waited, the worker was ready (no dependency down:
                         a wait for one is not a stall) and no output appeared; it must stay under
                         ``watchdog_s``, the watchdog's limit (``LIGHTBOX_DELIVERY_TIMEOUT_S``, the
                         shorter of its two), or a partition is held while nothing is processed
    exit_code            None while the worker ran through the whole cell (no crash, no fail-stop)

Usage (writes ``bench/results/bench_faults.json``, ``bench_faults_quick.json`` with ``--quick``; or
into ``--out``)::

    PYTHONPATH=. python bench/bench_faults.py                # the full table: 60 s faults
    PYTHONPATH=. python bench/bench_faults.py --quick        # 15 s faults, shorter windows
    PYTHONPATH=. python bench/bench_faults.py --quick --links s3 --faults timeout,down
    PYTHONPATH=. python bench/bench_faults.py --port-base 19300   # every server on 19300..19312
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.server
import io
import json
import re
import statistics
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.harness import RESULTS, record, run_env, run_topics

LINKS = ("broker", "s3", "origin", "registry")
FAULTS = ("latency_500", "latency_5s", "bandwidth_32k", "reset_peer", "timeout", "down", "limit_data", "flap")
#: limit_data per link: which way, and after how many bytes each connection is cut (see the docstring)
LIMIT_DATA = {"broker": ("upstream", 2 << 10), "s3": ("upstream", 64 << 10), "origin": ("downstream", 64 << 10)}
#: the watchdog's shorter limit, as the bench's workers run it (a send unanswered, brokers not known down)
WATCHDOG_S = 120.0
PRESETS_TOML = """\
[fault_main]
width = 192
height = 192
format = "jpeg"
quality = 85
fill = 0.8
"""


# ------------------------------------------------------------------------------- the faults
def apply_fault(proxy: Any, fault: str, hold_s: float, stop: threading.Event, link: str = "broker") -> float:
    """Put ``fault`` on ``proxy`` for ``hold_s`` seconds (``stop`` ends it early), then heal it;
    returns when it was healed (``time.time()``)."""
    toxics: list[str] = []
    try:
        if fault == "latency_500":
            toxics += [proxy.add("latency", stream=s, latency=500, jitter=200) for s in ("upstream", "downstream")]
        elif fault == "latency_5s":
            toxics += [proxy.add("latency", stream=s, latency=5000, jitter=0) for s in ("upstream", "downstream")]
        elif fault == "bandwidth_32k":
            toxics += [proxy.add("bandwidth", stream=s, rate=32) for s in ("upstream", "downstream")]
        elif fault == "reset_peer":
            toxics.append(proxy.add("reset_peer", stream="upstream", timeout=0))
            hold_s = min(hold_s, 5.0)  # a burst of resets, not an outage
        elif fault == "timeout":
            toxics.append(proxy.add("timeout", stream="upstream", timeout=0))
        elif fault == "limit_data":
            stream, nbytes = LIMIT_DATA[link]
            toxics.append(proxy.add("limit_data", stream=stream, bytes=nbytes))
        elif fault == "down":
            proxy.disable()
        elif fault == "flap":
            end = time.monotonic() + hold_s
            while time.monotonic() < end and not stop.is_set():
                proxy.disable()
                stop.wait(min(5.0, max(0.0, end - time.monotonic())))
                proxy.enable()
                stop.wait(min(5.0, max(0.0, end - time.monotonic())))
            return time.time()
        else:
            raise ValueError(f"unknown fault {fault!r}")
        stop.wait(hold_s)
    finally:
        for t in toxics:
            proxy.remove(t)
        if not proxy.enabled:
            proxy.enable()
    return time.time()


def applies(fault: str, link: str) -> bool:
    if link == "registry":
        return fault not in ("bandwidth_32k", "limit_data", "flap")
    return fault != "flap" or link == "broker"


# ------------------------------------------------------------------------------- the servers
class _Origin(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # connections the fault proxy resets are the point, not news


def start_origin(root: Path, port: int) -> _Origin:
    """A plain HTTP origin serving ``root`` (the photos the HTTP inputs name)."""
    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, directory=str(root), **k)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = _Origin(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@dataclass
class Servers:
    """The broker (direct for the bench, proxied for the worker), S3, the origin, the schema
    registry (when a registry cell runs) and their proxies."""

    kafka: Any
    s3: Any
    toxiproxy: Any
    origin: _Origin
    proxies: dict[str, Any]
    metrics_port: int
    registry: Any = None

    @property
    def origin_url(self) -> str:
        return f"http://{self.proxies['origin'].address}"

    @property
    def registry_url(self) -> str:
        """The registry's Confluent API through its proxy (the worker's); ``registry.api_url`` is direct."""
        from lightbox.devservers.registry_local import CCOMPAT_PATH

        return f"http://{self.proxies['registry'].address}{CCOMPAT_PATH}"


@contextlib.contextmanager
def servers(work: Path, port_base: int | None, registry: bool = False) -> Iterator[Servers]:
    from lightbox.devservers.kafka_local import LocalKafka
    from lightbox.devservers.launch import free_port
    from lightbox.devservers.s3_local import LocalS3
    from lightbox.devservers.toxiproxy_local import LocalToxiproxy

    chosen: dict[int, int] = {}

    def port(k: int) -> int:  # the same port each time k is asked for (the broker advertises the proxy's)
        if port_base is not None:
            return port_base + k
        if k not in chosen:
            chosen[k] = free_port()
        return chosen[k]

    tp = LocalToxiproxy.start(port=port(0), data_dir=work / "toxiproxy")
    kafka = s3 = origin = reg = None
    try:
        kafka = LocalKafka.start(port=port(4), controller_port=port(5), proxied_port=port(1),
                                 proxied_listen=port(6), data_dir=work / "kafka")
        s3 = LocalS3.start(port=port(7), data_dir=work / "s3", buckets=("bench-faults",))
        origin = start_origin(work / "photos", port(8))
        api = tp.api
        proxies = {"broker": api.create("broker", kafka.proxied_upstream, listen=f"127.0.0.1:{port(1)}"),
                   "s3": api.create("s3", f"127.0.0.1:{s3.port}", listen=f"127.0.0.1:{port(2)}"),
                   "origin": api.create("origin", f"127.0.0.1:{port(8)}", listen=f"127.0.0.1:{port(3)}")}
        if registry:  # port(10) is the worker's backfill process's metrics port (metrics + 1)
            from lightbox.devservers.registry_local import LocalRegistry

            reg = LocalRegistry.start(port=port(12), data_dir=work / "registry", name=f"bench-faults-{port(12)}")
            proxies["registry"] = api.create("registry", f"127.0.0.1:{reg.port}", listen=f"127.0.0.1:{port(11)}")
        yield Servers(kafka, s3, api, origin, proxies, port(9), reg)
    finally:
        if origin is not None:
            origin.shutdown()
        for srv in (reg, s3, kafka, tp):
            if srv is not None:
                srv.stop()


# ------------------------------------------------------------------------------- the stream
def make_photos(root: Path, count: int) -> tuple[list[Path], list[bytes]]:
    """``count`` photos (<= 640 px) and the bad files."""
    from PIL import Image

    from lightbox.samples import make_bad_inputs, make_catalog

    good = make_catalog(root, count)
    for path in good:
        with Image.open(path) as im:
            im.load()
            fmt = im.format or "JPEG"
            small = im.copy()
        small.thumbnail((640, 640), Image.Resampling.LANCZOS)
        buf = io.BytesIO()
        small.save(buf, format=fmt, **({"quality": 88} if fmt in ("JPEG", "WEBP") else {}))
        path.write_bytes(buf.getvalue())
    bad = [p.read_bytes() for p in sorted(make_bad_inputs(root.parent / "bad").values())]
    return good, bad


class Stream:
    """Events of the mixed stream, in a fixed rotation: 5 inline photos, 3 fetched ones, 2 bad files."""

    KINDS = ("inline", "http", "inline", "bad", "inline", "http", "inline", "http", "inline", "bad")

    def __init__(self, good: list[Path], bad: list[bytes], origin_url: str) -> None:
        self.good, self.bad, self.origin_url, self.n = good, bad, origin_url, 0
        self.kind_of: dict[str, str] = {}
        self.codec: Any = None  # the registry cells: the codec inputs are framed with (else the producer's)

    async def publish(self, prod: Any, ev: dict[str, Any]) -> Any:
        if self.codec is None:
            return await prod.publish(ev)
        return await prod.publish_raw(self.codec.encode(ev), key=ev["sku"].encode())

    def next(self) -> dict[str, Any]:
        from streams.producer import ImageProducer

        i, self.n = self.n, self.n + 1
        kind = self.KINDS[i % len(self.KINDS)]
        photo = self.good[i % len(self.good)]
        if kind == "inline":
            source: dict[str, Any] = {"data": photo.read_bytes()}
        elif kind == "http":
            source = {"uri": f"{self.origin_url}/{photo.name}", "sha256": None}
        else:
            source = {"data": self.bad[i % len(self.bad)]}
        ev = ImageProducer.event(source, sku=f"sku-{i}", image_id=photo.name, presets=["fault_main"])
        self.kind_of[ev["event_id"]] = kind
        return ev


def registry_codec(registry_api: str, topic: str, *, next_version: bool) -> Any:
    """A codec that frames input events with the registry's id for the input schema (registered
    under the topic's subject, directly: not through the proxy), or with ``next_version``, for a
    compatible next version of it (one more optional field), registered now."""
    import copy

    from schemas.codec import AvroCodec, load_schema
    from streams.registry import RegistrySchemaStore
    from streams.settings import SchemaRegistrySettings

    own = load_schema("product_image_event")
    writer = copy.deepcopy(own)
    if next_version:
        writer["fields"].append({"name": "campaign", "type": ["null", "string"], "default": None})
    store = RegistrySchemaStore(SchemaRegistrySettings(url=registry_api), patience_s=30.0)
    return AvroCodec(store, f"{topic}-value", reader_schema=own, writer_schema=writer)


def cell_codecs(srv: Servers, topics: dict[str, str], registry: bool) -> Any:
    """How the cell's events are read back: the packaged schemas, or the registry's (direct)."""
    from schemas.events import EventCodecs
    from streams.registry import event_codecs
    from streams.settings import Settings

    if not registry:
        return EventCodecs.create()
    return event_codecs(Settings().replace(schema_registry_url=srv.registry.api_url),
                        topics={"product": topics["input"], "processed": topics["output"],
                                "dead_letter": topics["dlq"]})


# ------------------------------------------------------------------------------- one cell
@dataclass
class Cell:
    link: str
    fault: str
    published: int = 0
    lost: int = 0
    duplicates: int = 0
    duplicates_identical: bool = True
    dead_letters_fault: dict[str, int] = field(default_factory=dict)
    detect_s: float | None = None
    not_ready_s: float = 0.0
    ready_after_heal: bool = False
    heal_first_output_s: float | None = None
    heal_drained_s: float | None = None
    rss_steady_mb: float | None = None
    rss_peak_mb: float | None = None
    in_flight_peak: int | None = None
    connects: int | None = None
    stall_s: float | None = None
    watchdog_s: float = WATCHDOG_S
    outputs_during_fault: int = 0
    exit_code: int | None = None
    note: str = ""


def _readyz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def _in_flight(port: int) -> int | None:
    """The worker's ``lightbox_in_flight`` gauge (None when /metrics does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            found = re.search(rb"^lightbox_in_flight (\S+)$", resp.read(), re.M)
    except OSError:
        return None
    return int(float(found.group(1))) if found else None


def _connections(port: int) -> set[int]:
    """The client ports of the TCP connections established to local ``port`` (the proxy's side)."""
    ends: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                f = line.split()
                if len(f) > 3 and f[3] == "01" and int(f[1].rsplit(":", 1)[1], 16) == port:
                    ends.add(int(f[2].rsplit(":", 1)[1], 16))
    return ends


def longest_stall(samples: list[tuple[float, int]], appended: list[float], published: dict[str, float],
                  done: dict[str, float]) -> float:
    """The longest run of samples ``(time, /readyz status)`` in which inputs waited (published, no
    output yet), no output was appended and the worker said it was ready (a not-ready sample
    neither counts nor ends the run: waiting for a dependency is no stall; an output ends it)."""
    import bisect

    appended = sorted(appended)
    starts = sorted(published.values())
    ends = sorted(done.values())
    run = worst = 0.0
    prev: float | None = None
    for t, status in samples:
        if prev is not None:
            output = bisect.bisect_right(appended, t) > bisect.bisect_right(appended, prev)
            waiting = bisect.bisect_right(starts, t) > bisect.bisect_right(ends, t)
            if output or not waiting:
                run = 0.0
            elif status == 200:
                run += t - prev
                worst = max(worst, run)
        prev = t
    return round(worst, 1)


def _rss_tree(pid: int) -> int:
    """RSS of ``pid`` and its children (the backfill process), bytes."""
    total = 0
    pids = [pid]
    with contextlib.suppress(OSError):
        pids += [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    for p in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            line = next(ln for ln in Path(f"/proc/{p}/status").read_text().splitlines() if ln.startswith("VmRSS:"))
            total += int(line.split()[1]) * 1024
    return total


class Outputs:
    """Reads the cell's output and dead-letter topics: per source event id, (append time s, kind, code)."""

    def __init__(self, bootstrap: str, output: str, dlq: str, codecs: Any = None) -> None:
        from aiokafka import AIOKafkaConsumer

        from schemas.events import EventCodecs

        self.codecs, self.output = codecs or EventCodecs.create(), output
        self.consumer = AIOKafkaConsumer(output, dlq, bootstrap_servers=bootstrap, group_id=None,
                                         enable_auto_commit=False, auto_offset_reset="earliest",
                                         max_partition_fetch_bytes=16 << 20)
        self.seen: dict[str, tuple[float, str, str | None]] = {}
        self.appended: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.consumer.start()
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while True:
            batch = await self.consumer.getmany(timeout_ms=200, max_records=500)
            for records in batch.values():
                for r in records:
                    t = r.timestamp / 1000
                    self.appended.append(t)
                    if r.topic == self.output:
                        sid, kind, code = self.codecs.processed.decode(r.value)["source_event_id"], "processed", None
                    else:
                        dead = self.codecs.dead_letter.decode(r.value)
                        sid, kind, code = dead["source_event_id"], "dead_letter", str(dead["error_code"])
                    self.seen.setdefault(sid, (t, kind, code))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.consumer.stop()


async def run_cell(srv: Servers, stream_photos: tuple[list[Path], list[bytes]], link: str, fault: str, *,
                   rate: float, steady_s: float, fault_s: float, after_s: float, drain_s: float,
                   work: Path, extra_env: dict[str, str] | None = None) -> Cell:
    from lightbox.audit import run_audit
    from lightbox.demo import WorkerProcess
    from streams.producer import ImageProducer

    cell = Cell(link, fault)
    tag = f"faults-{link}-{fault}-{uuid.uuid4().hex[:4]}"
    topics = run_topics(tag)
    env = {**worker_env(srv, topics, tag, work / tag, registry=link == "registry"), **(extra_env or {})}
    stream = Stream(*stream_photos, srv.origin_url)
    if link == "registry":
        stream.codec = await asyncio.to_thread(registry_codec, srv.registry.api_url, topics["input"],
                                               next_version=False)
    codecs = await asyncio.to_thread(cell_codecs, srv, topics, link == "registry")
    worker = WorkerProcess(env, work / tag / "worker.log").start()
    reader = Outputs(srv.kafka.bootstrap, topics["output"], topics["dlq"], codecs)
    published: dict[str, float] = {}
    samples: list[tuple[float, int, int]] = []  # (time, readyz status, rss)
    in_flight: list[int] = []
    conns: list[tuple[float, set[int]]] = []  # (time, client ports connected to the faulted link's proxy)
    proxy_port = int(srv.proxies[link].address.rsplit(":", 1)[1])
    stop_sampling = asyncio.Event()

    async def sample() -> None:
        while not stop_sampling.is_set():
            status = await asyncio.to_thread(_readyz, srv.metrics_port)
            samples.append((time.time(), status, _rss_tree(worker.proc.pid) if worker.running() else 0))
            held = await asyncio.to_thread(_in_flight, srv.metrics_port)
            if held is not None:
                in_flight.append(held)
            conns.append((time.time(), _connections(proxy_port)))
            await asyncio.sleep(0.5)

    try:
        # ready: the worker joined its group (it serves /readyz 200 once it has partitions and a model)
        deadline = time.monotonic() + 240
        while _readyz(srv.metrics_port) != 200:
            if not worker.running() or time.monotonic() > deadline:
                cell.note = "the worker did not become ready"
                cell.exit_code = worker.proc.poll() if worker.proc else None
                return cell
            await asyncio.sleep(0.5)
        await reader.start()
        sampler = asyncio.create_task(sample())
        fault_stop = threading.Event()
        async with ImageProducer(srv.kafka.bootstrap, topics["input"]) as prod:
            futs = []
            t_start = time.time()
            t_fault = t_start + steady_s
            t_heal_planned = t_fault + (min(fault_s, 5.0) if fault == "reset_peer" else fault_s)
            t_end = t_heal_planned + after_s
            fault_task: asyncio.Future[float] | None = None
            i = 0
            while time.time() < t_end:
                if fault_task is None and time.time() >= t_fault:
                    if link == "registry":  # a producer's next schema version, just before the fault
                        stream.codec = await asyncio.to_thread(registry_codec, srv.registry.api_url,
                                                               topics["input"], next_version=True)
                    t_fault = time.time()
                    fault_task = asyncio.ensure_future(asyncio.to_thread(
                        apply_fault, srv.proxies[link], fault, fault_s, fault_stop, link))
                ev = stream.next()
                published[ev["event_id"]] = time.time()
                futs.append(await stream.publish(prod, ev))
                i += 1
                await asyncio.sleep(max(0.0, t_start + i / rate - time.time()))
            await prod.flush(futs)
        assert fault_task is not None
        t_heal = await fault_task
        cell.published = len(published)
        before_heal = {e for e, t in published.items() if t < t_heal}
        deadline = time.monotonic() + drain_s
        while not set(published) <= reader.seen.keys() and time.monotonic() < deadline and worker.running():
            await asyncio.sleep(0.5)
        t_drained = max((reader.seen[e][0] for e in before_heal if e in reader.seen), default=None)
        if before_heal <= reader.seen.keys() and t_drained is not None:
            cell.heal_drained_s = round(max(0.0, t_drained - t_heal), 1)
        after = [t for t in reader.appended if t >= t_heal]
        cell.heal_first_output_s = round(min(after) - t_heal, 1) if after else None
        cell.outputs_during_fault = sum(t_fault <= t < t_heal for t in reader.appended)
        await asyncio.sleep(2.0)  # a last readiness sample after the drain
        stop_sampling.set()
        await sampler
        cell.exit_code = None if worker.running() else worker.proc.poll()
        # readiness and memory
        not_ready = [t for t, s, _ in samples if s != 200 and t >= t_fault]
        cell.detect_s = round(min(not_ready) - t_fault, 1) if not_ready else None
        cell.not_ready_s = round(0.5 * len(not_ready), 1)
        cell.ready_after_heal = bool(samples) and samples[-1][1] == 200
        steady = [r for t, _, r in samples if t < t_fault and r]
        peak = [r for t, _, r in samples if t >= t_fault and r]
        cell.rss_steady_mb = round(statistics.median(steady) / 2**20, 1) if steady else None
        cell.rss_peak_mb = round(max(peak) / 2**20, 1) if peak else None
        cell.in_flight_peak = max(in_flight) if in_flight else None
        before = set().union(*(c for t, c in conns if t < t_fault))
        during = set().union(*(c for t, c in conns if t_fault <= t <= t_heal + 1.0))
        cell.connects = len(during - before)
        cell.stall_s = longest_stall([(t, st) for t, st, _ in samples], reader.appended, published,
                                     {e: reader.seen[e][0] for e in published if e in reader.seen})
        for e, (_, kind, code) in reader.seen.items():
            if kind == "dead_letter" and stream.kind_of.get(e) in ("inline", "http") and code is not None:
                cell.dead_letters_fault[code] = cell.dead_letters_fault.get(code, 0) + 1
        rep = await run_audit(srv.kafka.bootstrap, [topics["input"], topics["backfill"]],
                              [topics["output"], topics["dlq"]], codecs=codecs)
        cell.lost, cell.duplicates, cell.duplicates_identical = len(rep.missing), rep.duplicates, \
            rep.duplicates_identical
    finally:
        stop_sampling.set()
        await reader.stop()
        worker.stop()
        srv.toxiproxy.reset()
        for p in srv.proxies.values():
            p.enabled = True
    return cell


def worker_env(srv: Servers, topics: dict[str, str], tag: str, data_dir: Path, *,
               registry: bool = False) -> dict[str, str]:
    """One cell's worker: the broker, S3 and origin (and with ``registry``, the schema registry)
    through their proxies."""
    data_dir.mkdir(parents=True, exist_ok=True)
    presets = data_dir / "presets.toml"
    presets.write_text(PRESETS_TOML)
    more = {"LIGHTBOX_SCHEMA_REGISTRY_URL": srv.registry_url, "LIGHTBOX_SCHEMA_REGISTRY_TIMEOUT_S": "5"} \
        if registry else {}
    return run_env(srv.kafka.proxied_bootstrap, topics, tag, data_dir / "faust", **{
            "LIGHTBOX_SEGMENTER": "classical", "LIGHTBOX_PRESETS_FILE": str(presets),
            "LIGHTBOX_METRICS_PORT": str(srv.metrics_port),
            "LIGHTBOX_OUTPUT_STORE": f"s3://bench-faults/{tag}",
            "LIGHTBOX_S3_ENDPOINT": f"http://{srv.proxies['s3'].address}", "LIGHTBOX_STORE_TIMEOUT_S": "5",
            "LIGHTBOX_STORE_RETRIES": "1", "LIGHTBOX_FETCH_ALLOW": srv.proxies["origin"].address,
            "LIGHTBOX_FETCH_TIMEOUT_S": "10", "LIGHTBOX_SESSION_TIMEOUT_S": "10", "OMP_NUM_THREADS": "1",
            "AWS_ACCESS_KEY_ID": srv.s3.access_key, "AWS_SECRET_ACCESS_KEY": srv.s3.secret_key,
            "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true", **more})


# ------------------------------------------------------------------------------- capacity
async def capacity(srv: Servers, photos: tuple[list[Path], list[bytes]], work: Path, burst: int = 40,
                   extra_env: dict[str, str] | None = None) -> float:
    """Inputs per second one worker (with ``extra_env``'s settings) finishes from a backlog of the
    mixed stream, no fault."""
    from lightbox.demo import WorkerProcess
    from streams.producer import ImageProducer

    tag = f"faults-capacity-{uuid.uuid4().hex[:4]}"
    topics = run_topics(tag)
    worker = WorkerProcess({**worker_env(srv, topics, tag, work / tag), **(extra_env or {})},
                           work / tag / "worker.log").start()
    reader = Outputs(srv.kafka.bootstrap, topics["output"], topics["dlq"])
    try:
        while _readyz(srv.metrics_port) != 200:
            if not worker.running():
                raise RuntimeError(f"the worker exited during the capacity run; see {work / tag / 'worker.log'}")
            await asyncio.sleep(0.5)
        await reader.start()
        stream = Stream(*photos, srv.origin_url)
        async with ImageProducer(srv.kafka.bootstrap, topics["input"]) as prod:
            await prod.flush([await prod.publish(stream.next()) for _ in range(burst)])
        t0 = time.time()
        while len(reader.seen) < burst:
            await asyncio.sleep(0.2)
        return burst / (time.time() - t0)
    finally:
        await reader.stop()
        worker.stop()


# ------------------------------------------------------------------------------- main
async def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.work or tempfile.mkdtemp(prefix="lightbox-bench-faults-"))
    work.mkdir(parents=True, exist_ok=True)
    photos = make_photos(work / "photos", 16)
    fault_s = args.fault_s or (15.0 if args.quick else 60.0)
    steady_s, after_s = (8.0, 8.0) if args.quick else (30.0, 20.0)
    cells: list[dict[str, Any]] = []
    extra_env = dict(kv.split("=", 1) for kv in args.worker_env)
    with servers(work, args.port_base, registry="registry" in args.links) as srv:
        cap = args.rate / 0.5 if args.rate else await capacity(srv, photos, work, extra_env=extra_env)
        rate = args.rate or 0.5 * cap
        print(f"capacity {cap:.2f} inputs/s; feeding {rate:.2f}/s; faults of {fault_s:.0f} s", flush=True)
        for link in args.links:
            for fault in args.faults:
                if not applies(fault, link):
                    continue
                t0 = time.monotonic()
                cell = await run_cell(srv, photos, link, fault, rate=rate, steady_s=steady_s, fault_s=fault_s,
                                      after_s=after_s, drain_s=args.drain_s, work=work,
                                      extra_env=extra_env)
                cells.append(asdict(cell))
                print(f"{link:7s} {fault:14s} {time.monotonic() - t0:5.0f} s  " + json.dumps(
                    {k: v for k, v in asdict(cell).items() if k not in ("link", "fault")}), flush=True)
                record("bench_faults_quick" if args.quick else "bench_faults",
                       {"capacity_per_s": cap, "rate_per_s": rate, "fault_s": fault_s, "quick": args.quick,
                        "worker_env": args.worker_env, "cells": cells}, args.out)
    return {"capacity_per_s": cap, "rate_per_s": rate, "fault_s": fault_s, "quick": args.quick,
            "worker_env": args.worker_env, "cells": cells}


def markdown(result: dict[str, Any]) -> str:
    """The table of a result file, as docs/delivery.md shows it."""
    def s(v: Any) -> str:
        return "—" if v is None else f"{v:g}" if isinstance(v, float) else str(v)

    rows = ["| link | fault | inputs | lost | duplicates | dead letters (good inputs) | detect s | not ready s "
            "| ready after | heal → first output s | heal → drained s | RSS steady → peak MiB | in flight peak "
            "| connects | stall s | exit |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in result["cells"]:
        dup = f"{c['duplicates']}{', identical' if c['duplicates'] and c['duplicates_identical'] else ''}"
        dead = ", ".join(f"{n} {code}" for code, n in sorted(c["dead_letters_fault"].items())) or "0"
        ended = "ran" if c["exit_code"] is None else c["exit_code"]
        rows.append(f"| {c['link']} | {c['fault']} | {c['published']} | {c['lost']} | {dup} | {dead} | "
                    f"{s(c['detect_s'])} | {s(c['not_ready_s'])} | {'yes' if c['ready_after_heal'] else 'no'} | "
                    f"{s(c['heal_first_output_s'])} | {s(c['heal_drained_s'])} | "
                    f"{s(c['rss_steady_mb'])} → {s(c['rss_peak_mb'])} | {s(c.get('in_flight_peak'))} | "
                    f"{s(c.get('connects'))} | {s(c.get('stall_s'))} | {ended} |")
    return "\n".join(rows)


def _csv(choices: tuple[str, ...]) -> Callable[[str], list[str]]:
    def parse(value: str) -> list[str]:
        items = [v.strip() for v in value.split(",") if v.strip()]
        bad = [v for v in items if v not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {', '.join(choices)}")
        return items
    return parse


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="15 s faults and short windows (the whole table in "
                                                        "about an hour instead of several)")
    ap.add_argument("--links", type=_csv(LINKS), default=list(LINKS), help=f"comma-separated: {','.join(LINKS)}")
    ap.add_argument("--faults", type=_csv(FAULTS), default=list(FAULTS), help=f"comma-separated: {','.join(FAULTS)}")
    ap.add_argument("--fault-s", type=float, default=None, help="how long each fault lasts (default 60, --quick 15)")
    ap.add_argument("--rate", type=float, default=None, help="inputs/s to feed (default: half the measured "
                                                             "capacity)")
    ap.add_argument("--drain-s", type=float, default=300.0, help="longest wait for the backlog after a heal")
    ap.add_argument("--port-base", type=int, default=None, help="put every server on PORT..PORT+12 (default: "
                                                                "free ports)")
    ap.add_argument("--worker-env", action="append", default=[], metavar="NAME=VALUE",
                    help="a setting for every cell's worker (repeatable), e.g. LIGHTBOX_MAX_IN_FLIGHT_BYTES=67108864")
    ap.add_argument("--work", default=None, help="folder for the servers' data and the workers' logs")
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder of the result file")
    ap.add_argument("--markdown", type=Path, default=None, metavar="RESULT_JSON",
                    help="print the table of an earlier run's result file and exit")
    args = ap.parse_args()
    bad = [kv for kv in args.worker_env if "=" not in kv]
    if bad:
        ap.error(f"--worker-env takes NAME=VALUE; got {bad}")
    if args.markdown is not None:
        print(markdown(json.loads(args.markdown.read_text())))
        return 0
    res = asyncio.run(run(args))
    print(json.dumps({"out": str(args.out), "cells": len(res["cells"]),
                      "lost": sum(c["lost"] for c in res["cells"])}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
