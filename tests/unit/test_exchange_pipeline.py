"""The request pipeline as plain functions, called without an exchange: media, redaction, and the
egress check that reads the outgoing bytes again.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from ext_proc.detect.catalog.engine import Catalog
from ext_proc.detect.subjects.header import encode_subject_header, parse_subject_header
from ext_proc.detect.subjects.matcher import CompiledSubjects, compile_subjects
from ext_proc.dialects import DIALECTS
from ext_proc.exchange.pipeline import find_media, redact_and_check, redact_document
from ext_proc.policy.model import Policy
from ext_proc.transform.placeholders import PlaceholderMap
from ext_proc.transform.walk import dump_json
from tests.support.e2e import PERSON, SAMPLES
from tests.support.fakes import chat

CHAT = DIALECTS["chat"]
EMAIL = SAMPLES["EMAIL"]
IMAGE: dict[str, Any] = {
    "type": "image_url",
    "image_url": {"url": "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAAB"},
}


def subjects() -> CompiledSubjects:
    return compile_subjects(parse_subject_header(encode_subject_header({"ref": "p-1", "subjects": [PERSON]})))


def body(system: str, text: str) -> dict[str, Any]:
    doc = chat(text, system=system)
    doc["messages"].append({"role": "user", "content": [{"type": "text", "text": "and this"}, IMAGE]})
    return doc


def test_find_media_lists_each_part_once() -> None:
    doc = body("be brief", "hello")
    [part] = find_media(doc, CHAT)
    assert (part.media, part.is_bytes) == ("image", True)
    assert part.container[part.key] == IMAGE["image_url"]["url"]


def test_redact_document_and_redact_and_check_on_a_chat_body_with_a_subject() -> None:
    policy = Policy(tenant="acme")
    doc = body("Assist Marisol.", f"Write to Marisol Quintero-Vance at {EMAIL}")
    raw = json.dumps(doc).encode()
    placeholders = PlaceholderMap()
    counts: Counter[str] = Counter()
    compiled = subjects()
    media = find_media(doc, CHAT)
    redaction = redact_document(
        json.loads(raw),
        policy=policy,
        dialect=CHAT,
        catalog=Catalog.for_sets(policy.sets),
        placeholders=placeholders,
        subjects=compiled,
        media=media,
        counts=counts,
    )
    n = placeholders.nonce
    expected = body(f"Assist <SUBJECT1_NAME_{n}_1>.", f"Write to <SUBJECT1_NAME_{n}_2> at <EMAIL_{n}_1>")
    assert redaction.changed and redaction.doc == expected
    assert placeholders.originals == {
        f"<SUBJECT1_NAME_{n}_1>": "Marisol",
        f"<SUBJECT1_NAME_{n}_2>": "Marisol Quintero-Vance",
        f"<EMAIL_{n}_1>": EMAIL,
    }
    assert counts == Counter({"SUBJECT1_NAME": 2, "EMAIL": 1})

    # The same through redact_and_check: the bytes that would leave, read again.
    checked_counts: Counter[str] = Counter()
    checked_map = PlaceholderMap()
    checked = redact_and_check(
        raw,
        doc,
        policy=policy,
        dialect=CHAT,
        catalog=Catalog.for_sets(policy.sets),
        placeholders=checked_map,
        subjects=compiled,
        media=media,
        counts=checked_counts,
    )
    m = checked_map.nonce
    assert checked.changed and checked.survivor is None
    assert checked.body == dump_json(
        body(f"Assist <SUBJECT1_NAME_{m}_1>.", f"Write to <SUBJECT1_NAME_{m}_2> at <EMAIL_{m}_1>")
    )
    assert checked_counts == counts
    assert checked.check_ms >= 0


def test_redact_and_check_finds_a_declared_identifier_left_in_the_system_prompt() -> None:
    """redactSystem: false leaves system text as it is; the egress check still reads it."""
    policy = Policy(tenant="acme", redact_system=False)
    doc = chat("Write to Marisol Quintero-Vance", system="The caller is Marisol Quintero-Vance.")
    raw = json.dumps(doc).encode()
    placeholders = PlaceholderMap()
    checked = redact_and_check(
        raw,
        doc,
        policy=policy,
        dialect=CHAT,
        catalog=Catalog.for_sets(policy.sets),
        placeholders=placeholders,
        subjects=subjects(),
        media=[],
        counts=Counter(),
    )
    assert checked.changed
    assert checked.survivor == "SUBJECT1_NAME"
    n = placeholders.nonce
    assert json.loads(checked.body) == chat(
        f"Write to <SUBJECT1_NAME_{n}_1>", system="The caller is Marisol Quintero-Vance."
    )


def test_redact_and_check_without_findings_returns_the_raw_bytes() -> None:
    policy = Policy(tenant="acme")
    raw = b'{"model": "gpt-test", "messages": [{"role": "user", "content": "hello"}]}'
    checked = redact_and_check(
        raw,
        json.loads(raw),
        policy=policy,
        dialect=CHAT,
        catalog=Catalog.for_sets(policy.sets),
        placeholders=PlaceholderMap(),
        subjects=subjects(),
        media=[],
        counts=Counter(),
    )
    assert (checked.body, checked.changed, checked.survivor) == (raw, False, None)


def test_strip_mode_writes_markers() -> None:
    policy = Policy(tenant="acme", mode="strip")
    placeholders = PlaceholderMap()
    redaction = redact_document(
        chat(f"mail {EMAIL}"),
        policy=policy,
        dialect=CHAT,
        catalog=Catalog.for_sets(policy.sets),
        placeholders=placeholders,
        subjects=None,
        media=[],
        counts=Counter(),
    )
    assert redaction.doc == chat("mail [EMAIL]")
    assert placeholders.originals == {}
