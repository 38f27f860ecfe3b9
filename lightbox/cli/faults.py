"""``lightbox toxiproxy up|down|status|proxy|toxic|clear|link``: a local Toxiproxy, the TCP fault
proxy that goes between a worker and the servers it talks to (:mod:`lightbox.devservers.toxiproxy_local`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from lightbox.cli.common import console, err
from lightbox.cli.servers import DataDirOption, InstanceName, _down, _instance, _status, _up

MODULE = "lightbox.devservers.toxiproxy_local"

toxiproxy_app = typer.Typer(
    help="A local Toxiproxy (a TCP fault proxy) for fault tests: put a proxy between a worker and Kafka, S3 or "
         "an HTTP origin, then add latency, a bandwidth cap, resets, a blackhole or a cut link. Built once with "
         "`go install`; no Docker.", no_args_is_help=True)

InstanceOnly = Annotated[str | None, typer.Option("--name", help="the Toxiproxy instance (default: 'default')")]


def _api(name: str | None) -> Any:
    from lightbox.devservers.toxiproxy_local import read_state

    key = _instance(name, None)
    state = read_state(key)
    if state is None or not state.alive():
        err.print(f"[red]no local Toxiproxy running for instance {key!r}:[/] start one with `lightbox toxiproxy up`")
        raise typer.Exit(1)
    return state.api


def _call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    from lightbox.devservers.toxiproxy_local import ToxiproxyError

    try:
        return fn(*args, **kwargs)
    except (ToxiproxyError, ValueError) as exc:
        err.print(f"[red]{exc}[/]")
        raise typer.Exit(1) from None


@toxiproxy_app.command("up")
def up(port: Annotated[int | None, typer.Option(help="the API port (default: a free one)")] = None,
       data_dir: Annotated[Path | None, typer.Option(help="folder for its log (default: a new temporary one, "
                                                          "removed by `down`)")] = None,
       name: InstanceName = None) -> None:
    """Build Toxiproxy with `go install` (once) and start its server on 127.0.0.1 in the background.
    Then make proxies with `lightbox toxiproxy proxy` and faults with `lightbox toxiproxy toxic`."""
    from lightbox.devservers.toxiproxy_local import LocalToxiproxy

    key = _instance(name, data_dir)
    up = _up(MODULE, key, lambda state: state.url, "starting Toxiproxy (the first run builds it with go install)…",
             "toxiproxy", lambda: LocalToxiproxy.start(port=port, data_dir=data_dir, name=key))
    if up is None:
        return
    server, took = up
    console.print(f"Toxiproxy API at [bold]{server.url}[/] in {took:.1f} s (pid {server.pid}, "
                  f"instance {key!r}, log {server.log_file})")


@toxiproxy_app.command("down")
def down(name: InstanceName = None, data_dir: DataDirOption = None) -> None:
    """Stop the Toxiproxy this instance's `up` started (every proxy goes with it)."""
    _down("toxiproxy", MODULE, _instance(name, data_dir), "Toxiproxy", "Toxiproxy")


@toxiproxy_app.command("status")
def status(name: InstanceName = None, data_dir: DataDirOption = None) -> None:
    """Say whether the local Toxiproxy runs, where, and its proxies. Exit code 1 when it does not."""
    _status("toxiproxy", MODULE, _instance(name, data_dir), lambda s: s.url,
            lambda s: "proxies: " + (", ".join(f"{p.name} {p.listen}->{p.upstream}"
                                               f"{'' if p.enabled else ' (down)'}"
                                               for p in s.api.proxies().values()) or "none"))


@toxiproxy_app.command("proxy")
def proxy(proxy_name: Annotated[str, typer.Argument(help="the proxy's name")],
          upstream: Annotated[str, typer.Option(help="host:port of the server behind it")],
          listen: Annotated[str, typer.Option(help="host:port it listens on (port 0: a free one)")] = "127.0.0.1:0",
          name: InstanceOnly = None) -> None:
    """Make (or replace) a proxy from LISTEN to UPSTREAM; clients then connect to LISTEN. For a Kafka
    broker, LISTEN must be the address the broker advertises."""
    p = _call(_api(name).create, proxy_name, upstream, listen)
    console.print(f"proxy {p.name}: {p.listen} -> {p.upstream}")


@toxiproxy_app.command("toxic")
def toxic(proxy_name: Annotated[str, typer.Argument(help="the proxy")],
          kind: Annotated[str, typer.Argument(help="latency, bandwidth, slow_close, timeout, reset_peer, "
                                                   "limit_data or slicer")],
          attribute: Annotated[list[str] | None, typer.Option(
              "--attr", "-a", help="NAME=NUMBER, repeatable: latency=500 jitter=200 (ms), rate=32 (KB/s), "
                                   "timeout=0 (ms; 0: for good), bytes=100000, delay=…")] = None,
          stream: Annotated[str, typer.Option(help="downstream (server to client) or upstream")] = "downstream",
          name: InstanceOnly = None) -> None:
    """Add a fault to a proxy's traffic; `lightbox toxiproxy clear PROXY` removes it."""
    attrs: dict[str, int | float] = {}
    for a in attribute or []:
        key, sep, value = a.partition("=")
        try:
            attrs[key] = float(value) if "." in value else int(value)
        except ValueError:
            sep = ""
        if not sep:
            err.print(f"[red]bad --attr {a!r}:[/] expected NAME=NUMBER")
            raise typer.Exit(2)
    if stream not in ("upstream", "downstream"):
        err.print("[red]--stream is upstream or downstream[/]")
        raise typer.Exit(2)
    p = _call(_api(name).get, proxy_name)
    added = _call(p.add, kind, stream=stream, **attrs)
    console.print(f"proxy {proxy_name}: toxic {added} ({kind} {attrs}, {stream})")


@toxiproxy_app.command("clear")
def clear(proxy_name: Annotated[str, typer.Argument(help="the proxy")], name: InstanceOnly = None) -> None:
    """Remove every toxic of a proxy (the link is healed)."""
    _call(_call(_api(name).get, proxy_name).clear)
    console.print(f"proxy {proxy_name}: no toxics")


@toxiproxy_app.command("link")
def link(proxy_name: Annotated[str, typer.Argument(help="the proxy")],
         state: Annotated[str, typer.Argument(help="down (connections cut, new ones refused) or up")],
         name: InstanceOnly = None) -> None:
    """Take a proxy's link down or bring it up again."""
    if state not in ("up", "down"):
        err.print("[red]the link is up or down[/]")
        raise typer.Exit(2)
    p = _call(_api(name).get, proxy_name)
    _call(p.enable if state == "up" else p.disable)
    console.print(f"proxy {proxy_name}: link {state}")
