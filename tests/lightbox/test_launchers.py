"""Local launchers that cannot step on each other: `lightbox kafka up/down/status` keep one state
per instance (--name, else the data folder), `down` stops only the process its own state started
(pid and start time checked), and an `up` on a port or folder another instance holds says who."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from lightbox.devservers.launch import instance_key, process_start_time, same_process, states

Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cli]:
    monkeypatch.setenv("LIGHTBOX_STATE_DIR", str(tmp_path / "state"))
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("LIGHTBOX_STATE_FILE", None)
    env.pop("LIGHTBOX_KAFKA_BOOTSTRAP", None)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "lightbox.cli", *args], env=env, capture_output=True,
                              text=True, timeout=180)

    yield run
    for key in ("a", "b", "x"):  # whatever a failed test left running
        run("kafka", "down", "--name", key)


def _port(out: str) -> int:
    return int(out.split("127.0.0.1:")[1].split()[0])


@pytest.mark.kafka
@pytest.mark.slow
def test_two_launchers_at_once_keep_their_own_brokers(cli: Cli, tmp_path: Path) -> None:
    with ThreadPoolExecutor(2) as pool:  # two tools starting their brokers at the same moment
        up_a, up_b = pool.map(lambda n: cli("kafka", "up", "--name", n), ["a", "b"])
    assert up_a.returncode == 0 and up_b.returncode == 0, up_a.stderr + up_b.stderr
    port_a, port_b = _port(up_a.stdout), _port(up_b.stdout)
    assert port_a != port_b and "instance 'a'" in up_a.stdout
    st_a = json.loads((tmp_path / "state" / "kafka-a.json").read_text())
    st_b = json.loads((tmp_path / "state" / "kafka-b.json").read_text())
    assert st_a["pid"] != st_b["pid"] and st_a["started"] == process_start_time(st_a["pid"])

    # a's port is taken: the message names the instance that holds it
    clash = cli("kafka", "up", "--name", "x", "--port", str(port_a))
    assert clash.returncode == 1 and f"port {port_a} is taken by the local kafka instance 'a'" in clash.stderr

    down_a = cli("kafka", "down", "--name", "a")
    assert down_a.returncode == 0 and "stopped Kafka" in down_a.stdout
    assert not same_process(st_a["pid"], st_a["started"])
    status_b = cli("kafka", "status", "--name", "b")  # b never noticed
    assert status_b.returncode == 0 and f"127.0.0.1:{port_b}" in status_b.stdout
    with socket.create_connection(("127.0.0.1", port_b), timeout=5):
        pass
    # no name, no folder: the default instance, which nobody started here
    none = cli("kafka", "down")
    assert "no local broker recorded for instance 'default'" in none.stdout and "b" in none.stdout
    assert same_process(st_b["pid"], st_b["started"])
    assert cli("kafka", "down", "--name", "b").returncode == 0
    assert not same_process(st_b["pid"], st_b["started"])


@pytest.mark.kafka
@pytest.mark.slow
def test_a_data_folder_in_use_is_refused_with_its_holder(cli: Cli, tmp_path: Path) -> None:
    data = tmp_path / "kafka-data"
    key = instance_key(None, data)
    with ThreadPoolExecutor(2) as pool:  # two launchers on one folder at the same moment
        first, second = pool.map(lambda args: cli("kafka", "up", "--data-dir", str(data), *args), [[], ["--name", "x"]])
    assert sorted([first.returncode, second.returncode]) == [0, 1], first.stderr + second.stderr
    won, lost = ("x", key) if second.returncode == 0 else (key, "x")
    refused = first if first.returncode else second
    assert f"in use by the local kafka instance {won!r}" in refused.stderr, refused.stderr
    assert lost not in states("kafka") and won in states("kafka")
    again = cli("kafka", "up", "--data-dir", str(data), *(["--name", "x"] if won == "x" else []))
    assert again.returncode == 0 and "already running" in again.stdout  # the same instance: found
    down = cli("kafka", "down", *(["--name", "x"] if won == "x" else ["--data-dir", str(data)]))
    assert down.returncode == 0 and "stopped Kafka" in down.stdout
    assert not (data / ".lightbox-instance.json").exists()
    # the folder is free again: the other instance may use it now
    other = cli("kafka", "up", "--data-dir", str(data), *(["--name", "x"] if won != "x" else []))
    assert other.returncode == 0, other.stderr
    assert cli("kafka", "down", *(["--name", "x"] if won != "x" else ["--data-dir", str(data)])).returncode == 0


@pytest.mark.parametrize(("command", "kind", "extra"), [
    ("kafka", "kafka", {"controller_port": 2}), ("s3", "s3", {"access_key": "k", "secret_key": "s"}),
    ("azure", "azurite", {"account": "a", "key": "k"}), ("gcs", "gcs", {})])
def test_down_never_signals_a_process_that_reused_the_pid(cli: Cli, tmp_path: Path, command: str, kind: str,
                                                          extra: dict[str, object]) -> None:
    """A recorded pid now belongs to another process (another start time): `down` leaves it alone,
    for the broker, s3proxy and both emulators alike, and `status` says the instance is not running."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        started = process_start_time(other.pid)
        assert started is not None
        state = {"pid": other.pid, "port": 1, "data_dir": str(tmp_path / "gone"), "owns_data_dir": False,
                 "started": started - 1, "name": "a", **extra}
        (tmp_path / "state").mkdir()
        (tmp_path / "state" / f"{kind}-a.json").write_text(json.dumps(state))
        status = cli(command, "status", "--name", "a")
        assert status.returncode == 1 and "not running (instance 'a')" in status.stdout, status.stdout
        down = cli(command, "down", "--name", "a")
        assert down.returncode == 0 and "no longer running; nothing signalled" in down.stdout, down.stdout
        assert other.poll() is None  # still running
        assert not (tmp_path / "state" / f"{kind}-a.json").exists()
        again = cli(command, "down", "--name", "a")
        assert again.returncode == 0 and "recorded for instance 'a'" in again.stdout, again.stdout
    finally:
        other.kill()
        other.wait()


def test_instance_names_are_checked() -> None:
    assert instance_key("my-tool_1", "/x") == "my-tool_1"
    assert instance_key(None, "/x") == instance_key(None, "/x/../x") != instance_key(None, "/y")
    assert instance_key(None, None) == "default"
    with pytest.raises(ValueError, match="bad instance name"):
        instance_key("../etc", None)


def _time_wait_on(port: int) -> int:
    """Connections in TIME_WAIT (state 06) whose local port is ``port`` (Java's sockets are IPv6 ones
    with IPv4-mapped addresses: /proc/net/tcp6 too)."""
    rows = [r.split() for f in ("tcp", "tcp6") for r in Path(f"/proc/net/{f}").read_text().splitlines()[1:]]
    return sum(1 for r in rows if r[3] == "06" and int(r[1].rsplit(":", 1)[1], 16) == port)


@pytest.mark.kafka
@pytest.mark.slow
def test_a_killed_broker_with_clients_starts_again_on_its_port_and_data(cli: Cli, tmp_path: Path) -> None:
    """SIGKILL a broker while a producer is connected: the kill leaves the broker's side of those
    connections in TIME_WAIT on its port. `kafka up --port P --data-dir D` starts it again there,
    with the records it had."""
    import asyncio
    import contextlib
    import time

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    from lightbox.devservers.launch import free_port

    data, port = tmp_path / "kafka-data", free_port()
    up = cli("kafka", "up", "--port", str(port), "--data-dir", str(data))
    assert up.returncode == 0, up.stderr
    state = json.loads((tmp_path / "state" / f"kafka-{instance_key(None, data)}.json").read_text())

    async def produce_then_kill() -> None:
        prod = AIOKafkaProducer(bootstrap_servers=f"127.0.0.1:{port}", acks="all")
        await prod.start()
        await asyncio.gather(*[await prod.send("kept", b"r%d" % i, partition=0) for i in range(3)])
        os.kill(state["pid"], 9)  # a crash, with the producer connected
        for _ in range(100):  # the producer sees the connection end and closes its side
            if _time_wait_on(port):
                break
            await asyncio.sleep(0.1)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(prod.stop(), 10)

    asyncio.run(produce_then_kill())
    deadline = time.monotonic() + 10
    while same_process(state["pid"], state["started"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _time_wait_on(port) > 0, "the kill left no TIME_WAIT on the broker's port: the case is not exercised"
    again = cli("kafka", "up", "--port", str(port), "--data-dir", str(data))
    assert again.returncode == 0, again.stderr
    assert f"127.0.0.1:{port}" in again.stdout

    async def read_back() -> list[bytes]:
        cons = AIOKafkaConsumer("kept", bootstrap_servers=f"127.0.0.1:{port}", auto_offset_reset="earliest",
                                enable_auto_commit=False)
        await cons.start()
        try:
            seen: list[bytes] = []
            for _ in range(20):
                got = await cons.getmany(timeout_ms=1000, max_records=10)
                seen += [r.value for rs in got.values() for r in rs if r.value is not None]
                if len(seen) >= 3:
                    break
            return seen
        finally:
            await cons.stop()

    try:
        assert sorted(asyncio.run(read_back())) == [b"r0", b"r1", b"r2"]
    finally:
        assert cli("kafka", "down", "--data-dir", str(data)).returncode == 0


def test_toxiproxy_up_proxy_toxic_link_and_down(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`lightbox toxiproxy`: a proxy in front of a TCP echo server, a latency toxic that delays it,
    a link taken down (refused) and up again, a toxic it does not know refused with the list, `down`."""
    import threading
    import time

    from typer.testing import CliRunner

    from lightbox.cli import app

    monkeypatch.setenv("LIGHTBOX_STATE_DIR", str(tmp_path / "state"))
    runner = CliRunner()

    def cli(*args: str) -> Any:
        return runner.invoke(app, list(args), env={"COLUMNS": "200"})

    echo = socket.create_server(("127.0.0.1", 0))
    upstream = echo.getsockname()[1]

    def serve() -> None:
        while True:
            try:
                conn, _ = echo.accept()
            except OSError:
                return
            with conn:
                conn.sendall(conn.recv(16))

    threading.Thread(target=serve, daemon=True).start()

    def roundtrip(port: int) -> float:
        t0 = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
            c.sendall(b"ping")
            assert c.recv(16) == b"ping"
        return time.monotonic() - t0

    try:
        up = cli("toxiproxy", "up", "--name", "x")
        assert up.exit_code == 0 and "Toxiproxy API at" in up.stdout, up.output
        made = cli("toxiproxy", "proxy", "web", "--upstream", f"127.0.0.1:{upstream}", "--name", "x")
        assert made.exit_code == 0, made.output
        port = int(made.stdout.split("127.0.0.1:")[1].split()[0])
        assert roundtrip(port) < 0.3
        slow = cli("toxiproxy", "toxic", "web", "latency", "-a", "latency=400", "--name", "x")
        assert slow.exit_code == 0 and "latency_downstream" in slow.stdout, slow.output
        assert roundtrip(port) >= 0.4
        assert cli("toxiproxy", "clear", "web", "--name", "x").exit_code == 0
        assert cli("toxiproxy", "link", "web", "down", "--name", "x").exit_code == 0
        with pytest.raises(ConnectionRefusedError):
            roundtrip(port)
        status = cli("toxiproxy", "status", "--name", "x")
        assert status.exit_code == 0 and "web" in status.stdout and "(down)" in status.stdout, status.stdout
        assert cli("toxiproxy", "link", "web", "up", "--name", "x").exit_code == 0
        assert roundtrip(port) < 0.3
        bogus = cli("toxiproxy", "toxic", "web", "bogus", "--name", "x")
        assert bogus.exit_code == 1 and "unknown toxic 'bogus'" in bogus.output and "limit_data" in bogus.output
    finally:
        assert cli("toxiproxy", "down", "--name", "x").exit_code == 0
        echo.close()
    assert cli("toxiproxy", "status", "--name", "x").exit_code == 1
