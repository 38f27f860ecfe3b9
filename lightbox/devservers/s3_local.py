"""A local S3-compatible server (s3proxy on its filesystem backend) without Docker.

The jars come from Maven Central through the packaged ``lightbox/devservers/data/s3proxy-pom.xml`` into a cache folder
(like Kafka's, see ``lightbox/devservers/kafka_local.py``); the server runs as ``java -cp '<cache>/lib/*'
org.gaul.s3proxy.Main --properties s3proxy.conf`` on 127.0.0.1 with a free port, SigV2/V4 authentication
and a temporary data folder. A bucket is a folder under that folder (``buckets=`` creates them at start).
Used by ``lightbox s3 up|down|status`` and by the pytest session fixture.
"""

from __future__ import annotations

import re
import secrets
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from importlib import resources
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
    maven_jars,
    port_free,
    process_start_time,
)

__all__ = [
    "S3PROXY_VERSION",
    "LocalS3",
    "S3LaunchError",
    "cache_dir",
    "clear_state",
    "ensure_jars",
    "read_state",
]

S3PROXY_VERSION = "2.6.0"
POM = Path(str(resources.files("lightbox.devservers") / "data" / "s3proxy-pom.xml"))
REGION = "us-east-1"

LOGBACK = """\
<configuration>
  <appender name="out" class="ch.qos.logback.core.ConsoleAppender">
    <encoder><pattern>%d{HH:mm:ss.SSS} %-5level %logger{24} - %msg%n</pattern></encoder>
  </appender>
  <root level="WARN"><appender-ref ref="out"/></root>
</configuration>
"""

PROPERTIES = """\
s3proxy.endpoint=http://127.0.0.1:{port}
s3proxy.authorization=aws-v2-or-v4
s3proxy.identity={access_key}
s3proxy.credential={secret_key}
jclouds.provider=filesystem-nio2
jclouds.identity=local
jclouds.credential=local
jclouds.filesystem.basedir={basedir}
"""


class S3LaunchError(RuntimeError):
    """The local S3 server could not be installed or started; the message says why."""


def cache_dir() -> Path:
    return cache_root() / f"s3proxy-{S3PROXY_VERSION}"


def ensure_jars(target: Path | None = None, *, quiet: bool = True) -> Path:
    """Resolve s3proxy's jars with Maven into ``target/lib`` once; return that folder."""
    return maven_jars(POM, (target or cache_dir()) / "lib", f"s3proxy-{S3PROXY_VERSION}.jar",
                      f"s3proxy {S3PROXY_VERSION}", S3LaunchError, quiet=quiet)


def _java() -> str:
    return find_java("s3proxy", S3LaunchError)


def _answers_http(port: int) -> bool:
    """True once the server answers an HTTP request (any status: an unsigned request gets 403)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
            s.sendall(b"HEAD / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            return s.recv(12).startswith(b"HTTP/1.")
    except OSError:
        return False


@dataclass
class LocalS3(EmulatorProcess):
    """One running (or stopped) local S3 server. Buckets are folders under ``data_dir/buckets``."""

    kind = "s3"
    state_env = "LIGHTBOX_S3_STATE_FILE"
    launch_error = S3LaunchError
    pid: int
    port: int
    data_dir: str
    access_key: str
    secret_key: str
    owns_data_dir: bool = True
    buckets: list[str] = field(default_factory=list)
    started: int | None = None  # the server process's start time (lightbox.devservers.launch.process_start_time)
    name: str = "default"  # the instance key its state is kept under (lightbox.devservers.launch.instance_key)

    @property
    def endpoint(self) -> str:
        return self.url

    @property
    def log_file(self) -> Path:
        return Path(self.data_dir) / "s3proxy.log"

    def answers(self) -> bool:
        return _answers_http(self.port)

    @property
    def basedir(self) -> Path:
        return Path(self.data_dir) / "buckets"

    def env(self) -> dict[str, str]:
        """The standard AWS variables (and lightbox's endpoint) a client needs to reach this server."""
        return {"LIGHTBOX_S3_ENDPOINT": self.endpoint, "AWS_ENDPOINT_URL": self.endpoint,
                "AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_REGION": REGION, "AWS_ALLOW_HTTP": "true"}

    def create_bucket(self, name: str) -> None:
        """A bucket on the filesystem backend is a folder (an unsigned CreateBucket is refused)."""
        if not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", name):  # S3's rule (s3proxy says NoSuchBucket)
            raise S3LaunchError(f"bad bucket name {name!r}: 3-63 lower-case letters, digits, dots and hyphens")
        (self.basedir / name).mkdir(parents=True, exist_ok=True)
        if name not in self.buckets:
            self.buckets.append(name)

    @classmethod
    def start(cls, *, data_dir: str | Path | None = None, port: int | None = None,
              buckets: tuple[str, ...] = ("lightbox",), access_key: str | None = None,
              secret_key: str | None = None, heap: str = "256m", timeout_s: float = 60.0,
              name: str = "default") -> LocalS3:
        """Write the properties, start the server and return once it answers HTTP. A ``port`` that
        is taken, or a ``data_dir`` a running server of another instance holds, raises
        :class:`S3LaunchError` naming the holder."""
        lib = ensure_jars()
        owns = data_dir is None
        if port and not port_free(port):
            raise S3LaunchError(f"port {port} is taken by {holder_of_port('s3', port)}; choose another --port")
        ddir = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="lightbox-s3-"))
        ddir.mkdir(parents=True, exist_ok=True)
        with folder_lock(ddir):  # two `up` on one folder at once: the second sees the first's claim
            if data_dir is not None:
                try:
                    check_data_dir(ddir, "s3", name)
                except InstanceBusy as exc:
                    raise S3LaunchError(str(exc)) from None
            port = port or free_port()
            s3 = cls(pid=0, port=port, data_dir=str(ddir), owns_data_dir=owns, name=name,
                     access_key=access_key or f"lightbox-{secrets.token_hex(4)}",
                     secret_key=secret_key or secrets.token_urlsafe(24))
            s3.basedir.mkdir(parents=True, exist_ok=True)
            for b in buckets:
                s3.create_bucket(b)
            props = ddir / "s3proxy.conf"
            props.write_text(PROPERTIES.format(port=port, access_key=s3.access_key, secret_key=s3.secret_key,
                                               basedir=s3.basedir))
            props.chmod(0o600)
            (ddir / "logback.xml").write_text(LOGBACK)  # without one, logback logs every request at DEBUG
            with s3.log_file.open("ab") as out:
                proc = subprocess.Popen(
                    [_java(), f"-Xmx{heap}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true",
                     f"-Dlogback.configurationFile={ddir / 'logback.xml'}", "-cp", f"{lib}/*", "org.gaul.s3proxy.Main",
                     "--properties", str(props)],
                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            s3.pid, s3.started = proc.pid, process_start_time(proc.pid)
            claim_data_dir(ddir, "s3", name, s3.pid, s3.started)
        s3.wait_until_up(proc, timeout_s, "s3proxy")
        return s3


def read_state(key: str = "default") -> LocalS3 | None:
    """The server instance ``key`` (:func:`lightbox.devservers.launch.instance_key`) started, if recorded."""
    return LocalS3.read_state(key)


def clear_state(key: str = "default") -> None:
    LocalS3.clear_state(key)
