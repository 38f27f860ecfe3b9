"""A local Prometheus server (the ``prometheus`` binary on PATH, e.g. Debian's package) that
scrapes given targets, with its storage in a temporary folder: for tests, benchmarks and the
stage-breakdown plot. Queries go through its HTTP API (standard library only).

    with LocalPrometheus.start(["127.0.0.1:9464"], scrape_interval_s=1) as prom:
        prom.query('sum(lightbox_images_total)')
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from lightbox.devservers.launch import free_port, tail

__all__ = ["LocalPrometheus", "PrometheusLaunchError", "prometheus_binary"]


class PrometheusLaunchError(RuntimeError):
    """The server did not start or answer; the message says why (its log tail included)."""


def prometheus_binary() -> str | None:
    """The ``prometheus`` executable, or None (``apt-get install prometheus``)."""
    return shutil.which("prometheus") or next((p for p in ("/usr/bin/prometheus",) if Path(p).exists()), None)


def config_text(targets: Sequence[str], scrape_interval_s: float, job: str = "lightbox") -> str:
    """A minimal scrape configuration (YAML is a superset of JSON)."""
    interval = f"{int(scrape_interval_s * 1000)}ms"
    return json.dumps({
        "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": list(targets)}]}],
    }, indent=2)


@dataclass
class LocalPrometheus:
    url: str
    proc: subprocess.Popen[bytes]
    folder: Path
    _owned: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)

    @classmethod
    def start(cls, targets: Sequence[str], *, scrape_interval_s: float = 1.0, folder: Path | None = None,
              timeout_s: float = 60.0) -> LocalPrometheus:
        binary = prometheus_binary()
        if binary is None:
            raise PrometheusLaunchError("no prometheus binary on PATH (Debian: apt-get install prometheus)")
        owned = None
        if folder is None:
            owned = tempfile.TemporaryDirectory(prefix="lightbox-prometheus-")
            folder = Path(owned.name)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "prometheus.yml").write_text(config_text(targets, scrape_interval_s))
        port = free_port()
        log = (folder / "prometheus.log").open("wb")
        proc = subprocess.Popen(
            [binary, f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        prom = cls(f"http://127.0.0.1:{port}", proc, folder, owned)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            try:
                with urllib.request.urlopen(f"{prom.url}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return prom
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        last = prom.log_tail()
        prom.stop()
        raise PrometheusLaunchError(f"prometheus did not become ready within {timeout_s:g} s: {last}")

    def log_tail(self, n: int = 20) -> str:
        return tail(self.folder / "prometheus.log", n, missing="")

    def _get(self, path: str, params: dict[str, str]) -> Any:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.load(resp)
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus {path} failed: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's result vector: ``[{"metric": {...}, "value": [t, "v"]}, ...]``."""
        params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
        return list(self._get("/api/v1/query", params)["result"])

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> list[dict[str, Any]]:
        """A range query's matrix: ``[{"metric": {...}, "values": [[t, "v"], ...]}, ...]``."""
        return list(self._get("/api/v1/query_range", {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                                      "step": f"{step_s:g}"})["result"])

    def targets_up(self) -> int:
        """How many scrape targets answered their last scrape."""
        return sum(1 for r in self.query("up") if r["value"][1] == "1")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self._owned is not None:
            self._owned.cleanup()
            self._owned = None

    def __enter__(self) -> LocalPrometheus:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
