"""The request pipeline as plain functions: body → findings → rewrite → egress check.

Nothing here talks to Envoy, Redis or the OCR pool, so the whole of it can be called and tested
in-process: `find_media` lists a body's media parts once, `redact_document` runs the detectors
(the tenant's catalog, what each value's key and the pairs written in a text imply
(ext_proc.detect.structure), and the declared subjects) over every string the dialect walk hands
it and writes placeholders (or strip markers), and `redact_and_check` also reads the final body
again for any declared identifier that survived, whatever redaction did.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ext_proc.detect.catalog.engine import Catalog
from ext_proc.detect.findings import Finding
from ext_proc.detect.opaque import FIXED_SHAPE_DETECTORS, OPAQUE_KEYS, is_opaque_token
from ext_proc.detect.structure import KeyPath, reads_number, structured_findings
from ext_proc.detect.subjects.matcher import CompiledSubjects
from ext_proc.dialects import Dialect
from ext_proc.media.parts import MediaPart
from ext_proc.policy.model import Policy
from ext_proc.transform.actions import apply_actions
from ext_proc.transform.egress import check_body
from ext_proc.transform.placeholders import Placeholders
from ext_proc.transform.redact import (
    Replacement,
    distinct_strip_key,
    resolve_overlaps,
    reversible,
    rewrite,
    strip,
)
from ext_proc.transform.surrogates import surrogates_kept
from ext_proc.transform.walk import Encoded, LeafWalker, Position, dump_json


def find_media(doc: Any, dialect: Dialect) -> list[MediaPart]:
    """The body's media parts at the dialect's schema positions, each at most once (the first,
    most specific discovery of a payload wins)."""
    found: dict[tuple[int, str], MediaPart] = {}
    for part in dialect.media(doc):
        found.setdefault((id(part.container), part.key), part)
    return list(found.values())


@dataclass(frozen=True, slots=True)
class Redaction:
    doc: Any
    changed: bool


def redact_document(
    doc: Any,
    *,
    policy: Policy,
    dialect: Dialect,
    catalog: Catalog,
    placeholders: Placeholders,
    subjects: CompiledSubjects | None,
    media: Sequence[MediaPart],
    counts: Counter[str],
) -> Redaction:
    """Every string of `doc` (values, keys, JSON inside strings) with its findings replaced;
    `counts` gains one per replaced finding, by label. Real media bytes are not read as text (a
    media payload that is base64 of text is read as that text), nor system text under
    `redactSystem: false`."""
    # Surrogate mode writes placeholders first; the commit swaps them before release.
    restores = policy.mode in ("reversible", "surrogate")
    replacement: Replacement = reversible(placeholders) if restores else strip
    surrogate = policy.mode == "surrogate"
    subject_detect = subjects.detect if subjects is not None else None
    fixed_shape = catalog.restricted(FIXED_SHAPE_DETECTORS)

    extensions = policy.extensions

    def catalog_findings(text: str, path: KeyPath | None) -> list[Finding]:
        found = catalog.detect(text)
        structured = structured_findings(text, path, catalog)
        if structured:
            # What a key implies passes the allow list too (the catalog's own findings did).
            found = [*found, *catalog.allowed(text, structured)]
        return apply_actions(found, extensions, counts)

    def detect(text: str, path: KeyPath | None) -> list[Finding]:
        if surrogate:
            return surrogates_kept(lambda t: catalog_findings(t, path))(text)
        return catalog_findings(text, path)

    def visit(text: str, path: KeyPath | None) -> str:
        if path and path[-1] in OPAQUE_KEYS and is_opaque_token(text):
            # A provider's opaque blob (encrypted reasoning, a signature): only a key of a fixed
            # shape can be in it; read as words it would spell initials by chance.
            findings = apply_actions(fixed_shape.detect(text), extensions, counts)
        else:
            findings = detect(text, path)
            if subject_detect is not None:
                findings = [*findings, *subject_detect(text)]
        if not findings:
            return text
        return rewrite(text, resolve_overlaps(findings, text), replacement, counts)

    positions, encoded = media_positions(media)
    system: set[Position] = set()
    if not policy.redact_system:
        system = {(id(container), key) for container, key in dialect.system_positions(doc)}
    walker = LeafWalker(
        visit,
        media_positions=positions,
        system_positions=system,
        encoded=encoded,
        read_number=reads_number,
        # Strip markers carry no index: two keys redacted alike are numbered apart. A placeholder
        # is distinct per original, so a collision there is refused (KeyCollision).
        distinct_key=None if restores else distinct_strip_key,
    )
    new_doc = walker.walk(doc)
    return Redaction(new_doc, walker.stats.changed)


def media_positions(media: Sequence[MediaPart]) -> tuple[set[Position], dict[Position, Encoded]]:
    """The positions of real media (not read as text), and of payloads that are base64 of text
    (read as that text)."""
    skipped: set[Position] = set()
    encoded: dict[Position, Encoded] = {}
    for part in media:
        position = (id(part.container), part.key)
        if part.is_bytes:
            skipped.add(position)
        elif part.encoded_text is not None and part.payload is not None:
            encoded[position] = part.payload
    return skipped, encoded


@dataclass(frozen=True, slots=True)
class Checked:
    """A subject request's body after redaction: what would leave, and what survived in it."""

    body: bytes
    changed: bool
    survivor: str | None  # the label (`SUBJECT1_PHONE`) of a declared identifier still there
    check_ms: float  # the egress check's own time


def redact_and_check(
    raw: bytes,
    doc: Any,
    *,
    policy: Policy,
    dialect: Dialect,
    catalog: Catalog,
    placeholders: Placeholders,
    subjects: CompiledSubjects,
    media: Sequence[MediaPart],
    counts: Counter[str],
    masked: bool = False,
) -> Checked:
    """Redact, then read the outgoing bytes again for the declared identifiers (`masked`: images
    were masked in place, so the body changed even where no text did)."""
    redaction = redact_document(
        doc,
        policy=policy,
        dialect=dialect,
        catalog=catalog,
        placeholders=placeholders,
        subjects=subjects,
        media=media,
        counts=counts,
    )
    changed = redaction.changed or masked
    body = dump_json(redaction.doc) if changed else raw
    start = time.perf_counter()
    hit = check_body(body, dialect, subjects, nonce=placeholders.nonce, pseudonyms=placeholders.pseudonyms())
    check_ms = round((time.perf_counter() - start) * 1000, 3)
    return Checked(body, changed, hit.label if hit is not None else None, check_ms)
