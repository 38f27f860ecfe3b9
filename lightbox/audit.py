"""``lightbox audit``: reconcile inputs against processed events and dead letters.

Every input must end as exactly one logical output: a ``ProcessedImageEvent`` or a
``DeadLetterEvent``. After a crash an input may be output twice; that is allowed when the copies
are byte-identical (same ``event_id``, same variant bytes and sha256), because outputs are
deterministic. The audit counts inputs, processed, dead letters, missing and duplicate outputs,
and says whether every duplicate is identical.

Identity: an input is known by its ``event_id`` (the ``source_event_id`` its outputs carry) when
it can be read, else by its position ``topic:partition:offset`` (dead letters keep the original
record's position; processed events carry it in the ``lightbox-source`` header). The same event
replayed on the backfill topic is the same logical input.

:func:`reconcile` is pure (records in, an :class:`AuditReport` out); :func:`run_audit` reads the
topics from Kafka through :mod:`streams.consume`.
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from schemas.errors import LightboxError
from schemas.events import EventCodecs
from streams.registry import default_codecs

__all__ = ["AuditInput", "AuditOutput", "AuditReport", "input_of", "output_of", "reconcile", "run_audit"]

SOURCE_HEADER = "lightbox-source"
Kind = Literal["processed", "dead_letter"]


def position(topic: str, partition: int, offset: int) -> str:
    return f"{topic}:{partition}:{offset}"


@dataclass(frozen=True, slots=True)
class AuditInput:
    """One input record: where it is, and its event id when it could be read."""

    topic: str
    partition: int
    offset: int
    event_id: str | None
    value_sha256: str = ""
    headers: tuple[tuple[str, bytes], ...] = ()

    @property
    def position(self) -> str:
        return position(self.topic, self.partition, self.offset)


@dataclass(frozen=True, slots=True)
class AuditOutput:
    """One processed event or dead letter, reduced to what reconciliation compares.

    ``fingerprint`` is what must match between duplicates: for a processed event its event id and
    every variant (preset, format, size, declared sha256 and the digest of the bytes or the URI);
    for a dead letter its event id, error code and the digest of the original value.
    ``original`` is a dead letter's copy of the input (value digest, headers), checked against it."""

    kind: Kind
    event_id: str
    source_event_id: str | None
    source: str | None  # topic:partition:offset of the input, when known
    fingerprint: tuple[Any, ...]
    where: str = ""  # the output's own topic:partition:offset
    error_code: str | None = None
    original: tuple[str, tuple[tuple[str, bytes], ...]] | None = None
    digest_ok: bool = True  # every inline variant's bytes hash to its declared sha256


@dataclass
class AuditReport:
    inputs: int = 0
    processed: int = 0  # inputs with a processed event
    dead_letters: int = 0  # inputs with a dead letter (and no processed event)
    missing: list[str] = field(default_factory=list)  # inputs with neither (positions)
    duplicates: int = 0  # outputs beyond the first for an input
    duplicated_inputs: int = 0
    duplicates_identical: bool = True
    conflicts: list[str] = field(default_factory=list)  # inputs whose outputs differ (positions)
    original_mismatches: list[str] = field(default_factory=list)  # dead letters whose original != the input
    bad_digests: int = 0  # processed events whose inline bytes do not hash to their sha256
    outside_range: int = 0  # outputs of inputs not in the audited range
    unreadable_outputs: int = 0
    error_codes: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.conflicts or self.original_mismatches or self.bad_digests)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}

    def lines(self, shown: int = 20) -> list[tuple[str, bool]]:
        """The report as text: ``(line, is_a_problem)`` per line; lists cut at ``shown`` items."""
        same = "" if not self.duplicates else " (byte-identical)" if self.duplicates_identical else " (NOT identical)"
        out = [(f"inputs {self.inputs}  processed {self.processed}  dead letters {self.dead_letters}  "
                f"missing {len(self.missing)}  duplicates {self.duplicates}{same}", False)]
        if self.error_codes:
            out.append(("dead letters by code: " + ", ".join(f"{k} {v}" for k, v in self.error_codes.items()), False))
        for title, items in (("missing", self.missing), ("differing duplicates", self.conflicts),
                             ("dead letters whose original differs from the input", self.original_mismatches)):
            if items:
                more = f" … ({len(items)} in all)" if len(items) > shown else ""
                out.append((f"{title}: {', '.join(items[:shown])}{more}", True))
        if self.bad_digests:
            out.append((f"{self.bad_digests} processed events whose bytes do not match their sha256", True))
        if self.outside_range or self.unreadable_outputs:
            out.append((f"({self.outside_range} outputs of inputs outside the range, "
                        f"{self.unreadable_outputs} unreadable outputs)", False))
        return out


def _sha(data: bytes | None) -> str:
    return hashlib.sha256(data or b"").hexdigest()


def reconcile(inputs: Iterable[AuditInput], outputs: Iterable[AuditOutput], *, unreadable_outputs: int = 0
              ) -> AuditReport:
    """Match outputs to inputs by event id (position for unreadable inputs) and count."""
    key_of_pos: dict[str, str] = {}
    first_pos: dict[str, str] = {}
    by_pos: dict[str, AuditInput] = {}
    for rec in inputs:
        key = rec.event_id or f"@{rec.position}"
        key_of_pos[rec.position] = key
        first_pos.setdefault(key, rec.position)
        by_pos[rec.position] = rec
    report = AuditReport(inputs=len(first_pos), unreadable_outputs=unreadable_outputs)
    got: dict[str, list[AuditOutput]] = defaultdict(list)
    codes: Counter[str] = Counter()
    for out in outputs:
        key = out.source_event_id or (key_of_pos.get(out.source, f"@{out.source}") if out.source else "")
        if key not in first_pos:
            report.outside_range += 1
            continue
        got[key].append(out)
        report.bad_digests += not out.digest_ok
        if out.kind == "dead_letter" and out.source in by_pos and out.original is not None:
            rec = by_pos[out.source]
            if out.original != (rec.value_sha256, rec.headers):
                report.original_mismatches.append(out.source)
    for key, pos in first_pos.items():
        outs = got.get(key, [])
        if not outs:
            report.missing.append(pos)
            continue
        if any(o.kind == "processed" for o in outs):
            report.processed += 1
        else:
            report.dead_letters += 1
            codes[outs[0].error_code or "?"] += 1
        if len(outs) > 1:
            report.duplicates += len(outs) - 1
            report.duplicated_inputs += 1
            if _differ(outs):
                report.conflicts.append(pos)
    order = {r.position: (r.topic, r.partition, r.offset) for r in by_pos.values()}
    for listed in (report.missing, report.conflicts, report.original_mismatches):
        listed.sort(key=lambda pos: order.get(pos, ("", 0, 0)))
    report.duplicates_identical = not report.conflicts
    report.error_codes = dict(sorted(codes.items()))
    return report


def _differ(outs: Sequence[AuditOutput]) -> bool:
    """Whether the outputs of one input are not all the same: one kind, one fingerprint, and one
    event id per source position (a dead letter's id comes from its input's position, so the same
    event dead-lettered on two topics has two ids)."""
    if len({(o.kind, o.fingerprint) for o in outs}) > 1:
        return True
    ids: dict[str | None, set[str]] = defaultdict(set)
    for o in outs:
        ids[o.source].add(o.event_id)
    return any(len(v) > 1 for v in ids.values())


# -- from Kafka records -------------------------------------------------------------------------
def input_of(codecs: EventCodecs, topic: str, partition: int, offset: int, value: bytes | None,
             headers: Sequence[tuple[str, bytes]] = ()) -> AuditInput:
    event_id = None
    if value is not None:
        try:
            event_id = str(codecs.product.decode(value)["event_id"])
        except LightboxError:  # unreadable: known by its position
            event_id = None
    return AuditInput(topic, partition, offset, event_id, _sha(value), tuple((k, bytes(v or b"")) for k, v in headers))


def output_of(codecs: EventCodecs, value: bytes | None, headers: Sequence[tuple[str, bytes]] = (),
              where: str = "") -> AuditOutput | None:
    """The :class:`AuditOutput` of a processed event or dead letter; None when unreadable."""
    from streams.consume import decode_any

    if value is None:
        return None
    try:
        kind, ev = decode_any(codecs, value)
    except LightboxError:
        return None
    source = next((v.decode(errors="replace") for k, v in headers if k == SOURCE_HEADER), None)
    if kind == "processed":
        variants = tuple(
            (v["preset"], v["format"], v["width"], v["height"], v["size"], v["sha256"],
             _sha(v["data"]) if v.get("data") is not None else v.get("uri"))
            for v in ev["variants"])
        ok = all(v.get("data") is None or _sha(v["data"]) == v["sha256"] for v in ev["variants"])
        return AuditOutput("processed", ev["event_id"], ev["source_event_id"], source,
                           (ev["event_id"], variants), where, digest_ok=ok)
    if kind == "dead_letter":
        orig = ev["original"]
        pos = position(orig["topic"], orig["partition"], orig["offset"])
        original = (_sha(orig["value"]), tuple((h["key"], h["value"] or b"") for h in orig["headers"]))
        return AuditOutput("dead_letter", ev["event_id"], ev["source_event_id"], pos,
                           (ev["error_code"], original[0]), where,
                           error_code=ev["error_code"], original=original)
    return None


async def run_audit(bootstrap: str, input_topics: Sequence[str], output_topics: Sequence[str], *,
                    from_offset: int | None = None, to_offset: int | None = None, since_ms: int | None = None,
                    until_ms: int | None = None, codecs: EventCodecs | None = None,
                    security: Mapping[str, Any] | None = None) -> AuditReport:
    """Read the inputs in the range and every output that can belong to them; reconcile.

    Outputs are read from the topics' start, or from ``since_ms`` (outputs are produced after
    their inputs) when a time range is given. ``security``: aiokafka keyword arguments
    (``streams.security.aiokafka_kwargs``); from the ``LIGHTBOX_KAFKA_*`` environment when ``None``."""
    from streams.consume import read_records

    codecs = codecs or default_codecs()
    ins = await read_records(bootstrap, input_topics, from_offset=from_offset, to_offset=to_offset,
                             since_ms=since_ms, until_ms=until_ms, security=security)
    outs_raw = await read_records(bootstrap, output_topics, since_ms=since_ms, security=security)
    inputs = [input_of(codecs, r.topic, r.partition, r.offset, r.value, r.headers) for r in ins]
    outputs, unreadable = [], 0
    for r in outs_raw:
        out = output_of(codecs, r.value, r.headers, position(r.topic, r.partition, r.offset))
        if out is None:
            unreadable += 1
        else:
            outputs.append(out)
    return reconcile(inputs, outputs, unreadable_outputs=unreadable)
