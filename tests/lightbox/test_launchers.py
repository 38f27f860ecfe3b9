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
