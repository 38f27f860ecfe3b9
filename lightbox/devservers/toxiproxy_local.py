"""A local Toxiproxy (Shopify's TCP fault proxy) without Docker, and a small client for its HTTP API.

Toxiproxy is a Go program, built once with ``go install`` (version pinned below) into a cache
folder beside Kafka's jars; it runs on 127.0.0.1 (``server -host 127.0.0.1 -port API``). Each
*proxy* listens on a port and forwards to an upstream server; *toxics* added to a proxy change
what passes: ``latency``, ``bandwidth``, ``slow_close``, ``timeout`` (a blackhole, for good with
``timeout=0``), ``reset_peer``, ``limit_data``, ``slicer``. A proxy that is disabled refuses and
drops every connection (the link is down). Used by ``lightbox toxiproxy up|down|status``, by the
network fault tests and by ``bench/bench_faults.py``.

The client (:class:`Toxiproxy`, :class:`Proxy`) speaks the documented HTTP API with the standard
library: a dozen small JSON calls do not need a dependency (the Python client on PyPI is no longer
kept).

A Kafka broker must be reached through the address it advertises, so a proxy in front of one must
*be* that address: :meth:`lightbox.devservers.kafka_local.LocalKafka.start` with ``proxied_port`` adds a
listener that advertises the proxy's port.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from lightbox.devservers.launch import (
    EmulatorProcess,
    InstanceBusy,
    cache_root,
    check_data_dir,
    claim_data_dir,
    folder_lock,
    free_port,
    holder_of_port,
    port_free,
    process_start_time,
)

__all__ = ["TOXIC_TYPES", "TOXIPROXY_VERSION", "LocalToxiproxy", "Proxy", "Toxiproxy", "ToxiproxyError",
           "ToxiproxyLaunchError", "cache_dir", "clear_state", "ensure_server", "read_state"]

TOXIPROXY_VERSION = "v2.12.0"
TOXIPROXY_MODULE = "github.com/Shopify/toxiproxy/v2/cmd/server"
#: the toxics Toxiproxy 2.12 knows, with their attributes (times in ms, rate in KB/s, delay of slicer in µs)
TOXIC_TYPES = {
    "latency": ("latency", "jitter"),
    "bandwidth": ("rate",),
    "slow_close": ("delay",),
    "timeout": ("timeout",),
    "reset_peer": ("timeout",),
    "limit_data": ("bytes",),
    "slicer": ("average_size", "size_variation", "delay"),
}
Stream = Literal["upstream", "downstream"]


class ToxiproxyLaunchError(RuntimeError):
    """Toxiproxy could not be built or started; the message says why."""


class ToxiproxyError(RuntimeError):
    """The Toxiproxy API refused a call (status and its message)."""


def cache_dir() -> Path:
    return cache_root() / f"toxiproxy-{TOXIPROXY_VERSION.lstrip('v')}"


def ensure_server(target: Path | None = None) -> Path:
    """The ``toxiproxy-server`` executable: ``$LIGHTBOX_TOXIPROXY_SERVER`` if set, else built once
    with ``go install`` into the cache (through the Go module proxy)."""
    explicit = os.environ.get("LIGHTBOX_TOXIPROXY_SERVER")
    if explicit:
        return Path(explicit)
    root = target or cache_dir()
    exe = root / "server"  # go install names it after the package folder, cmd/server
    if exe.exists():
        return exe
    go = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None)
    if go is None:
        raise ToxiproxyLaunchError("go is not on PATH: it is needed once to build Toxiproxy (Go 1.23+)")
    tmp = root.with_name(root.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    proc = subprocess.run([go, "install", f"{TOXIPROXY_MODULE}@{TOXIPROXY_VERSION}"], capture_output=True, text=True,
                          check=False, timeout=1800, env={**os.environ, "GOBIN": str(tmp)})
    if proc.returncode != 0:
        raise ToxiproxyLaunchError(f"go install {TOXIPROXY_MODULE}@{TOXIPROXY_VERSION} failed "
                                   f"(exit {proc.returncode}):\n{(proc.stderr or proc.stdout)[-2000:]}")
    shutil.rmtree(root, ignore_errors=True)
    tmp.rename(root)
    return exe


# -- the client ------------------------------------------------------------------------------------
class Toxiproxy:
    """The HTTP API of one Toxiproxy server (``url``: ``http://127.0.0.1:PORT``)."""

    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        self.url, self.timeout_s = url.rstrip("/"), timeout_s

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """One API call; the decoded JSON answer (None for an empty one). Raises :class:`ToxiproxyError`."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"{self.url}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            try:
                why = json.loads(exc.read() or b"{}").get("error", "")
            except ValueError:
                why = ""
            raise ToxiproxyError(f"toxiproxy {method} {path}: HTTP {exc.code} {why}".rstrip()) from None
        except OSError as exc:
            raise ToxiproxyError(f"toxiproxy at {self.url} does not answer ({exc})") from None
        return json.loads(raw) if raw.strip() else None

    def version(self) -> str:
        req = urllib.request.Request(f"{self.url}/version")
        with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
            raw: str = resp.read().decode().strip()
        try:  # 2.12 answers JSON ({"version": ...}); older ones plain text
            return str(json.loads(raw).get("version", raw))
        except (ValueError, AttributeError):
            return raw

    def proxies(self) -> dict[str, Proxy]:
        return {name: Proxy(self, name, p["listen"], p["upstream"], p["enabled"])
                for name, p in (self.call("GET", "/proxies") or {}).items()}

    def create(self, name: str, upstream: str, listen: str = "127.0.0.1:0", *, enabled: bool = True) -> Proxy:
        """A proxy ``name`` from ``listen`` (port 0: a free one, read back) to ``upstream``
        (``host:port``); one of that name is replaced."""
        if name in self.proxies():
            self.call("DELETE", f"/proxies/{name}")
        p = self.call("POST", "/proxies", {"name": name, "listen": listen, "upstream": upstream, "enabled": enabled})
        return Proxy(self, name, p["listen"], p["upstream"], p["enabled"])

    def get(self, name: str) -> Proxy:
        p = self.call("GET", f"/proxies/{name}")
        return Proxy(self, name, p["listen"], p["upstream"], p["enabled"])

    def delete(self, name: str) -> None:
        self.call("DELETE", f"/proxies/{name}")

    def reset(self) -> None:
        """Every proxy enabled, every toxic removed."""
        self.call("POST", "/reset")


@dataclass
class Proxy:
    """One proxy of a :class:`Toxiproxy`; ``listen`` is ``host:port``."""

    api: Toxiproxy
    name: str
    listen: str
    upstream: str
    enabled: bool = True

    @property
    def port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])

    @property
    def address(self) -> str:
        """``127.0.0.1:PORT``: what a client connects to."""
        return f"127.0.0.1:{self.port}"

    def add(self, kind: str, *, name: str | None = None, stream: Stream = "downstream", toxicity: float = 1.0,
            **attributes: int | float) -> str:
        """Add a toxic of ``kind`` (:data:`TOXIC_TYPES` names its attributes); returns its name."""
        known = TOXIC_TYPES.get(kind)
        if known is None:
            raise ValueError(f"unknown toxic {kind!r}; known: {', '.join(TOXIC_TYPES)}")
        extra = set(attributes) - set(known)
        if extra:
            raise ValueError(f"toxic {kind!r} has no attribute {sorted(extra)}; it has {list(known)}")
        toxic = name or f"{kind}_{stream}"
        self.api.call("POST", f"/proxies/{self.name}/toxics", {
            "name": toxic, "type": kind, "stream": stream, "toxicity": toxicity, "attributes": attributes})
        return toxic

    def remove(self, toxic: str) -> None:
        self.api.call("DELETE", f"/proxies/{self.name}/toxics/{toxic}")

    def toxics(self) -> list[dict[str, Any]]:
        return list(self.api.call("GET", f"/proxies/{self.name}/toxics") or [])

    def clear(self) -> None:
        """Remove every toxic of this proxy."""
        for t in self.toxics():
            self.remove(t["name"])

    def disable(self) -> None:
        """The link is down: connections are closed and new ones refused."""
        self.api.call("POST", f"/proxies/{self.name}", {"enabled": False})
        self.enabled = False

    def enable(self) -> None:
        self.api.call("POST", f"/proxies/{self.name}", {"enabled": True})
        self.enabled = True


# -- the server ------------------------------------------------------------------------------------
@dataclass
class LocalToxiproxy(EmulatorProcess):
    """One running (or stopped) Toxiproxy server; ``url`` is its API."""

    kind = "toxiproxy"
    state_env = "LIGHTBOX_TOXIPROXY_STATE_FILE"
    launch_error = ToxiproxyLaunchError
    pid: int
    port: int
    data_dir: str
    owns_data_dir: bool = True
    started: int | None = None
    name: str = "default"

    @property
    def api(self) -> Toxiproxy:
        return Toxiproxy(self.url)

    def answers(self) -> bool:
        try:
            self.api.version()
        except (OSError, ValueError):
            return False
        return True

    @classmethod
    def start(cls, *, port: int | None = None, data_dir: str | Path | None = None, timeout_s: float = 30.0,
              name: str = "default") -> LocalToxiproxy:
        """Start the server (its API on ``port``, a free one by default); return once it answers.
        A ``port`` that is taken, or a ``data_dir`` another instance holds, raises
        :class:`ToxiproxyLaunchError` naming the holder."""
        exe = ensure_server()
        if port and not port_free(port):
            raise ToxiproxyLaunchError(f"port {port} is taken by {holder_of_port('toxiproxy', port)}; "
                                       "choose another --port")
        owns = data_dir is None
        ddir = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="lightbox-toxiproxy-"))
        ddir.mkdir(parents=True, exist_ok=True)
        with folder_lock(ddir):
            if not owns:
                try:
                    check_data_dir(ddir, "toxiproxy", name)
                except InstanceBusy as exc:
                    raise ToxiproxyLaunchError(str(exc)) from None
            port = port or free_port()
            tp = cls(pid=0, port=port, data_dir=str(ddir), owns_data_dir=owns, name=name)
            with tp.log_file.open("ab") as out:
                proc = subprocess.Popen([str(exe), "-host", "127.0.0.1", "-port", str(port)], stdout=out,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            tp.pid, tp.started = proc.pid, process_start_time(proc.pid)
            claim_data_dir(ddir, "toxiproxy", name, tp.pid, tp.started)
        tp.wait_until_up(proc, timeout_s, "toxiproxy")
        return tp


def read_state(key: str = "default") -> LocalToxiproxy | None:
    """The server instance ``key`` (:func:`lightbox.devservers.launch.instance_key`) started, if recorded."""
    return LocalToxiproxy.read_state(key)


def clear_state(key: str = "default") -> None:
    LocalToxiproxy.clear_state(key)
