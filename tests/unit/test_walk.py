"""The fail-closed leaf walk: every string a body carries is read, and nothing unread is forwarded."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ext_proc.dialects import DIALECTS
from ext_proc.exchange.refusals import refusal_for
from ext_proc.transform.walk import (
    MAX_DEPTH,
    STRUCTURAL_KEYS,
    LeafWalker,
    NestingTooDeep,
    NotJson,
    parse_json,
)
from tests.support.examples import example_count

MARK = "\ue000"  # a private-use character no generated text contains


def mark(text: str) -> str:
    return MARK + text


def walk(doc: Any, dialect: str = "generic", *, redact_system: bool = True) -> tuple[Any, list[str]]:
    seen: list[str] = []

    def visit(text: str, _path: object) -> str:
        seen.append(text)
        return mark(text)

    d = DIALECTS[dialect]
    media = {(id(p.container), p.key) for p in d.media(doc) if p.is_bytes}
    system = set() if redact_system else {(id(c), k) for c, k in d.system_positions(doc)}
    return LeafWalker(visit, media_positions=media, system_positions=system).walk(doc), seen


def unread_strings(value: Any, *, caller: bool = False, key: object = None, parent: Any = None) -> list[str]:
    """Every string in `value` that did not pass through `mark`, JSON inside strings included."""
    out: list[str] = []
    if isinstance(value, str):
        if value.startswith(MARK):
            return out
        try:
            inner = json.loads(value)
        except ValueError:
            inner = None
        if isinstance(inner, (dict, list)):
            return unread_strings(inner, caller=True)
        out.append(value)
    elif isinstance(value, dict):
        for k, v in value.items():
            if not k.startswith(MARK):
                out.append(k)
            out.extend(unread_strings(v, caller=caller, key=k, parent=value))
    elif isinstance(value, list):
        for item in value:
            out.extend(unread_strings(item, caller=caller, parent=value))
    return out


# --- properties ---------------------------------------------------------------------------------

text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters=MARK), max_size=12)
# Keys that carry no structural meaning, so the walk must read every value under them.
plain_keys = text.filter(lambda k: k not in STRUCTURAL_KEYS and k != "name")
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(plain_keys, children, max_size=4),
    max_leaves=25,
)
nested_json_strings = json_values.map(lambda v: json.dumps({"payload": v}))


@settings(max_examples=example_count(300), suppress_health_check=[HealthCheck.too_slow])
@given(doc=st.dictionaries(plain_keys, json_values | nested_json_strings, max_size=6))
def test_walk_never_forwards_a_string_it_did_not_read(doc: dict[str, Any]) -> None:
    out, _ = walk(doc)
    assert unread_strings(out) == []


@pytest.mark.slow
@settings(max_examples=5000, suppress_health_check=[HealthCheck.too_slow])
@given(doc=st.dictionaries(plain_keys, json_values | nested_json_strings, max_size=6))
def test_walk_never_forwards_a_string_it_did_not_read_many(doc: dict[str, Any]) -> None:
    out, _ = walk(doc)
    assert unread_strings(out) == []


@settings(max_examples=example_count(200))
@given(doc=json_values)
def test_walk_with_identity_visit_is_the_identity(doc: Any) -> None:
    walker = LeafWalker(lambda s, _p: s, media_positions=set(), system_positions=set())
    assert walker.walk(doc) == doc
    assert walker.stats.changed is False


# --- what is and is not exempt ------------------------------------------------------------------


def test_structural_values_are_kept_outside_caller_data_only() -> None:
    doc = {
        "model": "gpt-x",
        "id": "call_123",
        "metadata": {"id": "mine", "type": "customer"},
        "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {"name": "x"}}}],
    }
    out, _ = walk(doc)
    assert out["model"] == "gpt-x"  # exempt positions keep their (schema) key as is too
    assert out["id"] == "call_123"
    assert out[mark("metadata")] == {mark("id"): mark("mine"), mark("type"): mark("customer")}
    function = out[mark("tools")][0][mark("function")]
    assert function["name"] == "lookup"  # a tool's name is protocol
    assert function[mark("parameters")] == {mark("name"): mark("x")}  # a schema is the caller's


def test_a_message_name_is_text() -> None:
    out, _ = walk({"messages": [{"role": "user", "name": "someone", "content": "hi"}]}, "chat")
    message = out[mark("messages")][0]
    assert message[mark("name")] == mark("someone")
    assert message["role"] == "user"


def test_tool_arguments_json_is_walked_as_json() -> None:
    args = json.dumps({"to": "someone", "nested": {"k": ["v"]}})
    doc = {
        "messages": [
            {"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": args}}]}
        ]
    }
    out, seen = walk(doc, "chat")
    new_args = out[mark("messages")][0][mark("tool_calls")][0][mark("function")][mark("arguments")]
    assert json.loads(new_args) == {mark("to"): mark("someone"), mark("nested"): {mark("k"): [mark("v")]}}
    assert "someone" in seen


def test_unchanged_json_inside_a_string_keeps_its_exact_text() -> None:
    args = '{ "a" :  1 }'
    walker = LeafWalker(lambda s, _p: s, media_positions=set(), system_positions=set())
    assert walker.walk({"arguments": args}) == {"arguments": args}


def test_large_numbers_are_read_small_ones_are_not() -> None:
    out, seen = walk({"n": 4111111111111111, "small": 42, "f": 4.5e15, "ratio": 0.5})
    assert "4111111111111111" in seen and "4500000000000000" in seen
    assert out[mark("small")] == 42 and out[mark("ratio")] == 0.5
    assert out[mark("n")] == mark("4111111111111111")


# A data: URL of a real PNG's first bytes (signature and IHDR chunk).
PNG_URL = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAAB"


def test_chat_media_payload_is_skipped_but_a_url_is_read() -> None:
    doc = {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": PNG_URL}},
                    {"type": "image_url", "image_url": {"url": "https://example.com/x.png"}},
                    {"type": "text", "text": "look"},
                ],
            }
        ]
    }
    out, _ = walk(doc, "chat")
    parts = out[mark("messages")][0][mark("content")]
    assert parts[0][mark("image_url")]["url"] == PNG_URL
    assert parts[1][mark("image_url")][mark("url")] == mark("https://example.com/x.png")
    assert parts[2][mark("text")] == mark("look")


def test_media_shaped_object_in_tool_input_is_text() -> None:
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    doc = {
        "messages": [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": block}]}
        ]
    }
    out, _ = walk(doc, "messages")
    tool_input = out[mark("messages")][0][mark("content")][0][mark("input")]
    assert tool_input[mark("source")][mark("data")] == mark("AAAA")
    assert tool_input[mark("type")] == mark("image")  # caller data: even `type` is read


@pytest.mark.parametrize(
    ("dialect", "doc", "system_text"),
    [
        (
            "chat",
            {"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "u"}]},
            "sys",
        ),
        (
            "chat",
            {"messages": [{"role": "developer", "content": "sys"}, {"role": "user", "content": "u"}]},
            "sys",
        ),
        ("responses", {"instructions": "sys", "input": "u"}, "sys"),
        (
            "responses",
            {"input": [{"role": "system", "content": "sys"}, {"role": "user", "content": "u"}]},
            "sys",
        ),
        ("messages", {"system": "sys", "messages": [{"role": "user", "content": "u"}]}, "sys"),
    ],
)
def test_redact_system_false_leaves_system_text_and_reads_the_rest(
    dialect: str, doc: Any, system_text: str
) -> None:
    _, seen_all = walk(doc, dialect)
    assert system_text in seen_all and "u" in seen_all
    _, seen = walk(doc, dialect, redact_system=False)
    assert system_text not in seen and "u" in seen


def test_unknown_item_types_are_read() -> None:
    doc = {"input": [{"type": "some_future_item", "payload": {"deep": ["secret-ish"]}, "output": "out"}]}
    out, seen = walk(doc, "responses")
    assert "secret-ish" in seen and "out" in seen
    assert unread_strings(out) == ["type", "some_future_item"]  # only its structural type is left as is


# --- refusals -------------------------------------------------------------------------------------


def test_nesting_past_the_limit_is_refused() -> None:
    doc: Any = "x"
    for _ in range(MAX_DEPTH + 1):
        doc = [doc]
    with pytest.raises(NestingTooDeep):
        walk(doc)


def test_nesting_inside_a_string_counts_too() -> None:
    inner: Any = "x"
    for _ in range(MAX_DEPTH - 5):
        inner = [inner]
    doc: Any = {"arguments": json.dumps(inner)}
    for _ in range(10):
        doc = [doc]
    with pytest.raises(NestingTooDeep):
        walk(doc)


def test_pathological_nesting_in_the_body_is_refused_not_crashed() -> None:
    with pytest.raises(NestingTooDeep):
        parse_json("[" * 200_000 + "]" * 200_000)


@pytest.mark.parametrize(
    "body",
    ['{"a": 1, "a": 2}', "{'a': 1}", '{"a": NaN}', '{"a": Infinity}', "not json", '{"a": 1', ""],
)
def test_not_json_is_refused(body: str) -> None:
    with pytest.raises(NotJson):
        parse_json(body)


def test_a_number_too_long_to_read_is_refused_not_an_error() -> None:
    """Python's int() stops at 4,300 digits with a ValueError that is no JSONDecodeError: a 400,
    in the body and in JSON inside a string, never an exception that ends the exchange (500)."""
    number = "7" * 5000
    with pytest.raises(NotJson) as refused:
        parse_json('{"n": ' + number + "}")
    assert refusal_for(refused.value).status == 400
    with pytest.raises(NotJson):
        walk({"metadata": {"args": '{"n": ' + number + "}"}})


def test_a_lone_surrogate_in_a_rewritten_body_is_refused_as_not_json() -> None:
    from ext_proc.transform.walk import dump_json

    with pytest.raises(NotJson):
        dump_json({"a": "x\ud800y"})


def test_describe_names_the_error_but_never_its_message() -> None:
    from ext_proc.errors import describe

    secret = "jane.roe@example.com"
    try:
        {}[secret]
    except KeyError as exc:
        described = describe(exc)
    assert described["error"] == "KeyError"
    assert described["where"].startswith("test_walk.py:")
    assert secret not in json.dumps(described)
