"""Key context (ext_proc.detect.structure) and real media (ext_proc.media.parts), read by the walk,
the pipeline, the egress check and the output gate.

Values are invented: an SSN and phone numbers from reserved ranges, passwords made up here.
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from typing import Any

import pytest

from ext_proc.detect.catalog.engine import Catalog
from ext_proc.detect.findings import SETS, Finding
from ext_proc.detect.structure import key_role, pair_findings, path_role, value_findings
from ext_proc.detect.subjects.header import encode_subject_header, parse_subject_header
from ext_proc.detect.subjects.matcher import compile_subjects
from ext_proc.dialects import DIALECTS
from ext_proc.exchange.pipeline import find_media, redact_and_check, redact_document
from ext_proc.exchange.refusals import refusal_for
from ext_proc.media.parts import read_payload, signature_family
from ext_proc.policy.model import Policy
from ext_proc.restore.output_gate import OutputGate
from ext_proc.transform.placeholders import PlaceholderMap
from ext_proc.transform.redact import resolve_overlaps
from ext_proc.transform.walk import KeyCollision
from tests.support.e2e import PERSON

ALL = Catalog.for_sets(SETS)
SSN = "078051120"  # nine digits: an SSN only where a key (or a word) says so
PHONE = "4155550132"  # ten digits: a phone only where a key (or a word) says so
PASSWORD = "tulip-Harbor-92"
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAAB")  # a PNG's signature and IHDR chunk


def left_in(text: str, *values: str) -> list[int]:
    """The indices of `values` still in `text` (a failing assertion names indices, never values)."""
    return [index for index, value in enumerate(values) if value in text]


def kinds(findings: list[Any], text: str) -> list[tuple[str, str]]:
    return [(f.kind, text[f.start : f.end]) for f in findings]


# --- which keys say something --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "kind"),
    [
        ("password", "SECRET_ASSIGNMENT"),
        ("db_password", "SECRET_ASSIGNMENT"),
        ("apiKey", "SECRET_ASSIGNMENT"),
        ("client_secret", "SECRET_ASSIGNMENT"),
        ("Authorization", "SECRET_ASSIGNMENT"),
        ("access_token", "SECRET_ASSIGNMENT"),
        ("passcode", "SECRET_ASSIGNMENT"),
        ("session_cookie", "SECRET_ASSIGNMENT"),
        ("ssn", "SSN"),
        ("social_security_number", "SSN"),
        ("SocialSecurityNumber", "SSN"),
        ("tax_id", "SSN"),
        ("phone", "PHONE"),
        ("phone_number", "PHONE"),
        ("phoneNumber", "PHONE"),
        ("PHONE_NUMBER", "PHONE"),
        ("Phone Number", "PHONE"),
        ("mobile", "PHONE"),
        ("tel", "PHONE"),
        ("telno", "PHONE"),
        ("fax_number", "PHONE"),
        ("emergency_contact_phone", "PHONE"),
        ("contact_number", "PHONE"),
    ],
)
def test_keys_that_name_a_value(key: str, kind: str) -> None:
    role = key_role(key)
    assert role is not None and role.kind == kind


@pytest.mark.parametrize(
    "key",
    [
        "token_count", "max_tokens", "total_tokens", "password_hint", "password_policy", "secret_name",
        "token_url", "public_key", "phone_type", "phone_verified", "has_phone", "phone_country_code",
        "cell_type", "ssn_last4", "eos_token", "pad_token", "tokens", "name", "content", "hotel",
        "email", "key", "id", "text",
    ],
)  # fmt: skip
def test_keys_that_name_a_property_or_nothing(key: str) -> None:
    assert key_role(key) is None


@pytest.mark.parametrize(
    "key",
    [
        "p\u0430ssword",
        "\uff50\uff41\uff53\uff53\uff57\uff4f\uff52\uff44",
        "pass\u200bword",
        "Passwort",
        "mot_de_passe",
    ],
)
def test_a_disguised_or_foreign_secret_key_still_names_a_secret(key: str) -> None:
    role = key_role(key)
    assert role is not None and role.kind == "SECRET_ASSIGNMENT"


@pytest.mark.parametrize(
    "key", ["tel\u00e9fono", "telefonnummer", "numero_de_telephone", "\uff53\uff53\uff4e"]
)
def test_a_disguised_or_foreign_identifier_key_still_names_it(key: str) -> None:
    assert key_role(key) is not None


def test_a_key_is_found_through_wrappers_but_not_under_logprobs() -> None:
    assert path_role(("phone", "number")) == key_role("phone")
    assert path_role(("password", "value")) == key_role("password")
    assert path_role(("password", "description")) is None  # a schema describing a password
    assert path_role(("logprobs", "content", "token")) is None  # a model's token is text


# --- values under keys -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (("ssn",), SSN, [("SSN", SSN)]),
        (("record", "social_security_number"), "078-051120", [("SSN", "078-051120")]),
        (("phone",), PHONE, [("PHONE", PHONE)]),
        (("contact", "mobile"), "415 555 0132", [("PHONE", "415 555 0132")]),
        (("password",), PASSWORD, [("SECRET_ASSIGNMENT", PASSWORD)]),
        (("password",), "mySecretPassword", [("SECRET_ASSIGNMENT", "mySecretPassword")]),
        (("headers", "Authorization"), "Bearer q8R2kLm4Zt", [("SECRET_ASSIGNMENT", "q8R2kLm4Zt")]),
        (("auth",), "a1b2c3d4e5", [("SECRET_ASSIGNMENT", "a1b2c3d4e5")]),
        (("token",), "abc123XYZ", [("SECRET_ASSIGNMENT", "abc123XYZ")]),
        (("DB_PASS",), "kettle", [("SECRET_ASSIGNMENT", "kettle")]),
        (("session_cookie",), "sid=abc; theme=dark", [("SECRET_ASSIGNMENT", "sid=abc; theme=dark")]),
    ],
)
def test_a_value_is_read_in_its_keys_context(path: tuple[str, ...], value: str, expected: Any) -> None:
    assert kinds(value_findings(path, value, ALL), value) == expected


def test_alone_the_bare_digits_say_nothing() -> None:
    assert ALL.detect(SSN) == [] and ALL.detect(PHONE) == [] and ALL.detect(PASSWORD) == []


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("password",), ""),
        (("password",), "  "),
        (("password",), "true"),
        (("password",), "null"),
        (("password",), "********"),
        (("password",), "${DB_PASSWORD}"),
        (("password",), "{{ vault.db }}"),
        (("password",), "<your password>"),
        (("password",), "[REDACTED]"),
        (("api_key",), "OPENAI_API_KEY"),
        (("token",), "refresh_token"),
        (("auth",), "oauth2"),
        (("auth",), "bearer"),
        (("pwd",), "/home/agent/project"),
        (("pass",), "through"),
        (("token",), "Hello"),
        (("secret",), "The meeting is at noon"),
        (("api_key",), "test"),
        (("phone",), "ask at the front desk"),
        (("phone",), "12"),
        (("ssn",), "123"),
        (("max_tokens",), "4096"),
        (("phone_type",), PHONE),
    ],
)
def test_values_that_are_no_value(path: tuple[str, ...], value: str) -> None:
    assert value_findings(path, value, ALL) == []


def test_a_policy_without_the_kind_adds_nothing() -> None:
    secrets_only = Catalog.for_sets(["secrets"])
    assert value_findings(("ssn",), SSN, secrets_only) == []
    assert value_findings(("password",), PASSWORD, Catalog.for_sets(["pii"])) == []


# --- pairs written in text ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f'The record: {{"ssn": "{SSN}", "phone": {PHONE}}} ends here', [("SSN", SSN), ("PHONE", PHONE)]),
        (f'escaped {{\\"ssn\\": \\"{SSN}\\"}}', [("SSN", SSN)]),
        (f"python {{'phone_number': '{PHONE}'}}", [("PHONE", PHONE)]),
        (f'{{"password": "{PASSWORD}"}}', [("SECRET_ASSIGNMENT", PASSWORD)]),
        (f"phone_number: {PHONE}\nnext line", [("PHONE", PHONE)]),
        (f"social_security_number={SSN}", [("SSN", SSN)]),
        (f"user=ann&password={PASSWORD}&x=1", [("SECRET_ASSIGNMENT", PASSWORD)]),
        ("user=ann&password=p%40ss%2Bw0rd", [("SECRET_ASSIGNMENT", "p%40ss%2Bw0rd")]),
        (f"https://api.example.com/cb?code=1&access_token={PASSWORD}", [("SECRET_ASSIGNMENT", PASSWORD)]),
        (f"tel={PHONE}&ok=1", [("PHONE", PHONE)]),
        (
            "DEBUG=true\nDB_PASSWORD=kettle\nexport API_TOKEN=abc123XYZ",
            [("SECRET_ASSIGNMENT", "kettle"), ("SECRET_ASSIGNMENT", "abc123XYZ")],
        ),
    ],
)
def test_pairs_in_text_are_read_in_context(text: str, expected: Any) -> None:
    assert kinds(pair_findings(text, ALL), text) == expected


@pytest.mark.parametrize(
    "text",
    [
        '{"max_tokens": 1000, "token_count": 88}',
        '{"password_hint": "first pet", "phone_type": "mobile"}',
        "Note: the phone rang twice at 10:30",
        "password = getpass()",  # code: the catalog's to judge
        "PASSWORD = hunter",  # spaces around `=`: code, not an environment file
        "DB_PASSWORD=${DB_PASSWORD}",
        '{"password": "${DB_PASSWORD}"}',
    ],
)
def test_pairs_that_say_nothing(text: str) -> None:
    assert pair_findings(text, ALL) == []


def test_pairs_with_disguised_keys_map_back_to_the_original() -> None:
    text = f'{{"p\u0430ssword": "{PASSWORD}", "\uff53\uff53\uff4e": "{SSN}"}}'
    assert kinds(pair_findings(text, ALL), text) == [("SECRET_ASSIGNMENT", PASSWORD), ("SSN", SSN)]


def test_a_finding_that_loses_keeps_what_it_covers_beyond_the_winner() -> None:
    text = "Marisol-7731"
    name = Finding("SUBJECT1_NAME", 0, 7, priority=1)
    secret = Finding("SECRET_ASSIGNMENT", 0, 12, priority=19)
    assert resolve_overlaps([name, secret]) == [name]  # without the text: as before
    assert kinds(resolve_overlaps([name, secret], text), text) == [
        ("SUBJECT1_NAME", "Marisol"),
        ("SECRET_ASSIGNMENT", "-7731"),
    ]


# --- through the pipeline -------------------------------------------------------------------------

RECORD: dict[str, Any] = {
    "ssn": SSN,
    "phone": PHONE,
    "password": PASSWORD,
    "mobile": 4155550199,
    "env": [{"name": "DB_PASSWORD", "value": "kettle-Mauve-31"}],
    "max_tokens": 1000,
    "password_hint": "first pet",
}
VALUES = [SSN, PHONE, PASSWORD, "4155550199", "kettle-Mauve-31"]


def redact(doc: Any, dialect: str = "chat", mode: str = "reversible") -> tuple[Any, Counter[str]]:
    policy = Policy(tenant="t", mode=mode)  # type: ignore[arg-type]
    counts: Counter[str] = Counter()
    d = DIALECTS[dialect]
    out = redact_document(
        doc,
        policy=policy,
        dialect=d,
        catalog=Catalog.for_sets(policy.sets),
        placeholders=PlaceholderMap(),
        subjects=None,
        media=find_media(doc, d),
        counts=counts,
    )
    return out.doc, counts


def assert_none_left(doc: Any) -> None:
    text = json.dumps(doc)
    left = [index for index, value in enumerate(VALUES) if value in text]
    assert left == [], "values left (by index)"


@pytest.mark.parametrize(
    "doc",
    [
        {"model": "m", "messages": [{"role": "user", "content": json.dumps(RECORD)}]},
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "metadata": RECORD},
        {
            "model": "m",
            "messages": [
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "f", "arguments": json.dumps(RECORD)},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": json.dumps({"r": json.dumps(RECORD)})},
            ],
        },
        {"model": "m", "messages": [{"role": "user", "content": "See " + json.dumps(RECORD) + " above."}]},
    ],
    ids=["pasted", "metadata", "tool-calls-nested", "json-in-prose"],
)
def test_a_record_leaves_nothing_in_any_shape(doc: dict[str, Any]) -> None:
    out, counts = redact(doc)
    assert_none_left(out)
    assert counts["SSN"] >= 1 and counts["PHONE"] >= 2 and counts["SECRET_ASSIGNMENT"] >= 2
    text = json.dumps(out)
    assert "first pet" in text and "1000" in text  # properties of a value are left alone


def test_a_json_schema_is_not_a_record() -> None:
    schema = {
        "type": "object",
        "properties": {
            "password": {"type": "string", "description": "the user's password"},
            "phone": {"type": "string", "pattern": "^[0-9]+$"},
        },
        "required": ["password", "phone"],
    }
    tool = {"type": "function", "function": {"name": "login", "parameters": schema}}
    doc = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [tool]}
    out, counts = redact(doc)
    assert out == doc and counts == Counter()


def test_a_declared_name_inside_a_secret_does_not_let_the_rest_through() -> None:
    compiled = compile_subjects(parse_subject_header(encode_subject_header({"subjects": [PERSON]})))
    doc = {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "metadata": {"password": "Marisol-7731"},
    }
    raw = json.dumps(doc).encode()
    checked = redact_and_check(
        raw,
        doc,
        policy=Policy(tenant="t"),
        dialect=DIALECTS["chat"],
        catalog=ALL,
        placeholders=PlaceholderMap(),
        subjects=compiled,
        media=[],
        counts=Counter(),
    )
    assert checked.survivor is None
    left = left_in(checked.body.decode(), "7731", "Marisol")
    assert left == []


def test_strip_markers_never_merge_two_keys() -> None:
    doc = {"model": "m", "messages": [{"role": "user", "content": "x"}], "metadata": {}}
    doc["metadata"] = {
        "ann@example.com": "a",
        "bob@example.com": "b",
        "[EMAIL_2]": "c",
        "cy@example.com": "d",
    }
    out, counts = redact(doc, mode="strip")
    assert sorted(out["metadata"].values()) == ["a", "b", "c", "d"]
    assert len(out["metadata"]) == 4 and counts["EMAIL"] == 3


def test_placeholders_that_would_merge_two_keys_are_refused() -> None:
    # A reply's placeholder pasted back as a key can only collide in a contrived body: refused.
    placeholders = PlaceholderMap()
    first = placeholders.placeholder_for("EMAIL", "ann@example.com")
    doc = {"metadata": {first: 1, "ann@example.com": 2}}
    with pytest.raises(KeyCollision) as info:
        redact_document(
            doc,
            policy=Policy(tenant="t"),
            dialect=DIALECTS["generic"],
            catalog=ALL,
            placeholders=placeholders,
            subjects=None,
            media=[],
            counts=Counter(),
        )
    refusal = refusal_for(info.value)
    assert (refusal.status, refusal.code) == (422, "redacted_keys_collide")


# --- real media only -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("head", "family"),
    [
        (PNG, "image"),
        (b"\xff\xd8\xff\xe0\x00\x10JFIF", "image"),
        (b"GIF89a\x01\x00", "image"),
        (b"RIFF\x00\x00\x00\x00WEBPVP8 ", "image"),
        (b"RIFF\x00\x00\x00\x00WAVEfmt ", "audio"),
        (b"%PDF-1.7\n", "document"),
        (b"ID3\x04\x00", "audio"),
        (b"OggS\x00\x02", "audio"),
        (b"\x00\x00\x00\x18ftypmp42", "video"),
        (b"\x00\x00\x00\x18ftypM4A ", "audio"),
        (b"\x1a\x45\xdf\xa3\x01", "video"),
        (b"PK\x03\x04\x14\x00", "archive"),
        (b"\x89PNG\r\n\x1a\n", None),  # a signature with no chunk after it
        (b"Jane Roe 4111 1111 1111 1111", None),
    ],
)
def test_signatures(head: bytes, family: str | None) -> None:
    assert signature_family(head) == family


def test_a_payload_is_media_only_when_it_decodes_to_media_the_position_accepts() -> None:
    png = base64.b64encode(PNG).decode()
    assert read_payload(png).media_for("image")
    assert read_payload("data:image/png;base64," + png).media_for("image")
    assert not read_payload("data:image/png;base64," + png).media_for("audio")
    assert not read_payload("data:audio/wav;base64," + png).media_for("image")  # declared otherwise
    assert not read_payload("data:image/png;name=scan.png;base64," + png).media_for("image")  # a parameter
    assert not read_payload("Jane Roe 4111 1111 1111 1111").media_for("image")
    assert not read_payload(png[:10] + " " + png[10:]).media_for("image")  # not strict base64
    wrapped = "\n".join(png[i : i + 8] for i in range(0, len(png), 8))
    assert read_payload(wrapped).media_for("image")  # line breaks of MIME base64 are fine
    fake_pdf = base64.b64encode(b"%PDF-1.4 Jane Roe, card 4111 1111 1111 1111").decode()
    assert not read_payload(fake_pdf).media_for("file")  # text that starts like a PDF is text
    text = base64.b64encode(b"Card 4111 1111 1111 1111 for Jane Roe").decode()
    assert read_payload(text).text() == "Card 4111 1111 1111 1111 for Jane Roe"


def anthropic_image(data: str) -> dict[str, Any]:
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}
    return {"model": "claude", "max_tokens": 8, "messages": [{"role": "user", "content": [block]}]}


def image_data(doc: dict[str, Any]) -> str:
    return str(doc["messages"][0]["content"][0]["source"]["data"])


def test_text_at_a_media_position_is_read_and_real_media_is_not() -> None:
    card = "4111 1111 1111 1111"
    prose, _ = redact(anthropic_image(f"Jane Roe, card {card}"), "messages")
    left = left_in(image_data(prose), card)
    assert left == []
    encoded = base64.b64encode(f"Jane Roe, card {card}".encode()).decode()
    out, counts = redact(anthropic_image(encoded), "messages")
    decoded = base64.b64decode(image_data(out)).decode()
    left = left_in(decoded, card)
    rewritten = decoded.startswith("Jane Roe, card <CREDIT_CARD_")
    assert left == [] and rewritten
    png = base64.b64encode(PNG + b"\x00" * 64).decode()
    unchanged, counts = redact(anthropic_image(png), "messages")
    assert image_data(unchanged) == png and counts == Counter()


def test_generic_data_urls_are_media_in_lists_too_but_only_real_ones_are_skipped() -> None:
    png = "data:image/png;base64," + base64.b64encode(PNG).decode()
    prose = "data:image/png;base64,Jane Roe card 4111 1111 1111 1111"
    doc = {"model": "e", "input": [png, prose]}
    parts = find_media(doc, DIALECTS["generic"])
    assert [(p.media, p.is_bytes) for p in parts] == [("image", True), ("image", False)]
    out, counts = redact(doc, "generic")
    kept, left = out["input"][0] == png, left_in(out["input"][1], "4111")
    assert kept and left == [] and counts["CREDIT_CARD"] == 1


# --- the output gate ------------------------------------------------------------------------------


def test_the_gate_reads_a_reply_tree_in_its_keys_context() -> None:
    gate = OutputGate(ALL, lambda text: text)
    reply = {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "c",
                            "function": {"name": "f", "arguments": json.dumps({"user": {"ssn": SSN}})},
                        }
                    ],
                },
                "logprobs": {"content": [{"token": "Hello", "logprob": -0.1}]},
            }
        ],
        "usage": {"total_tokens": 12},
        "record": {"phone": int(PHONE), "password": PASSWORD},
    }
    assert gate.read_tree(reply)
    assert gate.counts() == {"PHONE": 1, "SECRET_ASSIGNMENT": 1, "SSN": 1}


def test_the_gate_reads_pairs_in_a_streamed_window() -> None:
    gate = OutputGate(ALL, lambda text: text)
    window = gate.window("args")
    for piece in ('{"phone_', 'number": "415', '5550132"}'):
        window.feed(piece)
    assert gate.finish_window("args")
    assert gate.counts() == {"PHONE": 1}
