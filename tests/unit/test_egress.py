"""The egress traversal: every reading of the outgoing body reaches the matcher, media bytes do not.

These tests use a stand-in finder that only knows one folded digit run, so they test what is read
(keys, numbers as exact decimals, literals inside strings, JSON inside strings, media skips), not
how renderings match (tests/unit/test_subjects.py does that).
"""

from __future__ import annotations

import base64
import json
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ext_proc.dialects import DIALECTS
from ext_proc.transform.egress import EgressHit, check_body, exact_decimal
from ext_proc.transform.grammar import COMPILE_AFTER, format_placeholder, own_markers, strip_marker
from ext_proc.transform.walk import MAX_DEPTH, NestingTooDeep
from tests.support.examples import example_count

NEEDLE = "4045550187"


class DigitsFinder:
    """Finds NEEDLE as a digit run bounded by non-digits (a stand-in for the compiled subjects)."""

    def __init__(self) -> None:
        self.read: list[str] = []

    def first_survivor(self, text: str) -> str | None:
        self.read.append(text)
        digits = "".join(c if c.isdigit() else " " for c in text).split()
        return "SUBJECT1_PHONE" if NEEDLE in digits else None


def check(doc: object, dialect: str = "generic", raw: str | None = None) -> EgressHit | None:
    body = (raw if raw is not None else json.dumps(doc)).encode()
    return check_body(body, DIALECTS[dialect], DigitsFinder())


@pytest.mark.parametrize(
    "raw",
    [
        '{"a": "call 4045550187"}',
        '{"4045550187": "key"}',
        '{"n": 4045550187}',
        '{"n": 4.045550187e9}',
        '{"n": 4045550187.0}',
        '{"n": 40455501.87e2}',
        '{"s": "as a float 4.045550187e9 in text"}',
        '{"s": "4.045550187E+9"}',
        '{"args": "{\\"to\\": 4.045550187e9}"}',
        '{"args": "{\\"k\\": \\"{\\\\\\"deep\\\\\\": \\\\\\"4045550187\\\\\\"}\\"}"}',
        '{"metadata": {"note": ["x", {"y": "4045550187"}]}}',
        '[{"type": "image", "data": "4045550187"}]',
    ],
)
def test_every_reading_is_checked(raw: str) -> None:
    assert check(None, raw=raw) == EgressHit("SUBJECT1_PHONE")


@pytest.mark.parametrize(
    "raw",
    [
        '{"a": "call 2140455501870"}',
        '{"n": 40455501870}',
        '{"n": 4.0455501870e10}',
        '{"a": "nothing here", "b": [1, 2.5, true, null]}',
        "",
    ],
)
def test_clean_bodies_pass(raw: str) -> None:
    assert check(None, raw=raw) is None


# The start of a real PNG (signature and IHDR chunk), as base64.
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAAB"


def test_media_payload_at_a_schema_position_is_skipped() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
    doc = {"messages": [{"role": "user", "content": [image]}]}
    assert check(doc, "messages") is None


def test_text_at_a_media_position_is_read() -> None:
    """Only real media is skipped: digits, prose or base64 of text at a media position are read."""
    encoded = base64.b64encode(f"call {NEEDLE}".encode()).decode()
    for data in (NEEDLE, f"call {NEEDLE}", encoded):
        image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}
        doc = {"messages": [{"role": "user", "content": [image]}]}
        assert check(doc, "messages") == EgressHit("SUBJECT1_PHONE")


def test_media_shaped_object_in_a_tool_input_is_text() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": NEEDLE}}
    tool_use = {"type": "tool_use", "id": "t1", "name": "f", "input": image}
    doc = {"messages": [{"role": "assistant", "content": [tool_use]}]}
    assert check(doc, "messages") == EgressHit("SUBJECT1_PHONE")


def test_chat_image_data_url_is_skipped_but_its_detail_key_is_read() -> None:
    part = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + PNG, "detail": NEEDLE}}
    doc = {"messages": [{"role": "user", "content": [part]}]}
    assert check(doc, "chat") == EgressHit("SUBJECT1_PHONE")
    del part["image_url"]["detail"]
    assert check(doc, "chat") is None


def test_structural_values_are_read_too() -> None:
    # Unlike redaction, the egress check exempts nothing structural: an id is bytes that leave.
    assert check({"messages": [{"role": "user", "content": "hi"}], "model": NEEDLE}, "chat") is not None


def test_nesting_past_the_limit_is_refused() -> None:
    doc: object = "x"
    for _ in range(MAX_DEPTH + 2):
        doc = [doc]
    with pytest.raises(NestingTooDeep):
        check(doc)


def test_exact_decimal() -> None:
    assert exact_decimal(Decimal("1e21")) == "1" + "0" * 21
    assert exact_decimal(Decimal("4.045550187e9")) == NEEDLE
    assert exact_decimal(12) == "12"
    assert exact_decimal(Decimal("1e999999")) == "1"  # never a million zeros


@settings(max_examples=example_count(300))
@given(
    path=st.lists(st.sampled_from(["a", "b", "metadata", "arguments", "input"]), min_size=1, max_size=6),
    as_number=st.booleans(),
    as_key=st.booleans(),
    as_json_string=st.booleans(),
)
def test_the_needle_is_found_wherever_it_is_put(
    path: list[str], as_number: bool, as_key: bool, as_json_string: bool
) -> None:
    leaf: object = int(NEEDLE) if as_number else f"see {NEEDLE}."
    doc: object = {NEEDLE: 1} if as_key else leaf
    for key in reversed(path):
        doc = {key: json.dumps(doc) if as_json_string and key == "arguments" else doc}
    assert check(doc) == EgressHit("SUBJECT1_PHONE")


def test_own_placeholders_are_read_as_separators_but_foreign_ones_are_read() -> None:
    class HexFinder:
        """Flags a declared id that happens to be spelled by the nonce."""

        def first_survivor(self, text: str) -> str | None:
            return "SUBJECT1_ID" if "b846057" in text.lower() else None

    own = {"messages": [{"role": "user", "content": "call <SUBJECT1_PHONE_4b846057_1> or [EMAIL]"}]}
    body = json.dumps(own).encode()
    assert check_body(body, DIALECTS["chat"], HexFinder()) is not None  # unneutralised: spurious hit
    assert check_body(body, DIALECTS["chat"], HexFinder(), nonce="4b846057") is None
    # The same text under another nonce is not this request's placeholder: it is read.
    assert check_body(body, DIALECTS["chat"], HexFinder(), nonce="00000000") is not None


def test_own_markers_read_the_same_before_and_after_the_request_pattern_is_compiled() -> None:
    """A request's own placeholders and strip markers read as separators, another request's
    placeholder as text: with the shared pattern and, after COMPILE_AFTER markers, with the
    request's own."""
    nonce, other = "0a1b2c3d", "ffee0011"
    text = (
        f"a {format_placeholder('EMAIL', nonce, 1)} b {format_placeholder('EMAIL', other, 2)} "
        f"c {strip_marker('PHONE')} d"
    )
    expected = f"a   b {format_placeholder('EMAIL', other, 2)} c   d"
    markers = own_markers(nonce)
    assert markers is own_markers(nonce)  # one object per nonce: what it learned is kept
    readings = [markers.sub(" ", text) for _ in range(COMPILE_AFTER // 3 + 2)]
    assert markers._own is not None  # the switch happened within the loop
    assert set(readings) == {expected}
