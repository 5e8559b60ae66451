"""Scripted model output as raw SSE bytes, and what a client reads back from a stream.

The output gate's tests send streams the fake upstream writes byte for byte (its `raw`
behaviour), so every shape an upstream may send can be scripted: text split over any number of
events, blocks and parts, any SSE line ending, a last event without its blank line, a stream
without its terminal event. `script` writes one; `client_texts` reads a stream the way the SDKs
accumulate it (each channel's deltas joined, nothing after an error event), so a test can say
what reached the client and what did not.

A script is a list of (channel, text) pieces in order; channel names per dialect:
- chat: `content`, `reasoning_content`, `refusal`, `audio` (the transcript), `function_call`
  (legacy arguments), `tool:N` (tool call N's arguments);
- completions: `text`;
- responses: `text:P` (output_text of part P), `refusal:P`, `summary:P` (reasoning summary part),
  `args:N` (function call N's arguments), `code` (code interpreter), `transcript` (audio);
- messages: `text:B`, `thinking:B` (block B), `json:B` (tool_use block B's input).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

Script = list[tuple[str, str]]
LINE_ENDINGS = ("\n", "\r\n", "\r")
ENDINGS = ("normal", "no_terminal", "unterminated")


# Where a script's deltas end and its terminal events begin.
_END: tuple[str | None, Any] = ("__end__", None)


def _event(data: Any, name: str | None, nl: str) -> str:
    head = f"event: {name}{nl}" if name else ""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"{head}data: {payload}{nl}{nl}"


def script(dialect: str, pieces: Script, *, newline: str = "\n", ending: str = "normal") -> bytes:
    """The SSE bytes of `pieces` in `dialect`'s stream shape. `ending`: `normal` (the dialect's
    terminal events), `no_terminal` (the stream just stops after the last delta), `unterminated`
    (no terminal events, and the last event lacks its blank line)."""
    events = list(_EVENTS[dialect](pieces))
    end = events.index(_END)
    chosen = events[:end] + events[end + 1 :] if ending == "normal" else events[:end]
    out = "".join(_event(data, name, newline) for name, data in chosen)
    if ending == "unterminated":
        out = out[: -len(newline)]
    return out.encode("utf-8")


def _chat(pieces: Script) -> Iterator[tuple[str | None, Any]]:
    base = {"id": "chatcmpl-s1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-x"}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> tuple[None, Any]:
        return None, {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    yield chunk({"role": "assistant", "content": ""})
    started: set[str] = set()
    for channel, text in pieces:
        if channel.startswith("tool:"):
            index = int(channel[5:])
            call: dict[str, Any] = {"index": index, "function": {"arguments": text}}
            if channel not in started:
                call.update(id=f"call_{index}", type="function")
                call["function"]["name"] = "lookup"
            yield chunk({"tool_calls": [call]})
        elif channel == "function_call":
            fc: dict[str, Any] = {"arguments": text}
            if channel not in started:
                fc["name"] = "lookup"
            yield chunk({"function_call": fc})
        elif channel == "audio":
            audio: dict[str, Any] = {"transcript": text}
            if channel not in started:
                audio["id"] = "audio_s1"
            yield chunk({"audio": audio})
        else:
            yield chunk({channel: text})
        started.add(channel)
    yield _END
    yield chunk({}, "stop")
    yield None, "[DONE]"


def _completions(pieces: Script) -> Iterator[tuple[str | None, Any]]:
    base = {"id": "cmpl-s1", "object": "text_completion", "created": 1, "model": "gpt-x"}
    yield None, {**base, "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": None}]}
    for _, text in pieces:
        yield None, {**base, "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": None}]}
    yield _END
    yield None, {**base, "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "stop"}]}
    yield None, "[DONE]"


_RESPONSES_DELTA = {
    "text": ("response.output_text.delta", "output_text", "text", "content_index"),
    "refusal": ("response.refusal.delta", "refusal", "refusal", "content_index"),
    "summary": ("response.reasoning_summary_text.delta", "summary_text", "text", "summary_index"),
}


def _responses(pieces: Script) -> Iterator[tuple[str | None, Any]]:
    seq = iter(range(1, 10_000))

    def ev(kind: str, **fields: Any) -> tuple[str, Any]:
        return kind, {"type": kind, "sequence_number": next(seq), **fields}

    response = {"id": "resp_s1", "object": "response", "status": "in_progress", "output": []}
    yield ev("response.created", response=response)
    texts: dict[str, str] = {}
    order: list[str] = []
    for channel, text in pieces:
        kind, _, index = channel.partition(":")
        if channel not in texts:
            texts[channel] = ""
            order.append(channel)
            if kind in _RESPONSES_DELTA:
                _, part_type, field, index_field = _RESPONSES_DELTA[kind]
                item = "rs_s1" if kind == "summary" else "msg_s1"
                event = (
                    "response.reasoning_summary_part.added"
                    if kind == "summary"
                    else "response.content_part.added"
                )
                yield ev(
                    event,
                    item_id=item,
                    output_index=0,
                    **{index_field: int(index)},
                    part={"type": part_type, field: ""},
                )
        texts[channel] += text
        if kind in _RESPONSES_DELTA:
            delta_type, _, _, index_field = _RESPONSES_DELTA[kind]
            item = "rs_s1" if kind == "summary" else "msg_s1"
            yield ev(delta_type, item_id=item, output_index=0, **{index_field: int(index)}, delta=text)
        elif kind == "args":
            yield ev(
                "response.function_call_arguments.delta", item_id=f"fc_{index}", output_index=1, delta=text
            )
        elif kind == "code":
            yield ev("response.code_interpreter_call_code.delta", item_id="ci_s1", output_index=2, delta=text)
        elif kind == "transcript":
            yield ev("response.audio.transcript.delta", response_id="resp_s1", delta=text)
    yield _END
    for channel in order:
        kind, _, index = channel.partition(":")
        text = texts[channel]
        if kind in _RESPONSES_DELTA:
            delta_type, part_type, field, index_field = _RESPONSES_DELTA[kind]
            item = "rs_s1" if kind == "summary" else "msg_s1"
            yield ev(
                delta_type[: -len("delta")] + "done",
                item_id=item,
                output_index=0,
                **{index_field: int(index)},
                **{field: text},
            )
        elif kind == "args":
            yield ev(
                "response.function_call_arguments.done", item_id=f"fc_{index}", output_index=1, arguments=text
            )
    message = {
        "id": "msg_s1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [
            {"type": "output_text", "text": texts[c], "annotations": []}
            for c in order
            if c.startswith("text:")
        ],
    }
    output: list[Any] = [message]
    output += [
        {
            "id": f"fc_{c[5:]}",
            "type": "function_call",
            "call_id": f"call_{c[5:]}",
            "name": "lookup",
            "arguments": texts[c],
        }
        for c in order
        if c.startswith("args:")
    ]
    yield ev("response.completed", response={**response, "status": "completed", "output": output})


def _messages(pieces: Script) -> Iterator[tuple[str | None, Any]]:
    message = {"id": "msg_s1", "type": "message", "role": "assistant", "model": "claude-x", "content": []}
    yield "message_start", {"type": "message_start", "message": message}
    current: str | None = None
    for channel, text in pieces:
        kind, _, index = channel.partition(":")
        block = int(index)
        if channel != current:
            if current is not None:
                yield (
                    "content_block_stop",
                    {"type": "content_block_stop", "index": int(current.partition(":")[2])},
                )
            current = channel
            start: dict[str, Any] = {
                "text": {"type": "text", "text": ""},
                "thinking": {"type": "thinking", "thinking": ""},
            }.get(kind, {"type": "tool_use", "id": f"toolu_s{block}", "name": "lookup", "input": {}})
            yield (
                "content_block_start",
                {"type": "content_block_start", "index": block, "content_block": start},
            )
        delta = {
            "text": {"type": "text_delta", "text": text},
            "thinking": {"type": "thinking_delta", "thinking": text},
            "json": {"type": "input_json_delta", "partial_json": text},
        }[kind]
        yield "content_block_delta", {"type": "content_block_delta", "index": block, "delta": delta}
    yield _END
    if current is not None:
        yield "content_block_stop", {"type": "content_block_stop", "index": int(current.partition(":")[2])}
    yield (
        "message_delta",
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 1}},
    )
    yield "message_stop", {"type": "message_stop"}


_EVENTS = {"chat": _chat, "completions": _completions, "responses": _responses, "messages": _messages}


# --- reading a stream back -----------------------------------------------------------------------

_BLANK = re.compile(r"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r(?!\n)|\n)")
_LINE = re.compile(r"\r\n|\r|\n")


def events_of(body: bytes) -> list[tuple[str | None, str]]:
    """The (event name, data) of every complete event in `body` (any line ending)."""
    text = body.decode("utf-8", "replace")
    out: list[tuple[str | None, str]] = []
    for block in _BLANK.split(text):
        name, data = None, []
        for line in _LINE.split(block):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
        if data:
            out.append((name, "\n".join(data)))
    return out


def client_texts(body: bytes) -> tuple[dict[str, str], bool]:
    """Each channel's text as an SDK joins it from `body` (any dialect), and whether the stream
    ended with an error event; nothing after an error is read."""
    texts: dict[str, str] = {}
    for name, data in events_of(body):
        try:
            event = json.loads(data)
        except ValueError:
            continue
        if not isinstance(event, dict):
            continue
        if name == "error" or ("error" in event and event.get("type") in (None, "error")):
            return texts, True
        for channel, text in _deltas(event):
            texts[channel] = texts.get(channel, "") + text
    return texts, False


def _deltas(event: dict[str, Any]) -> Iterator[tuple[str, str]]:
    kind = event.get("type")
    if isinstance(event.get("choices"), list):
        for choice in event["choices"]:
            if isinstance(choice.get("text"), str):
                yield "text", choice["text"]
            delta = choice.get("delta") or {}
            for field in ("content", "reasoning_content", "refusal"):
                if isinstance(delta.get(field), str):
                    yield field, delta[field]
            for call in delta.get("tool_calls") or []:
                yield f"tool:{call.get('index')}", (call.get("function") or {}).get("arguments") or ""
            if isinstance(delta.get("function_call"), dict):
                yield "function_call", delta["function_call"].get("arguments") or ""
            if isinstance(delta.get("audio"), dict):
                yield "audio", delta["audio"].get("transcript") or ""
    elif kind == "content_block_start":
        block = event.get("content_block") or {}
        for field in ("text", "thinking"):
            if isinstance(block.get(field), str):
                yield field, block[field]
    elif kind == "content_block_delta":
        delta = event.get("delta") or {}
        for field, channel in (
            ("text", "text"),
            ("thinking", "thinking"),
            ("partial_json", f"json:{event.get('index')}"),
        ):
            if isinstance(delta.get(field), str):
                yield channel, delta[field]
    elif isinstance(kind, str) and kind.endswith(".delta") and isinstance(event.get("delta"), str):
        name = kind.removeprefix("response.").removesuffix(".delta")
        if name in ("function_call_arguments", "custom_tool_call_input"):
            name = f"{name}:{event.get('item_id')}"
        yield name, event["delta"]


def client_channel(dialect: str, channel: str) -> str:
    """The name `client_texts` gives the text of script channel `channel` (joined ones share one)."""
    kind, _, index = channel.partition(":")
    if dialect == "responses":
        return {
            "text": "output_text",
            "refusal": "refusal",
            "summary": "reasoning_summary_text",
            "transcript": "audio.transcript",
            "code": "code_interpreter_call_code",
        }.get(kind, f"function_call_arguments:fc_{index}")
    if dialect == "messages":
        return channel if kind == "json" else kind
    return channel


def released(dialect: str, pieces: Script, texts: dict[str, str], value: str) -> int:
    """How many characters of `value` reached the client: where the script wrote it, how far the
    client's text of that channel (a prefix of what was written: the gate releases in order)
    reaches into it."""
    written: dict[str, str] = {}
    for channel, text in pieces:
        name = client_channel(dialect, channel)
        written[name] = written.get(name, "") + text
    best = 0
    for name, full in written.items():
        got = texts.get(name, "")
        assert full.startswith(got), f"{name}: the client got text that was not written"
        at = full.find(value)
        if at >= 0:
            best = max(best, min(len(value), max(0, len(got) - at)))
    return best
