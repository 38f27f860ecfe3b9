"""What the benchmarks that run a broker and workers share: one local broker, a run's fresh
topics and worker environment, publishing a backlog or a paced load, reading outputs and their
latency, CPU meters from /proc, percentiles, the tree a ``--baseline REF`` names, the JSON
record every bench writes, the peer benchmarks' photo set (:func:`peer_photos`) and their
``lightbox worker`` on files (:func:`start_file_worker`, :func:`run_file_worker`).

Import it from a bench script run as ``PYTHONPATH=. python bench/bench_x.py``::

    from bench.harness import Broker, OutputReader, add_baseline, record, run_env, run_topics

Conventions:

- ``--baseline REF`` (:func:`add_baseline`): a git ref whose tree (``git archive``, unpacked into a
  temporary folder by :func:`baseline_tree`) runs beside this working tree on the same
  virtualenv; ``''`` for none. No other way to name a second tree.
- Latency of an event = its output's broker append time (output and dead-letter topics are made
  with ``message.timestamp.type=LogAppendTime``) minus the event's ``created_at`` (set when the
  bench sends it; one machine, one clock).
- Every bench writes ``<out>/<name>.json`` through :func:`record`: its figures plus the command,
  date, machine and commit, so a figure can be traced to how it was measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PARTITIONS = 4
TOPIC_KINDS = ("input", "backfill", "output", "dlq")

__all__ = [
    "PARTITIONS",
    "PEER_CLASSES",
    "RESULTS",
    "ROOT",
    "Broker",
    "CpuMeter",
    "OutputReader",
    "PeerPhoto",
    "add_baseline",
    "baseline_tree",
    "busy_s",
    "create_topics",
    "git_state",
    "peer_photo_specs",
    "peer_photos",
    "percentiles",
    "photo_set",
    "poisson_schedule",
    "proc_cpu_s",
    "publish",
    "record",
    "run_env",
    "run_file_worker",
    "run_topics",
    "start_file_worker",
]


# ------------------------------------------------------------------------------- the trees
def add_baseline(parser: Any, default: str = "main") -> None:
    """The one way a bench names the tree it compares with: ``--baseline REF``."""
    parser.add_argument("--baseline", default=default, metavar="REF",
                        help=f"git ref of the tree to compare with, run beside this one (default {default!r}; "
                             "'' for none)")


def baseline_tree(ref: str, into: Path | None = None) -> Path | None:
    """``git archive REF`` unpacked into ``into`` (default: a new temporary folder); None for ``''``."""
    if not ref:
        return None
    into = into or Path(tempfile.mkdtemp(prefix=f"lightbox-baseline-{ref.replace('/', '_')}-"))
    data = subprocess.run(["git", "archive", ref], cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into


def git_state() -> dict[str, Any]:
    """The commit this tree is at, and whether the worker's code differs from it."""
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()

    dirty = git("status", "--porcelain", "--", "agents", "streams", "gpu_kernels", "schemas", "blobio", "lightbox")
    return {"commit": git("rev-parse", "HEAD"), "worker_code_dirty": bool(dirty)}


def record(name: str, figures: dict[str, Any], out: Path = RESULTS) -> Path:
    """``<out>/<name>.json``: ``figures`` with the command, date, machine and commit."""
    out.mkdir(parents=True, exist_ok=True)
    body = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(),
                        "load_average_1min": os.getloadavg()[0]},
            "git": git_state(), **figures}
    path = out / f"{name}.json"
    path.write_text(json.dumps(body, indent=2, default=str))
    return path


# ------------------------------------------------------------------------------- broker and topics
@contextlib.contextmanager
def Broker() -> Iterator[Any]:
    """A local Kafka broker for the bench's whole run (``.bootstrap``, ``.pid``); stopped after."""
    from lightbox.devservers.kafka_local import LocalKafka

    kafka = LocalKafka.start()
    try:
        yield kafka
    finally:
        kafka.stop()


def run_topics(tag: str) -> dict[str, str]:
    """A run's own topic names (input, backfill, output, dlq)."""
    return {k: f"bench.{tag}.{k}" for k in TOPIC_KINDS}


def new_tag(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


async def create_topics(bootstrap: str, topics: dict[str, str], partitions: int = PARTITIONS) -> None:
    """The run's topics; the output and dead-letter topics keep the brokers' append times."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        append = {"message.timestamp.type": "LogAppendTime"}
        await admin.create_topics([NewTopic(name, partitions, 1, topic_configs=append if k in ("output", "dlq") else {})
                                   for k, name in topics.items()])
    finally:
        await admin.close()


def run_env(bootstrap: str, topics: dict[str, str], tag: str, data_dir: Path, *, partitions: int = PARTITIONS,
            **extra: str) -> dict[str, str]:
    """A ``lightbox worker``'s environment for one run: its topics, group, data folder, a CPU device
    and no metrics port; ``extra`` on top (``LIGHTBOX_...`` names)."""
    return {"LIGHTBOX_KAFKA_BOOTSTRAP": bootstrap, "LIGHTBOX_GROUP_ID": f"bench-{tag}",
            "LIGHTBOX_INPUT_TOPIC": topics["input"], "LIGHTBOX_OUTPUT_TOPIC": topics["output"],
            "LIGHTBOX_DLQ_TOPIC": topics["dlq"], "LIGHTBOX_BACKFILL_TOPIC": topics["backfill"],
            "LIGHTBOX_TOPIC_PARTITIONS": str(partitions), "LIGHTBOX_DATA_DIR": str(data_dir),
            "LIGHTBOX_DEVICE": "cpu", "LIGHTBOX_WORKER_ID": f"bench-{tag}", "LIGHTBOX_METRICS_PORT": "0", **extra}


# ------------------------------------------------------------------------------- load
async def publish(bootstrap: str, topic: str, events: Sequence[dict[str, Any]], *, rate: float | None = None,
                  codecs: Any = None) -> dict[str, int]:
    """Publish ``events`` (made with ``ImageProducer.event``): all at once (a backlog) or, with
    ``rate``, one every ``1/rate`` s (open loop: the schedule does not wait for the worker).
    Returns event id -> created_at (ms)."""
    from streams.producer import ImageProducer

    created: dict[str, int] = {}
    async with ImageProducer(bootstrap, topic, codecs=codecs) as prod:
        futs = []
        start = time.monotonic()
        for i, ev in enumerate(events):
            if rate:
                await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
            created[ev["event_id"]] = ev["created_at"]
            futs.append(await prod.publish(ev))
        await prod.flush(futs)
    return created


def poisson_schedule(rate: float, seconds: float, n_images: int, seed: int) -> list[tuple[float, int]]:
    """Arrival times (s) of a Poisson process of ``rate``/s over ``seconds``, conditioned on its
    expected count ``n = round(rate * seconds)`` (so the offered rate is the nominal one even in
    short windows): given ``n`` arrivals, a Poisson process's times are ``n`` sorted uniform
    draws. Each arrival gets a random image index."""
    import numpy as np

    rng = np.random.default_rng(seed)
    n = max(1, round(rate * seconds))
    times = np.sort(rng.uniform(0.0, seconds, size=n))
    return [(float(t), int(i)) for t, i in zip(times, rng.integers(0, n_images, size=n), strict=True)]


def photo_set(folder: Path, n: int = 20) -> list[Path]:
    """``n`` supplier-like files, deterministic: the sample catalog (0.1 to 2 MP photographs as
    JPEG, progressive JPEG, PNG, WebP) and six odd ones: a small JPEG, a CMYK JPEG, an 11 MP
    JPEG, a greyscale PNG, a progressive JPEG and an upscaled one."""
    import skimage.data as data
    from PIL import Image

    from lightbox.samples import make_catalog

    folder.mkdir(parents=True, exist_ok=True)
    photos = {name: getattr(data, name)() for name in ("coffee", "chelsea", "astronaut", "camera", "rocket")}
    files = make_catalog(folder, max(0, n - 6))
    coffee = Image.fromarray(photos["coffee"])
    extras: list[tuple[str, Any, str, dict[str, Any]]] = [
        ("small-coffee.jpg", coffee.resize((400, 300)), "JPEG", {"quality": 90}),
        ("cmyk-chelsea.jpg", Image.fromarray(photos["chelsea"]).convert("CMYK"), "JPEG", {"quality": 90}),
        ("big-astronaut.jpg", Image.fromarray(photos["astronaut"]).resize((3840, 2880), Image.Resampling.LANCZOS),
         "JPEG", {"quality": 92}),
        ("grey-camera.png", Image.fromarray(photos["camera"]), "PNG", {}),
        ("prog-rocket.jpg", Image.fromarray(photos["rocket"]).resize((1600, 1068)), "JPEG",
         {"quality": 85, "progressive": True}),
        ("upscaled-coffee.jpg", coffee.resize((2400, 1600), Image.Resampling.BICUBIC), "JPEG", {"quality": 90}),
    ]
    for name, img, fmt, opts in extras[: n - len(files)]:
        path = folder / name
        img.save(path, format=fmt, **opts)
        files.append(path)
    return files


# ------------------------------------------------------------------------------- the peer photos
# The peer benchmarks' photo set (bench_peers.py, bench_stream_peers.py): scikit-image's photographs
# of things (not the star field: a sky of specks has no subject to cut out) in three size classes
# and the formats ordinary shops upload, in turn, made deterministically.
PEER_PHOTOS = ("coffee", "chelsea", "astronaut", "rocket", "camera", "clock", "coins", "immunohistochemistry",
               "retina")
PEER_FORMATS = ("jpeg", "progressive", "cmyk", "png", "webp")
PEER_CLASSES: dict[str, tuple[float, ...]] = {  # target megapixels per photo, in turn
    "small": (0.12, 0.2, 0.3, 0.45, 0.16, 0.25, 0.35, 0.48),
    "mid": (0.6, 1.0, 1.6, 2.4, 0.8, 1.2, 2.0, 2.8),
    "large": (3.5, 6.0, 9.0, 12.0),
}
PEER_QUICK = {"small": 3, "mid": 3, "large": 1}


@dataclass(frozen=True, slots=True)
class PeerPhoto:
    name: str  # file stem
    photo: str  # the scikit-image photograph
    size_class: str
    fmt: str
    width: int
    height: int

    @property
    def suffix(self) -> str:
        return {"png": ".png", "webp": ".webp"}.get(self.fmt, ".jpg")


def _skimage_photo(name: str) -> Any:
    import numpy as np
    import skimage.data

    a = getattr(skimage.data, name)()
    if a.ndim == 2:
        a = np.dstack([a] * 3)
    return np.ascontiguousarray(a[..., :3])


def peer_photo_specs(quick: bool = False) -> list[PeerPhoto]:
    """The set's photos: ``small`` (<= 0.5 MP), ``mid`` (0.5-3 MP), ``large`` (3-24 MP), each
    scaled to a target pixel count of its class, in baseline JPEG, progressive JPEG, CMYK JPEG,
    PNG and WebP in turn; ``quick``: 3 small, 3 mid, 1 large."""
    specs = []
    for k, (cls, targets) in enumerate(PEER_CLASSES.items()):
        for j, mp in enumerate(targets[: PEER_QUICK[cls]] if quick else targets):
            photo = PEER_PHOTOS[(k * 3 + j) % len(PEER_PHOTOS)]
            h, w = _skimage_photo(photo).shape[:2]
            s = (mp * 1e6 / (h * w)) ** 0.5
            specs.append(PeerPhoto(f"{cls}-{j:02d}-{photo}", photo, cls, PEER_FORMATS[(k + j) % len(PEER_FORMATS)],
                                   max(1, round(w * s)), max(1, round(h * s))))
    return specs


def _write_photo(img: Any, spec: PeerPhoto, path: Path) -> None:
    if spec.fmt == "jpeg":
        img.save(path, "JPEG", quality=90)
    elif spec.fmt == "progressive":
        img.save(path, "JPEG", quality=90, progressive=True, optimize=True)
    elif spec.fmt == "cmyk":
        img.convert("CMYK").save(path, "JPEG", quality=92)
    elif spec.fmt == "png":
        img.save(path, "PNG", compress_level=6)
    else:
        img.save(path, "WEBP", quality=90, method=4)


def peer_photos(root: Path, quick: bool = False) -> dict[str, list[Path]]:
    """The peer photo set (:func:`peer_photo_specs`) under ``root/<class>/`` (kept when already
    there and complete; the same bytes on every run with the same libraries); returns the files
    per size class. ``root/manifest.json`` records each photo's spec."""
    from PIL import Image

    specs = peer_photo_specs(quick)
    manifest = root / "manifest.json"
    wanted = [asdict(s) for s in specs]
    out: dict[str, list[Path]] = {c: [] for c in PEER_CLASSES}
    paths = [root / s.size_class / f"{s.name}{s.suffix}" for s in specs]
    fresh = manifest.is_file() and json.loads(manifest.read_text()) == wanted and all(p.is_file() for p in paths)
    for spec, path in zip(specs, paths, strict=True):
        if not fresh:
            path.parent.mkdir(parents=True, exist_ok=True)
            img = Image.fromarray(_skimage_photo(spec.photo)).resize((spec.width, spec.height),
                                                                     Image.Resampling.LANCZOS)
            _write_photo(img, spec, path)
        out[spec.size_class].append(path)
    if not fresh:
        manifest.write_text(json.dumps(wanted, indent=1))
    return {c: v for c, v in out.items() if v}


# ------------------------------------------------------------------------------- a worker on files
def _file_worker_env(bootstrap: str, topics: dict[str, str], tag: str, out: Path, files: list[Path],
                     tree: Path) -> dict[str, str]:
    roots = sorted({str(f.resolve().parent) for f in files})
    return {**os.environ, "PYTHONPATH": str(tree),
            **run_env(bootstrap, topics, f"peers-{tag}", out / "data", LIGHTBOX_OUTPUT_DIR=str(out / "variants"),
                      LIGHTBOX_FILE_ROOTS=",".join(roots))}


def start_file_worker(bootstrap: str, topics: dict[str, str], tag: str, out: Path, files: list[Path],
                      tree: Path = ROOT) -> subprocess.Popen[bytes]:
    """A ``lightbox worker`` process of ``tree`` on ``topics``: default settings but for the
    addresses, a group of its own, the variants written under ``OUT/variants`` and ``file://``
    reads allowed in the folders of ``files``; its output in ``OUT/worker.log``."""
    out.mkdir(parents=True, exist_ok=True)
    with (out / "worker.log").open("wb") as log:
        return subprocess.Popen([sys.executable, "-m", "lightbox.cli", "worker"], cwd=tree,
                                env=_file_worker_env(bootstrap, topics, tag, out, files, tree), stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


async def _publish_files(bootstrap: str, topic: str, files: list[Path], presets: list[str]) -> None:
    from streams.producer import ImageProducer

    async with ImageProducer(bootstrap, topic) as prod:
        futs = [await prod.publish(prod.event_for_file(f, presets=presets, inline=False)) for f in files]
        await prod.flush(futs)


async def _first_records(bootstrap: str, topics: list[str], n: int, deadline: float,
                         proc: subprocess.Popen[bytes]) -> list[tuple[int, str, bytes]]:
    """``(append time ms, topic, value)`` of the first ``n`` records on ``topics``."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(*topics, bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                auto_offset_reset="earliest")
    await consumer.start()
    got: list[tuple[int, str, bytes]] = []
    try:
        while len(got) < n:
            if proc.poll() is not None:
                raise RuntimeError(f"the worker exited with {proc.returncode} after {len(got)} of {n} outputs")
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(got)} of {n} outputs arrived in time")
            for records in (await consumer.getmany(timeout_ms=200)).values():
                got += [(r.timestamp, r.topic, r.value) for r in records]
    finally:
        await consumer.stop()
    return got


def run_file_worker(files: list[Path], out: Path, bootstrap: str, presets: list[str],
                    tree: Path = ROOT) -> dict[str, Any]:
    """The same photos through a real ``lightbox worker`` of ``tree`` (default this checkout), as
    the peer benchmark's ``worker`` tool: fresh topics, one ProductImageEvent per photo that names
    the file (``file://``, the worker reads only the photos' folders), ``presets``, default
    settings otherwise; one worker (:func:`start_file_worker`) started and stopped (SIGTERM) once
    every event has its output. Reported like a whole ``process`` run:

    - ``seconds``: from the worker's start to the last output's broker append time (start-up,
      group join and model load included, as a ``process`` run includes its own start);
    - ``steady_ms_per_image``: (last - first output's append time) / (outputs - 1);
    - ``cpu_s``: the worker's CPU time (user + system, /proc) until the last output;
    - ``stages_ms``: milliseconds per image per stage from the processed events' spans (each
      batched span divided by its batch size)."""
    from lightbox.devservers.launch import terminate
    from lightbox.report import per_event_stage_ms
    from schemas.codec import split_frame
    from schemas.events import EventCodecs

    tag = uuid.uuid4().hex[:8]
    topics = {k: f"peers.{tag}.{k}" for k in TOPIC_KINDS}
    asyncio.run(create_topics(bootstrap, topics))
    asyncio.run(_publish_files(bootstrap, topics["input"], files, presets))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    proc = start_file_worker(bootstrap, topics, tag, out, files, tree)
    try:
        got = asyncio.run(_first_records(bootstrap, [topics["output"], topics["dlq"]], len(files),
                                         time.monotonic() + 600, proc))
        cpu = proc_cpu_s(proc.pid)
    finally:
        terminate(proc.pid, 60)  # SIGTERM (a graceful stop), SIGKILL after 60 s
    dead = sum(1 for _, topic, _ in got if topic == topics["dlq"])
    if dead:
        raise RuntimeError(f"the worker dead-lettered {dead} of {len(files)} photos; see {out / 'worker.log'}")
    times = sorted(t for t, _, _ in got)
    codecs = EventCodecs.create()
    events = [codecs.processed.decode(v) for _, _, v in got if split_frame(v)[0] == codecs.processed.writer_id]
    stages: dict[str, float] = {}
    for ev in events:
        for k, v in per_event_stage_ms(ev, amortized=True).items():
            stages[k] = stages.get(k, 0.0) + v / len(events)
    return {"seconds": round(times[-1] / 1000 - t0, 3), "cpu_s": round(cpu, 3),
            "steady_ms_per_image": round((times[-1] - times[0]) / max(1, len(times) - 1), 1),
            "stages_ms": {k: round(v, 2) for k, v in sorted(stages.items())}}


# ------------------------------------------------------------------------------- outputs
class OutputReader:
    """Reads a run's output and dead-letter topics from the start, in the background: per source
    event id its append time (ms), the worker's own latency and the batch it ran in."""

    def __init__(self, bootstrap: str, output: str, dlq: str, codecs: Any = None) -> None:
        from aiokafka import AIOKafkaConsumer

        from schemas.events import EventCodecs

        self.codecs, self.output = codecs or EventCodecs.create(), output
        self.consumer = AIOKafkaConsumer(output, dlq, bootstrap_servers=bootstrap, group_id=None,
                                         enable_auto_commit=False, auto_offset_reset="earliest",
                                         max_partition_fetch_bytes=64 << 20, fetch_max_bytes=128 << 20)
        self.processed: dict[str, dict[str, Any]] = {}  # source event id -> figures
        self.dead: list[str | None] = []
        self.changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.consumer.start()
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while True:
            batch = await self.consumer.getmany(timeout_ms=100, max_records=200)
            for records in batch.values():
                for r in records:
                    if r.topic == self.output:
                        ev = self.codecs.processed.decode(r.value)
                        decode = next((s for s in ev["spans"] if s["stage"] == "decode"), None)
                        self.processed[ev["source_event_id"]] = {
                            "appended_ms": r.timestamp, "timestamp_type": r.timestamp_type,
                            "worker_latency_ms": ev["latency_us"] / 1000,
                            "batch": decode["batch_size"] if decode else 0}
                    else:
                        self.dead.append(self.codecs.dead_letter.decode(r.value)["source_event_id"])
            if batch:
                self.changed.set()

    async def wait_for(self, ids: set[str], timeout_s: float, alive: Any = lambda: True) -> bool:
        """Until every id in ``ids`` has an output (or a dead letter), ``alive()`` is false, or timeout."""
        deadline = time.monotonic() + timeout_s
        while not ids <= (self.processed.keys() | set(self.dead)):
            if time.monotonic() > deadline or not alive():
                return False
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), 1.0)
        return True

    def latencies_ms(self, created: dict[str, int]) -> list[float]:
        """Append time minus ``created_at`` of every event in ``created`` that has an output."""
        return [float(self.processed[e]["appended_ms"] - t) for e, t in created.items() if e in self.processed]

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.consumer.stop()


def percentiles(values: Sequence[float]) -> dict[str, float]:
    import numpy as np

    if not values:
        return {"p50": float("nan"), "p90": float("nan"), "p99": float("nan"), "max": float("nan"), "n": 0}
    a = np.asarray(values, dtype=float)
    return {"p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99)), "max": float(a.max()), "n": int(a.size)}


# ------------------------------------------------------------------------------- CPU
_TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` and its reaped children (0 if gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / _TICK  # utime stime cutime cstime


def busy_s() -> float:
    """CPU seconds all cores spent not idle since boot."""
    vals = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(vals[:8]) - vals[3] - vals[4]) / _TICK  # minus idle and iowait; guest is in user


class CpuMeter:
    """CPU used between construction and :meth:`read` by the worker, the broker, this bench, and
    everything else (the machine may be shared: a run with many ``other_cores`` was slowed down)."""

    def __init__(self, worker_pid: int, broker_pid: int) -> None:
        self.pids = {"worker": worker_pid, "broker": broker_pid, "bench": os.getpid()}
        self.start = self._sample()

    def _sample(self) -> dict[str, float]:
        return {"wall": time.monotonic(), "busy": busy_s(), **{k: proc_cpu_s(p) for k, p in self.pids.items()}}

    def read(self) -> dict[str, float]:
        end = self._sample()
        d = {k: end[k] - self.start[k] for k in end}
        others = d["busy"] - d["worker"] - d["broker"] - d["bench"]
        return {"worker_s": d["worker"], "broker_s": d["broker"], "bench_s": d["bench"],
                "other_cores": max(0.0, others) / max(1e-3, d["wall"])}
