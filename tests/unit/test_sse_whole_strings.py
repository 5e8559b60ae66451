"""The strings of a stream that are no restore channel are restored in one piece.

A stream's delta texts are restore channels (a placeholder may be cut across deltas); every other
string of an event is restored whole, whether the output gate reads it as a channel of its key
path (a delta field this code does not know, a block's or part's first text) or not at all. The
gate reads such strings before restore, as the model wrote them: the placeholder is never a
finding.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from ext_proc.detect.catalog.engine import Catalog
from ext_proc.detect.findings import ALL_SETS
from ext_proc.dialects import DIALECTS
from ext_proc.exchange.reply import build_output_gate
from ext_proc.restore.restorers import Restorer
from ext_proc.restore.sse import SseRestorer
from ext_proc.transform.placeholders import PlaceholderMap

ORIGINAL = "jane.doe@example.com"
CATALOG = Catalog.for_sets(ALL_SETS)


def restored(dialect: str, events: list[tuple[str | None, dict[str, Any]]], gate: str | None) -> str:
    pmap = PlaceholderMap(nonce="ab12cd34")
    placeholder = pmap.placeholder_for("EMAIL", ORIGINAL)
    raw = "".join(
        (f"event: {name}\n" if name else "") + "data: " + json.dumps(data).replace("PH", placeholder) + "\n\n"
        for name, data in events
    )
    output_gate = None
    if gate is not None:
        output_gate = build_output_gate(CATALOG, Restorer(pmap), deny=gate == "deny")
    sse = SseRestorer(Restorer(pmap), DIALECTS[dialect], output_gate)
    out = sse.feed(raw.encode()) + sse.finish()
    if output_gate is not None:
        assert output_gate.counts() == {}, "the gate took the placeholder for a finding"
    return out.decode()


CHAT = [
    (
        None,
        {
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {"content": "hi", "note": "to PH"}}],
        },
    ),
    (
        None,
        {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"extra": {"to": ["PH"]}}}]},
    ),
]
MESSAGES = [
    (
        "content_block_start",
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": "to PH "}},
    ),
    (
        "content_block_delta",
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "ok"}},
    ),
    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
]
RESPONSES = [
    (
        "response.content_part.added",
        {
            "type": "response.content_part.added", "item_id": "m1", "output_index": 0, "content_index": 0,
            "part": {"type": "output_text", "text": "to PH ", "annotations": []},
        },
    ),
    (
        "response.output_text.delta",
        {
            "type": "response.output_text.delta", "item_id": "m1", "output_index": 0, "content_index": 0,
            "delta": "ok",
        },
    ),
]  # fmt: skip


@pytest.mark.parametrize("gate", [None, "report", "deny"])
@pytest.mark.parametrize(
    ("dialect", "events", "count"),
    [("chat", CHAT, 2), ("messages", MESSAGES, 1), ("responses", RESPONSES, 1)],
    ids=["chat-other-delta-fields", "messages-block-start", "responses-part-added"],
)
def test_strings_outside_the_restore_channels_are_restored_whole(
    dialect: str, events: list[tuple[str | None, dict[str, Any]]], count: int, gate: str | None
) -> None:
    out = restored(dialect, events, gate)
    assert "ab12cd34" not in out.lower()
    assert out.count(ORIGINAL) == count


# --- bookkeeping keys are skipped only where the APIs put them -----------------------------------

BOOKKEEPING = ["id", "type", "model", "role", "status", "object", "signature", "call_id", "index", "item_id"]
EMAIL = "zorblat.quimby@fennwick.io"


def denied(dialect: str, events: list[tuple[str | None, dict[str, Any]]]) -> tuple[bool, bool]:
    """(the gate tripped, the value reached the client) for a stream under `deny`."""
    pmap = PlaceholderMap(nonce="ab12cd34")
    gate = build_output_gate(CATALOG, Restorer(pmap), deny=True)
    sse = SseRestorer(Restorer(pmap), DIALECTS[dialect], gate)
    raw = "".join((f"event: {n}\n" if n else "") + "data: " + json.dumps(d) + "\n\n" for n, d in events)
    out = sse.feed(raw.encode()) + sse.finish()
    return gate.tripped, EMAIL.encode() in out


@pytest.mark.parametrize("key", BOOKKEEPING)
def test_a_bookkeeping_key_outside_the_apis_objects_is_read(key: str) -> None:
    value = {key: EMAIL}
    chunk = {"object": "chat.completion.chunk"}
    hi = {"index": 0, "delta": {"content": "Hi"}}
    block = {"type": "text", "text": "", "citations": [value]}
    cases = {
        "under a delta field of its own": (
            "chat",
            [(None, {**chunk, "choices": [{"index": 0, "delta": {"content": "Hi", "x": value}}]})],
        ),
        "in the envelope's metadata": ("chat", [(None, {**chunk, "metadata": value, "choices": [hi]})]),
        "in a block's citations": (
            "messages",
            [("content_block_start", {"type": "content_block_start", "index": 0, "content_block": block})],
        ),
    }
    for name, (dialect, events) in cases.items():
        assert denied(dialect, events) == (True, False), name
    pmap = PlaceholderMap(nonce="ab12cd34")
    gate = build_output_gate(CATALOG, Restorer(pmap), deny=True)
    message = {"role": "assistant", "content": "hi", "extra": {key: EMAIL}}
    gate.read_tree({"id": "chatcmpl-1", "choices": [{"index": 0, "message": message}]})
    assert gate.tripped, "a JSON reply"


def test_bookkeeping_where_the_apis_put_it_is_not_read() -> None:
    """The API's own ids and types are not model output (an id can look like a random token)."""
    signature = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"
    start = {"type": "thinking", "thinking": "", "signature": ""}
    delta = {"type": "signature_delta", "signature": signature}
    events = [
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": start}),
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
    ]
    assert CATALOG.detect(signature), "the sample must look like a value when read"
    tripped, _ = denied("messages", events)
    assert not tripped


def test_a_responses_item_text_starts_its_channel() -> None:
    """Text an upstream puts in `response.output_item.added` (a part's start, a call's arguments)
    is read joined with the deltas after it, as the SDK joins them."""
    item = {
        "id": "m1",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "see 4539 "}],
    }
    delta = {"item_id": "m1", "output_index": 0, "content_index": 0, "delta": "1488 0343 6467 done"}
    events = [
        (
            "response.output_item.added",
            {"type": "response.output_item.added", "output_index": 0, "item": item},
        ),
        ("response.output_text.delta", {"type": "response.output_text.delta", **delta}),
    ]
    tripped, _ = denied("responses", events)
    assert tripped
    call = {"id": "fc1", "type": "function_call", "name": "send", "arguments": '{"to": "jane.roe@exa'}
    events = [
        (
            "response.output_item.added",
            {"type": "response.output_item.added", "output_index": 0, "item": call},
        ),
        (
            "response.function_call_arguments.delta",
            {
                "type": "response.function_call_arguments.delta",
                "item_id": "fc1",
                "output_index": 0,
                "delta": 'mple.org"}',
            },
        ),
    ]
    tripped, _ = denied("responses", events)
    assert tripped


def test_a_field_without_schema_is_read_event_by_event_too() -> None:
    """Joined across events, `x` of the second event would read glued to the first's text (`abc`
    + `4539 …`); an SDK shows each event's `x` on its own."""
    chunk = {"object": "chat.completion.chunk"}
    events = [
        (None, {**chunk, "choices": [{"index": 0, "delta": {"content": "a", "x": "abc"}}]}),
        (None, {**chunk, "choices": [{"index": 0, "delta": {"content": "b", "x": "4539 1488 0343 6467"}}]}),
        (None, {**chunk, "choices": [{"index": 0, "delta": {"content": "c", "x": "def"}}]}),
    ]
    assert denied("chat", events)[0]
    unknown = {"item_id": "m1", "output_index": 0, "content_index": 0}
    events = [
        ("response.future_text.delta", {"type": "response.future_text.delta", **unknown, "delta": "abc"}),
        (
            "response.future_text.delta",
            {"type": "response.future_text.delta", **unknown, "delta": "078-05-1120"},
        ),
    ]
    assert denied("responses", events)[0]
