"""Helpers of the schema registry tests: a basic-auth gate in front of the registry, and a
standard producer (confluent-kafka with its AvroSerializer) writing lightbox's input events.

Apicurio Registry 2.6 authenticates only through an OpenID Connect server, so the tests put a small
reverse proxy in front of it that asks for HTTP basic auth, as a Confluent registry configured for
basic auth does (401 without the right user and password, the registry's answer otherwise)."""

from __future__ import annotations

import base64
import copy
import http.server
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from schemas.codec import load_schema

PRODUCT = load_schema("product_image_event")


def product_v2() -> dict[str, Any]:
    """A compatible next version of ProductImageEvent, as a producer would ship it: one more optional field."""
    v2 = copy.deepcopy(PRODUCT)
    v2["fields"].append({"name": "campaign", "type": ["null", "string"], "default": None})
    return v2


class _Gate(http.server.BaseHTTPRequestHandler):
    upstream = ""
    expected = ""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _forward(self) -> None:
        if self.headers.get("Authorization") != self.expected:
            body = json.dumps({"error_code": 401, "message": "Unauthorized"}).encode()
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        length = int(self.headers.get("Content-Length") or 0)
        data = self.rfile.read(length) if length else None
        req = urllib.request.Request(self.upstream + self.path, data=data, method=self.command,
                                     headers={k: v for k, v in self.headers.items()
                                              if k.lower() in ("content-type", "accept")})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                status, body, ctype = resp.status, resp.read(), resp.headers.get("Content-Type", "")
        except urllib.error.HTTPError as exc:
            status, body, ctype = exc.code, exc.read(), exc.headers.get("Content-Type", "")
        self.send_response(status)
        self.send_header("Content-Type", ctype or "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = _forward


@contextmanager
def basic_auth_gate(upstream: str, user: str, password: str) -> Iterator[str]:
    """A registry URL that forwards to ``upstream`` (a base URL with its path) only with ``user:password``."""
    root = upstream.split("/apis/", 1)
    handler = type("Gate", (_Gate,), {
        "upstream": root[0], "expected": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        path = "/apis/" + root[1] if len(root) == 2 else ""
        yield f"http://127.0.0.1:{server.server_address[1]}{path}"
    finally:
        server.shutdown()
        server.server_close()


def serializer(registry_url: str, schema: dict[str, Any]) -> Any:
    """confluent-kafka's AvroSerializer for ``schema`` (registers it under the topic's subject)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer

    client = SchemaRegistryClient({"url": registry_url})
    return AvroSerializer(client, json.dumps(schema), conf={"auto.register.schemas": True})


def deserializer(registry_url: str) -> Any:
    """confluent-kafka's AvroDeserializer: reads whatever id a record carries, with the registry's schema."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer

    return AvroDeserializer(SchemaRegistryClient({"url": registry_url}))


def other_subjects(registry_url: str, n: int = 3, tag: str = "") -> list[int]:
    """Register ``n`` unrelated schemas, so that the ids lightbox's events get are not 1, 2, 3."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    client = SchemaRegistryClient({"url": registry_url})
    return [client.register_schema(f"other{tag}-{i}-value", Schema(json.dumps(
        {"type": "record", "name": f"Other{i}", "namespace": f"com.example{tag}",
         "fields": [{"name": "x", "type": "int"}, {"name": f"f{tag}{i}", "type": "string", "default": ""}]}), "AVRO"))
        for i in range(n)]
