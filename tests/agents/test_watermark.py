"""The per-partition contiguous watermark (agents/watermark.py): pure, no Kafka."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.watermark import OffsetRewound, Watermarks


@st.composite
def handed_and_order(draw: st.DrawFn) -> tuple[list[tuple[int, int]], list[int]]:
    """Inputs handed over 1-3 partitions (rising offsets with gaps) and a completion order."""
    handed: list[tuple[int, int]] = []
    for part in range(draw(st.integers(1, 3))):
        offset = draw(st.integers(0, 5))
        for _ in range(draw(st.integers(0, 12))):
            handed.append((part, offset))
            offset += draw(st.integers(1, 3))  # gaps: transaction markers, compaction
    order = draw(st.permutations(range(len(handed))))
    return handed, list(order)


@given(handed_and_order())
def test_released_prefix_never_passes_an_unfinished_input(case: tuple[list[tuple[int, int]], list[int]]) -> None:
    handed, order = case
    wm: Watermarks[int] = Watermarks()
    tickets = [wm.submit(part, off, i) for i, (part, off) in enumerate(handed)]
    done: set[int] = set()
    released: dict[int, list[int]] = {}
    for i in order:
        for t in wm.done(tickets[i]):
            released.setdefault(int(str(t.key)), []).append(t.offset)
        done.add(i)
        for part, committable in wm.committable().items():
            unfinished = [off for j, (p, off) in enumerate(handed) if p == part and j not in done]
            assert not unfinished or committable <= min(unfinished)
        for part, offs in released.items():  # released in offset order, each once
            assert offs == sorted(set(offs))
            assert all(j in done for j, (p, off) in enumerate(handed) if p == part and off <= offs[-1])
    assert wm.pending == 0
    for part, offs in released.items():
        assert offs == [off for p, off in handed if p == part]


def test_revoked_partition_releases_nothing_from_old_generation() -> None:
    wm: Watermarks[str] = Watermarks()
    a, b = wm.submit(0, 10, "a"), wm.submit(0, 11, "b")
    assert [t.token for t in wm.done(b)] == []
    assert [t.token for t in wm.revoke([0])] == ["b"]  # done, waiting for a: dropped
    assert wm.pending == 0
    c = wm.submit(0, 10, "c")  # the next owner of the partition's generation starts again
    assert wm.done(a) == [] and not wm.is_current(a)
    assert [t.token for t in wm.done(c)] == ["c"]
    assert wm.committable() == {0: 11}


def test_offsets_must_rise_within_a_generation() -> None:
    wm: Watermarks[None] = Watermarks()
    wm.submit(0, 5, None)
    with pytest.raises(OffsetRewound):
        wm.submit(0, 5, None)


def test_double_done_is_a_bug() -> None:
    wm: Watermarks[None] = Watermarks()
    wm.submit(0, 1, None)
    t = wm.submit(0, 2, None)
    assert wm.done(t) == []
    with pytest.raises(ValueError, match="twice"):
        wm.done(t)
