"""A Confluent-compatible schema registry as lightbox's schema store (``LIGHTBOX_SCHEMA_REGISTRY_URL``).

Inputs are read with the writer schema the registry holds for the id in their Confluent frame
(``GET /schemas/ids/{id}``), resolved to lightbox's own reader schema; outputs are framed with the
ids the registry gives lightbox's schemas under their subjects. The HTTP client is
confluent-kafka's ``SchemaRegistryClient`` (the ecosystem's reference client; its own retries are
off: this module decides what is retried).

What each kind of failure does (the worker's inputs are decoded in its prepare threads):

    404 on an id                    SchemaInvalid naming the id: that input's dead letter
    connection error, timeout, 5xx  retried with backoff for as long as it takes (``patience_s``
                                    bounds it where a command waits, not the worker); the input
                                    waits, nothing is dead-lettered; ``reachable`` is False meanwhile
                                    (the worker's /readyz says so)
    401, 403                        RegistryRefused (a FatalError): the worker stops with a line that
                                    names the credential the registry refused

Ids are cached per process (an id's schema never changes); concurrent misses for one id make one
request. Credentials are never logged: messages name the setting and the user, never a secret.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit, urlunsplit

import fastavro

from schemas.codec import Schema, record_name
from schemas.errors import (
    FatalError,
    RegistryError,
    RegistryRefused,
    RegistryRejected,
    RegistryUnavailable,
    SchemaInvalid,
)
from schemas.events import SUBJECTS, EventCodecs
from streams.settings import SchemaRegistrySettings, Settings

__all__ = ["BACKWARD_LEVELS", "RegistryError", "RegistryRefused", "RegistryRejected", "RegistrySchemaStore",
           "RegistryUnavailable", "client_config", "default_codecs", "describe", "event_codecs", "redact",
           "registry_store", "subject_name"]

log = logging.getLogger("lightbox.registry")

T = TypeVar("T")


class Waiter(Protocol):
    """Told when a dependency is unreachable and when it answers again (``agents.dependencies``)."""

    def failed(self, name: str, reason: str) -> float: ...

    def sleep(self, seconds: float) -> bool: ...

    def reached(self, name: str) -> None: ...

#: compatibility levels under which a reader on the new version reads data written with the old ones
BACKWARD_LEVELS = {"BACKWARD", "BACKWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE"}


def redact(url: str) -> str:
    """``url`` without a user or password in it."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    return urlunsplit((parts.scheme, host + (f":{parts.port}" if parts.port else ""), parts.path, parts.query, ""))


def subject_name(strategy: str, topic: str, full_name: str) -> str:
    """TopicNameStrategy (``<topic>-value``) or RecordNameStrategy (the record's full name)."""
    return full_name if strategy == "record" else f"{topic}-value"


def _credential(cfg: SchemaRegistrySettings) -> str:
    """Which credential the requests carry, for a refusal's message (never the secret)."""
    if cfg.user_info is not None:
        user = cfg.user_info.get_secret_value().split(":", 1)[0]
        return f"LIGHTBOX_SCHEMA_REGISTRY_USER_INFO (user {user!r})"
    if cfg.bearer_token is not None:
        return "LIGHTBOX_SCHEMA_REGISTRY_BEARER_TOKEN"
    if cfg.certfile is not None:
        return f"the client certificate LIGHTBOX_SCHEMA_REGISTRY_CERTFILE={cfg.certfile}"
    return "no credential (set LIGHTBOX_SCHEMA_REGISTRY_USER_INFO or _BEARER_TOKEN)"


def client_config(cfg: SchemaRegistrySettings) -> dict[str, Any]:
    """``SchemaRegistryClient``'s configuration from the settings (its own retries off)."""
    if not cfg.url:
        raise ValueError("LIGHTBOX_SCHEMA_REGISTRY_URL is not set")
    conf: dict[str, Any] = {"url": cfg.url, "timeout": cfg.timeout_s, "max.retries": 0}
    if cfg.user_info is not None:
        if ":" not in cfg.user_info.get_secret_value():
            raise ValueError("LIGHTBOX_SCHEMA_REGISTRY_USER_INFO must be USER:PASSWORD")
        if cfg.bearer_token is not None:
            raise ValueError("set LIGHTBOX_SCHEMA_REGISTRY_USER_INFO or _BEARER_TOKEN, not both")
        conf["basic.auth.user.info"] = cfg.user_info.get_secret_value()
    elif cfg.bearer_token is not None:
        token, cluster = cfg.bearer_token.get_secret_value(), cfg.bearer_logical_cluster or ""
        conf["bearer.auth.credentials.source"] = "CUSTOM"
        conf["bearer.auth.custom.provider.config"] = {}
        conf["bearer.auth.custom.provider.function"] = lambda _conf: {
            "bearer.auth.token": token, "bearer.auth.logical.cluster": cluster}
    if cfg.ca is not None:
        conf["ssl.ca.location"] = str(cfg.ca)
    if cfg.keyfile is not None and cfg.certfile is None:
        raise ValueError("LIGHTBOX_SCHEMA_REGISTRY_KEYFILE is set without LIGHTBOX_SCHEMA_REGISTRY_CERTFILE")
    if cfg.certfile is not None:
        conf["ssl.certificate.location"] = str(cfg.certfile)
        if cfg.keyfile is not None:
            conf["ssl.key.location"] = str(cfg.keyfile)
    return conf


@dataclass
class _Outage:
    """An outage in progress: since when, when it was last reported."""

    since: float
    reported: float
    cause: str


class RegistrySchemaStore:
    """:class:`schemas.codec.SchemaStore` over a Confluent-compatible registry (module docstring).

    ``patience_s``: how long a call keeps retrying an unreachable registry before raising
    :class:`RegistryUnavailable` (``None``: for ever; the worker's inputs wait). ``client``: a
    ``SchemaRegistryClient`` (made from ``settings`` when not given)."""

    def __init__(self, settings: SchemaRegistrySettings, *, client: Any = None, patience_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        if client is None:
            from confluent_kafka.schema_registry import SchemaRegistryClient

            client = SchemaRegistryClient(client_config(settings))
        self.settings, self.client, self.patience_s = settings, client, patience_s
        self.waiter: Waiter | None = None  # when set, outages are waited for through it (event_codecs)
        self.url = redact(settings.url or "")
        self.clock, self.sleep = clock, sleep
        self._schemas: dict[int, Schema] = {}
        self._parsed: dict[int, Any] = {}
        self._locks: dict[int, threading.Lock] = {}
        self._guard = threading.Lock()
        self._outage: _Outage | None = None
        self.requests = 0  # registry requests made (tests: one per id, however many threads miss it)

    # -- reachability -------------------------------------------------------------------------
    @property
    def reachable(self) -> bool:
        """False while the registry is unreachable (the worker's readiness)."""
        return self._outage is None

    def readiness(self) -> tuple[bool, str]:
        outage = self._outage
        if outage is None:
            return True, "ok"
        return False, f"schema registry {self.url} unreachable for {self.clock() - outage.since:.0f} s ({outage.cause})"

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()`` against the registry: refused credentials raise :class:`RegistryRefused`,
        an unreachable registry (or 5xx) is retried with backoff; other answers are raised."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError
        from httpx2 import TransportError

        attempt, started = 0, self.clock()
        while True:
            try:
                self.requests += 1
                result = fn()
            except SchemaRegistryError as exc:
                status = exc.http_status_code
                if status in (401, 403):
                    raise RegistryRefused(
                        f"the schema registry at {self.url} refused {_credential(self.settings)} "
                        f"(HTTP {status}) while {what}: check that credential") from None
                if status < 500:
                    raise
                cause, kind = f"HTTP {status}: {exc.error_message}"[:200], "server error"
            except TransportError as exc:
                cause = f"{type(exc).__name__}: {exc}"[:200]
                kind = "timeout" if "Timeout" in type(exc).__name__ else "unreachable"
            else:
                self._recovered()
                return result
            if self.waiter is not None:  # the worker: its dependencies book says who is down
                self._unreachable(self.clock(), cause, what)
                if not self.waiter.sleep(self.waiter.failed(self.name, kind)):
                    raise FatalError(f"{self.name}: stopped while waiting for it ({kind})")
                continue
            now = self.clock()
            self._unreachable(now, cause, what)
            if self.patience_s is not None and now - started >= self.patience_s:
                raise RegistryUnavailable(f"the schema registry at {self.url} stayed unreachable for "
                                          f"{now - started:.0f} s while {what} ({cause})")
            self.sleep(min(10.0, 0.25 * 2 ** min(attempt, 6)) * random.uniform(0.8, 1.2))
            attempt += 1

    def _unreachable(self, now: float, cause: str, what: str) -> None:
        with self._guard:
            outage = self._outage
            if outage is None:
                self._outage = _Outage(now, now, cause)
                log.warning("schema registry %s unreachable while %s (%s): retrying with backoff; inputs wait, "
                            "none is dead-lettered", self.url, what, cause)
            elif now - outage.reported >= 30.0:
                outage.reported, outage.cause = now, cause
                log.warning("schema registry %s still unreachable after %.0f s (%s); inputs wait",
                            self.url, now - outage.since, cause)

    @property
    def name(self) -> str:
        return f"schema registry {self.url}"

    def _recovered(self) -> None:
        if self._outage is None:
            return
        if self.waiter is not None:
            self.waiter.reached(self.name)
        with self._guard:
            outage, self._outage = self._outage, None
        if outage is not None:
            log.warning("schema registry %s reachable again after %.0f s", self.url, self.clock() - outage.since)

    # -- SchemaStore --------------------------------------------------------------------------
    def schema(self, schema_id: int) -> Schema:
        """The writer schema of ``schema_id`` (cached; one request however many threads miss it)."""
        found = self._schemas.get(schema_id)
        if found is not None:
            return found
        with self._guard:
            lock = self._locks.setdefault(schema_id, threading.Lock())
        with lock:
            found = self._schemas.get(schema_id)
            if found is None:
                found = self._fetch(schema_id)
                self._schemas[schema_id] = found
        return found

    def _fetch(self, schema_id: int) -> Schema:
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            got = self._call(f"reading schema id {schema_id}", lambda: self.client.get_schema(schema_id))
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                raise SchemaInvalid(f"unknown schema id {schema_id}: the schema registry at {self.url} does not "
                                    "hold it", stage="deserialize") from None
            raise SchemaInvalid(f"schema id {schema_id}: the schema registry at {self.url} answered HTTP "
                                f"{exc.http_status_code}: {exc.error_message}"[:300], stage="deserialize") from None
        kind = (got.schema_type or "AVRO").upper()
        if kind != "AVRO":
            raise SchemaInvalid(f"schema id {schema_id} is a {kind} schema, not Avro", stage="deserialize")
        if got.references:
            raise SchemaInvalid(f"schema id {schema_id} uses schema references, which lightbox does not resolve",
                                stage="deserialize")
        try:
            parsed = json.loads(got.schema_str)
        except ValueError:
            raise SchemaInvalid(f"schema id {schema_id}: the registry's schema is not JSON",
                                stage="deserialize") from None
        if isinstance(parsed, str):  # a primitive schema, "string"
            parsed = {"type": parsed}
        return parsed  # type: ignore[no-any-return]

    def parsed(self, schema_id: int) -> Any:
        found = self._parsed.get(schema_id)
        if found is None:
            schema = self.schema(schema_id)
            try:
                found = fastavro.parse_schema(schema)
            except Exception as exc:  # fastavro raises several types for a schema it cannot read
                raise SchemaInvalid(f"schema id {schema_id} is not a valid Avro schema: {type(exc).__name__}",
                                    stage="deserialize") from None
            self._parsed[schema_id] = found
        return found

    def latest(self, subject: str) -> tuple[int, Schema]:
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            got = self._call(f"reading the latest version of {subject!r}",
                             lambda: self.client.get_latest_version(subject))
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                raise KeyError(f"no schema registered for subject {subject!r}") from None
            raise
        return int(got.schema_id), self.schema(int(got.schema_id))

    def register(self, subject: str, schema: Schema) -> int:
        """The id of ``schema`` under ``subject``: registered (auto_register) or looked up.
        :class:`RegistryRejected` when the registry refuses it or it is missing."""
        from confluent_kafka.schema_registry import Schema as RegistrySchema
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        text = json.dumps(schema, separators=(",", ":"))
        full = record_name(fastavro.parse_schema(schema))
        try:
            if self.settings.auto_register:
                self.ensure_backward(subject)
                sid = self._call(f"registering {full} under {subject!r}",
                                 lambda: self.client.register_schema(subject, RegistrySchema(text, "AVRO")))
            else:
                found = self._call(f"looking {full} up under {subject!r}",
                                   lambda: self.client.lookup_schema(subject, RegistrySchema(text, "AVRO")))
                sid = found.schema_id
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404 and not self.settings.auto_register:
                raise RegistryRejected(
                    f"{full} is not registered under subject {subject!r} in the schema registry at {self.url} and "
                    "LIGHTBOX_SCHEMA_REGISTRY_AUTO_REGISTER is false: register it (`lightbox schemas register`) "
                    "or allow auto-registration") from None
            raise RegistryRejected(
                f"the schema registry at {self.url} rejected {full} under subject {subject!r} (HTTP "
                f"{exc.http_status_code}, {exc.error_code}): {exc.error_message}"[:600]
                + (" — it is not compatible with the subject's latest version; check it with "
                   "`lightbox schemas check`" if exc.http_status_code == 409 else "")) from None
        self._schemas.setdefault(int(sid), json.loads(text))
        return int(sid)

    def compatibility(self, subject: str) -> str | None:
        """The subject's own compatibility level, or None when it has none."""
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            level = self._call(f"reading the compatibility of subject {subject!r}",
                               lambda: self.client.get_compatibility(subject))
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                return None
            raise
        return str(level).upper() if level else None

    def ensure_backward(self, subject: str) -> str:
        """Set BACKWARD on ``subject`` when it has no level of its own or NONE (what Apicurio reports for
        a subject without one); warn when its level is another under which a new version may break
        readers of older records. Returns the level in force."""
        level = self.compatibility(subject)
        if level in (None, "NONE"):
            self._call(f"setting BACKWARD on {subject!r}", lambda: self.client.set_compatibility(subject, "BACKWARD"))
            return "BACKWARD"
        if level not in BACKWARD_LEVELS:
            log.warning("subject %r has compatibility %s in the schema registry %s: a new version may break "
                        "readers of older records (BACKWARD is what lightbox expects)", subject, level, self.url)
        return level

    def check(self, subject: str, schema: Schema) -> tuple[bool, list[str]]:
        """Whether ``schema`` may be registered under ``subject`` (the registry's own test
        against the latest version; a subject with no version accepts anything)."""
        from confluent_kafka.schema_registry import Schema as RegistrySchema
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        text = json.dumps(schema, separators=(",", ":"))
        try:
            result = self._call(f"checking a schema against {subject!r}", lambda: self.client.test_compatibility(
                subject, RegistrySchema(text, "AVRO"), verbose=True))
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                return True, []
            raise RegistryRejected(f"the schema registry at {self.url} could not check the schema under {subject!r} "
                                   f"(HTTP {exc.http_status_code}): {exc.error_message}"[:600]) from None
        if isinstance(result, bool):
            return result, []
        ok, messages = result
        return bool(ok), [str(m) for m in messages or []]


def default_codecs(*, product_topic: str | None = None) -> EventCodecs:
    """:func:`event_codecs` of the environment's settings (``LIGHTBOX_SCHEMA_REGISTRY_*``): what a
    library client uses when given no codecs. ``product_topic``: where it writes input events (the
    input topic by default)."""
    settings = Settings()
    return event_codecs(settings, topics={"product": product_topic} if product_topic else None)


def describe(codecs: EventCodecs) -> str | None:
    """One line on where ids come from, for a start-up message (None with the file store)."""
    store = codecs.store
    if not isinstance(store, RegistrySchemaStore):
        return None
    outs = ", ".join(f"{c.reader_name.rsplit('.', 1)[-1]} id {c.writer_id} under {c.subject!r}"
                     for c in (codecs.processed, codecs.dead_letter))
    return f"schema registry {store.url}: inputs read by their ids; outputs framed as {outs}"


def registry_store(cfg: SchemaRegistrySettings, *, patience_s: float | None = None) -> RegistrySchemaStore:
    return RegistrySchemaStore(cfg, patience_s=patience_s)


def event_codecs(settings: Settings, *, start_patience_s: float = 60.0, patience_s: float | None = 60.0,
                 topics: Mapping[str, str] | None = None, waiter: Waiter | None = None) -> EventCodecs:
    """lightbox's three codecs as the settings say: the packaged (or ``schema_store``) file store,
    or the schema registry at ``schema_registry_url``, where lightbox's schemas are registered (or
    looked up) under their subjects now. ``topics``: the topic each kind is written to, by kind
    (``product``, ``processed``, ``dead_letter``; the input, output and dead-letter topics by default).
    ``start_patience_s``: how long the registry may stay unreachable now, while the schemas are
    registered; ``patience_s``: at every later lookup of an input's id (``None``: for ever, the
    worker's inputs wait) before :class:`RegistryUnavailable`. ``waiter``: after start, an outage is
    reported to it and waited for through it (the worker's ``agents.dependencies``: intake pauses,
    /readyz names the registry, the watchdog does not count the wait)."""
    from schemas.codec import FileSchemaStore

    cfg = settings.schema_registry
    if not cfg.url:
        return EventCodecs.create(FileSchemaStore(settings.worker.schema_store))
    where = {"product": settings.topics.input, "processed": settings.topics.output,
             "dead_letter": settings.topics.dlq, **(topics or {})}
    store = RegistrySchemaStore(cfg, patience_s=start_patience_s)
    subjects = {kind: subject_name(cfg.subject_strategy, where[kind], full) for kind, (_, full) in SUBJECTS.items()}
    codecs = EventCodecs.create(store, subjects=subjects)
    store.patience_s, store.waiter = patience_s, waiter
    return codecs
