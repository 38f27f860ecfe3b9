"""A local single-node Apache Kafka (KRaft broker + controller) without Docker.

The jars come from Maven Central through the packaged ``lightbox/devservers/data/kafka-pom.xml``
into a cache folder; the broker runs as ``java -cp '<cache>/lib/*' kafka.Kafka server.properties`` on 127.0.0.1 with
free ports and a temporary data dir. Used by ``lightbox kafka up|down|status`` and by the
pytest session fixture. Imports no Kafka client: readiness is read from the broker's log and
its listening socket.

The cluster id lives with the data dir (``<data_dir>/cluster.id``), so a broker stopped or killed
(``kill``) starts again on the same folder (``restart`` or ``lightbox kafka up --data-dir D``) with
its topics, offsets and committed group offsets intact.

A fault proxy in front of the broker (:mod:`lightbox.devservers.toxiproxy_local`) must be what the broker
advertises: clients connect to the advertised address after their first request. ``proxied_port``
adds a second listener, ``PROXIED``, on a port of its own (``proxied_listen``) that advertises
``127.0.0.1:<proxied_port>``; a proxy from that port to ``proxied_listen`` then carries every
connection of the clients bootstrapped on it, while the ``PLAINTEXT`` listener stays direct (for
tools that must not see the fault).

``lightbox kafka up`` keeps what it started in a state file per instance (``--name``, else the
data folder, else ``default``; :mod:`lightbox.devservers.launch`): ``down`` stops only the process that state
started (pid and start time), and an ``up`` on a folder or port another instance holds says so.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from lightbox.devservers.kafka_secure import client_env, secure_setup
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
    same_process,
    terminate,
    wait_gone,
)

__all__ = [
    "KAFKA_VERSION",
    "KafkaLaunchError",
    "LocalKafka",
    "cache_dir",
    "clear_state",
    "cluster_id",
    "ensure_jars",
    "read_state",
]

KAFKA_VERSION = "4.4.0"
# package data, so an installed wheel can fetch Kafka too (a regular install unpacks it as a file)
POM = Path(str(resources.files("lightbox.devservers") / "data" / "kafka-pom.xml"))
READY_LINE = "Kafka Server started"


class KafkaLaunchError(RuntimeError):
    """The local broker could not be installed, formatted or started; the message says why."""


def cache_dir() -> Path:
    return cache_root() / f"kafka-{KAFKA_VERSION}"


def ensure_jars(target: Path | None = None, *, quiet: bool = True) -> Path:
    """Resolve the broker's jars with Maven into ``target/lib`` once; return that folder."""
    return maven_jars(POM, (target or cache_dir()) / "lib", f"kafka_2.13-{KAFKA_VERSION}.jar",
                      f"Kafka {KAFKA_VERSION}", KafkaLaunchError, quiet=quiet)


def _java() -> str:
    return find_java("Kafka 4.x", KafkaLaunchError)


def _previous_ports(props: Path) -> tuple[int | None, int | None]:
    """(client port, controller port) a data dir's ``server.properties`` used, if it has one."""
    try:
        text = props.read_text()
    except OSError:
        return None, None
    port = re.search(r"^advertised\.listeners=\w+://[^:,]+:(\d+)", text, re.M)
    voter = re.search(r"^controller\.quorum\.voters=\d+@[^:,]+:(\d+)", text, re.M)
    return (int(port.group(1)) if port else None), (int(voter.group(1)) if voter else None)


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


SERVER_PROPERTIES = """\
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller_port}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs={data_dir}/log
num.partitions={partitions}
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
message.max.bytes={max_message_bytes}
replica.fetch.max.bytes={max_message_bytes}
log.retention.hours=24
"""


@dataclass
class LocalKafka(EmulatorProcess):
    """One running (or stopped) local broker. ``bootstrap`` is ``127.0.0.1:<port>``."""

    kind = "kafka"
    state_env = "LIGHTBOX_STATE_FILE"
    launch_error = KafkaLaunchError
    pid: int
    port: int
    controller_port: int
    data_dir: str
    owns_data_dir: bool = True
    secure: bool = False  # a SASL_SSL listener (lightbox.devservers.kafka_secure); clients need client_env()
    proxied_port: int | None = None  # the PROXIED listener advertises this port (a fault proxy's)
    proxied_listen: int | None = None  # where the PROXIED listener listens (the proxy's upstream)
    started: int | None = None  # the broker process's start time (lightbox.devservers.launch.process_start_time)
    name: str = "default"  # the instance key its state is kept under (lightbox.devservers.launch.instance_key)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def proxied_bootstrap(self) -> str:
        """The address clients that go through the fault proxy use (the proxy's)."""
        if self.proxied_port is None:
            raise KafkaLaunchError("this broker was started without proxied_port")
        return f"127.0.0.1:{self.proxied_port}"

    @property
    def proxied_upstream(self) -> str:
        """Where the fault proxy forwards to: the PROXIED listener."""
        return f"127.0.0.1:{self.proxied_listen}"

    @classmethod
    def start(
        cls,
        *,
        data_dir: str | Path | None = None,
        port: int | None = None,
        partitions: int = 4,
        max_message_bytes: int = 20 * 1024 * 1024,
        heap: str = "512m",
        timeout_s: float = 90.0,
        secure: bool = False,
        controller_port: int | None = None,
        name: str = "default",
        proxied_port: int | None = None,
        proxied_listen: int | None = None,
    ) -> LocalKafka:
        """Format storage (keeping the data dir's cluster id) and start the broker; return once it
        accepts connections. A ``port`` that is taken, or a ``data_dir`` a running broker of another
        instance holds, raises :class:`KafkaLaunchError` naming the holder. ``proxied_port``: a
        second listener that advertises that port (a fault proxy's; see the module docstring), listening
        on ``proxied_listen`` (default: a free port)."""
        if proxied_port is not None and secure:
            raise KafkaLaunchError("a proxied listener is plain text: it cannot be combined with secure")
        lib = ensure_jars()
        owns = data_dir is None
        for p in (port, controller_port):
            if p and not port_free(p):
                raise KafkaLaunchError(f"port {p} is taken by {holder_of_port('kafka', p)}; choose another --port")
        ddir = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="lightbox-kafka-"))
        ddir.mkdir(parents=True, exist_ok=True)
        with folder_lock(ddir):  # two `up` on one folder at once: the second sees the first's claim
            try:
                check_data_dir(ddir, "kafka", name)
            except InstanceBusy as exc:
                raise KafkaLaunchError(str(exc)) from None
            # a data dir used before keeps its address when the ports are still free
            was_port, was_controller = _previous_ports(ddir / "server.properties")
            port = port or (was_port if was_port and port_free(was_port) else free_port())
            controller_port = controller_port or (
                was_controller if was_controller and port_free(was_controller) else free_port())
            props = ddir / "server.properties"
            secure_props, secure_fmt = secure_setup(ddir, port, controller_port) if secure else ("", [])
            props.touch(mode=0o600)
            props.chmod(0o600)  # the secure config holds the inter-broker password
            text = SERVER_PROPERTIES.format(port=port, controller_port=controller_port, data_dir=ddir,
                                            partitions=partitions, max_message_bytes=max_message_bytes)
            if proxied_port is not None:
                proxied_listen = proxied_listen or free_port()
                text = _with_proxied_listener(text, proxied_listen, proxied_port)
            props.write_text(text + secure_props)
            java, cp = _java(), f"{lib}/*"
            fmt = subprocess.run(
                [java, "-cp", cp, "kafka.tools.StorageTool", "format", "--ignore-formatted",
                 "-t", cluster_id(ddir), "-c", str(props), *secure_fmt],
                capture_output=True, text=True, check=False)
            if fmt.returncode != 0:
                raise KafkaLaunchError(f"kafka storage format failed: {fmt.stderr[-2000:] or fmt.stdout[-2000:]}")
            kafka = cls._launch(props, port=port, controller_port=controller_port, data_dir=ddir, owns=owns,
                                heap=heap, timeout_s=timeout_s, secure=secure, name=name)
            kafka.proxied_port, kafka.proxied_listen = proxied_port, proxied_listen
            return kafka

    @classmethod
    def _launch(cls, props: Path, *, port: int, controller_port: int, data_dir: Path, owns: bool, heap: str,
                timeout_s: float, secure: bool, name: str = "default") -> LocalKafka:
        """Run the broker on an already formatted data dir; return once it accepts connections."""
        ddir, cp = data_dir, f"{ensure_jars()}/*"
        java = _java()
        log = ddir / "kafka.log"
        seen = log.stat().st_size if log.exists() else 0  # a restart appends: look for a new ready line
        with log.open("ab") as out:
            proc = subprocess.Popen(
                [java, f"-Xmx{heap}", "-Xms128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                 "-Djava.awt.headless=true", "-Dorg.slf4j.simpleLogger.defaultLogLevel=info",
                 "-cp", cp, "kafka.Kafka", str(props)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        kafka = cls(pid=proc.pid, port=port, controller_port=controller_port,
                    data_dir=str(ddir), owns_data_dir=owns, secure=secure,
                    started=process_start_time(proc.pid), name=name)
        claim_data_dir(ddir, "kafka", name, proc.pid, kafka.started)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise KafkaLaunchError(
                    f"broker exited with {proc.returncode} during start; last log lines:\n{kafka.log_tail()}")
            if _port_open(port) and READY_LINE in _read_from(log, seen):
                return kafka
            time.sleep(0.2)
        kafka.stop()
        raise KafkaLaunchError(f"broker did not start within {timeout_s:.0f} s; log:\n{kafka.log_tail()}")

    def kill(self) -> None:
        """SIGKILL the broker, as a crash would; the data dir is kept for :meth:`restart`."""
        if not same_process(self.pid, self.started):
            return  # gone already (its pid may belong to another process by now)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        wait_gone(self.pid, 10.0)

    def restart(self, *, heap: str = "512m", timeout_s: float = 90.0) -> LocalKafka:
        """Start this broker again on its data dir, ports and properties (after :meth:`kill`,
        or a stop of a broker whose data dir was kept); stops it first if it still runs.
        Updates this object in place (new pid) and returns it."""
        if same_process(self.pid, self.started):
            terminate(self.pid, 30.0)
        props = Path(self.data_dir) / "server.properties"
        if not props.exists():
            raise KafkaLaunchError(f"nothing to restart: {props} is missing")
        new = self._launch(props, port=self.port, controller_port=self.controller_port,
                           data_dir=Path(self.data_dir), owns=self.owns_data_dir, heap=heap, timeout_s=timeout_s,
                           secure=self.secure, name=self.name)
        self.pid, self.started = new.pid, new.started
        return self

    def client_env(self) -> dict[str, str]:
        """The ``LIGHTBOX_KAFKA_*`` settings a client needs for this broker."""
        if not self.secure:
            return {"LIGHTBOX_KAFKA_BOOTSTRAP": self.bootstrap}
        return client_env(self.bootstrap, Path(self.data_dir))

    def answers(self) -> bool:
        return _port_open(self.port)

    def stop(self, timeout_s: float = 30.0) -> bool:
        """As :meth:`EmulatorProcess.stop`; Kafka shuts down cleanly on SIGTERM, given the time."""
        return super().stop(timeout_s)


def _with_proxied_listener(props: str, listen: int, advertised: int) -> str:
    """``props`` with a PROXIED listener on ``listen`` that advertises ``advertised``."""
    out = []
    for line in props.splitlines():
        if line.startswith("listeners="):
            line += f",PROXIED://127.0.0.1:{listen}"
        elif line.startswith("advertised.listeners="):
            line += f",PROXIED://127.0.0.1:{advertised}"
        elif line.startswith("listener.security.protocol.map="):
            line += ",PROXIED:PLAINTEXT"
        out.append(line)
    return "\n".join(out) + "\n"


def _read_from(path: Path, offset: int) -> str:
    with path.open("rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def cluster_id(data_dir: Path) -> str:
    """The data dir's KRaft cluster id: kept in ``cluster.id`` (or read back from a formatted log's
    ``meta.properties``); a new one is made and kept on first use."""
    kept = data_dir / "cluster.id"
    if kept.exists():
        return kept.read_text().strip()
    meta = data_dir / "log" / "meta.properties"
    found = None
    if meta.exists():
        for line in meta.read_text().splitlines():
            if line.startswith("cluster.id="):
                found = line.split("=", 1)[1].strip()
    cid = found or str(uuid.uuid4()).replace("-", "")[:22]
    kept.write_text(cid + "\n")
    return cid


def read_state(key: str = "default") -> LocalKafka | None:
    """The broker instance ``key`` (:func:`lightbox.devservers.launch.instance_key`) started, if recorded."""
    return LocalKafka.read_state(key)


def clear_state(key: str = "default") -> None:
    LocalKafka.clear_state(key)
