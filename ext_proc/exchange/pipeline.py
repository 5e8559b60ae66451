"""The request pipeline as plain functions: body → findings → rewrite → egress check.

Nothing here talks to Envoy, Redis or the OCR pool, so the whole of it can be called and tested
in-process: `find_media` lists a body's media parts once, `redact_document` runs the detectors
(the tenant's catalog and the declared subjects) over every string the dialect walk hands it and
writes placeholders (or strip markers), and `redact_and_check` also reads the final body again
for any declared identifier that survived, whatever redaction did.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ext_proc.detect.catalog.engine import Catalog
from ext_proc.detect.findings import Finding
from ext_proc.detect.subjects.matcher import CompiledSubjects
from ext_proc.dialects import Dialect
from ext_proc.media.parts import MediaPart
from ext_proc.policy.model import Policy
from ext_proc.transform.egress import check_body
from ext_proc.transform.placeholders import Placeholders
from ext_proc.transform.redact import Replacement, resolve_overlaps, reversible, rewrite, strip
from ext_proc.transform.surrogates import surrogates_kept
from ext_proc.transform.walk import LeafWalker, dump_json

Detect = Callable[[str], list[Finding]]


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
    `counts` gains one per replaced finding, by label. Media payloads (bytes) are not read as
    text, nor system text under `redactSystem: false`."""
    # Surrogate mode writes placeholders first; the commit swaps them before release.
    restores = policy.mode in ("reversible", "surrogate")
    replacement: Replacement = reversible(placeholders) if restores else strip
    detect: Detect = catalog.detect
    if policy.mode == "surrogate":
        detect = surrogates_kept(detect)
    subject_detect = subjects.detect if subjects is not None else None

    def visit(text: str) -> str:
        findings = detect(text)
        if subject_detect is not None:
            findings = [*findings, *subject_detect(text)]
        if not findings:
            return text
        return rewrite(text, resolve_overlaps(findings), replacement, counts)

    positions: set[tuple[int, object]] = {(id(part.container), part.key) for part in media if part.is_bytes}
    system: set[tuple[int, object]] = set()
    if not policy.redact_system:
        system = {(id(container), key) for container, key in dialect.system_positions(doc)}
    walker = LeafWalker(visit, media_positions=positions, system_positions=system)
    new_doc = walker.walk(doc)
    return Redaction(new_doc, walker.stats.changed)


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
    hit = check_body(body, dialect, subjects, nonce=placeholders.nonce)
    check_ms = round((time.perf_counter() - start) * 1000, 3)
    return Checked(body, changed, hit.label if hit is not None else None, check_ms)
