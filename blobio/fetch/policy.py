"""What a worker may fetch: file roots, allow-listed hosts and buckets, addresses it never dials. Pure.

Closed by default: with an empty policy only inline bytes pass. ``allow`` entries:

    s3://bucket  gs://bucket  az://container     one bucket (``s3://*``: any bucket of that store)
    cdn.example.com  cdn.example.com:8443        one http(s) host (any port / that port)
    https://cdn.example.com                      that host over https only
    *.example.com                                any subdomain of example.com (public addresses only)
    *                                            any host with public addresses

A host whose name or address resolves to a loopback, private, link-local, shared or reserved address is
refused unless it is named exactly (not through ``*``). Cloud metadata addresses are refused always.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field, replace
from pathlib import Path

__all__ = [
    "METADATA_ADDRESSES",
    "FetchPolicy",
    "address_refusal",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Instance metadata services: AWS/GCP/Azure/OpenStack, AWS over IPv6, Alibaba, Oracle.
METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254", "fd00:ec2::254", "100.100.100.200", "192.0.0.192", "169.254.170.2"))
BUCKET_SCHEMES = ("s3", "gs", "az")


def address_refusal(ip: IPAddress) -> str | None:
    """Why a worker must not dial ``ip`` unless its host is allow-listed by name; None for public ones."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip in METADATA_ADDRESSES:
        return "a cloud metadata address"
    for attr, why in (("is_loopback", "loopback"), ("is_link_local", "link-local"), ("is_multicast", "multicast"),
                      ("is_unspecified", "unspecified"), ("is_private", "private"), ("is_reserved", "reserved")):
        if getattr(ip, attr):
            return f"a {why} address"
    if not ip.is_global:
        return "not a public address"
    return None


@dataclass(frozen=True, slots=True)
class _HostRule:
    scheme: str | None  # "http" / "https" or None for both
    host: str           # lower-case; "*" or "*.suffix" for wildcards
    port: int | None

    @property
    def exact(self) -> bool:
        return not self.host.startswith("*")

    def matches(self, scheme: str, host: str, port: int) -> bool:
        if self.scheme is not None and self.scheme != scheme:
            return False
        if self.port is not None and self.port != port:
            return False
        if self.host == "*":
            return True
        if self.host.startswith("*."):
            return host.endswith(self.host[1:]) and host != self.host[2:]
        return host == self.host


def _host_rule(entry: str) -> _HostRule:
    scheme = None
    if "://" in entry:
        scheme, _, entry = entry.partition("://")
        scheme = scheme.lower()
        if scheme not in ("http", "https"):
            raise ValueError(f"allow-list entry {entry!r}: scheme must be http, https, s3, gs or az")
    entry = entry.rstrip("/")
    host, port = entry, None
    if entry.startswith("["):  # [v6]:port
        host, _, rest = entry[1:].partition("]")
        port = int(rest[1:]) if rest.startswith(":") else None
    elif entry.count(":") == 1:
        host, _, p = entry.partition(":")
        port = int(p)
    if not host or "/" in host:
        raise ValueError(f"allow-list entry {entry!r} is not a host, host:port or *.domain")
    return _HostRule(scheme, host.lower(), port)


@dataclass(frozen=True)
class FetchPolicy:
    """Limits and allow-lists for one worker's fetches (built once from settings)."""

    max_bytes: int
    file_roots: tuple[Path, ...] = ()
    allow: tuple[str, ...] = ()
    timeout_s: float = 30.0          # whole request, body included
    connect_timeout_s: float = 5.0
    retries: int = 3                 # extra attempts after transient failures (5xx, 429, resets, timeouts)
    backoff_s: float = 0.2           # first backoff; doubles per retry, with jitter, capped at 5 s
    max_redirects: int = 3
    s3_endpoint: str | None = None   # an S3-compatible endpoint (s3proxy, MinIO); AWS's otherwise
    ca_file: str | None = None       # CA bundle for https:// fetches; the system trust store otherwise
    _hosts: tuple[_HostRule, ...] = field(init=False, repr=False, compare=False)
    _buckets: frozenset[tuple[str, str]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        hosts, buckets = [], set()
        for entry in self.allow:
            scheme, sep, rest = entry.partition("://")
            if sep and scheme.lower() in BUCKET_SCHEMES:
                bucket = rest.strip("/")
                if not bucket or "/" in bucket:
                    raise ValueError(f"allow-list entry {entry!r}: name one bucket, e.g. s3://images")
                buckets.add((scheme.lower(), bucket))
            else:
                hosts.append(_host_rule(entry))
        object.__setattr__(self, "_hosts", tuple(hosts))
        object.__setattr__(self, "_buckets", frozenset(buckets))
        object.__setattr__(self, "file_roots", tuple(Path(r) for r in self.file_roots))

    def allows_bucket(self, scheme: str, bucket: str) -> bool:
        return (scheme, bucket) in self._buckets or (scheme, "*") in self._buckets

    def host_rule(self, scheme: str, host: str, port: int) -> tuple[bool, bool]:
        """(allowed at all, named exactly): only an exact entry lets a host reach non-public addresses."""
        host = host.lower().rstrip(".")
        hits = [r for r in self._hosts if r.matches(scheme, host, port)]
        return bool(hits), any(r.exact for r in hits)

    def with_allowed(self, *entries: str) -> FetchPolicy:
        """This policy plus ``entries`` (e.g. the output store's own bucket, for ``tail --save``)."""
        return replace(self, allow=(*self.allow, *entries))

