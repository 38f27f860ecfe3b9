"""With LIGHTBOX_OFFLINE set (the GPU validation run sets it) the model is never downloaded."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_offline_a_missing_model_is_an_error_not_a_download(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_kernels.segment.fetch_model import FetchFailed, ensure_u2netp

    calls: list[object] = []
    monkeypatch.setenv("LIGHTBOX_OFFLINE", "1")
    with pytest.raises(FetchFailed, match="LIGHTBOX_OFFLINE"):
        ensure_u2netp(tmp_path / "cache", download=lambda dest: calls.append(dest))  # type: ignore[arg-type,func-returns-value]
    assert calls == []
