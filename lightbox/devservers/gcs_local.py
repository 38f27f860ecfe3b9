"""A local Google Cloud Storage (fake-gcs-server) without Docker, for gs:// URLs.

fake-gcs-server is a Go program, installed once with ``go install`` (module version pinned below)
into a cache folder beside Kafka's jars; it runs on 127.0.0.1 with a free port over plain HTTP and
keeps its objects in a temporary folder (filesystem backend). Buckets named at start are created
through its JSON API. Clients reach it through obstore with a service-account file that points the
GCS client at this server and turns OAuth off (``gcs_base_url``, ``disable_oauth``), named by
``GOOGLE_SERVICE_ACCOUNT``. fake-gcs-server checks no credentials at all: it is a test double of
the API, for tests and laptops only. Used by ``lightbox gcs up|down|status`` and by the tests.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from lightbox.devservers.launch import EmulatorProcess, cache_root, free_port, instance_key

__all__ = ["FAKE_GCS_VERSION", "GcsLaunchError", "LocalGcs", "clear_state", "ensure_fake_gcs", "read_state"]

FAKE_GCS_VERSION = "v1.54.0"
FAKE_GCS_MODULE = "github.com/fsouza/fake-gcs-server"


class GcsLaunchError(RuntimeError):
    """fake-gcs-server could not be installed or started; the message says why."""


def cache_dir() -> Path:
    return cache_root() / f"fake-gcs-server-{FAKE_GCS_VERSION}"


def ensure_fake_gcs(target: Path | None = None) -> Path:
    """The ``fake-gcs-server`` executable: ``$LIGHTBOX_FAKE_GCS`` if set, else built once with
    ``go install`` into the cache (through the Go module proxy)."""
    explicit = os.environ.get("LIGHTBOX_FAKE_GCS")
    if explicit:
        return Path(explicit)
    root = target or cache_dir()
    exe = root / "fake-gcs-server"
    if exe.exists():
        return exe
    go = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None)
    if go is None:
        raise GcsLaunchError("go is not on PATH: it is needed once to build fake-gcs-server (Go 1.24+)")
    tmp = root.with_name(root.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    proc = subprocess.run([go, "install", f"{FAKE_GCS_MODULE}@{FAKE_GCS_VERSION}"], capture_output=True, text=True,
                          check=False, timeout=1800, env={**os.environ, "GOBIN": str(tmp)})
    if proc.returncode != 0:
        raise GcsLaunchError(f"go install {FAKE_GCS_MODULE}@{FAKE_GCS_VERSION} failed (exit {proc.returncode}):\n"
                             f"{(proc.stderr or proc.stdout)[-2000:]}")
    shutil.rmtree(root, ignore_errors=True)
    tmp.rename(root)
    return exe


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1).close()
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


@dataclass
class LocalGcs(EmulatorProcess):
    """One running (or stopped) fake-gcs-server."""

    kind = "gcs"
    state_env = "LIGHTBOX_GCS_STATE_FILE"
    launch_error = GcsLaunchError
    pid: int
    port: int
    data_dir: str
    owns_data_dir: bool = True
    buckets: list[str] = field(default_factory=list)
    started: int | None = None
    name: str = "default"

    def answers(self) -> bool:
        return _answers(self.url)

    @property
    def service_account_file(self) -> Path:
        return Path(self.data_dir) / "service-account.json"

    def env(self) -> dict[str, str]:
        """What an obstore (object_store) client reads to use this server for gs:// URLs."""
        return {"GOOGLE_SERVICE_ACCOUNT": str(self.service_account_file), "GOOGLE_ALLOW_HTTP": "true"}

    def create_bucket(self, name: str) -> None:
        if not re.fullmatch(r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]", name):
            raise GcsLaunchError(f"bad bucket name {name!r}: 3-63 lower-case letters, digits, dots, - and _")
        req = urllib.request.Request(f"{self.url}/storage/v1/b?project=lightbox", method="POST",
                                     data=json.dumps({"name": name}).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=10).close()
        except urllib.error.HTTPError as exc:
            if exc.code != 409:  # 409: it exists
                raise GcsLaunchError(f"creating bucket {name!r} failed: HTTP {exc.code}") from None
        if name not in self.buckets:
            self.buckets.append(name)

    def upload(self, bucket: str, key: str, data: bytes) -> None:
        """Write one object through the JSON API's media upload. (obstore writes through the XML API,
        ``PUT /bucket/key``, which fake-gcs-server 1.54 answers with 400 "invalid uploadType".)"""
        url = f"{self.url}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={urllib.parse.quote(key, safe='')}"
        req = urllib.request.Request(url, method="POST", data=data,
                                     headers={"Content-Type": "application/octet-stream"})
        urllib.request.urlopen(req, timeout=30).close()

    @classmethod
    def start(cls, *, data_dir: str | Path | None = None, port: int | None = None,
              buckets: tuple[str, ...] = ("lightbox",), timeout_s: float = 60.0, name: str | None = None) -> LocalGcs:
        exe = ensure_fake_gcs()
        owns = data_dir is None
        ddir = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="lightbox-gcs-"))
        (ddir / "objects").mkdir(parents=True, exist_ok=True)
        gcs = cls(pid=0, port=port or free_port(), data_dir=str(ddir), owns_data_dir=owns,
                  name=instance_key(name, None if owns else ddir))
        gcs.service_account_file.write_text(json.dumps(
            {"gcs_base_url": gcs.url, "disable_oauth": True, "client_email": "", "private_key": "",
             "private_key_id": ""}))
        with gcs.log_file.open("ab") as out:
            proc = subprocess.Popen(
                [str(exe), "-scheme", "http", "-host", "127.0.0.1", "-port", str(gcs.port),
                 "-public-host", f"127.0.0.1:{gcs.port}", "-external-url", gcs.url,
                 "-backend", "filesystem", "-filesystem-root", str(ddir / "objects"), "-log-level", "warn"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        gcs.wait_until_up(proc, timeout_s, "fake-gcs-server")
        for b in buckets:
            gcs.create_bucket(b)
        return gcs


def read_state(key: str = "default") -> LocalGcs | None:
    """The server instance ``key`` (:func:`lightbox.devservers.launch.instance_key`) started, if recorded."""
    return LocalGcs.read_state(key)


def clear_state(key: str = "default") -> None:
    LocalGcs.clear_state(key)
