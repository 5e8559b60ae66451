"""Restore into JSON text: every original written for where it lands (ext_proc.restore.json_context).

Structured output, tool-call arguments and JSON carried inside JSON strings, restored whole and
streamed at every cut, in the three dialects' streams and in buffered bodies: `json.loads` must
read back exactly the original values, and a value that spells JSON (`", "admin": true`) must
never add a key. Prose that merely starts with a bracket keeps raw insertion.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ext_proc.dialects import DIALECTS
from ext_proc.restore.json_body import restore_json_body
from ext_proc.restore.json_context import JsonContext, Spot, encode
from ext_proc.restore.restorers import Restorer
from ext_proc.restore.sse import SseRestorer
from ext_proc.restore.stream import StreamRestorer
from ext_proc.transform.placeholders import PlaceholderMap
from tests.support.examples import example_count
from tests.unit.test_restore import CHECKS, Expect, build, run, splits

NONCE = "5e7a9c01"
# Invented values that JSON must carry exactly: quotes, backslashes, control characters, line
# separators, non-ASCII, one that spells JSON structure, one that is a number.
VALUES: list[tuple[str, str]] = [
    ("SUBJECT1_NAME", 'Odile "Kit" Varga\\Marsh'),
    ("EMAIL", "o.varga@example.net"),
    ("SUBJECT1_ID", 'K-77", "admin": true, "x": "'),
    ("SUBJECT1_OTHER", "line one\nline two\ttab \u2028 sep \x01"),
    ("SUBJECT1_ID", "4471"),
    ("PHONE", "名前 \\ 🙂 \\u0041"),
]
PMAP = PlaceholderMap(nonce=NONCE)
PH = [PMAP.placeholder_for(label, original) for label, original in VALUES]
ORIG = [original for _, original in VALUES]
R = Restorer(PMAP)


def restored_stream(text: str, cuts: list[int], *, json_escaped: bool = False) -> str:
    stream = StreamRestorer(R, json_escaped=json_escaped)
    return "".join(stream.feed(part) for part in splits(text, cuts)) + stream.flush()


# A structured-output document as the model writes it, and what the caller must read back.
DOC_MODEL: dict[str, Any] = {
    "name": PH[0],
    "contact": {"email": PH[1], "ids": [PH[2], PH[4]]},
    "note": f"see {PH[3]} and {PH[5][1:-1]} ({PH[0].lower()})",
    PH[1]: "keyed by a placeholder",
}
DOC: dict[str, Any] = {
    "name": ORIG[0],
    "contact": {"email": ORIG[1], "ids": [ORIG[2], ORIG[4]]},
    "note": f"see {ORIG[3]} and {ORIG[5]} ({ORIG[0]})",
    ORIG[1]: "keyed by a placeholder",
}
# The same document in the ways models and providers write JSON.
WRITINGS = {
    "compact": json.dumps(DOC_MODEL, separators=(",", ":")),
    "pretty": "\n  " + json.dumps(DOC_MODEL, indent=2, ensure_ascii=False),
    "ascii_escaped_brackets": json.dumps(DOC_MODEL).replace("<", "\\u003c").replace(">", "\\u003e"),
}


@pytest.mark.parametrize("writing", list(WRITINGS))
def test_structured_output_reads_back_the_exact_values(writing: str) -> None:
    out = R.restore_text(WRITINGS[writing])
    assert json.loads(out) == DOC
    assert "admin" not in json.loads(out)


@pytest.mark.parametrize("writing", list(WRITINGS))
def test_structured_output_streamed_cut_anywhere(writing: str) -> None:
    text = WRITINGS[writing]
    whole = R.restore_text(text)
    for i in range(len(text) + 1):
        assert restored_stream(text, [i]) == whole, i
    for step in (1, 2, 3, 7):
        assert restored_stream(text, list(range(0, len(text), step))) == whole


def test_json_inside_json_strings_is_escaped_once_per_level() -> None:
    inner = json.dumps({"to": PH[1], "who": PH[0], "evil": PH[2]})
    middle = json.dumps({"payload": inner, "plain": PH[3]})
    args = json.dumps({"wrapped": middle, "n": 1})
    out = R.restore_text(args, json_escaped=True)
    outer = json.loads(out)
    assert outer["n"] == 1
    second = json.loads(outer["wrapped"])
    assert second["plain"] == ORIG[3]
    assert json.loads(second["payload"]) == {"to": ORIG[1], "who": ORIG[0], "evil": ORIG[2]}
    for i in range(len(args) + 1):
        assert restored_stream(args, [i], json_escaped=True) == out, i


def test_a_value_outside_strings_becomes_a_json_value_of_its_own() -> None:
    text = f'{{"id": {PH[4]}, "who": {PH[0]}, "list": [{PH[2]}, {PH[4][1:-1]}]}}'
    out = R.restore_text(text)
    assert json.loads(out) == {"id": 4471, "who": ORIG[0], "list": [ORIG[2], 4471]}
    assert restored_stream(text, list(range(0, len(text), 5))) == out


def test_prose_that_starts_with_a_bracket_gets_raw_values() -> None:
    for text, expected in [
        (f"[{PH[1]}](mailto:{PH[1]}) wrote", f"[{ORIG[1]}](mailto:{ORIG[1]}) wrote"),
        (f"[1] Contact {PH[0]} today", f"[1] Contact {ORIG[0]} today"),
        (f'{{not json}} "{PH[0]}"', f'{{not json}} "{ORIG[0]}"'),
        (f'  Note: "{PH[0]}"', f'  Note: "{ORIG[0]}"'),
    ]:
        assert R.restore_text(text) == expected
        assert restored_stream(text, list(range(0, len(text), 3))) == expected


def test_no_insertion_right_after_a_backslash() -> None:
    """`\\<EMAIL…>` in JSON: whatever went in would be read with the backslash; the model's text
    stays as it was, the other placeholders are restored."""
    text = '{"a": "\\' + PH[1] + '", "b": "' + PH[0] + '"}'
    out = R.restore_text(text)
    assert PH[1] in out
    assert json.loads(out.replace("\\" + PH[1], "x"))["b"] == ORIG[0]
    assert restored_stream(text, list(range(0, len(text), 2))) == out


def test_tool_arguments_are_json_whatever_they_begin_with() -> None:
    text = json.dumps(PH[0])  # a JSON string at the top level
    assert json.loads(R.restore_text(text, json_escaped=True)) == ORIG[0]
    assert R.restore_text(text) == f'"{ORIG[0]}"'  # prose: a quotation


def test_the_reader_tracks_what_the_client_reads() -> None:
    context = JsonContext()
    context.feed('{"a": "x')
    spot = context.spot()
    assert spot == Spot(1, 1, False)
    assert encode('"', spot) == '\\"'
    context.inserted(spot, '"')
    context.feed('", "b": ')
    spot = context.spot()
    assert spot is not None and spot.literal and spot.strings == 0
    context.inserted(spot, "12")
    context.feed("}")
    assert context.spot() == Spot(0, 0, True)
    context.feed(" and then prose")
    assert context.prose


def test_a_stream_state_puts_the_json_reader_back() -> None:
    text = '{"a": "' + PH[0] + '", "b": "' + PH[1] + '"}'
    stream = StreamRestorer(R)
    first = stream.feed(text[:9])
    saved = stream.save()
    rest = stream.feed(text[9:]) + stream.flush()
    stream2 = StreamRestorer(R)
    stream2.feed(text[:9])
    stream2.feed('"}')  # read past the string: the reader's state moved on
    stream2.load(saved)
    assert stream2.feed(text[9:]) + stream2.flush() == rest
    assert json.loads(first + rest) == {"a": ORIG[0], "b": ORIG[1]}


# --- buffered bodies and the three dialects' streams -----------------------------------------------

STRUCTURED = json.dumps({"name": PH[0], "id": PH[2]})
STRUCTURED_DOC = {"name": ORIG[0], "id": ORIG[2]}
NESTED_ARGS = json.dumps({"text": json.dumps({"name": PH[0], "email": PH[1]})})
NESTED_DOC = {"name": ORIG[0], "email": ORIG[1]}


def test_buffered_bodies_restore_structured_output_and_nested_arguments() -> None:
    chat = {
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": STRUCTURED,
                    "tool_calls": [
                        {"id": "c", "type": "function", "function": {"name": "f", "arguments": NESTED_ARGS}}
                    ],
                },
            }
        ]
    }
    out = json.loads(restore_json_body(json.dumps(chat).encode(), R))
    message = out["choices"][0]["message"]
    assert json.loads(message["content"]) == STRUCTURED_DOC
    assert json.loads(json.loads(message["tool_calls"][0]["function"]["arguments"])["text"]) == NESTED_DOC
    messages = {
        "content": [{"type": "tool_use", "input": {"text": STRUCTURED}}, {"type": "text", "text": STRUCTURED}]
    }
    out = json.loads(restore_json_body(json.dumps(messages).encode(), R))
    assert json.loads(out["content"][0]["input"]["text"]) == STRUCTURED_DOC
    assert json.loads(out["content"][1]["text"]) == STRUCTURED_DOC


@pytest.mark.parametrize("dialect", list(CHECKS))
def test_streams_restore_structured_output_cut_anywhere(dialect: str) -> None:
    stream = build(dialect, STRUCTURED, NESTED_ARGS, STRUCTURED, sizes=(3, 8, 5))
    expected_text = R.restore_text(STRUCTURED)
    assert json.loads(expected_text) == STRUCTURED_DOC
    # The nested document's string reads back as exactly its JSON with the originals in it.
    expect = Expect(text=expected_text, args={"text": json.dumps(NESTED_DOC)}, thinking=expected_text)
    CHECKS[dialect](run(SseRestorer(R, DIALECTS[dialect]), [stream]), expect)
    for i in range(0, len(stream) + 1, 13):
        CHECKS[dialect](run(SseRestorer(R, DIALECTS[dialect]), [stream[:i], stream[i:]]), expect)


# --- property: any JSON document, any cut -----------------------------------------------------------


@dataclass(frozen=True)
class Nested:
    """A string whose content is a JSON document of its own."""

    doc: Any


# Prose around the placeholders, with JSON's own characters; never an opening bracket, which at
# the start of a string would make it JSON text (the reader's rule, tested on its own above).
FREE = st.text(alphabet='abc XYZ019"\\}]:,\n\t/é😀', max_size=6)


@st.composite
def strings(draw: st.DrawFn) -> tuple[str, str]:
    model, expected = [], []
    for _ in range(draw(st.integers(0, 3))):
        free = draw(FREE)
        model.append(free)
        expected.append(free)
        which = draw(st.integers(0, len(PH) - 1))
        model.append(PH[which] if draw(st.booleans()) else PH[which].lower())
        expected.append(ORIG[which])
    return "".join(model), "".join(expected)


def documents(depth: int) -> st.SearchStrategy[tuple[Any, Any]]:
    leaves = st.one_of(
        strings(),
        st.integers(-5, 5).map(lambda n: (n, n)),
        st.sampled_from([None, True, False]).map(lambda v: (v, v)),
    )
    if depth == 0:
        return leaves
    inner = documents(depth - 1)
    containers = st.one_of(
        st.lists(inner, max_size=3).map(lambda items: ([m for m, _ in items], [e for _, e in items])),
        st.dictionaries(st.text(alphabet="kv", min_size=1, max_size=2), inner, max_size=3).map(
            lambda d: ({k: m for k, (m, _) in d.items()}, {k: e for k, (_, e) in d.items()})
        ),
    )
    # A string whose content is an object or array is JSON text; one that merely starts with a
    # quote is prose (a quotation), so only containers are nested.
    return st.one_of(leaves, containers, containers.map(lambda pair: (json.dumps(pair[0]), Nested(pair[1]))))


def same(actual: Any, expected: Any) -> bool:
    if isinstance(expected, Nested):
        return isinstance(actual, str) and same(json.loads(actual), expected.doc)
    if isinstance(expected, list):
        return isinstance(actual, list) and len(actual) == len(expected) and all(map(same, actual, expected))
    if isinstance(expected, dict):
        return (
            isinstance(actual, dict)
            and actual.keys() == expected.keys()
            and all(same(actual[k], expected[k]) for k in expected)
        )
    return bool(actual == expected) and type(actual) is type(expected)


@st.composite
def json_texts(draw: st.DrawFn) -> tuple[str, Any]:
    first_model, first_expected = draw(strings())
    model, expected = draw(documents(3))
    doc_model = {"first": first_model, "doc": model}
    doc_expected = {"first": first_expected, "doc": expected}
    text = json.dumps(doc_model, ensure_ascii=draw(st.booleans()), indent=draw(st.sampled_from([None, 1])))
    if draw(st.booleans()):
        text = text.replace("<", "\\u003c").replace(">", "\\u003e")
    return text, doc_expected


def _round_trip(case: tuple[str, Any], cuts: list[int], json_escaped: bool) -> None:
    text, expected = case
    whole = R.restore_text(text, json_escaped=json_escaped)
    assert same(json.loads(whole), expected)
    assert restored_stream(text, cuts, json_escaped=json_escaped) == whole


FAST = settings(max_examples=example_count(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=4000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CUTS = st.lists(st.integers(0, 3000), max_size=25)


@FAST
@given(json_texts(), CUTS, st.booleans())
def test_property_any_json_document_reads_back_its_values(
    case: tuple[str, Any], cuts: list[int], json_escaped: bool
) -> None:
    _round_trip(case, cuts, json_escaped)


@pytest.mark.slow
@SLOW
@given(json_texts(), CUTS, st.booleans())
def test_property_any_json_document_reads_back_its_values_long(
    case: tuple[str, Any], cuts: list[int], json_escaped: bool
) -> None:
    _round_trip(case, cuts, json_escaped)
