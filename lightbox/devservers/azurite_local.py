"""A local Azure Blob Storage (Azurite, Microsoft's storage emulator) without Docker, for az:// URLs.

Azurite comes from npm (``azurite``, pinned below) into a cache folder beside Kafka's jars, installed
once with ``npm install``; the blob service runs as ``azurite-blob`` on 127.0.0.1 with a free port,
a temporary data folder and an account of its own with a random key (``AZURITE_ACCOUNTS``; not the
emulator's well-known key). Containers named at start are created with one Shared Key-signed REST
call. Clients reach it through obstore's emulator mode: :meth:`LocalAzurite.env` gives the standard
``AZURE_STORAGE_*`` variables and ``AZURITE_BLOB_STORAGE_URL``.
Used by ``lightbox azure up|down|status`` and by the tests.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from email.utils import formatdate
from pathlib import Path

from lightbox.devservers.launch import EmulatorProcess, cache_root, free_port, instance_key

__all__ = ["AZURITE_VERSION", "AzuriteLaunchError", "LocalAzurite", "clear_state", "ensure_azurite", "read_state"]

AZURITE_VERSION = "3.37.0"
API_VERSION = "2021-08-06"


class AzuriteLaunchError(RuntimeError):
    """Azurite could not be installed or started; the message says why."""


def cache_dir() -> Path:
    return cache_root() / f"azurite-{AZURITE_VERSION}"


def ensure_azurite(target: Path | None = None) -> Path:
    """The ``azurite-blob`` executable: ``$LIGHTBOX_AZURITE`` if set, else installed from npm into the
    cache once (an interrupted install leaves nothing half-written)."""
    explicit = os.environ.get("LIGHTBOX_AZURITE")
    if explicit:
        return Path(explicit)
    root = target or cache_dir()
    exe = root / "node_modules" / ".bin" / "azurite-blob"
    if exe.exists():
        return exe
    npm = shutil.which("npm")
    if npm is None:
        raise AzuriteLaunchError("npm is not on PATH: it is needed once to install Azurite (Node.js 20+)")
    tmp = root.with_name(root.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    proc = subprocess.run([npm, "install", "--prefix", str(tmp), "--no-audit", "--no-fund", "--loglevel=error",
                           f"azurite@{AZURITE_VERSION}"], capture_output=True, text=True, check=False, timeout=900)
    if proc.returncode != 0:
        raise AzuriteLaunchError(f"npm install azurite@{AZURITE_VERSION} failed (exit {proc.returncode}):\n"
                                 f"{(proc.stderr or proc.stdout)[-2000:]}")
    shutil.rmtree(root, ignore_errors=True)
    tmp.rename(root)
    return exe


def _shared_key_request(url: str, account: str, key: str, method: str, path: str, query: dict[str, str]) -> int:
    """One Azure Blob REST call signed with Shared Key (no body); its HTTP status."""
    date = formatdate(usegmt=True)
    headers = {"x-ms-date": date, "x-ms-version": API_VERSION}
    canon_headers = "".join(f"{k}:{v}\n" for k, v in sorted(headers.items()))
    canon_resource = f"/{account}/{account}/{path}" + "".join(f"\n{k}:{v}" for k, v in sorted(query.items()))
    to_sign = f"{method}\n" + "\n" * 11 + canon_headers + canon_resource
    sig = base64.b64encode(hmac.new(base64.b64decode(key), to_sign.encode(), hashlib.sha256).digest()).decode()
    qs = "&".join(f"{k}={v}" for k, v in query.items())
    req = urllib.request.Request(f"{url}/{account}/{path}?{qs}", method=method,
                                 headers={**headers, "Authorization": f"SharedKey {account}:{sig}",
                                          "Content-Length": "0"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=1).close()
    except urllib.error.HTTPError:
        return True  # any HTTP answer: the server is up
    except OSError:
        return False
    return True


@dataclass
class LocalAzurite(EmulatorProcess):
    """One running (or stopped) Azurite blob service with one account."""

    kind = "azurite"
    state_env = "LIGHTBOX_AZURITE_STATE_FILE"
    launch_error = AzuriteLaunchError
    pid: int
    port: int
    data_dir: str
    account: str
    key: str
    owns_data_dir: bool = True
    containers: list[str] = field(default_factory=list)
    started: int | None = None
    name: str = "default"

    def answers(self) -> bool:
        return _answers(self.url)

    def env(self) -> dict[str, str]:
        """What an obstore (object_store) client reads to use this emulator for az:// URLs."""
        return {"AZURE_STORAGE_USE_EMULATOR": "true", "AZURITE_BLOB_STORAGE_URL": self.url,
                "AZURE_STORAGE_ACCOUNT_NAME": self.account, "AZURE_STORAGE_ACCOUNT_KEY": self.key}

    def create_container(self, name: str) -> None:
        if not re.fullmatch(r"[a-z0-9](?!.*--)[a-z0-9-]{1,61}[a-z0-9]", name):
            raise AzuriteLaunchError(f"bad container name {name!r}: 3-63 lower-case letters, digits and hyphens")
        status = _shared_key_request(self.url, self.account, self.key, "PUT", name, {"restype": "container"})
        if status not in (201, 409):  # 409: it exists
            raise AzuriteLaunchError(f"creating container {name!r} failed: HTTP {status}")
        if name not in self.containers:
            self.containers.append(name)

    @classmethod
    def start(cls, *, data_dir: str | Path | None = None, port: int | None = None,
              containers: tuple[str, ...] = ("lightbox",), timeout_s: float = 60.0,
              name: str | None = None) -> LocalAzurite:
        exe = ensure_azurite()
        owns = data_dir is None
        ddir = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="lightbox-azurite-"))
        ddir.mkdir(parents=True, exist_ok=True)
        az = cls(pid=0, port=port or free_port(), data_dir=str(ddir), owns_data_dir=owns,
                 account="lightbox", key=base64.b64encode(secrets.token_bytes(32)).decode(),
                 name=instance_key(name, None if owns else ddir))
        env = {**os.environ, "AZURITE_ACCOUNTS": f"{az.account}:{az.key}"}
        with az.log_file.open("ab") as out:
            proc = subprocess.Popen(
                [str(exe), "--blobHost", "127.0.0.1", "--blobPort", str(az.port), "--location", str(ddir / "data"),
                 "--skipApiVersionCheck", "--disableTelemetry"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        az.wait_until_up(proc, timeout_s, "azurite")
        for c in containers:
            az.create_container(c)
        return az


def read_state(key: str = "default") -> LocalAzurite | None:
    """The server instance ``key`` (:func:`lightbox.devservers.launch.instance_key`) started, if recorded."""
    return LocalAzurite.read_state(key)


def clear_state(key: str = "default") -> None:
    LocalAzurite.clear_state(key)
