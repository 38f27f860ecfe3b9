"""Path components from event fields (schemas.paths.safe_component) and `tail --save` with hostile SKUs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lightbox.show import save_variants
from schemas.paths import MAX_COMPONENT, safe_component

SAFE = re.compile(r"[A-Za-z0-9_-]([A-Za-z0-9._-]*[A-Za-z0-9_-])?")
HOSTILE = ["../escape", "../../../../tmp/x", "/etc/passwd", "a/../../b", "..", ".", "", "\x00", "a\x00b",
           "..\\..\\win", "C:\\x", ".hidden", "x" * 5000, "SKU/../..", "～／", "a/b", "a_b", " ", "\n", "SKU."]


def check(out: str) -> None:
    assert SAFE.fullmatch(out), out
    assert ".." not in out and "/" not in out and "\\" not in out and "\x00" not in out
    assert 1 <= len(out) <= MAX_COMPONENT


@given(st.text())
def test_any_text_becomes_one_safe_component(value: str) -> None:
    out = safe_component(value)
    check(out)
    assert safe_component(value) == out  # stable
    assert safe_component(out) == out  # idempotent: a safe name passes through


@given(st.lists(st.sampled_from(["..", ".", "/", "\\", "\x00", "a", "SKU-1", "é", "%2e", "~"]), max_size=40)
       .map("".join))
def test_traversal_shaped_text(value: str) -> None:
    check(safe_component(value))


@given(st.text(), st.text())
def test_different_values_stay_apart(a: str, b: str) -> None:
    if a != b:
        assert safe_component(a) != safe_component(b)


@pytest.mark.parametrize("value", ["SKU-1", "IMG_0042.v2", "abc"])
def test_safe_values_are_unchanged(value: str) -> None:
    assert safe_component(value) == value


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_values(value: str) -> None:
    check(safe_component(value))


def test_known_collision_pair_stays_apart() -> None:
    assert safe_component("a/b") != safe_component("a_b") == "a_b"


@pytest.mark.parametrize("sku", HOSTILE)
def test_tail_save_stays_in_its_folder(sku: str, tmp_path: Path) -> None:
    folder = tmp_path / "deep" / "save"
    ev = {"sku": sku, "variants": [{"preset": "../p", "format": "jpeg", "data": b"x", "uri": None},
                                   {"preset": "jd_main", "format": "../../png", "data": b"y", "uri": None}]}
    written = save_variants(ev, folder)
    assert len(written) == 2
    assert len(set(written)) == 2
    for path in written:
        assert path.parent == folder
        assert path.resolve().parent == folder.resolve()
    # nothing anywhere else under tmp_path
    assert sorted(p for p in tmp_path.rglob("*") if p.is_file()) == sorted(written)
