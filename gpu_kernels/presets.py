"""Marketplace presets, loaded from a TOML file (``gpu_kernels/presets.toml`` by default)."""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from schemas.errors import UnknownPreset

__all__ = ["DEFAULT_PRESETS_FILE", "Preset", "PresetBook", "load_presets"]

DEFAULT_PRESETS_FILE = Path(__file__).with_name("presets.toml")
Format = Literal["jpeg", "png", "webp"]
Background = Literal["white", "transparent"]
Shadow = Literal["none", "contact"]


@dataclass(frozen=True, slots=True)
class Preset:
    name: str
    width: int
    height: int
    format: Format = "jpeg"
    quality: int = 90
    fill: float = 0.8
    background: Background = "white"
    sharpen: float = 0.5
    shadow: Shadow = "none"  # "contact": a soft shadow right under the product (gpu_kernels/stages/shadow.py)
    # marketplace rules, checked per variant (gpu_kernels/stages/compliance.py)
    min_side: int = 0          # both sides of the variant at least this
    min_fill: float = 0.0      # the subject's box takes at least this share along its limiting axis
    pure_white: bool = False   # every border pixel exactly (255, 255, 255)
    allow_cut: bool = True     # False: the subject must not touch the photo's or the canvas' edge

    @property
    def look(self) -> tuple[object, ...]:
        """What the canvas depends on: presets with the same look render the same pixels (two
        marketplaces that both ask for 800 × 800 on white at fill 0.8)."""
        return (self.width, self.height, self.fill, self.background, self.sharpen, self.shadow)

    @property
    def encoding(self) -> tuple[object, ...]:
        """What the variant's bytes depend on: its :attr:`look`, format and quality."""
        return (*self.look, self.format, self.quality)

    def __post_init__(self) -> None:
        if self.width < 1 or self.height < 1:
            raise ValueError(f"preset {self.name!r}: size must be positive, got {self.width}x{self.height}")
        if self.format not in ("jpeg", "png", "webp"):
            raise ValueError(f"preset {self.name!r}: format must be jpeg, png or webp; got {self.format!r}")
        if self.background not in ("white", "transparent"):
            raise ValueError(f"preset {self.name!r}: background must be white or transparent; got {self.background!r}")
        if self.background == "transparent" and self.format == "jpeg":
            raise ValueError(f"preset {self.name!r}: a transparent background needs png or webp, not jpeg")
        if not 0.05 <= self.fill <= 1.0:
            raise ValueError(f"preset {self.name!r}: fill must be within [0.05, 1]; got {self.fill}")
        if self.shadow not in ("none", "contact"):
            raise ValueError(f"preset {self.name!r}: shadow must be none or contact; got {self.shadow!r}")
        if self.shadow == "contact" and self.background != "white":
            raise ValueError(f"preset {self.name!r}: a contact shadow needs a white background")
        if not 0.0 <= self.min_fill <= 1.0 or self.min_side < 0:
            raise ValueError(f"preset {self.name!r}: min_fill must be within [0, 1] and min_side >= 0")


class PresetBook(Mapping[str, Preset]):
    """An immutable name → preset mapping whose lookups fail with :class:`UnknownPreset`."""

    def __init__(self, presets: Iterable[Preset]) -> None:
        self._by_name = {p.name: p for p in presets}

    def __getitem__(self, name: str) -> Preset:
        return self._by_name[name]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)

    def resolve(self, names: Iterable[str]) -> list[Preset]:
        """The presets named, in order; raises :class:`UnknownPreset` naming every unknown one."""
        names = list(names)
        unknown = [n for n in names if n not in self._by_name]
        if unknown:
            raise UnknownPreset(
                f"unknown preset(s) {', '.join(map(repr, unknown))}; known: {', '.join(sorted(self))}",
                stage="presets",
            )
        return [self._by_name[n] for n in names]


def load_presets(path: str | Path | None = None) -> PresetBook:
    path = Path(path) if path else DEFAULT_PRESETS_FILE
    with path.open("rb") as f:
        raw = tomllib.load(f)
    return PresetBook(Preset(name=name, **fields) for name, fields in raw.items())
