"""http(s):// fetch with SSRF guards, through urllib3.

Each hop: the host must be allow-listed; its name is resolved once and every address checked (loopback,
private, link-local, shared, reserved: refused unless the host is named exactly in the allow-list; cloud
metadata: always refused); the connection goes to the checked address (the name is used for the Host
header, SNI and certificate check), so a second DNS answer cannot steer it elsewhere. Redirects are
followed by hand, at most ``max_redirects``, each hop checked again. Transient failures (connect errors,
timeouts, 429, 5xx) are retried with exponential backoff and jitter; the body is read through the byte
limit and a whole-fetch deadline.

obstore's HTTP store is not used here: it follows redirects inside the client (no hop can be checked),
resolves names itself (no pinning to a checked address) and escapes ``?`` into the path.
"""

from __future__ import annotations

import ipaddress
import random
import socket
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urljoin, urlsplit

from blobio.fetch.errors import fetch_error, show_uri
from blobio.fetch.policy import FetchPolicy, IPAddress, address_refusal

__all__ = ["Resolver", "fetch_http", "system_resolver"]

Resolver = Callable[[str, int], list[IPAddress]]
CHUNK = 256 << 10
USER_AGENT = "lightbox-fetch/1"


def system_resolver(host: str, port: int) -> list[IPAddress]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(ipaddress.ip_address(info[4][0]) for info in infos))


def _resolve(host: str, port: int, shown: str, resolver: Resolver) -> list[IPAddress]:
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    try:
        addrs = resolver(host, port)
    except (OSError, UnicodeError):
        raise fetch_error("unreachable", f"{shown}: host name does not resolve") from None
    if not addrs:
        raise fetch_error("unreachable", f"{shown}: host name does not resolve")
    return addrs


def _checked_address(url: str, policy: FetchPolicy, resolver: Resolver) -> tuple[str, str, int, IPAddress]:
    """(scheme, host, port, address to dial) for one hop, or FETCH_FAILED if the policy refuses it."""
    shown = show_uri(url)
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise fetch_error("malformed", f"{shown} is not a valid URL") from None
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower().rstrip(".")
    if scheme not in ("http", "https") or not host:
        raise fetch_error("malformed", f"{shown} is not an http(s) URL with a host")
    if parts.username or parts.password:
        raise fetch_error("denied", f"{shown}: credentials in URLs are refused")
    allowed, exact = policy.host_rule(scheme, host, port)
    if not allowed:
        raise fetch_error("denied", f"{shown}: host {host!r} is not in the fetch allow-list (LIGHTBOX_FETCH_ALLOW)")
    addrs = _resolve(host, port, shown, resolver)
    for ip in addrs:  # every answer, so a mixed answer cannot smuggle a private address in
        why = address_refusal(ip)
        if why == "a cloud metadata address" or (why is not None and not exact):
            raise fetch_error("denied", f"{shown}: {host!r} resolves to {why} ({ip})")
    return scheme, host, port, addrs[0]


class _Transient(Exception):
    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def _one_request(url: str, scheme: str, host: str, port: int, ip: IPAddress, policy: FetchPolicy,
                 deadline: float) -> tuple[int, str | None, bytes]:
    """(status, Location, body) for one GET to the pinned address; body only for 2xx."""
    import urllib3  # here, not at the top: every worker and `process` imports this module, few fetch http
    from urllib3.exceptions import HTTPError, MaxRetryError, NewConnectionError, ProtocolError, SSLError
    from urllib3.exceptions import TimeoutError as Urllib3Timeout

    shown = show_uri(url)
    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    default_port = 443 if scheme == "https" else 80
    literal = f"[{host}]" if ":" in host else host  # an IPv6 literal keeps its brackets in Host
    host_header = literal if port == default_port else f"{literal}:{port}"
    timeout = urllib3.Timeout(connect=policy.connect_timeout_s,
                              read=max(0.1, min(policy.timeout_s, deadline - time.monotonic())))
    kw: dict[str, Any] = {"timeout": timeout, "retries": False, "maxsize": 1}
    pool: urllib3.HTTPConnectionPool
    if scheme == "https":
        pool = urllib3.HTTPSConnectionPool(str(ip), port, server_hostname=host, assert_hostname=host,
                                           cert_reqs="CERT_REQUIRED", ca_certs=policy.ca_file, **kw)
    else:
        pool = urllib3.HTTPConnectionPool(str(ip), port, **kw)
    try:
        resp = pool.urlopen("GET", target, headers={"Host": host_header, "User-Agent": USER_AGENT,
                                                    "Accept": "image/*,*/*;q=0.5"},
                            redirect=False, preload_content=False, retries=False, assert_same_host=False)
        try:
            status = resp.status
            if 300 <= status < 400:
                return status, resp.headers.get("Location"), b""
            if status == 429 or status >= 500:
                raise _Transient("server error", f"HTTP {status}")
            if status in (404, 410):
                raise fetch_error("not found", f"{shown} (HTTP {status})")
            if status in (401, 403):
                raise fetch_error("denied", f"{shown} (HTTP {status})")
            if not 200 <= status < 300:
                raise fetch_error("server error", f"{shown} (HTTP {status})")
            declared = resp.headers.get("Content-Length", "")
            if declared.isdigit() and int(declared) > policy.max_bytes:
                raise fetch_error("too large", f"{shown} is {declared} bytes, over the {policy.max_bytes}-byte limit")
            chunks, total = [], 0
            for chunk in resp.stream(CHUNK, decode_content=True):
                total += len(chunk)
                if total > policy.max_bytes:
                    raise fetch_error("too large", f"{shown} sent more than the {policy.max_bytes}-byte limit")
                if time.monotonic() > deadline:
                    raise _Transient("timeout", f"body not complete within {policy.timeout_s:g} s")
                chunks.append(chunk)
            return status, None, b"".join(chunks)
        finally:
            resp.release_conn()
            resp.close()
    except (NewConnectionError, ProtocolError, MaxRetryError, ConnectionError) as exc:  # before timeouts:
        raise _Transient("unreachable", type(exc).__name__) from None  # NewConnectionError subclasses one
    except (TimeoutError, Urllib3Timeout) as exc:
        raise _Transient("timeout", type(exc).__name__) from None
    except SSLError:
        raise fetch_error("denied", f"{shown}: TLS verification failed for {host!r}") from None
    except HTTPError as exc:
        raise fetch_error("server error", f"{shown} ({type(exc).__name__})") from None
    finally:
        pool.close()


def fetch_http(url: str, policy: FetchPolicy, resolver: Resolver = system_resolver,
               sleep: Callable[[float], None] = time.sleep) -> bytes:
    deadline = time.monotonic() + policy.timeout_s * (policy.retries + 1)
    hops = 0
    while True:
        scheme, host, port, ip = _checked_address(url, policy, resolver)
        attempt = 0
        while True:
            try:
                status, location, body = _one_request(url, scheme, host, port, ip, policy, deadline)
                break
            except _Transient as exc:
                if attempt >= policy.retries or time.monotonic() >= deadline:
                    raise fetch_error(exc.reason, f"{show_uri(url)} ({exc}) after {attempt + 1} attempts"  # type: ignore[arg-type]
                                      ) from None
                sleep(min(5.0, policy.backoff_s * 2 ** attempt) * random.uniform(0.5, 1.0))
                attempt += 1
        if location is None:
            if 300 <= status < 400:
                raise fetch_error("server error", f"{show_uri(url)}: HTTP {status} without a Location")
            return body
        hops += 1
        if hops > policy.max_redirects:
            raise fetch_error("denied", f"{show_uri(url)}: more than {policy.max_redirects} redirects")
        nxt = urljoin(url, location)
        if scheme == "https" and not nxt.lower().startswith("https://"):
            raise fetch_error("denied", f"{show_uri(url)}: redirect from https to {show_uri(nxt)}")
        url = nxt
