"""What makes the local broker (:mod:`lightbox.devservers.kafka_local`) a secured one: a SASL_SSL listener.

At first start in a data folder it writes, under ``<data>/secure/``:

- ``ca.pem``: a fresh CA certificate (its private key is never written: it signs the broker's
  certificate in memory and is dropped, so no one can issue more certificates from it);
- ``broker.pem``: the broker's private key and certificate (``localhost``, ``127.0.0.1``; server
  and client use, since the broker also dials its own controller over mutual TLS);
- ``client.password``: the SCRAM-SHA-512 password of the client user ``lightbox`` (mode 0600).

Both SCRAM users (``lightbox`` for clients, ``admin`` for the broker's own inter-broker link) are
added at format time (``kafka-storage format --add-scram``). The controller listener takes TLS
with a client certificate only (the broker's own), so nothing on the broker accepts an
unauthenticated connection. A restart on the same data folder reuses what is there.
"""

from __future__ import annotations

import datetime as dt
import os
import secrets
from dataclasses import dataclass
from ipaddress import IPv4Address
from pathlib import Path

__all__ = ["CLIENT_USER", "MECHANISM", "SecureFiles", "client_env", "secure_setup"]

CLIENT_USER = "lightbox"
ADMIN_USER = "admin"
MECHANISM = "SCRAM-SHA-512"
VALID_DAYS = 365


@dataclass(frozen=True)
class SecureFiles:
    folder: Path

    @property
    def ca(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def broker(self) -> Path:
        return self.folder / "broker.pem"

    @property
    def client_password(self) -> Path:
        return self.folder / "client.password"

    @property
    def admin_password(self) -> Path:
        return self.folder / "admin.password"


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _make_certificates(files: SecureFiles) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"lightbox local CA {secrets.token_hex(4)}")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(hours=1)).not_valid_after(now + dt.timedelta(days=VALID_DAYS))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                       crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1)).not_valid_after(now + dt.timedelta(days=VALID_DAYS))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(IPv4Address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=True, key_cert_sign=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    _write_private(files.broker, key_pem + cert.public_bytes(pem) + ca.public_bytes(pem))
    files.ca.write_bytes(ca.public_bytes(pem))


def secure_setup(data_dir: Path, port: int, controller_port: int) -> tuple[str, list[str]]:
    """``(server.properties lines, extra format arguments)`` for a SASL_SSL broker on ``port``.

    The lines are appended to the plain configuration (a later key wins in a properties file)."""
    files = SecureFiles(data_dir / "secure")
    files.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not (files.ca.exists() and files.broker.exists()):
        _make_certificates(files)
    passwords = {}
    for user, path in ((CLIENT_USER, files.client_password), (ADMIN_USER, files.admin_password)):
        if not path.exists():
            _write_private(path, secrets.token_hex(24).encode())  # hex: nothing the --add-scram syntax parses
        passwords[user] = path.read_text().strip()
    props = "\n".join([
        "# -- secure: SASL_SSL for clients and brokers, mutual TLS for the controller "
        "(lightbox.devservers.kafka_secure)",
        f"listeners=SASL_SSL://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        f"advertised.listeners=SASL_SSL://127.0.0.1:{port}",
        "inter.broker.listener.name=SASL_SSL",
        "listener.security.protocol.map=SASL_SSL:SASL_SSL,CONTROLLER:SSL",
        f"sasl.enabled.mechanisms={MECHANISM}",
        f"sasl.mechanism.inter.broker.protocol={MECHANISM}",
        f"listener.name.sasl_ssl.{MECHANISM.lower()}.sasl.jaas.config="
        f"org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{ADMIN_USER}" password="{passwords[ADMIN_USER]}";',
        "ssl.keystore.type=PEM",
        f"ssl.keystore.location={files.broker}",
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={files.ca}",
        "listener.name.controller.ssl.client.auth=required",
        "",
    ])
    fmt = [arg for user, pw in passwords.items() for arg in ("--add-scram", f"{MECHANISM}=[name={user},password={pw}]")]
    return props, fmt


def client_env(bootstrap: str, data_dir: Path) -> dict[str, str]:
    """The ``LIGHTBOX_*`` settings a client needs for the secured local broker (password in a file)."""
    files = SecureFiles(Path(data_dir) / "secure")
    return {"LIGHTBOX_KAFKA_BOOTSTRAP": bootstrap,
            "LIGHTBOX_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "LIGHTBOX_KAFKA_SASL_MECHANISM": MECHANISM,
            "LIGHTBOX_KAFKA_SASL_USERNAME": CLIENT_USER,
            "LIGHTBOX_KAFKA_SASL_PASSWORD_FILE": str(files.client_password),
            "LIGHTBOX_KAFKA_SSL_CAFILE": str(files.ca)}
