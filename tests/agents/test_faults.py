"""The fault suite: real `lightbox worker` processes on a real broker, real photos and bad inputs;
each scenario injects one fault and ends with `lightbox audit` showing no input missing and
every duplicate byte-identical.

Each scenario records a row (scenario, inputs, processed, dead letters, missing, duplicates, time
to recover) — printed, and appended to ``$LIGHTBOX_FAULT_TABLE`` when set. Run them alone with
``pytest -m faults``.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from lightbox.audit import AuditReport
from streams.settings import Settings
from tests import faultkit as fk

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.faults]

N_IMAGES = 64


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], dict[str, Path], Path]:
    return fk.make_fault_catalog(tmp_path_factory.mktemp("faults"), N_IMAGES)


def check(rep: AuditReport, *, inputs: int, images: int) -> None:
    """What every scenario ends with: nothing missing, duplicates identical, dead letters carrying
    their input unchanged (value and headers), and every image processed."""
    assert rep.missing == [], rep.as_dict()
    assert rep.duplicates_identical and rep.conflicts == [], rep.as_dict()
    assert rep.original_mismatches == [] and rep.bad_digests == 0, rep.as_dict()
    assert (rep.inputs, rep.processed, rep.dead_letters) == (inputs, images, inputs - images), rep.as_dict()


# -- (a) --------------------------------------------------------------------------------------------
def test_a_sigkill_after_dead_letters_overtook_slower_images(settings: Settings, kit, tmp_path: Path) -> None:
    """Fresh group. On each partition a few slow images (a preset set of their own, so they wait
    in the batcher up to max_wait) come before fast dead letters. Wait until the group has
    committed past such a dead letter, SIGKILL the worker at once, let a successor finish.

    Against a commit that follows acks out of order (Faust's gap check on a fresh group), the
    slow images below the committed offset are lost: the audit lists them as missing."""
    good, bad, presets = kit
    slow, rest = good[:16], good[16:]
    bads = fk.bad_items(bad)
    plan: list[tuple[int | None, fk.Item]] = []
    for p in range(4):
        plan += [(p, it) for it in fk.images(slow[p * 4:(p + 1) * 4], fk.BOTH)]
        plan += [(p, bads[(2 * p) % len(bads)]), (p, bads[(2 * p + 1) % len(bads)])]
        plan += [(p, it) for it in fk.images(rest[p * 12:(p + 1) * 12])]
        plan += [(p, bads[(p + 3) % len(bads)])]
    env = fk.worker_env(settings, presets, slo_ms="20000", max_wait_ms="3000", max_batch="24",
                        fixed_batch="24")
    first = fk.Worker(env, tmp_path / "w1.log").start()
    second = None
    try:
        placed = asyncio.run(fk.publish(settings.kafka.bootstrap, settings.topics.input, plan))
        first_dead = {p: min(pl.offset for pl in placed if pl.partition == p and pl.item.bad) for p in range(4)}

        def passed_a_dead_letter() -> list[int]:
            got = asyncio.run(fk.committed(settings.kafka.bootstrap, settings.kafka.group_id, settings.topics.input))
            return [p for p, off in got.items() if off > first_dead[p]]

        part = fk.wait_for(passed_a_dead_letter, 120, "a commit past a dead letter", every_s=0.1,
                           alive=first.running)[0]
        first.kill()
        t_fault = time.monotonic()
        # the fault really happened: that dead letter was out before some lower image's output
        outs = fk.outputs(settings)
        dl = next(r for r in outs if r.topic == settings.topics.dlq
                  and dict(r.headers).get("lightbox-source", b"").endswith(f":{part}:{first_dead[part]}".encode()))
        lower = {f"{settings.topics.input}:{part}:{o}".encode() for o in range(first_dead[part])}
        lower_done = [r.timestamp_ms for r in outs if r.topic == settings.topics.output
                      and dict(r.headers).get("lightbox-source") in lower]
        assert len(lower_done) < len(lower) or max(lower_done) > dl.timestamp_ms, \
            "the dead letter did not overtake the slower images; the scenario did not happen"

        second = fk.Worker(env, tmp_path / "w2.log").start()
        fk.wait_drained(settings, fk.ends_of(placed), 180, alive=second.running)
        rep = fk.audit(settings)
        row = fk.Row("a: SIGKILL after dead letters overtook images (fresh group)").fill(rep)
        row.recover_s = round(time.monotonic() - t_fault, 1)
        row.notes = {"images_below_commit_without_output_at_kill": len(lower) - len(lower_done)}
        row.save()
        check(rep, inputs=len(plan), images=N_IMAGES)
    finally:
        first.stop()
        if second is not None:
            second.stop()


def standard_plan(good: list[Path], bad: dict[str, Path], prefix: str = "") -> list[tuple[int | None, fk.Item]]:
    """The images with the bad inputs spread among them, round-robin over 4 partitions."""
    items = fk.images(good, prefix=prefix)
    bads = fk.bad_items(bad)
    step = len(items) // len(bads)
    for i, b in enumerate(bads):
        items.insert(i * (step + 1) + step // 2, b)
    return fk.spread(items)


def processed_count(s: Settings) -> int:
    return sum(r.topic == s.topics.output for r in fk.outputs(s))


# -- (b) --------------------------------------------------------------------------------------------
def test_b_broker_sigkill_and_restart_on_the_same_data_dir(kit, tmp_path: Path) -> None:
    """A broker of its own, SIGKILLed mid-stream and restarted on its data dir (same cluster id,
    ports, topics and committed offsets). The worker rides it out, or fail-stops and a successor
    takes over; either way nothing is lost."""
    import uuid

    from lightbox.devservers.kafka_local import LocalKafka

    good, bad, presets = kit
    kafka = LocalKafka.start(data_dir=tmp_path / "kafka")
    tag = uuid.uuid4().hex[:8]
    s = Settings(kafka_bootstrap=kafka.bootstrap, group_id=f"faults-b-{tag}", input_topic=f"b-{tag}.images",
                 backfill_topic=f"b-{tag}.backfill", output_topic=f"b-{tag}.processed", dlq_topic=f"b-{tag}.dlq",
                 data_dir=tmp_path / "faust")
    env = fk.worker_env(s, presets, delivery_timeout_s="60")
    workers = [fk.Worker(env, tmp_path / "w1.log").start()]
    try:
        plan = standard_plan(good, bad)
        placed = asyncio.run(fk.publish(s.kafka.bootstrap, s.topics.input, plan))
        fk.wait_for(lambda: processed_count(s) >= 8, 120, "8 processed events", alive=workers[0].running)
        kafka.kill()
        t_fault = time.monotonic()
        time.sleep(2.0)  # the worker sees the broker gone
        kafka.restart()
        restarted_s = time.monotonic() - t_fault

        def drained_or_exited() -> bool:
            if not workers[-1].running():  # fail-stop: an orchestrator would start another
                workers.append(fk.Worker(env, tmp_path / f"w{len(workers) + 1}.log").start())
            got = asyncio.run(fk.committed(s.kafka.bootstrap, s.kafka.group_id, s.topics.input))
            return all(got.get(p, 0) >= end for p, end in fk.ends_of(placed).items())

        fk.wait_for(drained_or_exited, 240, "the group to commit every input after the restart", every_s=1.0)
        rep = fk.audit(s)
        row = fk.Row("b: broker SIGKILL + restart on its data dir").fill(rep)
        row.recover_s = round(time.monotonic() - t_fault, 1)
        row.notes = {"broker_restart_s": round(restarted_s, 1), "workers": len(workers),
                     "first_worker_exit": workers[0].proc.poll() if workers[0].proc else None}
        row.save()
        check(rep, inputs=len(plan), images=N_IMAGES)
    finally:
        for w in workers:
            w.stop()
        kafka.stop()


# -- (c) --------------------------------------------------------------------------------------------
def test_c_workers_join_mid_stream_then_one_leaves(settings: Settings, kit, tmp_path: Path) -> None:
    """One worker takes the first half; a second and a third join (the group rebalances to three);
    the second half is published, and one of the three leaves at once (SIGTERM)."""
    good, bad, presets = kit
    plan = standard_plan(good, bad)
    half = len(plan) // 2
    env = fk.worker_env(settings, presets)
    w1 = fk.Worker(env, tmp_path / "w1.log").start()
    workers = [w1]
    try:
        placed = asyncio.run(fk.publish(settings.kafka.bootstrap, settings.topics.input, plan[:half]))
        fk.wait_for(lambda: processed_count(settings) >= 4, 120, "4 processed events", alive=w1.running)
        workers += [fk.Worker(env, tmp_path / f"w{i}.log").start() for i in (2, 3)]
        t_join = time.monotonic()
        fk.wait_for(lambda: asyncio.run(fk.group_members(settings)) == 3, 120, "a stable group of three")
        joined_s = time.monotonic() - t_join
        placed += asyncio.run(fk.publish(settings.kafka.bootstrap, settings.topics.input, plan[half:]))
        leaver = workers[1]
        leaver.terminate()
        t_leave = time.monotonic()
        rc = leaver.exit_code(60)
        fk.wait_drained(settings, fk.ends_of(placed), 180)
        rep = fk.audit(settings)
        row = fk.Row("c: 2nd and 3rd worker join mid-stream, one leaves").fill(rep)
        row.recover_s = round(time.monotonic() - t_leave, 1)
        row.notes = {"rebalance_to_three_s": round(joined_s, 1), "leaver_exit": rc}
        row.save()
        assert rc == 0, leaver.log_tail()
        check(rep, inputs=len(plan), images=N_IMAGES)
        assert all(w.running() for w in workers if w is not leaver)
    finally:
        for w in workers:
            w.stop()


# -- (d) --------------------------------------------------------------------------------------------
RSS_BOUND = 768 << 20  # stated bound for a CPU worker with the classical segmenter and small presets


def test_d_burst_of_ten_times_capacity(settings: Settings, kit, tmp_path: Path) -> None:
    """A worker that may hold 16 inputs (max_batch 4) gets a burst of 10x that at once. Its
    resident memory stays under RSS_BOUND, and it pulls the burst from the broker as it works
    (its partitions pause) rather than all at once."""
    good, bad, presets = kit
    capacity = 2 * 4 + 8  # max(max_in_flight 8, 2 * max_batch + 8), as agents.wiring.runner_config
    items = fk.images(good) + fk.images(good, prefix="again-") + fk.images(good[:160 - 2 * len(good)], prefix="3-")
    items += fk.bad_items(bad)
    plan = fk.spread(items)
    assert len(plan) >= 10 * capacity
    env = fk.worker_env(settings, presets, max_batch="4", max_in_flight="8")
    w = fk.Worker(env, tmp_path / "w1.log").start()
    try:
        # the baseline once the worker has joined its group (imports done: they read files too)
        fk.wait_for(lambda: asyncio.run(fk.group_members(settings)) == 1, 120, "the worker to join",
                    alive=w.running)
        time.sleep(1.0)
        base_rss = w.rss()
        read0 = w.bytes_read()
        placed = asyncio.run(fk.publish(settings.kafka.bootstrap, settings.topics.input, plan))
        burst_bytes = sum(len(fk._value(fk.EventCodecs.create(), p.item)) for p in placed)
        t0 = time.monotonic()
        samples: list[tuple[float, int, int, int]] = []  # (s, rss, bytes read, committed)

        def sample() -> bool:
            got = asyncio.run(fk.committed(settings.kafka.bootstrap, settings.kafka.group_id, settings.topics.input))
            done = sum(got.values())
            samples.append((time.monotonic() - t0, w.rss(), w.bytes_read() - read0, done))
            return all(got.get(p, 0) >= end for p, end in fk.ends_of(placed).items())

        fk.wait_for(sample, 240, "the burst to be committed", every_s=0.25, alive=w.running)
        rep = fk.audit(settings)
        row = fk.Row("d: burst of 10x capacity").fill(rep)
        row.recover_s = round(time.monotonic() - t0, 1)
        half = next(smp for smp in samples if smp[3] >= len(plan) // 4)
        row.notes = {"capacity": capacity, "base_rss_mb": base_rss >> 20, "peak_rss_mb": w.peak_rss >> 20,
                     "burst_mb": round(burst_bytes / 2**20, 1),
                     "read_mb_when_quarter_committed": round(half[2] / 2**20, 1)}
        row.save()
        assert w.peak_rss < RSS_BOUND, row.notes
        # paused, not slurped: when a quarter of the burst is committed the worker has read well
        # under half of it from the broker (a worker that fetched everything would have read it all)
        assert half[2] < burst_bytes / 2, row.notes
        check(rep, inputs=len(plan), images=len(plan) - len(fk.bad_items(bad)))
    finally:
        w.stop()


# -- (e) --------------------------------------------------------------------------------------------
def test_e_sigterm_finishes_in_flight_work_and_commits(settings: Settings, kit, tmp_path: Path, u2netp) -> None:
    """The default model segmenter (u2netp). SIGTERM mid-stream: exit code 0 within
    shutdown_timeout; every input with an output is committed and nothing beyond (in-flight work
    finished, no output left uncommitted); a successor does the rest with no duplicate."""
    good, bad, presets = kit
    plan = standard_plan(good, bad)
    shutdown_s = 20
    # max_batch 4: at most 16 inputs in flight, a few seconds of u2netp work, well within shutdown_s
    env = fk.worker_env(settings, presets, segmenter="model", shutdown_timeout_s=str(shutdown_s), max_batch="4",
                        max_in_flight="8")
    first = fk.Worker(env, tmp_path / "w1.log").start()
    second = None
    try:
        placed = asyncio.run(fk.publish(settings.kafka.bootstrap, settings.topics.input, plan))
        fk.wait_for(lambda: processed_count(settings) >= 6, 180, "6 processed events", alive=first.running)
        first.terminate()
        t_fault = time.monotonic()
        rc = first.exit_code(120)  # a hang guard: it ends at the latest shutdown_s + 10 s after the stop begins
        stop_s = time.monotonic() - t_fault
        assert rc == 0, first.log_tail()
        got = asyncio.run(fk.committed(settings.kafka.bootstrap, settings.kafka.group_id, settings.topics.input))
        done: dict[int, set[int]] = {}
        for r in fk.outputs(settings):
            src = dict(r.headers).get("lightbox-source", b"").decode()
            _, part, off = src.rsplit(":", 2)
            done.setdefault(int(part), set()).add(int(off))
        for p in range(4):
            assert done.get(p, set()) == set(range(got.get(p, 0))), (p, got, sorted(done.get(p, set())))
        second = fk.Worker(env, tmp_path / "w2.log").start()
        fk.wait_drained(settings, fk.ends_of(placed), 240, alive=second.running)
        rep = fk.audit(settings)
        row = fk.Row("e: SIGTERM mid-stream (u2netp)").fill(rep)
        row.recover_s = round(time.monotonic() - t_fault, 1)
        row.notes = {"exit_code": rc, "stop_s": round(stop_s, 1), "committed_at_stop": sum(got.values())}
        row.save()
        check(rep, inputs=len(plan), images=N_IMAGES)
        assert rep.duplicates == 0, rep.as_dict()
        codecs = fk.EventCodecs.create()
        versions = {codecs.processed.decode(r.value)["model_version"] for r in fk.outputs(settings)
                    if r.topic == settings.topics.output and r.value}
        assert len(versions) == 1 and next(iter(versions)).startswith("u2netp"), versions
    finally:
        first.stop()
        if second is not None:
            second.stop()


# -- (f) --------------------------------------------------------------------------------------------
def test_f_output_store_unwritable_fail_stop_then_successor(settings: Settings, kit, tmp_path: Path) -> None:
    """Variants go to a content-addressed store folder. Mid-stream the folder becomes unwritable
    (replaced by a file: root ignores permissions). The worker fail-stops: non-zero exit, one clear
    log line. Once the folder is back, a successor completes; every variant URI holds its bytes."""
    import hashlib
    import shutil
    from urllib.parse import urlparse

    good, bad, presets = kit
    plan = standard_plan(good, bad)
    store = tmp_path / "store"
    store.mkdir()
    env = fk.worker_env(settings, presets, output_dir=str(store))
    first = fk.Worker(env, tmp_path / "w1.log").start()
    second = None
    try:
        placed = asyncio.run(fk.publish(settings.kafka.bootstrap, settings.topics.input, plan))
        fk.wait_for(lambda: processed_count(settings) >= 6, 120, "6 processed events", alive=first.running)
        aside = tmp_path / "store-aside"
        store.rename(aside)
        store.write_text("not a folder: the store is unwritable\n")
        t_fault = time.monotonic()
        rc = first.exit_code(60)
        failed_s = time.monotonic() - t_fault
        assert rc not in (0, None), f"exit {rc}\n{first.log_tail()}"
        fatal = [ln for ln in first.log().splitlines() if "CRITICAL" in ln]
        assert len(fatal) == 1 and "fail-stop" in fatal[0], fatal
        store.unlink()
        aside.rename(store)
        second = fk.Worker(env, tmp_path / "w2.log").start()
        fk.wait_drained(settings, fk.ends_of(placed), 180, alive=second.running)
        rep = fk.audit(settings)
        row = fk.Row("f: output store unwritable mid-stream").fill(rep)
        row.recover_s = round(time.monotonic() - t_fault, 1)
        row.notes = {"exit_code": rc, "fail_stop_s": round(failed_s, 1), "log_line": fatal[0][-160:]}
        row.save()
        check(rep, inputs=len(plan), images=N_IMAGES)
        from lightbox.audit import output_of
        from schemas.events import EventCodecs

        codecs = EventCodecs.create()
        for r in fk.outputs(settings):
            if r.topic == settings.topics.output:
                out = output_of(codecs, r.value, r.headers)
                assert out is not None
                for preset, _fmt, _w, _h, size, sha, uri in out.fingerprint[1]:
                    data = Path(urlparse(uri).path).read_bytes()
                    assert (len(data), hashlib.sha256(data).hexdigest()) == (size, sha), preset
    finally:
        first.stop()
        if second is not None:
            second.stop()
        if store.is_file():
            store.unlink()
        shutil.rmtree(tmp_path / "store-aside", ignore_errors=True)


# -- (g) --------------------------------------------------------------------------------------------
OUTPUT_LIMIT = 6_000


@pytest.mark.parametrize("store", [False, True], ids=["no-store", "store"])
def test_g_output_over_the_topics_size_limit(settings: Settings, kit, tmp_path: Path, store: bool) -> None:
    """The output topic is created with a small max.message.bytes. With no store configured an
    event over it becomes an OUTPUT_TOO_LARGE dead letter; with a store its variants go out of
    line (file:// URIs) and it is processed. The rest flow; nothing sticks."""
    good, bad, presets = kit
    items = fk.images(good[::2], fk.BOTH) + fk.images(good[1::2])
    bads = fk.bad_items(bad)
    plan = fk.spread(items + bads)
    asyncio.run(fk.create_topics(settings.kafka.bootstrap, {
        settings.topics.output: {"max.message.bytes": str(OUTPUT_LIMIT)}}))
    extra = {"output_dir": str(tmp_path / "store")} if store else {}
    w = fk.Worker(fk.worker_env(settings, presets, **extra), tmp_path / "w1.log").start()
    try:
        t0 = time.monotonic()
        placed = asyncio.run(fk.publish(settings.kafka.bootstrap, settings.topics.input, plan))
        fk.wait_drained(settings, fk.ends_of(placed), 180, alive=w.running)
        rep = fk.audit(settings)
        row = fk.Row(f"g: outputs over the topic's limit ({OUTPUT_LIMIT} B), "
                     f"{'store' if store else 'no store'}").fill(rep)
        row.recover_s = round(time.monotonic() - t0, 1)
        row.notes = {"error_codes": rep.error_codes}
        row.save()
        assert rep.missing == [] and rep.duplicates_identical and rep.original_mismatches == [], rep.as_dict()
        outs = [r for r in fk.outputs(settings) if r.topic == settings.topics.output]
        assert max(len(r.value or b"") for r in outs) <= OUTPUT_LIMIT
        too_large = rep.error_codes.get("OUTPUT_TOO_LARGE", 0)
        if store:
            check(rep, inputs=len(plan), images=len(items))
            assert any(b"file://" in (r.value or b"") for r in outs), "no variant went out of line"
        else:
            assert too_large > 0 and rep.processed > 0, rep.as_dict()
            assert rep.processed + too_large == len(items) and rep.inputs == len(plan), rep.as_dict()
        assert w.running(), w.log_tail()
    finally:
        w.stop()


# -- the local broker on a kept data dir --------------------------------------------------------------
def test_local_broker_starts_again_on_its_data_dir(tmp_path: Path) -> None:
    """`lightbox kafka up --data-dir D` twice (with a stop between) works: same cluster id and
    address, the records and the group's committed offsets are still there."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.structs import TopicPartition

    from lightbox.devservers.kafka_local import LocalKafka

    kafka = LocalKafka.start(data_dir=tmp_path / "kafka", partitions=1)
    tp = TopicPartition("kept", 0)

    async def write() -> None:
        prod = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, acks="all")
        await prod.start()
        try:
            await asyncio.gather(*[await prod.send("kept", b"x%d" % i) for i in range(3)])
        finally:
            await prod.stop()
        cons = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap, group_id="kept-group", enable_auto_commit=False)
        await cons.start()
        try:
            cons.assign([tp])
            await cons.commit({tp: 2})
        finally:
            await cons.stop()

    async def read(bootstrap: str) -> tuple[list[bytes], int | None]:
        got = await fk.read_records(bootstrap, ["kept"])
        return [r.value or b"" for r in got], (await fk.committed(bootstrap, "kept-group", "kept")).get(0)

    try:
        asyncio.run(write())
        cid, port = (tmp_path / "kafka" / "cluster.id").read_text(), kafka.port
        kafka.stop()
        again = LocalKafka.start(data_dir=tmp_path / "kafka", partitions=1)
        kafka = again
        assert ((tmp_path / "kafka" / "cluster.id").read_text(), again.port) == (cid, port)
        assert asyncio.run(read(again.bootstrap)) == ([b"x0", b"x1", b"x2"], 2)
    finally:
        kafka.stop()
