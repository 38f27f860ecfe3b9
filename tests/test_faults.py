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
        placed = asyncio.run(fk.publish(settings.kafka_bootstrap, settings.input_topic, plan))
        first_dead = {p: min(pl.offset for pl in placed if pl.partition == p and pl.item.bad) for p in range(4)}

        def passed_a_dead_letter() -> list[int]:
            got = asyncio.run(fk.committed(settings.kafka_bootstrap, settings.group_id, settings.input_topic))
            return [p for p, off in got.items() if off > first_dead[p]]

        part = fk.wait_for(passed_a_dead_letter, 120, "a commit past a dead letter", every_s=0.1,
                           alive=first.running)[0]
        first.kill()
        t_fault = time.monotonic()
        # the fault really happened: that dead letter was out before some lower image's output
        outs = fk.outputs(settings)
        dl = next(r for r in outs if r.topic == settings.dlq_topic
                  and dict(r.headers).get("lightbox-source", b"").endswith(f":{part}:{first_dead[part]}".encode()))
        lower = {f"{settings.input_topic}:{part}:{o}".encode() for o in range(first_dead[part])}
        lower_done = [r.timestamp_ms for r in outs if r.topic == settings.output_topic
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
