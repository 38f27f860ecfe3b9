"""A local Confluent-compatible schema registry (Apicurio Registry) without Docker.

Apicurio Registry's Quarkus build comes from Maven Central (``io.apicurio:apicurio-registry-app``,
``tar.gz`` classifier ``all``, fetched once with ``mvn dependency:get``) and is unpacked into the
cache folder (like Kafka's jars, :mod:`lightbox.devservers.launch`). It runs as ``java -jar
apicurio-registry-app-<v>-runner.jar`` on 127.0.0.1 with:

- its Confluent REST API under ``/apis/ccompat/v7`` (what ``LIGHTBOX_SCHEMA_REGISTRY_URL`` points at);
- canonical hashing, so the same schema sent as different JSON text keeps its id;
- BACKWARD as the global compatibility level (Apicurio's default is NONE, Confluent's BACKWARD);
- its storage in an H2 database file in the data folder, so a registry stopped and started again
  on the same folder (:meth:`LocalRegistry.restart`, ``lightbox registry up --data-dir D``) keeps its
  subjects and ids; each commit is written before the answer (``WRITE_DELAY=0``: H2's default
  half-second delay lost a registration killed right after it was answered).

Java 17+ is needed. Used by ``lightbox registry up|down|status`` and the tests' session fixture.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from lightbox.devservers.launch import (
    EmulatorProcess,
    InstanceBusy,
    cache_root,
    check_data_dir,
    claim_data_dir,
    find_java,
    folder_lock,
    free_port,
    holder_of_port,
    port_free,
    process_start_time,
    same_process,
    terminate,
    wait_gone,
)

__all__ = ["APICURIO_VERSION", "CCOMPAT_PATH", "LocalRegistry", "RegistryLaunchError", "app_dir", "clear_state",
           "ensure_app", "read_state"]

APICURIO_VERSION = "2.6.13.Final"
ARTIFACT = f"io.apicurio:apicurio-registry-app:{APICURIO_VERSION}:tar.gz:all"
RUNNER = f"apicurio-registry-app-{APICURIO_VERSION}-runner.jar"
CCOMPAT_PATH = "/apis/ccompat/v7"


class RegistryLaunchError(RuntimeError):
    """The local registry could not be installed or started; the message says why."""


def app_dir() -> Path:
    return cache_root() / f"apicurio-registry-{APICURIO_VERSION}"


def _maven_tarball(quiet: bool) -> Path:
    """The release tarball in the local Maven repository, fetched once with ``mvn dependency:get``."""
    repo = Path(os.environ.get("MAVEN_REPO_LOCAL") or Path.home() / ".m2" / "repository")
    tarball = (repo / "io" / "apicurio" / "apicurio-registry-app" / APICURIO_VERSION
               / f"apicurio-registry-app-{APICURIO_VERSION}-all.tar.gz")
    if tarball.is_file():
        return tarball
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RegistryLaunchError("Maven (mvn) is not on PATH: it is needed once to fetch Apicurio Registry "
                                  f"{APICURIO_VERSION} from Maven Central")
    cmd = [mvn, "-B", *(["-q"] if quiet else []), "dependency:get", "-Dtransitive=false", f"-Dartifact={ARTIFACT}"]
    proc = subprocess.run(cmd, capture_output=quiet, text=True, check=False)
    if proc.returncode != 0 or not tarball.is_file():
        tail = (proc.stdout or "")[-2000:] if quiet else ""
        raise RegistryLaunchError(f"mvn could not fetch {ARTIFACT} (exit {proc.returncode}):\n{tail}")
    return tarball


def ensure_app(*, quiet: bool = True) -> Path:
    """The unpacked registry (its runner jar and ``lib/``) in the cache, fetched and unpacked once;
    an interrupted unpack leaves nothing half-written."""
    target = app_dir()
    if (target / RUNNER).is_file():
        return target
    tarball = _maven_tarball(quiet)
    tmp = target.with_name(target.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with tarfile.open(tarball) as tar:
        tar.extractall(tmp, filter="data")
    found = next(tmp.rglob(RUNNER), None)
    if found is None:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RegistryLaunchError(f"{tarball} holds no {RUNNER}")
    shutil.rmtree(target, ignore_errors=True)
    found.parent.rename(target)
    shutil.rmtree(tmp, ignore_errors=True)
    return target


def _request(url: str, method: str = "GET", body: object | None = None, timeout_s: float = 5.0) -> object:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/vnd.schemaregistry.v1+json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.loads(resp.read() or b"null")


@dataclass
class LocalRegistry(EmulatorProcess):
    """One running (or stopped) local Apicurio Registry; its database is in ``data_dir``."""

    kind = "registry"
    state_env = "LIGHTBOX_REGISTRY_STATE_FILE"
    launch_error = RegistryLaunchError
    pid: int
    port: int
    data_dir: str
    owns_data_dir: bool = True
    started: int | None = None  # the server process's start time (launch.process_start_time)
    name: str = "default"  # the instance key its state is kept under (launch.instance_key)
    heap: str = "384m"

    @property
    def api_url(self) -> str:
        """The Confluent-compatible API: what ``LIGHTBOX_SCHEMA_REGISTRY_URL`` is set to."""
        return f"{self.url}{CCOMPAT_PATH}"

    @property
    def log_file(self) -> Path:
        return Path(self.data_dir) / "registry.log"

    def env(self) -> dict[str, str]:
        return {"LIGHTBOX_SCHEMA_REGISTRY_URL": self.api_url}

    def answers(self) -> bool:
        try:
            _request(f"{self.api_url}/subjects", timeout_s=2.0)
        except (OSError, ValueError):
            return False
        return True

    def global_compatibility(self) -> str:
        got = _request(f"{self.api_url}/config")
        return str(got.get("compatibilityLevel", "")) if isinstance(got, dict) else ""

    @classmethod
    def start(cls, *, data_dir: str | Path | None = None, port: int | None = None, heap: str = "384m",
              timeout_s: float = 120.0, name: str = "default") -> LocalRegistry:
        """Start the registry and return once it answers, with BACKWARD set globally. A ``port``
        that is taken, or a ``data_dir`` a running registry of another instance holds, raises
        :class:`RegistryLaunchError` naming the holder."""
        ensure_app()
        owns = data_dir is None
        if port and not port_free(port):
            raise RegistryLaunchError(f"port {port} is taken by {holder_of_port('registry', port)}; "
                                      "choose another --port")
        ddir = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="lightbox-registry-"))
        ddir.mkdir(parents=True, exist_ok=True)
        with folder_lock(ddir):
            if data_dir is not None:
                try:
                    check_data_dir(ddir, "registry", name)
                except InstanceBusy as exc:
                    raise RegistryLaunchError(str(exc)) from None
            reg = cls(pid=0, port=port or free_port(), data_dir=str(ddir.resolve()), owns_data_dir=owns, name=name,
                      heap=heap)
            proc = reg._launch()
            claim_data_dir(ddir, "registry", name, reg.pid, reg.started)
        reg.wait_until_up(proc, timeout_s, "Apicurio Registry")
        reg._backward()
        return reg

    def _launch(self) -> subprocess.Popen[bytes]:
        app = ensure_app()
        db = Path(self.data_dir) / "registry"
        cmd = [find_java("Apicurio Registry", RegistryLaunchError), f"-Xmx{self.heap}", "-XX:+UseSerialGC",
               "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true",
               "-Dquarkus.http.host=127.0.0.1", f"-Dquarkus.http.port={self.port}",
               "-Dregistry.ccompat.use-canonical-hash=true", "-Dquarkus.log.level=WARN",
               f"-Dquarkus.datasource.jdbc.url=jdbc:h2:file:{db};WRITE_DELAY=0",
               "-jar", str(app / RUNNER)]
        with self.log_file.open("ab") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    cwd=self.data_dir, start_new_session=True)
        self.pid, self.started = proc.pid, process_start_time(proc.pid)
        return proc

    def _backward(self) -> None:
        try:
            _request(f"{self.api_url}/config", "PUT", {"compatibility": "BACKWARD"})
        except (OSError, ValueError) as exc:
            self.stop()
            raise RegistryLaunchError(f"could not set BACKWARD compatibility: {exc}") from None

    def kill(self) -> None:
        """SIGKILL the registry, as a crash would; the data folder is kept for :meth:`restart`."""
        if not same_process(self.pid, self.started):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        wait_gone(self.pid, 10.0)

    def restart(self, *, timeout_s: float = 120.0) -> LocalRegistry:
        """Start this registry again on its port and data folder (its subjects and ids kept), after
        :meth:`kill` or a stop that kept the folder; stops it first if it still runs."""
        if same_process(self.pid, self.started):
            terminate(self.pid, 15.0)
        proc = self._launch()
        claim_data_dir(Path(self.data_dir), "registry", self.name, self.pid, self.started)
        self.wait_until_up(proc, timeout_s, "Apicurio Registry")
        return self


def read_state(key: str = "default") -> LocalRegistry | None:
    """The registry instance ``key`` (:func:`~lightbox.devservers.launch.instance_key`) recorded, if any."""
    return LocalRegistry.read_state(key)


def clear_state(key: str = "default") -> None:
    LocalRegistry.clear_state(key)
