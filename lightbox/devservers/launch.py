"""What the local launchers (Kafka, s3proxy, Prometheus) share: the cache folder, jars fetched
once with Maven from a packaged POM, the JDK, a free port, whether a pid still runs, and the
state a launcher keeps about what it started.

State (``lightbox kafka up`` / ``lightbox s3 up``): one file per *instance*, keyed by ``--name``,
else by the data folder (``dir-<hash of its absolute path>``), else ``default``, under
``<cache>/local/<kind>-<key>.json`` (``$LIGHTBOX_STATE_DIR`` moves the folder). It records the
server's pid **and that process's start time** (``/proc/<pid>/stat``), so ``down`` stops only
the process that this state started — never a process that reused the pid — and two tools that
use their own names or folders never see each other's servers. A data folder in use carries a
claim file naming its instance; a second ``up`` on that folder, or on a port that is taken,
stops with a message that says who holds it."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar, Self

__all__ = ["EmulatorProcess", "InstanceBusy", "cache_root", "claim_data_dir", "find_java", "folder_lock",
           "free_port", "instance_key", "maven_jars", "pid_alive", "port_free", "process_start_time",
           "release_data_dir", "same_process", "state_path", "state_root", "states", "tail", "terminate",
           "wait_gone"]

CLAIM_FILE = ".lightbox-instance.json"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class InstanceBusy(Exception):
    """A port or a data folder is held by another instance (or another program)."""


def cache_root() -> Path:
    """``$LIGHTBOX_CACHE_DIR``, else ``~/.cache/lightbox``."""
    return Path(os.environ.get("LIGHTBOX_CACHE_DIR") or Path.home() / ".cache" / "lightbox")


def maven_jars(pom: Path, lib: Path, marker: str, what: str, error: type[Exception], *, quiet: bool = True) -> Path:
    """Resolve ``pom``'s runtime dependencies into ``lib`` once (``marker`` is a glob that exists
    there when done); a failed or interrupted fetch leaves nothing half-written in ``lib``."""
    if any(lib.glob(marker)):
        return lib
    mvn = shutil.which("mvn")
    if mvn is None:
        raise error(f"Maven (mvn) is not on PATH: it is needed once to fetch {what}'s jars")
    tmp = lib.with_name("lib.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    cmd = [mvn, "-B", *(["-q"] if quiet else []), "-f", str(pom), "dependency:copy-dependencies",
           "-DincludeScope=runtime", f"-DoutputDirectory={tmp}"]
    proc = subprocess.run(cmd, capture_output=quiet, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stdout or "")[-2000:] if quiet else ""
        raise error(f"mvn failed to resolve {what} (exit {proc.returncode}):\n{tail}")
    shutil.rmtree(lib, ignore_errors=True)
    tmp.rename(lib)
    return lib


def find_java(what: str, error: type[Exception]) -> str:
    """``$JAVA_HOME/bin/java``, else ``java`` on PATH."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java:
        raise error(f"no java on PATH ({what} needs a JDK/JRE 17+)")
    return java


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def wait_gone(pid: int, timeout_s: float) -> bool:
    """Whether ``pid`` exited within ``timeout_s`` (reaped when it is our child)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            if os.waitpid(pid, os.WNOHANG)[0]:
                return True
        except ChildProcessError:  # not our child (started by another shell's `up`)
            if not pid_alive(pid):
                return True
        time.sleep(0.1)
    return False


def terminate(pid: int, timeout_s: float) -> None:
    """SIGTERM, then SIGKILL after ``timeout_s``; returns once ``pid`` is gone (or 5 s after the kill)."""
    for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        if wait_gone(pid, wait):
            return


# -- instance state ------------------------------------------------------------------------------
def process_start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot, ``/proc/<pid>/stat`` field 22), or None when
    it does not run. With the pid, it names one process: a pid reused later has another time."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def same_process(pid: int, started: int | None) -> bool:
    """Whether ``pid`` still runs and is the process that started at ``started`` (``None``: a
    state written before start times were kept — the pid alone decides)."""
    if pid <= 0 or not pid_alive(pid):
        return False
    return started is None or process_start_time(pid) == started


def instance_key(name: str | None, data_dir: str | Path | None) -> str:
    """``name`` (letters, digits, ``_.-``; at most 64), else ``dir-<12 hex>`` of the data folder's
    absolute path, else ``default``."""
    if name:
        if not _NAME.fullmatch(name):
            raise ValueError(f"bad instance name {name!r}: 1-64 letters, digits, '_', '.', '-' (not first)")
        return name
    if data_dir is not None:
        return "dir-" + hashlib.sha256(str(Path(data_dir).resolve()).encode()).hexdigest()[:12]
    return "default"


def state_path(kind: str, key: str, env_var: str | None = None) -> Path:
    """The state file of instance ``key`` of ``kind`` ("kafka", "s3"); ``$env_var`` (a file path)
    overrides it, as before instances had names."""
    explicit = os.environ.get(env_var) if env_var else None
    return Path(explicit) if explicit else state_root() / f"{kind}-{key}.json"


def state_root() -> Path:
    """``$LIGHTBOX_STATE_DIR``, else ``<cache>/local``: where the instances' state files live."""
    return Path(os.environ.get("LIGHTBOX_STATE_DIR") or cache_root() / "local")


def states(kind: str) -> dict[str, dict[str, object]]:
    """Every recorded instance of ``kind``: {key: its state's fields}."""
    out: dict[str, dict[str, object]] = {}
    for path in sorted(state_root().glob(f"{kind}-*.json")):
        try:
            out[path.stem[len(kind) + 1:]] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
    return out


def port_free(port: int) -> bool:
    """Whether a server could listen on ``port`` now. ``SO_REUSEADDR``, as every server sets it:
    connections a killed server left in TIME_WAIT do not hold the port (without it, a broker
    SIGKILLed with clients connected could not start again on its port for a minute)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def holder_of_port(kind: str, port: int) -> str:
    """Who holds ``port``: a recorded instance whose process still runs, else "another program"."""
    for key, st in states(kind).items():
        pid, started = st.get("pid"), st.get("started")
        if port in (st.get("port"), st.get("controller_port")) and isinstance(pid, int) \
                and same_process(pid, started if isinstance(started, int) else None):
            return f"the local {kind} instance {key!r} (pid {pid})"
    return "another program"


def claim_data_dir(data_dir: Path, kind: str, key: str, pid: int, started: int | None) -> None:
    """Mark ``data_dir`` as used by instance ``key``'s process (see :func:`check_data_dir`)."""
    (data_dir / CLAIM_FILE).write_text(json.dumps({"kind": kind, "key": key, "pid": pid, "started": started}))


def check_data_dir(data_dir: Path, kind: str, key: str) -> None:
    """Raise :class:`InstanceBusy` when a live process of another instance claims ``data_dir``."""
    try:
        claim = json.loads((data_dir / CLAIM_FILE).read_text())
    except (OSError, ValueError):
        return
    pid, started = claim.get("pid"), claim.get("started")
    if not isinstance(pid, int) or not same_process(pid, started if isinstance(started, int) else None):
        return  # a stale claim: its process is gone
    who = claim.get("key", "?")
    raise InstanceBusy(
        f"the data folder {data_dir} is in use by the local {claim.get('kind', kind)} instance {who!r} "
        f"(pid {pid}); stop it with `lightbox {claim.get('kind', kind)} down --name {who}`"
        + ("" if who == key else " or choose another --data-dir"))


def release_data_dir(data_dir: Path, pid: int) -> None:
    """Remove ``data_dir``'s claim if it is ``pid``'s."""
    path = data_dir / CLAIM_FILE
    try:
        if json.loads(path.read_text()).get("pid") == pid:
            path.unlink()
    except (OSError, ValueError):
        pass


@contextlib.contextmanager
def folder_lock(data_dir: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``data_dir`` (a lock file in it) while a launcher checks the
    folder's claim, starts its server and claims the folder: two launchers on one folder at once
    are served one after the other, and the second sees the first's claim."""
    with (data_dir / ".lightbox-instance.lock").open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def tail(path: Path, lines: int = 20, missing: str = "(no log)") -> str:
    """The last ``lines`` lines of a server's log ``path`` (``missing`` when it cannot be read)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return missing


class EmulatorProcess:
    """What a local server's record shares (Kafka, s3proxy, Azurite, fake-gcs-server): the process
    it started (pid and start time, so ``stop`` never signals a process that reused the pid), its
    log, whether it answers, and one state file per instance (``lightbox s3 up --name …``). A
    subclass is a dataclass with the fields ``pid``, ``started``, ``port``, ``data_dir``,
    ``owns_data_dir`` and ``name``, and sets ``kind``, ``state_env``, ``launch_error`` and
    :meth:`answers`."""

    kind: ClassVar[str]
    state_env: ClassVar[str]
    launch_error: ClassVar[type[Exception]]
    pid: int
    started: int | None
    port: int
    data_dir: str
    owns_data_dir: bool
    name: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return Path(self.data_dir) / f"{self.kind}.log"

    def answers(self) -> bool:
        raise NotImplementedError

    def log_tail(self, lines: int = 20) -> str:
        return tail(self.log_file, lines)

    def alive(self) -> bool:
        """The very process this record started runs and answers."""
        return same_process(self.pid, self.started) and self.answers()

    def wait_until_up(self, proc: subprocess.Popen[bytes], timeout_s: float, what: str) -> None:
        """Wait for the started ``proc`` to answer; raise ``launch_error`` with its log's tail
        when it exits or stays silent for ``timeout_s`` (then it is stopped)."""
        self.pid, self.started = proc.pid, process_start_time(proc.pid)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise self.launch_error(f"{what} exited with {proc.returncode} during start; log:\n{self.log_tail()}")
            if self.answers():
                return
            time.sleep(0.2)
        self.stop()
        raise self.launch_error(f"{what} did not start within {timeout_s:.0f} s; log:\n{self.log_tail()}")

    def stop(self, timeout_s: float = 15.0) -> bool:
        """SIGTERM, then SIGKILL after ``timeout_s``, only when the pid is still the process this
        record started; releases its claim on the data folder (:func:`claim_data_dir`, if it made
        one) and removes a temporary one. Returns whether it stopped one."""
        ours = same_process(self.pid, self.started)
        if ours:
            terminate(self.pid, timeout_s)
            release_data_dir(Path(self.data_dir), self.pid)
        if self.owns_data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)
        return ours

    def save_state(self) -> Path:
        """Record this instance (mode 600: the record may hold a key)."""
        path = state_path(self.kind, self.name, self.state_env)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(json.dumps(dataclasses.asdict(self)))  # type: ignore[call-overload]
        return path

    @classmethod
    def read_state(cls, key: str = "default") -> Self | None:
        """The instance ``key`` (:func:`instance_key`) recorded, if any."""
        try:
            return cls(**json.loads(state_path(cls.kind, key, cls.state_env).read_text()))
        except (OSError, ValueError, TypeError):
            return None

    @classmethod
    def clear_state(cls, key: str = "default") -> None:
        state_path(cls.kind, key, cls.state_env).unlink(missing_ok=True)
