"""Fetch, closed by default: each probe of the security review, SSRF guards against a real HTTP origin
in a thread, and s3:// against the test run's real S3 server (s3proxy)."""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import obstore
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blobio.fetch import Fetcher, FetchPolicy, fetch_source
from blobio.fetch.policy import IPAddress
from schemas.errors import FetchFailed, LightboxError, TooLarge

SECRET = b"root:*:19000:0:99999:7:::\nsecret-token-abc\n"
JPEG_ISH = b"\xff\xd8\xff\xe0" + b"\x00" * 2000


def fetcher(*, roots: tuple[Path, ...] = (), allow: tuple[str, ...] = (), max_bytes: int = 1 << 20,
            resolver: Callable[[str, int], list[IPAddress]] | None = None, **kw: Any) -> Fetcher:
    policy = FetchPolicy(max_bytes=max_bytes, file_roots=roots, allow=allow, **kw)
    return Fetcher(policy, resolver=resolver) if resolver else Fetcher(policy)


def refused(f: Fetcher, uri: str, reason: str, **source: Any) -> FetchFailed:
    with pytest.raises(FetchFailed) as info:
        f.fetch({"uri": uri, **source})
    exc = info.value
    assert exc.code == "FETCH_FAILED" and exc.stage == "fetch"
    assert exc.message.startswith(f"{reason}:"), exc.message
    assert b"secret-token" not in exc.message.encode() and "root:*" not in exc.message
    return exc


# ------------------------------------------------------------------------------ file://
@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    root = tmp_path / "root"
    root.mkdir()
    (root / "ok.jpg").write_bytes(JPEG_ISH)
    outside = tmp_path / "etc"
    outside.mkdir()
    (outside / "shadow").write_bytes(SECRET)
    (root / "escape.jpg").symlink_to(outside / "shadow")
    (root / "inside-link.jpg").symlink_to(root / "ok.jpg")
    (root / "sub").mkdir()
    return {"root": root, "outside": outside}


def test_file_uris_are_refused_without_roots(tree: dict[str, Path]) -> None:
    refused(fetcher(), (tree["root"] / "ok.jpg").as_uri(), "denied")
    refused(fetcher(), "file:///etc/passwd", "denied")


def test_file_under_a_root_is_read(tree: dict[str, Path]) -> None:
    f = fetcher(roots=(tree["root"],))
    assert f.fetch({"uri": (tree["root"] / "ok.jpg").as_uri()}) == JPEG_ISH
    assert f.fetch({"uri": "file://localhost" + str(tree["root"] / "ok.jpg")}) == JPEG_ISH
    assert f.fetch({"uri": (tree["root"] / "inside-link.jpg").as_uri()}) == JPEG_ISH


def test_shadow_like_file_outside_the_roots_is_refused_without_quoting_it(tree: dict[str, Path]) -> None:
    f = fetcher(roots=(tree["root"],))
    refused(f, (tree["outside"] / "shadow").as_uri(), "denied")
    refused(f, (tree["root"] / "escape.jpg").as_uri(), "denied")  # symlink escaping the root
    refused(f, f"file://{tree['root']}/../etc/shadow", "denied")


def test_devices_proc_and_sys_are_never_read(tree: dict[str, Path]) -> None:
    f = fetcher(roots=(Path("/"),), max_bytes=1 << 16)
    for uri in ("file:///dev/zero", "file:///dev/urandom", "file:///proc/self/environ", "file:///sys/kernel/uevent_seqnum"):
        refused(f, uri, "denied")
    # a device reached through a symlink inside a root is still a device
    link = tree["root"] / "zero.jpg"
    link.symlink_to("/dev/zero")
    refused(fetcher(roots=(tree["root"], Path("/dev"))), link.as_uri(), "denied")


@pytest.mark.timeout(20)
def test_fifo_socket_and_folder_are_refused_without_hanging(tree: dict[str, Path]) -> None:
    root = tree["root"]
    os.mkfifo(root / "pipe.jpg")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(root / "sock.jpg"))
    try:
        f = fetcher(roots=(root,))
        assert "FIFO" in refused(f, (root / "pipe.jpg").as_uri(), "denied").message
        assert "socket" in refused(f, (root / "sock.jpg").as_uri(), "denied").message
        assert "folder" in refused(f, (root / "sub").as_uri(), "denied").message
    finally:
        sock.close()


def test_a_file_is_read_through_the_byte_limit(tree: dict[str, Path]) -> None:
    f = fetcher(roots=(tree["root"],), max_bytes=1000)
    refused(f, (tree["root"] / "ok.jpg").as_uri(), "too large")
    assert fetcher(roots=(tree["root"],), max_bytes=len(JPEG_ISH)).fetch(
        {"uri": (tree["root"] / "ok.jpg").as_uri()}) == JPEG_ISH


@pytest.mark.parametrize("uri, reason", [
    ("file://somehost/{root}/ok.jpg", "denied"),
    ("file://{root}/ok%00.jpg", "malformed"),
    ("file://{root}/ok.jpg%00", "malformed"),
    ("file://{root}/%ff%fe.jpg", "malformed"),
    ("file://{root}/a b.jpg", "malformed"),
    ("file://{root}/ok.jpg\n", "malformed"),
    ("file:relative/ok.jpg", "malformed"),
    ("http://[::1/x.jpg", "malformed"),
    ("http://example.com:99999/x.jpg", "malformed"),
    ("ftp://example.com/x.jpg", "denied"),
    ("gopher://127.0.0.1:6379/_FLUSHALL", "denied"),
    ("", "malformed"),
])
def test_malformed_and_foreign_uris_are_fetch_failed(tree: dict[str, Path], uri: str, reason: str) -> None:
    refused(fetcher(roots=(tree["root"],)), uri.format(root=tree["root"]), reason)


def test_sha256_in_the_event_is_checked(tree: dict[str, Path]) -> None:
    import hashlib

    f, uri = fetcher(roots=(tree["root"],)), (tree["root"] / "ok.jpg").as_uri()
    assert f.fetch({"uri": uri, "sha256": hashlib.sha256(JPEG_ISH).hexdigest()}) == JPEG_ISH
    refused(f, uri, "mismatch", sha256="0" * 64)


def test_inline_bytes_keep_their_size_guard_and_the_old_entry_point_works(tree: dict[str, Path]) -> None:
    with pytest.raises(TooLarge):
        fetcher(max_bytes=10).fetch({"data": b"x" * 11})
    assert fetch_source({"uri": (tree["root"] / "ok.jpg").as_uri()}, max_bytes=1 << 20,
                        file_roots=[tree["root"]]) == JPEG_ISH


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=80), st.from_regex(r"(file|http|https|s3|gs|az|ftp)://[^\s]{0,40}")))
def test_any_uri_ends_as_fetch_failed_and_never_escapes(uri: str) -> None:
    """Closed policy: whatever the URI, the only outcome is FETCH_FAILED (no ValueError, no read)."""
    with pytest.raises(FetchFailed):
        fetcher().fetch({"uri": uri})


# ------------------------------------------------------------------------------ http(s)://
class Origin:
    """A real HTTP server in a thread: routes map a path to (status, headers, body) or a callable."""

    def __init__(self) -> None:
        self.routes: dict[str, Any] = {}
        self.hits: list[str] = []
        origin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                origin.hits.append(self.path)
                route = origin.routes.get(self.path.split("?")[0], (404, {}, b"nope"))
                if callable(route):
                    route = route(self)
                    if route is None:
                        return
                status, headers, body = route
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                if "Transfer-Encoding" not in headers:
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        class QuietServer(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that stops reading at the byte limit resets the connection: expected here

        self.server = QuietServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_port
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def origin() -> Iterator[Origin]:
    o = Origin()
    o.routes["/img.jpg"] = (200, {"Content-Type": "image/jpeg"}, JPEG_ISH)
    yield o
    o.close()


def resolver_to(*addresses: str) -> Callable[[str, int], list[IPAddress]]:
    def resolve(host: str, port: int) -> list[IPAddress]:
        return [ipaddress.ip_address(a) for a in addresses]
    return resolve


def test_hosts_outside_the_allow_list_are_refused_before_any_request(origin: Origin) -> None:
    refused(fetcher(), origin.url("/img.jpg"), "denied")
    refused(fetcher(allow=("cdn.example.com",)), origin.url("/img.jpg"), "denied")
    assert origin.hits == []


@pytest.mark.parametrize("address", ["127.0.0.1", "10.1.2.3", "172.16.0.9", "192.168.1.1", "169.254.10.10",
                                     "100.64.0.1", "0.0.0.0", "::1", "fe80::1", "fc00::1", "::ffff:127.0.0.1"])
def test_private_addresses_are_refused_after_dns_resolution(address: str) -> None:
    f = fetcher(allow=("*",), resolver=resolver_to(address))
    exc = refused(f, "http://images.example.test/x.jpg", "denied")
    assert "resolves to" in exc.message


def test_one_private_address_among_public_ones_is_enough_to_refuse() -> None:
    f = fetcher(allow=("*.example.test",), resolver=resolver_to("93.184.216.34", "10.0.0.7"))
    refused(f, "http://cdn.example.test/x.jpg", "denied")


def test_literal_private_and_metadata_addresses_are_refused(origin: Origin) -> None:
    f = fetcher(allow=("*",))
    refused(f, origin.url("/img.jpg"), "denied")  # 127.0.0.1 through the wildcard: loopback
    refused(f, "http://10.0.0.1/x.jpg", "denied")
    # metadata: refused even when named exactly
    refused(fetcher(allow=("169.254.169.254",)), "http://169.254.169.254/latest/meta-data/", "denied")
    refused(fetcher(allow=("metadata.google.internal",), resolver=resolver_to("169.254.169.254")),
            "http://metadata.google.internal/computeMetadata/v1/", "denied")
    assert origin.hits == []


def test_a_host_named_exactly_may_be_private(origin: Origin) -> None:
    f = fetcher(allow=(f"127.0.0.1:{origin.port}",))
    assert f.fetch({"uri": origin.url("/img.jpg?v=2&sig=a%2Fb")}) == JPEG_ISH
    assert origin.hits == ["/img.jpg?v=2&sig=a%2Fb"]  # the query string arrives as sent


def test_redirects_are_checked_hop_by_hop(origin: Origin) -> None:
    f = fetcher(allow=(f"127.0.0.1:{origin.port}",))
    origin.routes["/to-private"] = (302, {"Location": "http://10.0.0.5/x.jpg"}, b"")
    origin.routes["/to-metadata"] = (301, {"Location": "http://169.254.169.254/latest/meta-data/iam"}, b"")
    origin.routes["/to-other-port"] = (302, {"Location": "http://127.0.0.1:1/x.jpg"}, b"")
    origin.routes["/relative"] = (307, {"Location": "/img.jpg"}, b"")
    for path in ("/to-private", "/to-metadata", "/to-other-port"):
        refused(f, origin.url(path), "denied")
    assert f.fetch({"uri": origin.url("/relative")}) == JPEG_ISH


def test_at_most_three_redirects(origin: Origin) -> None:
    for i in range(4):
        origin.routes[f"/r{i}"] = (302, {"Location": f"/r{i + 1}"}, b"")
    origin.routes["/r4"] = (200, {}, JPEG_ISH)
    f = fetcher(allow=(f"127.0.0.1:{origin.port}",))
    assert f.fetch({"uri": origin.url("/r1")}) == JPEG_ISH  # 3 redirects
    refused(f, origin.url("/r0"), "denied")  # 4


def test_http_errors_map_to_reasons(origin: Origin) -> None:
    origin.routes["/gone"] = (404, {}, SECRET)
    origin.routes["/private"] = (403, {}, SECRET)
    origin.routes["/huge-declared"] = (200, {}, b"x" * 5000)

    def chunked(h: BaseHTTPRequestHandler) -> None:  # no Content-Length: only the streamed count can stop it
        h.send_response(200)
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()
        for _ in range(100):
            h.wfile.write(b"400\r\n" + b"y" * 1024 + b"\r\n")
        h.wfile.write(b"0\r\n\r\n")

    origin.routes["/huge-chunked"] = chunked
    f = fetcher(allow=(f"127.0.0.1:{origin.port}",), max_bytes=4096, retries=0)
    refused(f, origin.url("/gone"), "not found")
    refused(f, origin.url("/private"), "denied")
    refused(f, origin.url("/huge-declared"), "too large")
    refused(f, origin.url("/huge-chunked"), "too large")


def test_transient_failures_are_retried_with_backoff_then_reported(origin: Origin) -> None:
    calls = {"n": 0}

    def flaky(h: BaseHTTPRequestHandler) -> tuple[int, dict[str, str], bytes]:
        calls["n"] += 1
        return (503, {}, b"busy") if calls["n"] < 3 else (200, {}, JPEG_ISH)

    origin.routes["/flaky"] = flaky
    origin.routes["/down"] = (500, {}, b"")
    sleeps: list[float] = []
    policy = FetchPolicy(max_bytes=1 << 20, allow=(f"127.0.0.1:{origin.port}",), retries=3, backoff_s=0.2)
    from blobio.fetch.web import fetch_http

    assert fetch_http(origin.url("/flaky"), policy, sleep=sleeps.append) == JPEG_ISH
    assert calls["n"] == 3 and len(sleeps) == 2 and sleeps[1] > sleeps[0] * 0.5
    with pytest.raises(FetchFailed) as info:
        fetch_http(origin.url("/down"), policy, sleep=sleeps.append)
    assert info.value.message.startswith("server error:") and "4 attempts" in info.value.message
    assert info.value.retriable


def test_a_silent_server_is_a_timeout(origin: Origin) -> None:
    def slow(h: BaseHTTPRequestHandler) -> None:
        time.sleep(3)

    origin.routes["/slow"] = slow
    f = fetcher(allow=(f"127.0.0.1:{origin.port}",), timeout_s=0.5, retries=0)
    assert refused(f, origin.url("/slow"), "timeout").retriable


def test_a_closed_port_is_unreachable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    refused(fetcher(allow=(f"127.0.0.1:{port}",), retries=0), f"http://127.0.0.1:{port}/x.jpg", "unreachable")


# ------------------------------------------------------------------------------ s3://
@pytest.fixture
def s3_objects(s3_env: Any) -> dict[str, str]:
    prefix = f"fetch-{uuid.uuid4().hex[:8]}"
    client = s3_env.client()
    obstore.put(client, f"{prefix}/ok.jpg", JPEG_ISH)
    obstore.put(client, f"{prefix}/big.jpg", b"z" * 50_000)
    return {"ok": f"s3://{s3_env.bucket}/{prefix}/ok.jpg", "big": f"s3://{s3_env.bucket}/{prefix}/big.jpg",
            "missing": f"s3://{s3_env.bucket}/{prefix}/missing.jpg", "endpoint": s3_env.endpoint,
            "bucket": s3_env.bucket}


def s3_fetcher(objs: dict[str, str], **kw: Any) -> Fetcher:
    return fetcher(allow=(f"s3://{objs['bucket']}",), s3_endpoint=objs["endpoint"], retries=0, **kw)


def test_s3_objects_are_fetched_from_allow_listed_buckets(s3_objects: dict[str, str]) -> None:
    assert s3_fetcher(s3_objects).fetch({"uri": s3_objects["ok"]}) == JPEG_ISH
    refused(fetcher(s3_endpoint=s3_objects["endpoint"]), s3_objects["ok"], "denied")
    refused(fetcher(allow=("s3://other-bucket",), s3_endpoint=s3_objects["endpoint"]), s3_objects["ok"], "denied")


def test_s3_not_found_denied_and_too_large(s3_objects: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    refused(s3_fetcher(s3_objects), s3_objects["missing"], "not found")
    refused(s3_fetcher(s3_objects, max_bytes=10_000), s3_objects["big"], "too large")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    refused(s3_fetcher(s3_objects), s3_objects["ok"], "denied")


def test_s3_unreachable_endpoint_is_reported_not_raised(s3_env: Any) -> None:
    f = fetcher(allow=("s3://lightbox-test",), s3_endpoint="http://127.0.0.1:1", retries=1, timeout_s=2)
    exc = refused(f, "s3://lightbox-test/x.jpg", "unreachable")
    assert exc.retriable


def test_errors_are_lightbox_errors() -> None:
    assert issubclass(FetchFailed, LightboxError)


def test_s3_silent_endpoint_is_a_timeout(s3_env: Any) -> None:
    with socket.socket() as silent:  # accepts connections (backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        f = fetcher(allow=("s3://lightbox-test",), s3_endpoint=endpoint, retries=0, timeout_s=1)
        assert refused(f, "s3://lightbox-test/x.jpg", "timeout").retriable


# ------------------------------------------------------------------------------ https:// pinned to the checked address
def _tls_files(folder: Path, name: str) -> tuple[Path, Path, Path]:
    """(CA cert, server cert, server key): a throwaway CA and a certificate for ``name``."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "lightbox test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(hours=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = folder / "ca.pem", folder / "cert.pem", folder / "key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


def test_https_dials_the_checked_address_and_verifies_the_name(origin: Origin, tmp_path: Path) -> None:
    import ssl

    name = "images.example.test"
    ca, cert, key = _tls_files(tmp_path, name)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    origin.server.socket = ctx.wrap_socket(origin.server.socket, server_side=True)
    hosts: list[str] = []
    origin.routes["/host.jpg"] = lambda h: (hosts.append(h.headers["Host"]), (200, {}, JPEG_ISH))[1]
    calls: list[str] = []

    def resolve(host: str, port: int) -> list[IPAddress]:
        calls.append(host)
        return [ipaddress.ip_address("127.0.0.1")]

    url = f"https://{name}:{origin.port}/host.jpg"
    f = fetcher(allow=(f"{name}:{origin.port}",), resolver=resolve, ca_file=str(ca), retries=0)
    assert f.fetch({"uri": url}) == JPEG_ISH
    assert calls == [name] and hosts == [f"{name}:{origin.port}"]  # resolved once; the name in Host (and SNI)
    origin.routes["/downgrade"] = (302, {"Location": f"http://{name}:{origin.port}/host.jpg"}, b"")
    assert "from https" in refused(f, f"https://{name}:{origin.port}/downgrade", "denied").message
    # the same server under a name its certificate does not carry, or without the CA: refused
    other = fetcher(allow=(f"other.example.test:{origin.port}",), resolver=resolve, ca_file=str(ca), retries=0)
    assert "TLS" in refused(other, f"https://other.example.test:{origin.port}/host.jpg", "denied").message
    refused(fetcher(allow=(f"{name}:{origin.port}",), resolver=resolve, retries=0), url, "denied")
