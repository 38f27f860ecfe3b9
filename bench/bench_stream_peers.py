"""The lightbox worker against the streaming service a team writes first, on one Kafka broker.

Two services take the same photos (``bench.harness.peer_photos``: three size classes, ≤ 0.5 MP,
0.5–3 MP, 3–24 MP, in JPEG, progressive JPEG, CMYK JPEG, PNG and WebP) from a topic and make
the same three presets (taobao_main 800², xiaohongshu_cover 1080×1440, thumb_webp 400² WebP):

- ``peer``: an aiokafka consumer loop around rembg 2.0.86 (``bench/peers/peer_rembg.py serve``, in
  rembg's own virtualenv with aiokafka): per message ``remove(..., u2netp, bgcolor=white)``,
  Pillow per preset, produce the result, commit. JSON jobs naming the file.
- ``lightbox``: ``lightbox worker`` with default settings (CPU, this checkout); ProductImageEvents
  naming the file (``file://``).

Load levels are fractions of the peer's capacity measured in the same run, so the offered rates
follow the machine's speed at the time (the JSON keeps them, ``offered_img_s``, and each level's
realised arrival rate, ``arrived_per_s``: a few dozen Poisson arrivals come some percent off the
rate).

Both run the same u2netp file (lightbox's cached copy, linked where rembg looks; see
``bench/bench_peers.py``). The broker is one local Apache Kafka the benchmark starts; each
service gets fresh topics (4 partitions; output with ``LogAppendTime``) and a group of its own.

Per size class:

1. **capacity** (closed loop): each service, once warm, gets a backlog of photos at once;
   capacity = (outputs - 1) / (last - first output append time). The load levels below are
   fractions of the *peer's* capacity, so both services see the same arrival times.
2. **load levels** (open loop): Poisson arrivals (seeded per class and level, the same for both
   services) at 25, 50, 90 and 120 % of the peer's capacity, ``--seconds`` of arrivals per level
   (at least ``--min-events``), the next level once every event of the level has its output.
   Per level: end-to-end latency = the output's broker append time - the event's scheduled
   arrival (p50, p99), throughput = completed / (last completion - first arrival), CPU seconds
   per image of the service process (user + system, all threads, from /proc), failures (an
   error result or a dead letter).

Each service process is started once per class and round and warmed with one photo (its
start-up is not measured here: ``bench/bench_peers.py`` and its ``startup`` subcommand measure
it). Rounds alternate which service runs first. Reported per class and level: the median
over rounds, and the ratios ``lightbox / peer`` for throughput and ``peer / lightbox`` for p99
and CPU per image (above 1: lightbox is ahead).

    PYTHONPATH=. .venv/bin/python bench/bench_stream_peers.py [--quick] [--rounds 2] [--seconds 40]
        [--classes small,mid,large] [--kafka-port PORT] [--out bench/results/stream_peers]

``--quick``: the small class only, 3 photos, 8 s a level, 1 round (to see it work). Writes
``OUT/stream_peers.json`` and ``OUT/stream_peers.png``; prints the table. A benchmark, not a
test: it asserts nothing but that every event got its output.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import mimetypes
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_peers import PRESETS, compile_packages, model_file, rembg_python  # noqa: E402
from bench.harness import PEER_CLASSES, create_topics, peer_photos, proc_cpu_s, start_file_worker  # noqa: E402

LOADS = (0.25, 0.5, 0.9, 1.2)
SERVICES = ("peer", "lightbox")
PEER_DEPS = ("aiokafka==0.14.0",)  # what the streaming peer adds to rembg's virtualenv


@dataclass
class Service:
    """One running service on its own topics; ``kind`` says which wire format its jobs take."""

    kind: str
    proc: subprocess.Popen[bytes]
    topics: dict[str, str]
    tag: str
    out: Path
    sent: dict[bytes, float] = field(default_factory=dict)  # key -> scheduled arrival (epoch s)
    model: str = ""  # lightbox: the model and runtime its processed events name


def peer_python(venv: Path) -> Path:
    """rembg's virtualenv with aiokafka added (installed from PyPI on first use)."""
    py = rembg_python(venv)
    if subprocess.run([str(py), "-c", "import aiokafka"], capture_output=True).returncode:
        print(f"installing {' '.join(PEER_DEPS)} into {venv} …", flush=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", *PEER_DEPS], check=True)
    return py


def start(kind: str, bootstrap: str, files: list[Path], work: Path, peer_py: Path) -> Service:
    tag = uuid.uuid4().hex[:8]
    topics = {k: f"stream.{tag}.{k}" for k in ("input", "backfill", "output", "dlq")}
    asyncio.run(create_topics(bootstrap, topics))
    out = work / f"{kind}-{tag}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    if kind == "lightbox":
        proc = start_file_worker(bootstrap, topics, tag, out, files)
    else:
        with (out / "peer.log").open("wb") as log:
            proc = subprocess.Popen([str(peer_py), str(ROOT / "bench" / "peers" / "peer_rembg.py"), "serve", bootstrap,
                                     f"stream-peer-{tag}", topics["input"], topics["output"], str(out / "variants")],
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    return Service(kind, proc, topics, tag, out)


def stop(svc: Service) -> None:
    from lightbox.devservers.launch import terminate

    terminate(svc.proc.pid, 60)


def job(svc: Service, key: str, path: Path) -> bytes:
    """The wire bytes of one job for ``svc``: a ProductImageEvent (lightbox) or a JSON job (peer)."""
    if svc.kind == "lightbox":
        from streams.producer import ImageProducer

        ev = ImageProducer.event({"uri": path.resolve().as_uri(), "sha256": None}, sku=key, image_id=path.name,
                                 presets=PRESETS.split(","),
                                 content_type=mimetypes.guess_type(path.name)[0])
        return _codecs().product.encode(ev)
    return json.dumps({"id": key, "path": str(path.resolve())}).encode()


_CODECS: list[Any] = []


def _codecs() -> Any:
    if not _CODECS:
        from schemas.events import EventCodecs

        _CODECS.append(EventCodecs.create())
    return _CODECS[0]


def failed(svc: Service, topic: str, value: bytes) -> bool:
    if topic == svc.topics["dlq"]:
        return True
    if svc.kind == "peer":
        return "error" in json.loads(value)
    return False


async def drive(bootstrap: str, svc: Service, files: list[Path], offsets: list[float] | None,
                label: str, timeout_s: float) -> dict[str, Any]:
    """Publish one job per offset (seconds from now; None: all at once) and wait for every output.
    Returns the level's figures."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    n = len(offsets) if offsets is not None else len(files)
    keys = [f"{label}-{i}".encode() for i in range(n)]
    consumer = AIOKafkaConsumer(svc.topics["output"], svc.topics["dlq"], bootstrap_servers=bootstrap,
                                group_id=None, enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    mine = set(keys)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)
    await producer.start()
    done: dict[bytes, tuple[float, bool]] = {}
    cpu0 = proc_cpu_s(svc.proc.pid)
    t0 = time.time() + 0.05

    async def publish() -> None:
        for i, key in enumerate(keys):
            at = t0 + (offsets[i] if offsets is not None else 0.0)
            await asyncio.sleep(max(0.0, at - time.time()))
            svc.sent[key] = at
            await producer.send(svc.topics["input"], job(svc, key.decode(), files[i % len(files)]), key=key)
        await producer.flush()

    sender = asyncio.create_task(publish())
    deadline = time.monotonic() + timeout_s
    try:
        while len(done) < n:
            if svc.proc.poll() is not None:
                raise RuntimeError(f"the {svc.kind} service exited ({svc.proc.returncode}); see {svc.out}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{svc.kind} {label}: only {len(done)} of {n} outputs in {timeout_s:.0f} s")
            for records in (await consumer.getmany(timeout_ms=200)).values():
                for r in records:
                    if r.key in mine and r.key not in done:
                        done[r.key] = (r.timestamp / 1000, failed(svc, r.topic, r.value))
                        if svc.kind == "lightbox" and not svc.model and r.topic == svc.topics["output"]:
                            svc.model = str(_codecs().processed.decode(r.value).get("model_version", ""))
        await sender
    finally:
        sender.cancel()
        await producer.stop()
        await consumer.stop()
    cpu = proc_cpu_s(svc.proc.pid) - cpu0
    arrivals = [svc.sent[k] for k in keys]
    ends = [done[k][0] for k in keys]
    lat = sorted(e - a for a, e in zip(arrivals, ends, strict=True))
    span = max(ends) - min(arrivals)
    out_span = max(ends) - min(ends)
    spread = max(arrivals) - min(arrivals)
    return {"events": n, "failed": sum(1 for k in keys if done[k][1]),
            "arrived_per_s": round((n - 1) / spread, 4) if spread > 0 else None,
            "throughput": round(n / span, 4) if span > 0 else None,
            "capacity": round((n - 1) / out_span, 4) if offsets is None and out_span > 0 else None,
            "p50_s": round(_pct(lat, 50), 3), "p99_s": round(_pct(lat, 99), 3), "max_s": round(lat[-1], 3),
            "cpu_s_per_image": round(cpu / n, 4)}


def _pct(xs: list[float], q: float) -> float:
    """The q-th percentile of sorted ``xs`` (linear between the closest ranks)."""
    if len(xs) == 1:
        return xs[0]
    k = (len(xs) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def poisson(rate: float, n: int, seed: int) -> list[float]:
    import numpy as np

    gaps = np.random.default_rng(seed).exponential(1.0 / rate, n)
    return [float(v) for v in np.cumsum(gaps) - gaps[0]]


def events_for(rate: float, seconds: float, min_events: int) -> int:
    return max(min_events, round(rate * seconds))


def run_service(kind: str, bootstrap: str, cls: str, files: list[Path], work: Path, peer_py: Path,
                backlog: int | None, rates: dict[float, float] | None, args: argparse.Namespace,
                seed: int) -> dict[str, Any]:
    """One service process for one class: warm-up, then the capacity backlog (``backlog``) or
    the load levels (``rates``: load -> events/s)."""
    svc = start(kind, bootstrap, files, work, peer_py)
    row: dict[str, Any] = {}
    try:
        asyncio.run(drive(bootstrap, svc, files[:1], [0.0], "warm", 900))
        row["model"] = svc.model or "rembg u2netp (ONNX Runtime)"
        if backlog is not None:
            row["capacity"] = asyncio.run(drive(bootstrap, svc, [files[i % len(files)] for i in range(backlog)],
                                                None, "backlog", 1800))
        for k, (load, rate) in enumerate((rates or {}).items()):
            n = events_for(rate, args.seconds, args.min_events)
            offsets = poisson(rate, n, seed * 100 + k)
            row[f"{load:g}"] = asyncio.run(drive(bootstrap, svc, files, offsets, f"load{k}",
                                                 offsets[-1] + 1800))
            lv = row[f"{load:g}"]
            print(f"  {kind:8s} {cls:5s} {load:4.0%} {rate:6.2f}/s {n:3d} ev  thr {lv['throughput']:.2f}/s  "
                  f"p50 {lv['p50_s']:.2f} s  p99 {lv['p99_s']:.2f} s  cpu {lv['cpu_s_per_image']:.2f} s/img",
                  flush=True)
    finally:
        stop(svc)
    shutil.rmtree(svc.out / "variants", ignore_errors=True)
    return row


def summarise(capacity: dict[str, dict[str, list[dict[str, Any]]]],
              levels: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    med = statistics.median
    summary: dict[str, Any] = {}
    for cls in levels:
        caps = {s: med(r["capacity"] for r in capacity[cls][s]) for s in SERVICES}
        per_level: dict[str, Any] = {}
        for load in LOADS:
            key = f"{load:g}"
            rows = {s: [r[key] for r in levels[cls][s]] for s in SERVICES}
            m = {s: {f: round(med(r[f] for r in rows[s]), 4)
                     for f in ("throughput", "p50_s", "p99_s", "cpu_s_per_image")} for s in SERVICES}
            per_level[key] = {**m, "failed": {s: sum(r["failed"] for r in rows[s]) for s in SERVICES},
                              "throughput_ratio": round(m["lightbox"]["throughput"] / m["peer"]["throughput"], 3),
                              "p99_ratio": round(m["peer"]["p99_s"] / m["lightbox"]["p99_s"], 3),
                              "cpu_ratio": round(m["peer"]["cpu_s_per_image"] / m["lightbox"]["cpu_s_per_image"],
                                                 3)}
        summary[cls] = {"capacity_img_s": {s: round(v, 3) for s, v in caps.items()},
                        "model": {s: sorted({r.get("model", "") for r in levels[cls][s]}) for s in SERVICES},
                        "capacity_ratio": round(caps["lightbox"] / caps["peer"], 3),
                        "capacity_cpu_s_per_image": {s: round(med(r["cpu_s_per_image"] for r in capacity[cls][s]), 3)
                                                     for s in SERVICES},
                        "levels": per_level}
    return summary


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    classes = list(summary)
    fig, axes = plt.subplots(2, len(classes), figsize=(max(7.0, 4.2 * len(classes)), 6.4), squeeze=False)
    for j, cls in enumerate(classes):
        lv = summary[cls]["levels"]
        x = [float(k) * 100 for k in lv]
        for s, colour in zip(SERVICES, ("tab:orange", "tab:blue"), strict=True):
            axes[0][j].plot(x, [lv[k][s]["p50_s"] for k in lv], "o--", color=colour, label=f"{s} p50")
            axes[0][j].plot(x, [lv[k][s]["p99_s"] for k in lv], "o-", color=colour, label=f"{s} p99")
            axes[1][j].plot(x, [lv[k][s]["throughput"] for k in lv], "o-", color=colour, label=s)
        axes[1][j].plot(x, [summary[cls]["capacity_img_s"]["peer"] * v / 100 for v in x], ":", color="grey",
                        label="offered")
        axes[0][j].set_title(f"{cls}: latency (s)")
        axes[0][j].set_yscale("log")
        axes[1][j].set_title(f"{cls}: throughput (img/s)")
        axes[1][j].set_xlabel("offered load, % of the peer's capacity")
        for ax in axes[:, j]:
            ax.legend(fontsize=7)
    fig.suptitle("lightbox worker vs an aiokafka + rembg consumer\n(same broker, photos, presets)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "stream_peers")
    ap.add_argument("--quick", action="store_true", help="small class, 3 photos, 8 s a level, 1 round")
    ap.add_argument("--rounds", type=int, default=None, help="rounds of load levels (default 2; 1 with --quick)")
    ap.add_argument("--seconds", type=float, default=None, help="seconds of arrivals per level (default 40)")
    ap.add_argument("--min-events", type=int, default=None, help="events per level at least (default 8)")
    ap.add_argument("--backlog", type=int, default=None, help="capacity backlog per class (default 2 × photos)")
    ap.add_argument("--classes", default=None,
                    help=f"size classes (default {','.join(PEER_CLASSES)}; small with --quick)")
    ap.add_argument("--seed", type=int, default=46)
    ap.add_argument("--kafka-port", type=int, default=None, help="the broker's port (default: a free one)")
    ap.add_argument("--kafka-dir", type=Path, default=None, help="the broker's data dir (default: a temporary one)")
    ap.add_argument("--rembg-venv", type=Path, default=None, help="rembg's virtualenv (default OUT/../rembg-venv)")
    args = ap.parse_args()
    rounds = args.rounds or (1 if args.quick else 2)
    args.seconds = args.seconds or (8.0 if args.quick else 40.0)
    args.min_events = args.min_events or (4 if args.quick else 8)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    classes = (args.classes or ("small" if args.quick else ",".join(PEER_CLASSES))).split(",")
    sets = peer_photos(out.parent / ("peer-photos-quick" if args.quick else "peer-photos"), quick=args.quick)
    sets = {c: v for c, v in sets.items() if c in classes}
    model_file()
    peer_py = peer_python(args.rembg_venv or out.parent / "rembg-venv")
    compile_packages()
    from lightbox.devservers.kafka_local import LocalKafka

    work = out / "work"
    kafka = LocalKafka.start(port=args.kafka_port, data_dir=args.kafka_dir,
                             controller_port=args.kafka_port + 1 if args.kafka_port else None)
    capacity: dict[str, dict[str, list[dict[str, Any]]]] = {}
    levels: dict[str, dict[str, list[dict[str, Any]]]] = {}
    rates: dict[str, dict[float, float]] = {}
    try:
        for c, (cls, files) in enumerate(sets.items()):
            capacity[cls] = {s: [] for s in SERVICES}
            for s in SERVICES if c % 2 == 0 else SERVICES[::-1]:
                backlog = args.backlog or 2 * len(files)
                row = run_service(s, kafka.bootstrap, cls, files, work, peer_py, backlog, None, args, args.seed)
                capacity[cls][s].append({**row["capacity"], "model": row["model"]})
                print(f"  {s:8s} {cls:5s} capacity {row['capacity']['capacity']:.2f} img/s "
                      f"({backlog} photos at once)", flush=True)
            rates[cls] = {load: capacity[cls]["peer"][0]["capacity"] * load for load in LOADS}
        for r in range(rounds):
            for c, (cls, files) in enumerate(sets.items()):
                levels.setdefault(cls, {s: [] for s in SERVICES})
                for s in SERVICES if (r + c) % 2 == 0 else SERVICES[::-1]:
                    row = run_service(s, kafka.bootstrap, cls, files, work, peer_py, None, rates[cls], args,
                                      args.seed + c)
                    levels[cls][s].append(row)
    finally:
        kafka.stop()
        shutil.rmtree(work, ignore_errors=True)
    lost = sum(lv["failed"] for cl in levels.values() for rows in cl.values() for row in rows
               for lv in row.values() if isinstance(lv, dict))
    summary = summarise(capacity, levels)
    report = {"presets": PRESETS, "rounds": rounds, "quick": args.quick, "seconds_per_level": args.seconds,
              "min_events": args.min_events, "loads": LOADS, "offered_img_s": rates, "cpus": os.cpu_count(),
              "machine": platform.platform(), "load_avg_end": os.getloadavg(),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "summary": summary,
              "capacity_runs": capacity, "level_runs": levels, "failed_events": lost}
    (out / "stream_peers.json").write_text(json.dumps(report, indent=1))
    plot(summary, out / "stream_peers.png")
    print(f"\nmedian of {rounds} round(s); throughput ratio = lightbox / peer, p99 and CPU ratios = peer / lightbox "
          "(above 1: lightbox ahead)")
    print(f"{'class':6s} {'load':>5s} {'offered':>8s} {'thr peer':>9s} {'thr lb':>8s} {'x':>6s} {'p99 peer':>9s} "
          f"{'p99 lb':>8s} {'x':>6s} {'cpu peer':>9s} {'cpu lb':>7s} {'x':>6s}")
    for cls, s in summary.items():
        cap = s["capacity_img_s"]
        print(f"{cls:6s} capacity (backlog): peer {cap['peer']:.2f} img/s, lightbox {cap['lightbox']:.2f} img/s, "
              f"{s['capacity_ratio']:.2f}x; CPU s per image peer {s['capacity_cpu_s_per_image']['peer']:.2f}, "
              f"lightbox {s['capacity_cpu_s_per_image']['lightbox']:.2f}; lightbox's model "
              f"{', '.join(s['model']['lightbox'])}")
        for load, lv in s["levels"].items():
            print(f"{cls:6s} {float(load):5.0%} {rates[cls][float(load)]:8.2f} {lv['peer']['throughput']:9.2f} "
                  f"{lv['lightbox']['throughput']:8.2f} {lv['throughput_ratio']:5.2f}x {lv['peer']['p99_s']:9.2f} "
                  f"{lv['lightbox']['p99_s']:8.2f} {lv['p99_ratio']:5.2f}x {lv['peer']['cpu_s_per_image']:9.2f} "
                  f"{lv['lightbox']['cpu_s_per_image']:7.2f} {lv['cpu_ratio']:5.2f}x")
    if lost:
        print(f"\n{lost} event(s) ended as an error or a dead letter: see the JSON")
    print(f"\nwrote {out / 'stream_peers.json'} and {out / 'stream_peers.png'}")


if __name__ == "__main__":
    main()
