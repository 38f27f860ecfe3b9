"""streams.security: the one translation of LIGHTBOX_KAFKA_* into aiokafka and Faust arguments (no broker)."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import faust
import pytest
from pydantic import SecretStr

from lightbox.devservers.kafka_secure import SecureFiles, secure_setup
from streams.security import KafkaSecurityError, aiokafka_kwargs, faust_credentials, preflight
from streams.settings import Settings


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> SecureFiles:
    folder = tmp_path_factory.mktemp("pki")
    secure_setup(folder, 9093, 9094)
    return SecureFiles(folder / "secure")


def test_plaintext_is_the_default_and_adds_nothing() -> None:
    s = Settings(_env_file=None)  # type: ignore[call-arg]
    assert aiokafka_kwargs(s.kafka) == {"security_protocol": "PLAINTEXT"}
    assert faust_credentials(s.kafka) is None


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_ssl_with_a_password_file(mechanism: str, pki: SecureFiles) -> None:
    s = Settings(kafka_security_protocol="SASL_SSL", kafka_sasl_mechanism=mechanism, kafka_sasl_username="u",
                 kafka_sasl_password_file=pki.client_password, kafka_ssl_cafile=pki.ca)
    kw = aiokafka_kwargs(s.kafka)
    assert kw["security_protocol"] == "SASL_SSL" and kw["sasl_mechanism"] == mechanism
    assert kw["sasl_plain_username"] == "u" and kw["sasl_plain_password"] == pki.client_password.read_text().strip()
    ctx = kw["ssl_context"]
    assert isinstance(ctx, ssl.SSLContext) and ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert ctx.minimum_version >= ssl.TLSVersion.TLSv1_2
    creds = faust_credentials(s.kafka)
    assert isinstance(creds, faust.SASLCredentials)
    assert creds.protocol.value == "SASL_SSL" and creds.mechanism.value == mechanism and creds.ssl_context
    assert creds.password not in repr(creds)


def test_password_from_the_environment_is_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIGHTBOX_KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("LIGHTBOX_KAFKA_SASL_USERNAME", "u")
    monkeypatch.setenv("LIGHTBOX_KAFKA_SASL_PASSWORD", "hunter2")
    s = Settings()
    assert "hunter2" not in repr(s) and "hunter2" not in str(s.model_dump())
    kw = aiokafka_kwargs(s.kafka)
    assert kw == {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-512",
                  "sasl_plain_username": "u", "sasl_plain_password": "hunter2"}
    creds = faust_credentials(s.kafka)
    assert isinstance(creds, faust.SASLCredentials) and creds.protocol.value == "SASL_PLAINTEXT"


def test_ssl_with_a_client_certificate(pki: SecureFiles) -> None:
    s = Settings(kafka_security_protocol="SSL", kafka_ssl_cafile=pki.ca, kafka_ssl_certfile=pki.broker)
    kw = aiokafka_kwargs(s.kafka)
    assert set(kw) == {"security_protocol", "ssl_context"} and kw["security_protocol"] == "SSL"
    creds = faust_credentials(s.kafka)
    assert isinstance(creds, faust.SSLCredentials) and creds.protocol.value == "SSL"


@pytest.mark.parametrize(("over", "match"), [
    ({"kafka_security_protocol": "SASL_SSL"}, "needs LIGHTBOX_KAFKA_SASL_USERNAME"),
    ({"kafka_security_protocol": "SASL_SSL", "kafka_sasl_username": "u"}, "needs LIGHTBOX_KAFKA_SASL_PASSWORD"),
    ({"kafka_security_protocol": "SASL_SSL", "kafka_sasl_username": "u", "kafka_sasl_password": SecretStr("p"),
      "kafka_sasl_password_file": Path("/x")}, "not both"),
    ({"kafka_security_protocol": "SASL_SSL", "kafka_sasl_username": "u",
      "kafka_sasl_password_file": Path("/no/such/file")}, "PASSWORD_FILE=/no/such/file: cannot read it"),
    ({"kafka_security_protocol": "SASL_PLAINTEXT", "kafka_sasl_mechanism": "PLAIN", "kafka_sasl_username": "u",
      "kafka_sasl_password": SecretStr("p")}, "sends the password in the clear"),
    ({"kafka_security_protocol": "SSL", "kafka_ssl_cafile": Path("/no/such/ca.pem")}, "cannot load a CA bundle"),
    ({"kafka_security_protocol": "SSL", "kafka_ssl_keyfile": Path("/k.pem")}, "KEYFILE is set without"),
    ({"kafka_ssl_cafile": Path("/ca.pem")}, "PROTOCOL is PLAINTEXT"),
])
def test_misconfiguration_names_the_setting(over: dict[str, object], match: str) -> None:
    with pytest.raises(KafkaSecurityError, match=match):
        aiokafka_kwargs(Settings(**over).kafka)  # type: ignore[arg-type]


def test_plain_over_plaintext_only_when_asked() -> None:
    s = Settings(kafka_security_protocol="SASL_PLAINTEXT", kafka_sasl_mechanism="PLAIN", kafka_sasl_username="u",
                 kafka_sasl_password=SecretStr("p"), kafka_allow_plain_over_plaintext=True)
    assert aiokafka_kwargs(s.kafka)["sasl_mechanism"] == "PLAIN"


def test_preflight_leaves_an_unreachable_broker_to_the_client(pki: SecureFiles) -> None:
    s = Settings(kafka_bootstrap="127.0.0.1:1", kafka_security_protocol="SSL", kafka_ssl_cafile=pki.ca)
    asyncio.run(preflight(s.kafka.bootstrap, aiokafka_kwargs(s.kafka), timeout_s=5))  # no error: not a security cause


def test_the_local_pki(pki: SecureFiles) -> None:
    from cryptography import x509

    certs = x509.load_pem_x509_certificates(pki.broker.read_bytes())
    ca = x509.load_pem_x509_certificate(pki.ca.read_bytes())
    certs[0].verify_directly_issued_by(ca)
    sans = certs[0].extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in sans.get_values_for_type(x509.DNSName)
    for path in (pki.broker, pki.client_password, pki.admin_password):
        assert path.stat().st_mode & 0o077 == 0, path  # private: owner only
    assert not list(pki.folder.glob("*ca*key*"))  # the CA key is never written
