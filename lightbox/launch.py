"""What the local launchers (Kafka, s3proxy, Prometheus) share: the cache folder, jars fetched
once with Maven from a packaged POM, the JDK, a free port, whether a pid still runs."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["cache_root", "find_java", "free_port", "maven_jars", "pid_alive", "terminate", "wait_gone"]


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
