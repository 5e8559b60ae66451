"""Property (b) of issue 3: an identifier slipped back into a redacted body is caught by the egress
check, however it is disguised and wherever it is put.

The body starts clean (what redaction would forward); one declared identifier is then slipped
back in a random field (a string, an object key, metadata, tool-call arguments carried as JSON
inside a string, a JSON number or a number literal inside a string) under a random disguise
(separators of any length, case, zero-width characters, full-width forms, accents).
"""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ext_proc.detect.subjects.header import encode_subject_header, parse_subject_header
from ext_proc.detect.subjects.matcher import compile_subjects
from ext_proc.dialects import DIALECTS
from ext_proc.transform.egress import check_body
from tests.support.e2e import PERSON
from tests.support.examples import example_count

COMPILED = compile_subjects(parse_subject_header(encode_subject_header({"subjects": [PERSON]})))
# (label, canonical text) of what gets slipped back.
IDENTIFIERS = [
    ("SUBJECT1_NAME", "Marisol Quintero-Vance"),
    ("SUBJECT1_NAME", "Quintero-Vance, Marisol"),
    ("SUBJECT1_EMAIL", "mq@example.com"),
    ("SUBJECT1_PHONE", "4045550187"),
    ("SUBJECT1_PHONE", "+1 404 555 0187"),
    ("SUBJECT1_ID", "A1234567"),
    ("SUBJECT1_HANDLE", "mqvance77"),
    ("SUBJECT1_OTHER", "Project Bluebird"),
]
SEPARATORS = [" ", "-", ".", "_", "/", "  ", " - ", "\t", "\n", "***", ",", "·", "—", " | "]
ZERO_WIDTH = ["\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u00ad"]
ACCENTS = {"a": "á", "e": "é", "i": "í", "o": "ö", "u": "ü", "n": "ñ", "c": "ç", "A": "À", "E": "É"}


def disguise(text: str, rng: random.Random) -> str:
    out: list[str] = []
    for index, char in enumerate(text):
        if char.isalnum():
            if rng.random() < 0.3:
                char = char.swapcase()
            if rng.random() < 0.15 and char in ACCENTS:
                char = ACCENTS[char]
            if rng.random() < 0.15 and char.isascii():
                char = chr(ord(char) + 0xFEE0)  # full-width form
        elif rng.random() < 0.5:
            char = rng.choice(SEPARATORS)
        out.append(char)
        if index < len(text) - 1:
            if rng.random() < 0.2:
                out.append(rng.choice(ZERO_WIDTH))
            if rng.random() < 0.15 and text[index].isalnum() and text[index + 1].isalnum():
                out.append(rng.choice(SEPARATORS))
    return "".join(out)


def clean_body() -> dict:
    return {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "You help with <SUBJECT1_NAME_0badf00d_1>'s case."},
            {"role": "user", "content": "Please call <SUBJECT1_PHONE_0badf00d_1> tomorrow at 10."},
        ],
        "metadata": {"case": "open"},
        "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}],
    }


def place(body: dict, where: str, value: str) -> str:
    if where == "user":
        body["messages"][1]["content"] += " " + value
    elif where == "system":
        body["messages"][0]["content"] = value + " " + body["messages"][0]["content"]
    elif where == "key":
        body["metadata"][value] = "x"
    elif where == "metadata":
        body["metadata"]["note"] = [{"deep": f"see {value}"}]
    elif where == "arguments":
        call = {
            "id": "c1",
            "type": "function",
            "function": {"name": "lookup", "arguments": json.dumps({"q": value})},
        }
        body["messages"].append({"role": "assistant", "tool_calls": [call]})
    elif where == "tool_description":
        body["tools"][0]["function"]["description"] = f"Finds {value}"
    elif where == "model":
        body["model"] = value
    return json.dumps(body, ensure_ascii=bool(len(value) % 2))


def place_number(body: dict, where: str, digits: str, exponent_form: bool) -> str:
    literal = f"{digits[0]}.{digits[1:]}e{len(digits) - 1}" if exponent_form else digits
    if where == "json":
        return json.dumps(body)[:-1] + f', "n": {literal}}}'
    body["messages"][1]["content"] += f" ({literal})"
    return json.dumps(body)


def assert_caught(raw: str, label: str) -> None:
    hit = check_body(raw.encode("utf-8"), DIALECTS["chat"], COMPILED)
    assert hit is not None, f"{label} slipped through the egress check"
    assert hit.label.startswith("SUBJECT1_")


def test_the_clean_body_passes() -> None:
    assert check_body(json.dumps(clean_body()).encode(), DIALECTS["chat"], COMPILED) is None


WHERE = st.sampled_from(["user", "system", "key", "metadata", "arguments", "tool_description", "model"])


@settings(max_examples=example_count(1000), suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(identifier=st.sampled_from(IDENTIFIERS), where=WHERE, seed=st.integers(0, 2**32))
def test_a_disguised_identifier_is_caught(identifier: tuple[str, str], where: str, seed: int) -> None:
    label, text = identifier
    assert_caught(place(clean_body(), where, disguise(text, random.Random(seed))), label)


@pytest.mark.slow
@settings(max_examples=10000, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(identifier=st.sampled_from(IDENTIFIERS), where=WHERE, seed=st.integers(0, 2**32))
def test_a_disguised_identifier_is_caught_many(identifier: tuple[str, str], where: str, seed: int) -> None:
    label, text = identifier
    assert_caught(place(clean_body(), where, disguise(text, random.Random(seed))), label)


@settings(max_examples=example_count(1000), deadline=None)
@given(where=st.sampled_from(["json", "text"]), exponent_form=st.booleans(), country=st.booleans())
def test_a_phone_as_a_number_is_caught(where: str, exponent_form: bool, country: bool) -> None:
    digits = ("1" if country else "") + "4045550187"
    assert_caught(place_number(clean_body(), where, digits, exponent_form), "SUBJECT1_PHONE")
