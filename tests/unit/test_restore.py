"""Restore (ext_proc/restore.py): placeholders in replies → the caller's own values.

Text first (every tolerated mangling, every look-alike left alone), then JSON bodies, then the
three SSE dialects built in their real shapes and fed at every byte split, then property tests.
"""

from __future__ import annotations

import itertools
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anthropic
import httpx2
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ext_proc.dialects import DIALECTS
from ext_proc.restore.json_body import restore_json_body
from ext_proc.restore.restorers import Restorer
from ext_proc.restore.sse import SseRestorer
from ext_proc.restore.stream import StreamRestorer
from ext_proc.transform.placeholders import PlaceholderMap
from tests.support.examples import example_count

NONCE = "ab12cd34"
S = TypeVar("S", str, bytes)

# (label, original): originals with quotes, backslashes, newlines and non-ASCII on purpose.
VALUES: list[tuple[str, str]] = [
    ("EMAIL", "jane.doe@example.com"),
    ("EMAIL", 'o"brien\\x@example.org'),
    ("PHONE", "+1 (555) 010-9999"),
    ("CREDIT_CARD", "4111 1111 1111 1111"),
    ("SUBJECT1_NAME", 'Zoë "Z" Łukasiewicz\nsecond line'),
    ("SUBJECT12_NAME", "名前 テスト 🙂"),
    ("IP", "10.0.0.1"),
    ("IBAN", "DE89 3704 0044 0532 0130 00"),
]


def fresh() -> tuple[PlaceholderMap, list[str]]:
    """A map holding VALUES; returns it and the canonical placeholder of each value, in order."""
    pmap = PlaceholderMap(nonce=NONCE)
    return pmap, [pmap.placeholder_for(label, original) for label, original in VALUES]


PMAP, PH = fresh()
ORIG = [original for _, original in VALUES]
R = Restorer(PMAP)

# Every tolerated form of a placeholder `<LABEL_nonce_i>`, and combinations of them.
MANGLES: dict[str, Callable[[str], str]] = {
    "canonical": lambda p: p,
    "no_brackets": lambda p: p[1:-1],
    "lowercase": str.lower,
    "uppercase": str.upper,
    "markdown_underscores": lambda p: p.replace("_", "\\_"),
    "json_escaped_brackets": lambda p: "\\u003c" + p[1:-1] + "\\u003e",
    "json_escaped_brackets_upper": lambda p: "\\u003C" + p[1:-1] + "\\u003E",
    "only_opening_bracket": lambda p: p[:-1],
    "lower_markdown_no_brackets": lambda p: p[1:-1].lower().replace("_", "\\_"),
}
# The forms that carry their own end: any text may follow them.
CLOSED = ["canonical", "lowercase", "uppercase", "markdown_underscores", "json_escaped_brackets"]


# --- text -------------------------------------------------------------------------------------


@pytest.mark.parametrize("mangle", list(MANGLES))
@pytest.mark.parametrize("which", range(len(VALUES)))
def test_every_tolerated_form_restores_to_the_exact_original(mangle: str, which: int) -> None:
    text = f"Write to {MANGLES[mangle](PH[which])} today."
    assert R.restore_text(text) == f"Write to {ORIG[which]} today."


@pytest.mark.parametrize(
    "text",
    [
        "<EMAIL_1>",  # what a user might type: no nonce
        "<EMAIL_ffffffff_1>",  # another request's nonce
        "<EMAIL_ab12cd34_9>",  # index not in the map
        "EMAIL_ab12cd34_12",  # only index 1 exists: `_12` is not `_1` followed by `2`
        "<EMAIL_ab12cd34_12>",
        "<EMAIL_ab12cd34_01>",  # not how the grammar writes an index
        "<PASSPORT_ab12cd34_1>",  # a label this request never used
        "xEMAIL_ab12cd34_1",  # inside a word
        "SUBJECT2_NAME_ab12cd34_1",  # a longer label that is not in the map ends in a known one
        "SUBJECT1\\_EMAIL_ab12cd34_1",
        "<EMAIL_ab12cd3_1>",  # nonce cut short
        "<EMAIL__ab12cd34_1>",
        "",
    ],
)
def test_look_alikes_stay_as_they_are(text: str) -> None:
    assert R.restore_text(text) == text
    assert R.restore_text(text, json_escaped=True) == text


def test_longest_label_wins_and_indices_do_not_bleed() -> None:
    text = f"{PH[4]}|{PH[5]}|{PH[0]}|{PH[1]}"
    assert R.restore_text(text) == f"{ORIG[4]}|{ORIG[5]}|{ORIG[0]}|{ORIG[1]}"
    assert R.restore_text(PH[0] + "2") == ORIG[0] + "2"  # a closed placeholder ends at `>`


def test_word_boundaries_of_bracketless_forms() -> None:
    bare = PH[0][1:-1]
    assert R.restore_text(f"({bare})") == f"({ORIG[0]})"
    assert R.restore_text(f"_{bare}_") == f"_{ORIG[0]}_"  # markdown emphasis
    assert R.restore_text(f"__{bare}__") == f"__{ORIG[0]}__"
    assert R.restore_text(f"a_{bare}") == f"a_{bare}"
    escaped = json.dumps(ORIG[0])[1:-1]
    assert R.restore_text(f'"line\\n{bare}"', json_escaped=True) == f'"line\\n{escaped}"'


def test_json_escaped_insertion_keeps_tool_arguments_valid_json() -> None:
    for mangle in ("canonical", "no_brackets", "lowercase", "json_escaped_brackets"):
        form = MANGLES["canonical" if mangle == "json_escaped_brackets" else mangle]
        model_args = json.dumps({"to": [form(p) for p in PH], "note": f"hi {form(PH[4])}"})
        if mangle == "json_escaped_brackets":  # how some providers write `<` and `>` in JSON
            model_args = model_args.replace("<", "\\u003c").replace(">", "\\u003e")
        restored = R.restore_text(model_args, json_escaped=True)
        assert json.loads(restored) == {"to": ORIG, "note": f"hi {ORIG[4]}"}


def test_has_any_is_a_case_insensitive_nonce_check() -> None:
    assert R.has_any(b"..AB12CD34..") and R.has_any("..ab12cd34..")
    assert not R.has_any(b"<EMAIL_1>") and not R.has_any("nothing here")
    assert not Restorer(PlaceholderMap(nonce=NONCE)).has_any(NONCE)


def test_an_empty_map_restores_nothing() -> None:
    empty = Restorer(PlaceholderMap(nonce=NONCE))
    assert empty.restore_text(PH[0]) == PH[0]
    stream = StreamRestorer(empty)
    assert stream.feed("<EMA") == "<EMA" and stream.flush() == ""
    sse = SseRestorer(empty, DIALECTS["chat"])
    chunk = b'data: {"choices":[{"index":0,"delta":{"content":"<EMA"}}]}\n\n'
    assert sse.feed(chunk[:7]) == chunk[:7] and sse.feed(chunk[7:]) == chunk[7:] and sse.finish() == b""


def test_a_key_outside_the_grammar_is_refused() -> None:
    pmap = PlaceholderMap(nonce=NONCE)
    pmap.originals["<not a placeholder>"] = "x"
    with pytest.raises(ValueError):
        Restorer(pmap)


# --- stream hold-back --------------------------------------------------------------------------


def test_text_that_cannot_start_a_placeholder_goes_out_at_once() -> None:
    stream = StreamRestorer(R)
    assert stream.feed("Hello") == "Hello"  # time to first token: nothing held
    assert stream.feed(", world. ") == ", world. "
    assert stream.feed("Mail <") == "Mail " and stream.held == "<"
    assert stream.feed("EMAIL_ab") == "" and stream.held == "<EMAIL_ab"
    assert stream.feed("12cd34_1") == ""  # complete, but `_12` or a `>` could still follow
    assert stream.feed("> ok") == ORIG[0] + " ok"
    assert stream.feed(" em") == " " and stream.held == "em"  # could be `email_ab12cd34_…`
    assert stream.feed("bers") == "embers"
    assert stream.flush() == ""


def test_a_held_tail_is_restored_or_released_at_flush() -> None:
    stream = StreamRestorer(R)
    assert stream.feed("at EMAIL_ab12cd34_1") == "at "
    assert stream.flush() == ORIG[0]
    assert stream.feed("<EMAIL_ab1") == "" and stream.flush() == "<EMAIL_ab1"


def test_a_tool_argument_stream_inserts_json_escaped() -> None:
    args = json.dumps({"to": PH[1], "name": PH[4]}).replace("<", "\\u003c").replace(">", "\\u003e")
    stream = StreamRestorer(R, json_escaped=True)
    out = "".join(stream.feed(args[i : i + 3]) for i in range(0, len(args), 3)) + stream.flush()
    assert json.loads(out) == {"to": ORIG[1], "name": ORIG[4]}


# --- JSON bodies -------------------------------------------------------------------------------

CHAT_BODY: dict[str, Any] = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1700000000,
    "model": "gpt-4o-mini",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": f"I wrote to {PH[0]} about {MANGLES['markdown_underscores'](PH[4])}.",
                "refusal": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {
                            "name": "send_email",
                            "arguments": json.dumps({"to": PH[1], "body": f"Dear {PH[4]}"}),
                        },
                    }
                ],
            },
            "logprobs": None,
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {"prompt_tokens": 10, "completion_tokens": 20, "total_tokens": 30},
}

RESPONSES_BODY: dict[str, Any] = {
    "id": "resp_1",
    "object": "response",
    "created_at": 1700000000,
    "status": "completed",
    "model": "gpt-4.1",
    "output": [
        {
            "id": "msg_1",
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": f"Card {PH[3]} noted.", "annotations": []}],
        },
        {
            "id": "fc_1",
            "type": "function_call",
            "status": "completed",
            "call_id": "call_1",
            "name": "lookup",
            "arguments": json.dumps({"iban": PH[7]}).replace("<", "\\u003c").replace(">", "\\u003e"),
        },
    ],
    "metadata": {PH[6]: "keyed by a placeholder"},
}

MESSAGES_BODY: dict[str, Any] = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-6",
    "content": [
        {"type": "thinking", "thinking": f"The user is {PH[5]}.", "signature": "EqQBCgIYAhIM"},
        {"type": "text", "text": f"Calling {PH[2][1:-1]} now."},
        {"type": "tool_use", "id": "toolu_1", "name": "call", "input": {"number": PH[2], "who": [PH[4]]}},
    ],
    "stop_reason": "tool_use",
    "stop_sequence": None,
    "usage": {"input_tokens": 10, "output_tokens": 20},
}


def test_chat_body_is_restored_with_tool_arguments_kept_valid() -> None:
    out = json.loads(restore_json_body(json.dumps(CHAT_BODY).encode(), R))
    message = out["choices"][0]["message"]
    assert message["content"] == f"I wrote to {ORIG[0]} about {ORIG[4]}."
    arguments = json.loads(message["tool_calls"][0]["function"]["arguments"])
    assert arguments == {"to": ORIG[1], "body": f"Dear {ORIG[4]}"}
    assert out["usage"] == CHAT_BODY["usage"]


def test_responses_body_is_restored_keys_included() -> None:
    out = json.loads(restore_json_body(json.dumps(RESPONSES_BODY).encode(), R))
    assert out["output"][0]["content"][0]["text"] == f"Card {ORIG[3]} noted."
    assert json.loads(out["output"][1]["arguments"]) == {"iban": ORIG[7]}
    assert out["metadata"] == {ORIG[6]: "keyed by a placeholder"}


def test_messages_body_is_restored_in_every_block() -> None:
    body = json.dumps(MESSAGES_BODY, ensure_ascii=False).encode()
    out = json.loads(restore_json_body(body, R))
    assert out["content"][0]["thinking"] == f"The user is {ORIG[5]}."
    assert out["content"][0]["signature"] == "EqQBCgIYAhIM"
    assert out["content"][1]["text"] == f"Calling {ORIG[2]} now."
    assert out["content"][2]["input"] == {"number": ORIG[2], "who": [ORIG[4]]}


def test_a_body_without_the_nonce_is_the_same_bytes() -> None:
    body = json.dumps({**CHAT_BODY, "choices": []}, indent=2).encode()
    assert restore_json_body(body, R) is body
    look_alike = b'{"text": "<EMAIL_ab12cd34_9> stays"}'  # the nonce, but nothing of the map
    assert restore_json_body(look_alike, R) is look_alike


def test_a_body_that_is_not_json_is_restored_as_text() -> None:
    body = f"plain {PH[0]} text".encode()
    assert restore_json_body(body, R) == f"plain {ORIG[0]} text".encode()


# --- SSE: a client's view ---------------------------------------------------------------------


@dataclass
class Msg:
    event: str | None
    data: str
    raw: bytes


def parse_sse(stream: bytes) -> list[Msg]:
    """What an SSE client dispatches: events at blank lines, data lines joined by newlines."""
    out: list[Msg] = []
    name: str | None = None
    data: list[str] = []
    raw: list[bytes] = []
    for line in re.split(rb"\r\n|\n", stream):
        raw.append(line)
        if not line:
            if data:
                out.append(Msg(name, "\n".join(data), b"\n".join(raw)))
            name, data, raw = None, [], []
            continue
        field, _, value = line.decode().partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            name = value
        elif field == "data":
            data.append(value)
    return out


def run(sse: SseRestorer, chunks: list[bytes]) -> bytes:
    return b"".join(sse.feed(chunk) for chunk in chunks) + sse.finish()


def splits(stream: S, cuts: list[int]) -> list[S]:
    """`stream` cut at the given positions (clamped, deduplicated)."""
    cuts = sorted({min(max(c, 0), len(stream)) for c in cuts})
    bounds = [0, *cuts, len(stream)]
    return [stream[a:b] for a, b in itertools.pairwise(bounds)]


SIZES_DEFAULT = (1, 4, 2, 7, 3, 5)


def pieces(text: str, sizes: tuple[int, ...] = SIZES_DEFAULT) -> list[str]:
    """Cut text into deltas of varying size, so placeholders land split across several deltas."""
    out: list[str] = []
    i = k = 0
    while i < len(text):
        out.append(text[i : i + sizes[k % len(sizes)]])
        i += sizes[k % len(sizes)]
        k += 1
    return out


def sse(events: list[tuple[str | None, Any]], newline: str = "\n") -> bytes:
    out = []
    for name, data in events:
        payload = (
            data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
        )
        head = f"event: {name}{newline}" if name else ""
        out.append(f"{head}data: {payload}{newline}{newline}")
    return "".join(out).encode()


# A reply text as the model writes it (placeholders in several forms, one split at the very end so
# that only the end of the channel can release it) and what the client must see.
MODEL_TEXT = (
    f"Hi {MANGLES['canonical'](PH[4])}, I wrote to {MANGLES['no_brackets'](PH[0])} and "
    f"{MANGLES['lowercase'](PH[1])}; call {MANGLES['markdown_underscores'](PH[2])} or "
    f"{MANGLES['json_escaped_brackets'](PH[5])}. Look-alikes stay: <EMAIL_1>, <EMAIL_ffffffff_1>. "
    f"Card: {MANGLES['no_brackets'](PH[3])}"
)
EXPECTED_TEXT = (
    f"Hi {ORIG[4]}, I wrote to {ORIG[0]} and {ORIG[1]}; call {ORIG[2]} or {ORIG[5]}. "
    f"Look-alikes stay: <EMAIL_1>, <EMAIL_ffffffff_1>. Card: {ORIG[3]}"
)
MODEL_ARGS = json.dumps({"to": PH[1], "cc": [PH[0]], "name": PH[4]}).replace("<", "\\u003c")
EXPECTED_ARGS = {"to": ORIG[1], "cc": [ORIG[0]], "name": ORIG[4]}
THINKING = f"The user, {PH[5]}, wants mail sent to {PH[0][1:-1]}"
EXPECTED_THINKING = f"The user, {ORIG[5]}, wants mail sent to {ORIG[0]}"
PLAIN_TEXT = "Hello there, how are you today? All good."
PLAIN_ARGS = '{"city": "Paris", "days": 3}'


# Chat Completions ------------------------------------------------------------------------------

CHAT_BASE = {
    "id": "chatcmpl-1",
    "object": "chat.completion.chunk",
    "created": 1700000000,
    "model": "gpt-4o-mini",
}
CHAT_USAGE = {
    **CHAT_BASE,
    "choices": [],
    "usage": {"prompt_tokens": 9, "completion_tokens": 12, "total_tokens": 21},
}


def chat_stream(
    text: str, args: str | None, newline: str = "\n", sizes: tuple[int, ...] = SIZES_DEFAULT
) -> bytes:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> tuple[None, dict[str, Any]]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return None, {**CHAT_BASE, "system_fingerprint": "fp_1", "choices": [choice]}

    events: list[tuple[str | None, Any]] = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": p}) for p in pieces(text, sizes)]
    if args is not None:
        call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "send", "arguments": ""}}
        events.append(chunk({"tool_calls": [call]}))
        events += [chunk({"tool_calls": [{"index": 0, "function": {"arguments": p}}]}) for p in pieces(args)]
    events.append(chunk({}, "tool_calls" if args is not None else "stop"))
    events += [(None, CHAT_USAGE), (None, "[DONE]")]
    return sse(events, newline)


def chat_client(stream: bytes) -> tuple[str, str, list[Msg]]:
    msgs = parse_sse(stream)
    content, args = "", ""
    for msg in msgs:
        if msg.data == "[DONE]":
            continue
        for choice in json.loads(msg.data)["choices"]:
            content += choice["delta"].get("content") or ""
            for call in choice["delta"].get("tool_calls") or []:
                args += call.get("function", {}).get("arguments") or ""
    return content, args, msgs


# Responses -------------------------------------------------------------------------------------


def responses_stream(
    text: str, args: str, newline: str = "\n", sizes: tuple[int, ...] = SIZES_DEFAULT
) -> bytes:
    seq = iter(range(1000))
    events: list[tuple[str | None, Any]] = []

    def ev(data: dict[str, Any]) -> None:
        events.append((data["type"], {"type": data["type"], "sequence_number": next(seq), **data}))

    response = {
        "id": "resp_1",
        "object": "response",
        "created_at": 1700000000,
        "status": "in_progress",
        "model": "gpt-4.1",
        "output": [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {},
        "usage": None,
    }
    ev({"type": "response.created", "response": response})
    ev({"type": "response.in_progress", "response": response})
    message = {"id": "msg_1", "type": "message", "status": "in_progress", "role": "assistant", "content": []}
    ev({"type": "response.output_item.added", "output_index": 0, "item": message})
    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    where = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    ev({"type": "response.content_part.added", **where, "part": part})
    for p in pieces(text, sizes):
        ev({"type": "response.output_text.delta", **where, "delta": p, "logprobs": [], "obfuscation": "Zx"})
    ev({"type": "response.output_text.done", **where, "text": text, "logprobs": []})
    done_part = {**part, "text": text}
    ev({"type": "response.content_part.done", **where, "part": done_part})
    done_message = {**message, "status": "completed", "content": [done_part]}
    ev({"type": "response.output_item.done", "output_index": 0, "item": done_message})
    call = {
        "id": "fc_1",
        "type": "function_call",
        "status": "in_progress",
        "call_id": "call_1",
        "name": "send",
        "arguments": "",
    }
    ev({"type": "response.output_item.added", "output_index": 1, "item": call})
    for p in pieces(args):
        ev(
            {
                "type": "response.function_call_arguments.delta",
                "item_id": "fc_1",
                "output_index": 1,
                "delta": p,
            }
        )
    ev(
        {
            "type": "response.function_call_arguments.done",
            "item_id": "fc_1",
            "output_index": 1,
            "arguments": args,
        }
    )
    done_call = {**call, "status": "completed", "arguments": args}
    ev({"type": "response.output_item.done", "output_index": 1, "item": done_call})
    usage = {
        "input_tokens": 9,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 12,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 21,
    }
    completed = {**response, "status": "completed", "output": [done_message, done_call], "usage": usage}
    ev({"type": "response.completed", "response": completed})
    return sse(events, newline)


def responses_client(stream: bytes) -> dict[str, Any]:
    msgs = parse_sse(stream)
    seen: dict[str, Any] = {"text": "", "args": "", "msgs": msgs}
    for msg in msgs:
        data = json.loads(msg.data)
        assert msg.event == data["type"]
        if data["type"] == "response.output_text.delta":
            seen["text"] += data["delta"]
        elif data["type"] == "response.function_call_arguments.delta":
            seen["args"] += data["delta"]
        elif data["type"] == "response.output_text.done":
            seen["text_done"] = data["text"]
        elif data["type"] == "response.function_call_arguments.done":
            seen["args_done"] = data["arguments"]
        elif data["type"] == "response.completed":
            output = data["response"]["output"]
            seen["completed_text"] = output[0]["content"][0]["text"]
            seen["completed_args"] = output[1]["arguments"]
    return seen


# Messages --------------------------------------------------------------------------------------


def messages_stream(
    thinking: str, text: str, args: str, newline: str = "\n", sizes: tuple[int, ...] = SIZES_DEFAULT
) -> bytes:
    events: list[tuple[str | None, Any]] = []

    def ev(data: dict[str, Any]) -> None:
        events.append((data["type"], data))

    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-6",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 9, "output_tokens": 1},
    }
    ev({"type": "message_start", "message": message})
    ev({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}})
    for p in pieces(thinking, sizes):
        ev({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": p}})
    ev(
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "signature_delta", "signature": "EqQBCg"},
        }
    )
    ev({"type": "content_block_stop", "index": 0})
    ev({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}})
    ev({"type": "ping"})
    for p in pieces(text, sizes):
        ev({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": p}})
    ev({"type": "content_block_stop", "index": 1})
    block = {"type": "tool_use", "id": "toolu_1", "name": "send", "input": {}}
    ev({"type": "content_block_start", "index": 2, "content_block": block})
    for p in pieces(args):
        ev(
            {
                "type": "content_block_delta",
                "index": 2,
                "delta": {"type": "input_json_delta", "partial_json": p},
            }
        )
    ev({"type": "content_block_stop", "index": 2})
    delta = {"stop_reason": "tool_use", "stop_sequence": None}
    ev({"type": "message_delta", "delta": delta, "usage": {"output_tokens": 12}})
    ev({"type": "message_stop"})
    return sse(events, newline)


def messages_client(stream: bytes) -> dict[int, str]:
    blocks: dict[int, str] = {}
    for msg in parse_sse(stream):
        data = json.loads(msg.data)
        assert msg.event == data["type"]  # the Anthropic SDK drops events without `event:`
        if data["type"] == "content_block_delta":
            delta = data["delta"]
            field = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "partial_json"}
            if delta["type"] in field:
                blocks[data["index"]] = blocks.get(data["index"], "") + delta[field[delta["type"]]]
    return blocks


# The three dialects as cases: a stream, and a check of what the client saw.


@dataclass(frozen=True)
class Expect:
    text: str = EXPECTED_TEXT
    args: dict[str, Any] | None = None
    thinking: str = EXPECTED_THINKING

    @property
    def tool_args(self) -> dict[str, Any]:
        return EXPECTED_ARGS if self.args is None else self.args


def check_chat(out: bytes, expect: Expect) -> None:
    content, args, msgs = chat_client(out)
    assert content == expect.text
    assert json.loads(args) == expect.tool_args
    assert msgs[-1].data == "[DONE]"
    usage = json.dumps(CHAT_USAGE, separators=(",", ":"))
    assert [m.data for m in msgs if '"choices":[]' in m.data] == [usage]  # the usage chunk, untouched


def check_responses(out: bytes, expect: Expect) -> None:
    seen = responses_client(out)
    assert seen["text"] == seen["text_done"] == seen["completed_text"] == expect.text
    assert seen["args"] == seen["args_done"] == seen["completed_args"]
    assert json.loads(seen["args"]) == expect.tool_args


def check_messages(out: bytes, expect: Expect) -> None:
    blocks = messages_client(out)
    assert blocks.get(0, "") == expect.thinking  # no delta at all for an empty text
    assert blocks.get(1, "") == expect.text
    assert json.loads(blocks[2]) == expect.tool_args


CHECKS: dict[str, Callable[[bytes, Expect], None]] = {
    "chat": check_chat,
    "responses": check_responses,
    "messages": check_messages,
}


def build(
    dialect: str,
    text: str,
    args: str,
    thinking: str,
    newline: str = "\n",
    sizes: tuple[int, ...] = SIZES_DEFAULT,
) -> bytes:
    if dialect == "chat":
        return chat_stream(text, args, newline, sizes)
    if dialect == "responses":
        return responses_stream(text, args, newline, sizes)
    return messages_stream(thinking, text, args, newline, sizes)


CASES: dict[str, bytes] = {d: build(d, MODEL_TEXT, MODEL_ARGS, THINKING) for d in CHECKS}

# A shorter reply for the every-byte split (the number of runs grows with the square of the size).
SHORT_TEXT = (
    f"Hi {PH[4]}, mail {PH[0][1:-1]} or {MANGLES['json_escaped_brackets'](PH[5])}. Card {PH[3][1:-1]}"
)
SHORT_ARGS = json.dumps({"to": PH[1]}).replace("<", "\\u003c")
SHORT = Expect(
    text=f"Hi {ORIG[4]}, mail {ORIG[0]} or {ORIG[5]}. Card {ORIG[3]}",
    args={"to": ORIG[1]},
    thinking=f"Hi {ORIG[4]}, mail {ORIG[0]} or {ORIG[5]}. Card {ORIG[3]}",
)
SHORT_CASES: dict[str, bytes] = {
    d: build(d, SHORT_TEXT, SHORT_ARGS, SHORT_TEXT, sizes=(3, 8, 5, 13)) for d in CHECKS
}


def assert_no_empty_deltas(out: bytes, received: bytes) -> None:
    """Every event we wrote (not passed through as received) carries non-empty delta text."""
    for msg in parse_sse(out):
        if msg.raw in received or msg.data == "[DONE]":
            continue
        data = json.loads(msg.data)
        texts: list[Any] = [data.get("delta")] if isinstance(data.get("delta"), str) else []
        if isinstance(data.get("delta"), dict):
            texts += [v for k, v in data["delta"].items() if k != "type"]
        for choice in data.get("choices") or []:
            delta = choice.get("delta") or {}
            texts += [v for k, v in delta.items() if k in ("content", "refusal")]
            texts += [c.get("function", {}).get("arguments") for c in delta.get("tool_calls") or []]
        assert all(t != "" for t in texts), msg.data


def _cuts_near_frames(stream: bytes, step: int) -> list[int]:
    """Every `step`-th offset of `stream`, and every offset at or right after a line break (where
    framing decides: inside `\n\n`, right before or after it)."""
    near = {i + d for i, byte in enumerate(stream) if byte == 10 for d in (0, 1)}
    return sorted({*range(0, len(stream) + 1, step), *(i for i in near if 0 <= i <= len(stream))})


def check_split_in_two(dialect: str, step: int) -> None:
    stream = SHORT_CASES[dialect]
    whole = run(SseRestorer(R, DIALECTS[dialect]), [stream])
    CHECKS[dialect](whole, SHORT)
    assert_no_empty_deltas(whole, stream)
    for i in _cuts_near_frames(stream, step):
        # Event framing does not depend on where Envoy cut the body: the output is the same bytes.
        assert run(SseRestorer(R, DIALECTS[dialect]), [stream[:i], stream[i:]]) == whole, i


@pytest.mark.parametrize("dialect", list(CASES))
def test_sse_stream_split_in_two_anywhere_near_frames(dialect: str) -> None:
    check_split_in_two(dialect, step=11)


@pytest.mark.slow
@pytest.mark.parametrize("dialect", list(CASES))
def test_sse_stream_split_at_every_byte(dialect: str) -> None:
    check_split_in_two(dialect, step=1)


@pytest.mark.parametrize("dialect", list(CASES))
def test_sse_stream_random_multi_splits(dialect: str) -> None:
    stream = CASES[dialect]
    whole = run(SseRestorer(R, DIALECTS[dialect]), [stream])
    assert_no_empty_deltas(whole, stream)
    rng = random.Random(dialect)
    for _ in range(200):
        cuts = [rng.randrange(len(stream) + 1) for _ in range(rng.randrange(1, 40))]
        assert run(SseRestorer(R, DIALECTS[dialect]), splits(stream, cuts)) == whole
    byte_by_byte = run(SseRestorer(R, DIALECTS[dialect]), [stream[i : i + 1] for i in range(len(stream))])
    assert byte_by_byte == whole
    CHECKS[dialect](whole, Expect())


@pytest.mark.parametrize("dialect", list(CASES))
def test_sse_with_crlf_line_endings(dialect: str) -> None:
    stream = build(dialect, MODEL_TEXT, MODEL_ARGS, THINKING, newline="\r\n")
    whole = run(SseRestorer(R, DIALECTS[dialect]), [stream])
    CHECKS[dialect](whole, Expect())
    assert b"\n" not in whole.replace(b"\r\n", b"")  # what we write keeps the stream's line endings
    for i in range(0, len(stream), 53):  # cuts inside `\r\n\r\n` included
        assert (
            run(SseRestorer(R, DIALECTS[dialect]), [stream[:i], stream[i : i + 1], stream[i + 1 :]]) == whole
        )


def test_sse_without_placeholders_is_byte_identical() -> None:
    streams = {
        "chat": chat_stream(PLAIN_TEXT, PLAIN_ARGS),
        "responses": responses_stream(PLAIN_TEXT, PLAIN_ARGS),
        "messages": messages_stream(PLAIN_TEXT, PLAIN_TEXT, PLAIN_ARGS),
        "generic": chat_stream(PLAIN_TEXT, PLAIN_ARGS),
    }
    for dialect, stream in streams.items():
        for i in range(0, len(stream) + 1, 11):
            assert run(SseRestorer(R, DIALECTS[dialect]), [stream[:i], stream[i:]]) == stream


def test_a_tail_that_could_start_a_placeholder_moves_to_the_next_delta() -> None:
    # `I` could begin `IP_ab12cd34_1`: held until the next delta shows it does not.
    stream = chat_stream("Yes, I think so", None)
    chunks = [
        (None, json.loads(m.data)) for m in parse_sse(run(SseRestorer(R, DIALECTS["chat"]), [stream]))[:-1]
    ]
    contents = [c["choices"][0]["delta"].get("content") for _, c in chunks if c["choices"]]
    assert "".join(c or "" for c in contents) == "Yes, I think so"
    assert all(c != "" for c in contents[1:])


def test_a_held_tail_at_the_end_goes_out_before_the_finish_chunk() -> None:
    text = f"Reach me at {PH[0][1:-1]}"  # bracketless at the very end: only the end can decide
    out = run(SseRestorer(R, DIALECTS["chat"]), [chat_stream(text, None)])
    msgs = parse_sse(out)
    finish = next(i for i, m in enumerate(msgs) if '"finish_reason":"stop"' in m.data)
    synthetic = json.loads(msgs[finish - 1].data)
    assert synthetic["choices"][0]["delta"] == {"content": ORIG[0]}
    assert synthetic["choices"][0]["finish_reason"] is None and synthetic["id"] == "chatcmpl-1"
    assert chat_client(out)[0] == f"Reach me at {ORIG[0]}"


def test_chat_finish_in_the_same_chunk_as_the_last_delta() -> None:
    base = {
        **CHAT_BASE,
        "choices": [{"index": 0, "delta": {"content": f"to {PH[0][:9]}"}, "finish_reason": None}],
    }
    last = {
        **CHAT_BASE,
        "choices": [{"index": 0, "delta": {"content": PH[0][9:-1]}, "finish_reason": "stop"}],
    }
    out = run(SseRestorer(R, DIALECTS["chat"]), [sse([(None, base), (None, last), (None, "[DONE]")])])
    assert chat_client(out)[0] == f"to {ORIG[0]}"


def test_chat_choices_and_tool_calls_are_separate_channels() -> None:
    def chunk(choices: list[dict[str, Any]]) -> tuple[None, dict[str, Any]]:
        return None, {**CHAT_BASE, "choices": choices}

    half = len(PH[0]) // 2
    events = [
        chunk(
            [
                {"index": 0, "delta": {"content": PH[0][:half]}},
                {"index": 1, "delta": {"content": PH[1][:half]}},
            ]
        ),
        chunk([{"index": 1, "delta": {"content": PH[1][half:]}}]),
        chunk([{"index": 0, "delta": {"content": PH[0][half:]}}]),
        chunk(
            [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {"index": 0, "function": {"arguments": '{"a":"' + PH[2][:half]}},
                            {"index": 1, "function": {"arguments": '{"b":"' + PH[3][:half]}},
                        ]
                    },
                }
            ]
        ),
        chunk(
            [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 1, "function": {"arguments": PH[3][half:] + '"}'}}]},
                }
            ]
        ),
        chunk(
            [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": PH[2][half:] + '"}'}}]},
                }
            ]
        ),
        chunk(
            [
                {"index": 0, "delta": {}, "finish_reason": "stop"},
                {"index": 1, "delta": {}, "finish_reason": "stop"},
            ]
        ),
        (None, "[DONE]"),
    ]
    out = run(SseRestorer(R, DIALECTS["chat"]), [sse(events)])
    contents: dict[int, str] = {}
    calls: dict[int, str] = {}
    for msg in parse_sse(out)[:-1]:
        for choice in json.loads(msg.data)["choices"]:
            contents[choice["index"]] = contents.get(choice["index"], "") + (
                choice["delta"].get("content") or ""
            )
            for call in choice["delta"].get("tool_calls") or []:
                calls[call["index"]] = calls.get(call["index"], "") + call["function"]["arguments"]
    assert contents == {0: ORIG[0], 1: ORIG[1]}
    assert {k: json.loads(v) for k, v in calls.items()} == {0: {"a": ORIG[2]}, 1: {"b": ORIG[3]}}


def test_sse_unknown_events_comments_and_non_json_data() -> None:
    stream = (
        b": keep-alive\n\n"
        b'id: 7\nevent: custom\ndata: {"note": "' + PH[0].encode() + b'"}\n\n'
        b"data: not json " + PH[6].encode() + b"\n\n"
        b"retry: 100\n\n"
    )
    out = run(SseRestorer(R, DIALECTS["messages"]), [stream])
    assert out.startswith(b": keep-alive\n\n" + b"id: 7\nevent: custom\ndata: ")
    msgs = parse_sse(out)
    assert json.loads(msgs[0].data) == {"note": ORIG[0]}
    assert msgs[1].data == f"not json {ORIG[6]}"
    assert out.endswith(b"retry: 100\n\n")


def test_generic_dialect_restores_every_event_in_full() -> None:
    stream = sse([(None, {"a": {"b": [PH[0], {PH[1]: 1}]}, "arguments": json.dumps({"x": PH[4]})})])
    data = json.loads(parse_sse(run(SseRestorer(R, DIALECTS["generic"]), [stream]))[0].data)
    assert data["a"] == {"b": [ORIG[0], {ORIG[1]: 1}]}
    assert json.loads(data["arguments"]) == {"x": ORIG[4]}


def test_a_delta_is_judged_with_what_came_before_it() -> None:
    # Alone, `EMAIL_ab12cd34_1 ok` would be a placeholder; after `x` it is inside a word.
    bare = PH[0][1:-1]
    for dialect in CHECKS:
        stream = build(dialect, f"x{bare} ok", PLAIN_ARGS, f"x{bare} ok", sizes=(1, 100))
        out = run(SseRestorer(R, DIALECTS[dialect]), [stream])
        CHECKS[dialect](out, Expect(text=f"x{bare} ok", args=json.loads(PLAIN_ARGS), thinking=f"x{bare} ok"))


def test_a_body_nested_past_the_parser_is_restored_as_json_text() -> None:
    body = ("[" * 100_000 + json.dumps(PH[1]) + "]" * 100_000).encode()
    out = restore_json_body(body, R)
    assert out == body.replace(PH[1].encode(), json.dumps(ORIG[1])[1:-1].encode())


def test_a_last_event_without_its_blank_line_is_restored_as_an_event() -> None:
    """Read like any event (its channels, the gate), and still without the blank line."""
    sse_restorer = SseRestorer(R, DIALECTS["chat"])
    out = sse_restorer.feed(b'data: {"x": "' + PH[0].encode() + b'"}') + sse_restorer.finish()
    assert out.decode() == 'data: {"x":"' + ORIG[0] + '"}'


# --- the real SDKs read the restored streams ---------------------------------------------------


def served(body: bytes) -> httpx2.Client:
    def reply(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    return httpx2.Client(transport=httpx2.MockTransport(reply))


def test_openai_sdk_reads_the_restored_chat_stream() -> None:
    stream = CASES["chat"]
    restored = run(SseRestorer(R, DIALECTS["chat"]), splits(stream, list(range(0, len(stream), 13))))
    client = openai.OpenAI(api_key="k", base_url="http://upstream/v1", http_client=served(restored))
    with client.chat.completions.stream(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "x"}]
    ) as s:
        for _ in s:
            pass
        message = s.get_final_completion().choices[0].message
    assert message.content == EXPECTED_TEXT
    assert message.tool_calls is not None and message.tool_calls[0].function.name == "send"
    assert json.loads(message.tool_calls[0].function.arguments) == EXPECTED_ARGS


def test_openai_sdk_reads_the_restored_responses_stream() -> None:
    stream = CASES["responses"]
    restored = run(SseRestorer(R, DIALECTS["responses"]), splits(stream, list(range(0, len(stream), 11))))
    client = openai.OpenAI(api_key="k", base_url="http://upstream/v1", http_client=served(restored))
    deltas = ""
    with client.responses.stream(model="gpt-4.1", input="x") as s:
        for event in s:
            if event.type == "response.output_text.delta":
                deltas += event.delta
        final = s.get_final_response()
    assert deltas == final.output_text == EXPECTED_TEXT
    call = final.output[1]
    assert call.type == "function_call" and json.loads(call.arguments) == EXPECTED_ARGS


def test_anthropic_sdk_reads_the_restored_messages_stream() -> None:
    stream = CASES["messages"]
    restored = run(SseRestorer(R, DIALECTS["messages"]), splits(stream, list(range(0, len(stream), 17))))
    client = anthropic.Anthropic(api_key="k", base_url="http://upstream", http_client=served(restored))
    with client.messages.stream(
        model="claude-sonnet-4-6", max_tokens=100, messages=[{"role": "user", "content": "x"}]
    ) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == EXPECTED_TEXT
    thinking, block, tool = final.content
    assert thinking.type == "thinking" and thinking.thinking == EXPECTED_THINKING
    assert block.type == "text" and block.text == EXPECTED_TEXT
    assert tool.type == "tool_use" and tool.input == EXPECTED_ARGS


# --- properties ---------------------------------------------------------------------------------

FREE = st.text(
    alphabet=st.one_of(
        st.sampled_from("<>_\\ EMAILab12cd34uUxX0123456789\n\"'é名🙂"),
        st.characters(codec="utf-8"),
    ),
    max_size=12,
)


@st.composite
def model_texts(draw: st.DrawFn) -> tuple[str, str]:
    """(what the model wrote, what the caller must see): free text with placeholders in any form."""
    model: list[str] = []
    expected: list[str] = []
    for _ in range(draw(st.integers(0, 8))):
        if draw(st.booleans()):
            free = draw(FREE)
            model.append(free)
            expected.append(free)
            continue
        which = draw(st.integers(0, len(VALUES) - 1))
        mangle = draw(st.sampled_from(list(MANGLES)))
        form = MANGLES[mangle](PH[which])
        if mangle in CLOSED:
            model.append(form)
            expected.append(ORIG[which])
        else:
            # A form without its own end needs a word boundary on both sides to be one.
            model.append(f" {form} ")
            expected.append(f" {ORIG[which]} ")
    return "".join(model), "".join(expected)


def _restore_text_property(case: tuple[str, str]) -> None:
    model, expected = case
    assert R.restore_text(model) == expected


def _stream_property(case: tuple[str, str], cuts: list[int]) -> None:
    model, expected = case
    stream = StreamRestorer(R)
    bound = max(len(p) for p in PH) * 2 + 16
    out = []
    for part in splits(model, cuts):
        out.append(stream.feed(part))
        assert len(stream.held) <= bound
    out.append(stream.flush())
    assert "".join(out) == R.restore_text(model) == expected


def _sse_property(dialect: str, case: tuple[str, str], sizes: list[int], cuts: list[int]) -> None:
    model, expected = case
    data = build(dialect, model, MODEL_ARGS, model, sizes=tuple(sizes))
    out = run(SseRestorer(R, DIALECTS[dialect]), splits(data, cuts))
    CHECKS[dialect](out, Expect(text=expected, thinking=expected))


# Fragments of placeholders and their look-alikes, to build texts where any cut is a hard one.
PIECES_OF_PLACEHOLDERS = (
    *("<", ">", "_", "__", "\\", "\\_", "\\u003c", "\\u003e", "\\u003", "\\u00", "\\n", "n", " ", "x"),
    *("EMAIL", "email", "E", "SUBJECT1", "SUBJECT12", "_NAME", "IP", "I"),
    *(NONCE, NONCE.upper(), "ab12", "cd34", "1", "2", "12", "0", "_1", "_2"),
    *PH,
    *(p[1:-1] for p in PH),
)
FRAGMENTS = st.lists(st.one_of(st.sampled_from(PIECES_OF_PLACEHOLDERS), FREE), max_size=14).map("".join)


def _fragments_stream_property(model: str, cuts: list[int], json_escaped: bool) -> None:
    stream = StreamRestorer(R, json_escaped=json_escaped)
    out = "".join(stream.feed(part) for part in splits(model, cuts)) + stream.flush()
    assert out == R.restore_text(model, json_escaped=json_escaped)


def _fragments_sse_property(dialect: str, model: str, sizes: list[int], cuts: list[int]) -> None:
    # Whatever the model wrote, the client sees what restoring the whole text at once gives.
    data = build(dialect, model, MODEL_ARGS, model, sizes=tuple(sizes))
    out = run(SseRestorer(R, DIALECTS[dialect]), splits(data, cuts))
    expected = R.restore_text(model)
    CHECKS[dialect](out, Expect(text=expected, thinking=expected))


CUTS = st.lists(st.integers(0, 4000), max_size=30)
SIZES = st.lists(st.integers(1, 9), min_size=1, max_size=6)
FAST = settings(max_examples=example_count(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(model_texts())
def test_property_restore_text(case: tuple[str, str]) -> None:
    _restore_text_property(case)


@FAST
@given(model_texts(), st.lists(st.integers(0, 200), max_size=20))
def test_property_stream_equals_full_restore(case: tuple[str, str], cuts: list[int]) -> None:
    _stream_property(case, cuts)


@FAST
@given(st.sampled_from(["chat", "responses", "messages"]), model_texts(), SIZES, CUTS)
def test_property_sse_round_trip(
    dialect: str, case: tuple[str, str], sizes: list[int], cuts: list[int]
) -> None:
    _sse_property(dialect, case, sizes, cuts)


@FAST
@given(FRAGMENTS, st.lists(st.integers(0, 120), max_size=12), st.booleans())
def test_property_stream_equals_full_restore_on_fragments(
    model: str, cuts: list[int], json_escaped: bool
) -> None:
    _fragments_stream_property(model, cuts, json_escaped)


@FAST
@given(st.sampled_from(["chat", "responses", "messages"]), FRAGMENTS, SIZES, CUTS)
def test_property_sse_equals_full_restore_on_fragments(
    dialect: str, model: str, sizes: list[int], cuts: list[int]
) -> None:
    _fragments_sse_property(dialect, model, sizes, cuts)


@pytest.mark.slow
@SLOW
@given(FRAGMENTS, st.lists(st.integers(0, 120), max_size=12), st.booleans())
def test_property_stream_equals_full_restore_on_fragments_long(
    model: str, cuts: list[int], json_escaped: bool
) -> None:
    _fragments_stream_property(model, cuts, json_escaped)


@pytest.mark.slow
@SLOW
@given(st.sampled_from(["chat", "responses", "messages"]), FRAGMENTS, SIZES, CUTS)
def test_property_sse_equals_full_restore_on_fragments_long(
    dialect: str, model: str, sizes: list[int], cuts: list[int]
) -> None:
    _fragments_sse_property(dialect, model, sizes, cuts)


@pytest.mark.slow
@SLOW
@given(model_texts())
def test_property_restore_text_long(case: tuple[str, str]) -> None:
    _restore_text_property(case)


@pytest.mark.slow
@SLOW
@given(model_texts(), st.lists(st.integers(0, 200), max_size=20))
def test_property_stream_equals_full_restore_long(case: tuple[str, str], cuts: list[int]) -> None:
    _stream_property(case, cuts)


@pytest.mark.slow
@SLOW
@given(st.sampled_from(["chat", "responses", "messages"]), model_texts(), SIZES, CUTS)
def test_property_sse_round_trip_long(
    dialect: str, case: tuple[str, str], sizes: list[int], cuts: list[int]
) -> None:
    _sse_property(dialect, case, sizes, cuts)
