"""The settings reference, generated from ``streams.settings``: every ``LIGHTBOX_*`` variable with
its section, type, default and meaning (the field's ``description``), and the few variables read
outside ``Settings`` with the reason.

``lightbox settings`` prints it with the values in effect (secrets masked);
``lightbox settings --markdown`` prints ``docs/settings.md`` (``make docs`` writes it, and a test
fails when the file and the code disagree). Nothing here reads a setting: :func:`in_effect` takes
the environment and the ``.env`` values it is given.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import annotated_types
from pydantic import SecretStr
from pydantic.fields import FieldInfo

from streams.settings import _SECTIONS, Settings

__all__ = ["MASK", "OUTSIDE", "Outside", "Row", "in_effect", "markdown", "mask", "rows"]

PREFIX = "LIGHTBOX_"
MASK = "********"
REGENERATE = "lightbox settings --markdown > docs/settings.md"

_DEFAULT_FACTORIES = {"worker_id": "<host name>-<process id>"}  # field -> how its computed default reads
_SECRET_NAME = re.compile(r"password|secret|token", re.IGNORECASE)
_URL_USERINFO = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)[^/@\s]+@", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Row:
    """One variable of ``Settings``. ``sections`` has two entries where one variable sets two
    sections' fields (``LIGHTBOX_S3_ENDPOINT``: fetch and store)."""

    variable: str
    sections: tuple[str, ...]
    field: str
    type: str
    default: str
    meaning: str
    secret: bool


@dataclass(frozen=True, slots=True)
class Outside:
    """A variable read straight from the environment (never from ``.env``), and why."""

    variable: str
    default: str
    meaning: str
    why: str


OUTSIDE: tuple[Outside, ...] = (
    Outside("LIGHTBOX_MODEL_DIR", "~/.cache/lightbox/models",
            "where models are fetched and cached, with the runtime gate's verdicts and OpenVINO's cache",
            "read by the model fetcher in gpu_kernels, which the import layers keep apart from streams "
            "(and so from Settings), and by `lightbox model fetch` without a worker"),
    Outside("LIGHTBOX_OFFLINE", "unset",
            "set (not 0): the model is never downloaded; a missing one is an error saying where to put it "
            "(the GPU validation run, `bench/gpu/suite.sh`, sets it)",
            "read by the model fetcher in gpu_kernels, like `LIGHTBOX_MODEL_DIR`"),
    Outside("LIGHTBOX_CACHE_DIR", "~/.cache/lightbox",
            "the local development servers' downloads (Kafka and s3proxy jars, Azurite, fake-gcs-server, "
            "Toxiproxy) and "
            "Triton's environment (`tritonenv`)",
            "used by `lightbox kafka|s3|azure|gcs up` and `make` before any worker setting matters"),
    Outside("LIGHTBOX_STATE_DIR", "<LIGHTBOX_CACHE_DIR>/local",
            "where the local development servers record their running instances",
            "a development-server path, shared by every command that finds a local server"),
    Outside("LIGHTBOX_AZURITE", "installed from npm into the cache",
            "an `azurite-blob` executable for `lightbox azure up`", "a development-server tool, not a worker setting"),
    Outside("LIGHTBOX_FAKE_GCS", "built with `go install` into the cache",
            "a `fake-gcs-server` executable for `lightbox gcs up`", "a development-server tool, not a worker setting"),
    Outside("LIGHTBOX_TOXIPROXY_SERVER", "built with `go install` into the cache",
            "a Toxiproxy `server` executable for `lightbox toxiproxy up`, the network fault tests and "
            "`bench/bench_faults.py`", "a development-server tool, not a worker setting"),
    Outside("LIGHTBOX_TRITON_PYTHON", "<LIGHTBOX_CACHE_DIR>/tritonenv/bin/python",
            "the Python of Triton's own environment (nvidia-pytriton), which starts a local Triton server "
            "for the tests and `bench/bench_batching.py triton`",
            "a worker reaches Triton by `LIGHTBOX_TRITON_URL`; this only starts a local server"),
    Outside("LIGHTBOX_STATE_FILE", "<LIGHTBOX_STATE_DIR>/kafka-….json",
            "the state file of the local Kafka broker `lightbox kafka up` started (also `LIGHTBOX_S3_STATE_FILE`, "
            "`LIGHTBOX_AZURITE_STATE_FILE`, `LIGHTBOX_GCS_STATE_FILE`, `LIGHTBOX_TOXIPROXY_STATE_FILE`, "
            "`LIGHTBOX_REGISTRY_STATE_FILE` for the other local servers)",
            "names one development-server instance for the commands that look for it"),
    Outside("LIGHTBOX_BIND", "127.0.0.1", "the address compose publishes every port on (`infra/docker-compose.yml`)",
            "read by Docker Compose, not by lightbox"),
    Outside("LIGHTBOX_COMPOSE_ENV", "infra/compose.env", "the env file compose gives its services",
            "read by Docker Compose, not by lightbox"),
)

#: variables lightbox sets for its own child processes; not for users
INTERNAL = ("LIGHTBOX_BACKFILL_LIVE_FD", "LIGHTBOX_BACKFILL_PARENT_PID")


def _bounds(info: FieldInfo) -> str:
    marks = []
    for meta in info.metadata:
        for kind, attr, sign in ((annotated_types.Ge, "ge", "≥"), (annotated_types.Gt, "gt", ">"),
                                 (annotated_types.Le, "le", "≤"), (annotated_types.Lt, "lt", "<")):
            if isinstance(meta, kind):
                marks.append(f"{sign} {getattr(meta, attr)}")
    return ", ".join(marks)


def _type_name(annotation: Any) -> str:
    """A reader's name for a field's type: ``int``, ``path``, ``auto, cpu or gpu``, ``list of str``…"""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is Literal:
        names = [str(a) for a in args]
        return ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]
    if origin in (typing.Union, types.UnionType):
        kept = [a for a in args if a is not type(None)]
        return " or ".join(_type_name(a) for a in kept)
    if origin is list:
        return f"list of {_type_name(args[0])} (comma-separated or JSON)"
    if annotation is Path:
        return "path"
    if annotation is SecretStr:
        return "secret"
    return getattr(annotation, "__name__", str(annotation))


def _show(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, SecretStr):
        return MASK
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value) if value else "empty"
    return str(value)


def _default(name: str, info: FieldInfo) -> str:
    if info.default_factory is not None:
        if name in _DEFAULT_FACTORIES:
            return _DEFAULT_FACTORIES[name]
        return _show(info.default_factory())  # type: ignore[call-arg]
    return _show(info.default)


def _is_secret(name: str, info: FieldInfo) -> bool:
    if _type_name(info.annotation) == "secret":
        return True
    return bool(_SECRET_NAME.search(name)) and not name.endswith("_file")


def rows() -> list[Row]:
    """Every ``Settings`` variable, in section order, then field order. Raises ``ValueError`` for a
    field without a description: the reference has no line for it."""
    out: list[Row] = []
    for flat in Settings.flat_names():
        routes = Settings.routes(flat)
        section, name = routes[0]
        info = _SECTIONS[section].model_fields[name]
        if not info.description:
            raise ValueError(f"{section}.{name} has no description: add Field(description=...) in streams/settings.py")
        bounds = _bounds(info)
        kind = _type_name(info.annotation) + (f", {bounds}" if bounds else "")
        out.append(Row(PREFIX + flat.upper(), tuple(s for s, _ in routes), name, kind, _default(name, info),
                       " ".join(info.description.split()), _is_secret(name, info)))
    return out


def mask(value: str) -> str:
    """``value`` with any user and password in a URL replaced (``s3://key:secret@host`` → ``s3://***@host``)."""
    return _URL_USERINFO.sub(lambda m: f"{m.group('scheme')}***@", value)


def in_effect(settings: Settings, environ: Mapping[str, str], dotenv: Mapping[str, str | None]
              ) -> list[tuple[Row, str, str]]:
    """Each row with the value ``settings`` holds (secrets masked) and where it came from:
    ``environment``, ``.env`` or ``default``."""
    out = []
    for row in rows():
        section = getattr(settings, row.sections[0])
        value = getattr(section, row.field)
        shown = MASK if row.secret and value is not None else mask(_show(value))
        source = "environment" if row.variable in environ else ".env" if row.variable in dotenv else "default"
        out.append((row, shown, source))
    return out


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown() -> str:
    """``docs/settings.md``: one table per section, then the variables read outside ``Settings``."""
    lines = [
        "# Settings",
        "",
        f"<!-- generated from streams/settings.py by `{REGENERATE}` (`make docs`); do not edit by hand -->",
        "",
        "Every setting is an environment variable, or a `NAME=value` line in a `.env` file in the folder a",
        "command runs from; the environment wins over `.env`. `lightbox settings` prints the values in effect",
        "and where each came from, secrets masked. Command-line options override both.",
        "",
    ]
    by_section: dict[str, list[Row]] = {}
    for row in rows():
        by_section.setdefault(row.sections[0], []).append(row)
    for section, model in _SECTIONS.items():
        doc = " ".join((model.__doc__ or "").split())
        lines += [f"## {section}", "", doc, "", "| variable | type | default | meaning |", "|---|---|---|---|"]
        for row in by_section.get(section, []):
            also = f" (also sets {', '.join(row.sections[1:])})" if len(row.sections) > 1 else ""
            default = row.default if row.default in ("unset", "empty") else f"`{_cell(row.default)}`"
            lines.append(f"| `{row.variable}` | {_cell(row.type)} | {default} | "
                         f"{_cell(row.meaning)}{also} |")
        lines.append("")
    lines += [
        "## Read outside `Settings`",
        "",
        "These are read straight from the environment (a `.env` file does not set them), each for the reason",
        "given.",
        "",
        "| variable | default | meaning | why not in `Settings` |",
        "|---|---|---|---|",
    ]
    lines += [f"| `{o.variable}` | {_cell(o.default)} | {_cell(o.meaning)} | {_cell(o.why)} |" for o in OUTSIDE]
    lines += ["", "lightbox also sets " + ", ".join(f"`{v}`" for v in INTERNAL)
              + " for its backfill child process; they are not settings.", ""]
    return "\n".join(lines)
