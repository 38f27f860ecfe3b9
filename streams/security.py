"""How every Kafka client connects: the one translation of the ``LIGHTBOX_KAFKA_*`` security settings.

    AIOKafkaProducer(bootstrap_servers=..., **aiokafka_kwargs(settings.kafka))    # producer, consumer, admin
    faust.App(..., broker_credentials=faust_credentials(settings.kafka))          # the worker

Protocols: PLAINTEXT (local development), SSL (TLS, optionally a client certificate), SASL_PLAINTEXT and
SASL_SSL with PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512. TLS always verifies the broker's certificate and
host name (against ``kafka_ssl_cafile``, else the system's trust store); there is no switch to turn
that off. SASL PLAIN over SASL_PLAINTEXT would send the password in the clear and is refused unless
``kafka_allow_plain_over_plaintext`` says otherwise.

:func:`preflight` (one connection, before a client starts) turns a refused password or an untrusted
certificate into one :class:`KafkaSecurityError` naming the cause and the setting to look at, at once:
Kafka clients would log it and retry as if the broker were down, and retrying cannot fix it.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from streams.settings import KafkaSettings, Settings

if TYPE_CHECKING:
    from faust.types.auth import CredentialsT

__all__ = ["KafkaSecurityError", "aiokafka_kwargs", "client_kwargs", "explain_connect_error", "faust_credentials",
           "preflight", "producer_kwargs", "sasl_password", "ssl_context"]

_TLS = {"SSL", "SASL_SSL"}
_SASL = {"SASL_PLAINTEXT", "SASL_SSL"}


class KafkaSecurityError(RuntimeError):
    """The Kafka security settings are wrong, or the broker refused them. Not retriable: the message
    names the setting or the cause (never a password)."""

    retriable = False


def ssl_context(kafka: KafkaSettings) -> ssl.SSLContext | None:
    """The TLS context for SSL and SASL_SSL (``None`` for the others): TLS 1.2+, verified certificate and host."""
    if kafka.security_protocol not in _TLS:
        if kafka.ssl_cafile or kafka.ssl_certfile:
            raise KafkaSecurityError(f"LIGHTBOX_KAFKA_SSL_* files are set but LIGHTBOX_KAFKA_SECURITY_PROTOCOL is "
                                     f"{kafka.security_protocol}: use SSL or SASL_SSL")
        return None
    cafile = kafka.ssl_cafile
    try:
        ctx = ssl.create_default_context(cafile=str(cafile) if cafile else None)
    except (OSError, ssl.SSLError) as exc:
        raise KafkaSecurityError(f"LIGHTBOX_KAFKA_SSL_CAFILE={cafile}: cannot load a CA bundle from it "
                                 f"({type(exc).__name__}: {exc.strerror or exc})") from None
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    cert, key = kafka.ssl_certfile, kafka.ssl_keyfile
    if key and not cert:
        raise KafkaSecurityError("LIGHTBOX_KAFKA_SSL_KEYFILE is set without LIGHTBOX_KAFKA_SSL_CERTFILE")
    if cert:
        key_pw = kafka.ssl_key_password
        try:
            ctx.load_cert_chain(str(cert), str(key) if key else None,
                                key_pw.get_secret_value() if key_pw else None)
        except (OSError, ssl.SSLError) as exc:
            raise KafkaSecurityError(f"LIGHTBOX_KAFKA_SSL_CERTFILE={cert} / LIGHTBOX_KAFKA_SSL_KEYFILE={key}: cannot "
                                     f"load the client certificate and key ({type(exc).__name__})") from None
    return ctx


def sasl_password(kafka: KafkaSettings) -> str:
    """The SASL password, from ``kafka_sasl_password`` or the first line of ``kafka_sasl_password_file``."""
    if kafka.sasl_password is not None and kafka.sasl_password_file is not None:
        raise KafkaSecurityError("set LIGHTBOX_KAFKA_SASL_PASSWORD or LIGHTBOX_KAFKA_SASL_PASSWORD_FILE, not both")
    if kafka.sasl_password is not None:
        return kafka.sasl_password.get_secret_value()
    path = kafka.sasl_password_file
    if path is None:
        raise KafkaSecurityError(f"LIGHTBOX_KAFKA_SECURITY_PROTOCOL={kafka.security_protocol} needs "
                                 f"LIGHTBOX_KAFKA_SASL_PASSWORD or LIGHTBOX_KAFKA_SASL_PASSWORD_FILE")
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise KafkaSecurityError(f"LIGHTBOX_KAFKA_SASL_PASSWORD_FILE={path}: cannot read it "
                                 f"({type(exc).__name__})") from None
    if not lines or not lines[0]:
        raise KafkaSecurityError(f"LIGHTBOX_KAFKA_SASL_PASSWORD_FILE={path}: the first line is empty")
    return lines[0]


def _sasl(kafka: KafkaSettings) -> tuple[str, str]:
    protocol, mechanism = kafka.security_protocol, kafka.sasl_mechanism
    if not kafka.sasl_username:
        raise KafkaSecurityError(f"LIGHTBOX_KAFKA_SECURITY_PROTOCOL={protocol} needs LIGHTBOX_KAFKA_SASL_USERNAME")
    if protocol == "SASL_PLAINTEXT" and mechanism == "PLAIN" and not kafka.allow_plain_over_plaintext:
        raise KafkaSecurityError("SASL PLAIN over SASL_PLAINTEXT sends the password in the clear: use SASL_SSL, a "
                                 "SCRAM mechanism, or set LIGHTBOX_KAFKA_ALLOW_PLAIN_OVER_PLAINTEXT=true")
    return kafka.sasl_username, sasl_password(kafka)


def aiokafka_kwargs(kafka: KafkaSettings) -> dict[str, Any]:
    """Keyword arguments for ``AIOKafkaProducer``, ``AIOKafkaConsumer`` and ``AIOKafkaAdminClient``."""
    protocol = kafka.security_protocol
    kwargs: dict[str, Any] = {"security_protocol": protocol}
    ctx = ssl_context(kafka)
    if ctx is not None:
        kwargs["ssl_context"] = ctx
    if protocol in _SASL:
        user, password = _sasl(kafka)
        kwargs.update(sasl_mechanism=kafka.sasl_mechanism, sasl_plain_username=user,
                      sasl_plain_password=password)
    return kwargs


def faust_credentials(kafka: KafkaSettings) -> CredentialsT | None:
    """Faust's ``broker_credentials`` for the same settings (``None`` for PLAINTEXT)."""
    import faust

    protocol = kafka.security_protocol
    ctx = ssl_context(kafka)
    if protocol in _SASL:
        user, password = _sasl(kafka)
        return faust.SASLCredentials(username=user, password=password, ssl_context=ctx,
                                     mechanism=kafka.sasl_mechanism)
    if ctx is not None:
        return faust.SSLCredentials(ctx)
    return None


def client_kwargs(security: Mapping[str, Any] | None) -> dict[str, Any]:
    """``security`` as given, or, when ``None``, :func:`aiokafka_kwargs` of the environment's settings
    (so a library client such as ``ImageProducer(bootstrap)`` follows ``LIGHTBOX_KAFKA_*``)."""
    return dict(security) if security is not None else aiokafka_kwargs(Settings().kafka)


def producer_kwargs(kafka: KafkaSettings | None = None) -> dict[str, Any]:
    """What a producer adds to :func:`aiokafka_kwargs`: its batches' compression
    (``LIGHTBOX_KAFKA_COMPRESSION_TYPE``; the environment's settings when ``kafka`` is ``None``)."""
    codec = (kafka or Settings().kafka).compression_type
    return {"compression_type": None if codec == "none" else codec}


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in seen:
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    return seen


def explain_connect_error(exc: BaseException, bootstrap: str, kwargs: Mapping[str, Any]) -> KafkaSecurityError | None:
    """A :class:`KafkaSecurityError` naming the cause when ``exc`` (or its cause) is a refused SASL
    authentication or a failed TLS handshake; ``None`` for anything else (e.g. a broker not up yet)."""
    from aiokafka.errors import SaslAuthenticationFailed, UnsupportedSaslMechanismError

    where = f"Kafka at {bootstrap} ({kwargs.get('security_protocol', 'PLAINTEXT')})"
    mechanism = kwargs.get("sasl_mechanism")
    for e in _chain(exc):
        if isinstance(e, SaslAuthenticationFailed):
            return KafkaSecurityError(
                f"{where}: SASL authentication failed for user {kwargs.get('sasl_plain_username')!r} with {mechanism}: "
                f"wrong username or password (LIGHTBOX_KAFKA_SASL_USERNAME, LIGHTBOX_KAFKA_SASL_PASSWORD[_FILE])")
        if isinstance(e, UnsupportedSaslMechanismError):
            return KafkaSecurityError(f"{where}: the broker does not enable SASL mechanism {mechanism} "
                                      f"(LIGHTBOX_KAFKA_SASL_MECHANISM)")
        if isinstance(e, ssl.SSLCertVerificationError):
            return KafkaSecurityError(
                f"{where}: TLS certificate verification failed ({e.verify_message}): the broker's certificate is not "
                f"signed by a CA in LIGHTBOX_KAFKA_SSL_CAFILE (or the system trust store), or does not name the host")
        if isinstance(e, ssl.SSLError):
            return KafkaSecurityError(f"{where}: TLS handshake failed ({e.reason or type(e).__name__}); does this "
                                      f"listener take LIGHTBOX_KAFKA_SECURITY_PROTOCOL's protocol?")
    return None


async def preflight(bootstrap: str, kwargs: Mapping[str, Any], *, timeout_s: float = 15.0) -> None:
    """Open one connection to a bootstrap server with a client's security ``kwargs`` and raise
    :class:`KafkaSecurityError` at once when the broker refuses them.

    Kafka clients log a refused password or an untrusted certificate and retry as if the broker were
    down; this turns it into one error with the cause. A broker that cannot be reached is left to the
    client's own retries. Nothing to check (and no connection) for PLAINTEXT."""
    import asyncio

    from aiokafka.conn import collect_hosts, create_conn

    if kwargs.get("security_protocol", "PLAINTEXT") == "PLAINTEXT":
        return
    conn_kw = {k: kwargs[k] for k in ("security_protocol", "ssl_context", "sasl_mechanism", "sasl_plain_username",
                                      "sasl_plain_password") if k in kwargs}
    for host, port, _ in collect_hosts(bootstrap):
        try:
            conn = await asyncio.wait_for(create_conn(host, port, request_timeout_ms=int(timeout_s * 1000),
                                                      **conn_kw), timeout_s)
        except Exception as exc:  # refused, timed out, TLS or SASL error: explained, or left to the client
            explained = explain_connect_error(exc, bootstrap, kwargs)
            if explained is not None:
                raise explained from None
            continue
        conn.close()
        return
