"""A fake LLM upstream: OpenAI and Anthropic APIs on one stdlib HTTP server.

Used by the end-to-end tests (Envoy forwards the redacted requests here) and as the demo upstream
of ``make run``. It speaks the real JSON and SSE shapes that the official ``openai`` and
``anthropic`` SDKs parse, records every request it receives (so tests can check what left the
proxy), and by default **echoes** the caller's last input (``"You said: " + text``) so that
placeholders sent upstream come back in the reply and their restoration can be checked, in plain
text, in tool-call arguments and in reasoning/thinking.

Endpoints: ``POST /v1/chat/completions``, ``/v1/responses``, ``/v1/completions``,
``/v1/embeddings``, ``GET /v1/models[/{id}]``, ``POST /v1/messages``,
``/v1/messages/count_tokens``; anything else is a 404 in the provider's error shape. Control
endpoints (never recorded): ``GET /_fake/health``, ``GET /_fake/received``, ``POST /_fake/clear``,
``GET|POST|DELETE /_fake/behaviour``.

Behaviours (constructor keywords, :meth:`FakeUpstream.set_behaviour`, or per request with an
``x-fake-<name>`` header, ``_`` or ``-`` in the name; the header wins) shape the reply and the
transport: fixed ``reply`` text (where ``{{said}}`` is the caller's last input, ``{{said:N}}`` its
line N), ``tool`` calls, ``thinking``, odd ``chunk_bytes`` splits,
``delta_chars`` per delta, ``delay_ms`` between writes, ``pace_ms`` before every write (the
first included, the end of a chunked body sent with its last piece: each piece read on its own,
however fast the reader), ``stall_after_bytes`` / ``stall_s``,
``truncate_after_bytes``, ``fail_status`` and ``escape_brackets`` (``<``/``>`` as ``\\u003c``/
``\\u003e``; ``deep`` also inside tool-argument JSON text). ``raw`` sends any bytes instead of the
API's reply (in-process only: bytes, or a list of byte strings written one by one), with
``raw_type`` as its content type (``None``: no content type) and ``raw_encoding`` as its
content encoding: the reply of an upstream that sends whatever it likes.

Command line: ``python -m tests.support.fake_upstream --host 127.0.0.1 --port 18080`` serves until
SIGINT/SIGTERM and prints ``fake upstream listening on http://HOST:PORT`` when ready.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import json
import re
import select
import signal
import socket
import struct
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType, TracebackType
from typing import Any, Self
from urllib.parse import urlsplit

__all__ = ["BEHAVIOUR_DEFAULTS", "ECHO_PREFIX", "THINKING_PREFIX", "FakeUpstream", "Received", "main"]

ECHO_PREFIX = "You said: "
"""The echo reply is ``ECHO_PREFIX + <the caller's last input text>``."""

THINKING_PREFIX = "Thinking about: "
"""A thinking block / reasoning summary is ``THINKING_PREFIX + <the caller's last input text>``."""

BEHAVIOUR_DEFAULTS: dict[str, Any] = {
    "reply": None,  # str: fixed reply text instead of the echo ({{said}}, {{said:N}}: see _reply_text)
    "tool": False,  # answer with one call to the first declared function tool
    "thinking": False,  # also emit a thinking block (Anthropic) / reasoning item (Responses)
    "chunk_bytes": 0,  # >0: split the body byte stream into writes of this size; 0: one write per event
    "delta_chars": 4,  # characters per text / argument delta event
    "delay_ms": 0.0,  # sleep between writes
    "pace_ms": 0.0,  # sleep before every write; a chunked body's end goes with its last piece
    "stall_after_bytes": None,  # stop writing after N body bytes, hold the connection, then close
    "stall_s": 30.0,  # how long a stall holds the connection (cut short by stop())
    "truncate_after_bytes": None,  # close the connection after N body bytes
    "fail_status": None,  # answer this status with the provider's error JSON
    "escape_brackets": False,  # False | True | "deep": write < > as \u003c \u003e
    "raw": None,  # bytes | list of bytes: the body as written, on any route (writes in order)
    "raw_type": "text/event-stream",  # the raw body's content type (None: no header)
    "raw_encoding": None,  # the raw body's content-encoding header (None: none)
}

_KINDS: dict[str, str] = {
    "reply": "text",
    "tool": "bool",
    "thinking": "bool",
    "chunk_bytes": "int",
    "delta_chars": "int",
    "delay_ms": "float",
    "pace_ms": "float",
    "stall_after_bytes": "optint",
    "stall_s": "float",
    "truncate_after_bytes": "optint",
    "fail_status": "optint",
    "escape_brackets": "escape",
    "raw": "raw",
    "raw_type": "text",
    "raw_encoding": "text",
}

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
_NONE = {"", "none", "null", "off"}

DEFAULT_OPENAI_MODEL = "gpt-4o-mini"
DEFAULT_ANTHROPIC_MODEL = "claude-sonnet-4-6"
_OPENAI_MODELS = ("gpt-4o-mini", "gpt-4o", "gpt-4.1", "o4-mini", "text-embedding-3-small")
_ANTHROPIC_MODELS = ("claude-sonnet-4-6", "claude-opus-4-8", "claude-haiku-4-5")


def _coerce(name: str, value: Any) -> Any:
    """Return ``value`` converted to behaviour ``name``'s type (strings as from a header accepted)."""
    kind = _KINDS.get(name)
    if kind is None:
        raise KeyError(f"unknown behaviour {name!r}; known: {', '.join(sorted(_KINDS))}")
    if kind == "text":
        return None if value is None else str(value)
    if kind == "raw":
        if value is None:
            return None
        pieces = value if isinstance(value, (list, tuple)) else [value]
        return tuple(p if isinstance(p, bytes) else str(p).encode("utf-8") for p in pieces)
    if kind in ("bool", "escape"):
        if isinstance(value, bool) or value is None:
            return bool(value)
        text = str(value).strip().lower()
        if kind == "escape" and text == "deep":
            return "deep"
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise ValueError(f"behaviour {name}: expected a boolean{' or deep' if kind == 'escape' else ''}")
    if kind == "optint" and (value is None or (isinstance(value, str) and value.strip().lower() in _NONE)):
        return None
    if kind == "float":
        number = float(value)
    else:
        if isinstance(value, bool):
            raise ValueError(f"behaviour {name}: expected an integer")
        number = int(value)
    if number < 0:
        raise ValueError(f"behaviour {name}: must not be negative")
    if name == "delta_chars" and number < 1:
        raise ValueError("behaviour delta_chars: must be at least 1")
    return number


def _header_text(value: str) -> str:
    """Undo http.server's latin-1 decoding so UTF-8 header values (e.g. ``x-fake-reply``) survive."""
    try:
        return value.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return value


@dataclass(frozen=True)
class Received:
    """One request as the fake upstream received it (recorded before it answered)."""

    method: str
    path: str  # as received, query string included
    headers: dict[str, str]  # lowercased names, every header (repeated ones joined with ", ")
    body: bytes

    @property
    def route(self) -> str:
        """The path without its query string."""
        return urlsplit(self.path).path

    def json(self) -> Any:
        """The body parsed as JSON."""
        return json.loads(self.body)

    def text(self) -> str:
        """The body decoded as UTF-8 (undecodable bytes replaced)."""
        return self.body.decode("utf-8", errors="replace")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form (body as text), as served by ``GET /_fake/received``."""
        return {"method": self.method, "path": self.path, "headers": dict(self.headers), "body": self.text()}


class _Abort(Exception):
    """The connection was cut on purpose (stall, truncate) or by the client."""


def _new_id(prefix: str, length: int = 24) -> str:
    return prefix + uuid.uuid4().hex[:length]


def _tokens(text: str) -> int:
    return max(1, len(text) // 4)


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


# --------------------------------------------------------------------------------------------------
# What the caller said


def _parts_text(content: Any) -> str:
    """Text of a message content: a string, or the text of its text parts, joined with newlines."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    texts = [
        part["text"]
        for part in content
        if isinstance(part, dict)
        and part.get("type") in ("text", "input_text", "output_text")
        and isinstance(part.get("text"), str)
    ]
    return "\n".join(texts)


def _chat_input(body: Mapping[str, Any]) -> str:
    """Chat Completions: the last ``user`` (or ``tool`` result) message's text."""
    messages = body.get("messages")
    for message in reversed(messages if isinstance(messages, list) else []):
        if isinstance(message, dict) and message.get("role") in ("user", "tool"):
            return _parts_text(message.get("content"))
    return ""


def _responses_input(body: Mapping[str, Any]) -> str:
    """Responses: ``input`` when a string, else the last user message item's (or tool output's) text."""
    items = body.get("input")
    if isinstance(items, str):
        return items
    for item in reversed(items if isinstance(items, list) else []):
        if not isinstance(item, dict):
            continue
        if item.get("role") == "user" and item.get("type", "message") == "message":
            return _parts_text(item.get("content"))
        if item.get("type") == "function_call_output":
            return _parts_text(item.get("output"))
    return ""


def _anthropic_input(body: Mapping[str, Any]) -> str:
    """Messages: the last user message's text blocks, else the text of its ``tool_result`` blocks."""
    messages = body.get("messages")
    for message in reversed(messages if isinstance(messages, list) else []):
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        content = message.get("content")
        text = _parts_text(content)
        if text or not isinstance(content, list):
            return text
        results = [
            _parts_text(block.get("content"))
            for block in content
            if isinstance(block, dict) and block.get("type") == "tool_result"
        ]
        return "\n".join(r for r in results if r)
    return ""


_INPUTS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "/v1/chat/completions": _chat_input,
    "/v1/responses": _responses_input,
    "/v1/messages": _anthropic_input,
}


def _first_function_tool(tools: Any, api: str) -> str | None:
    """Name of the first declared function tool, in the API's tool declaration shape."""
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, dict):
            continue
        if api == "chat":
            function = tool.get("function") if tool.get("type", "function") == "function" else None
            name = function.get("name") if isinstance(function, dict) else None
        elif api == "responses":
            name = tool.get("name") if tool.get("type") == "function" else None
        else:
            name = tool.get("name") if tool.get("type", "custom") == "custom" else None
        if isinstance(name, str):
            return name
    return None


@dataclass(frozen=True)
class _Plan:
    """What to answer: the text, an optional tool call and an optional thinking text."""

    model: str
    text: str
    tool_name: str | None
    tool_input: dict[str, Any]
    thinking: str | None
    prompt_tokens: int

    def arguments(self, deep_escape: bool) -> str:
        """The tool call's arguments as JSON text (``<``/``>`` escaped in it under ``deep``)."""
        text = json.dumps(self.tool_input, ensure_ascii=False)
        return _escape(text) if deep_escape else text


def _escape(text: str) -> str:
    return text.replace("<", "\\u003c").replace(">", "\\u003e")


_SAID = re.compile(r"\{\{said(?::([0-9]+))?\}\}")


def _reply_text(template: str, said: str) -> str:
    """A fixed reply, where ``{{said}}`` stands for the caller's last input as received and
    ``{{said:N}}`` for its line N (from 0; empty past the last): a scripted reply that names
    what the request carried (placeholders whose nonce only the request knows)."""
    lines = said.split("\n")

    def fill(m: re.Match[str]) -> str:
        if m.group(1) is None:
            return said
        n = int(m.group(1))
        return lines[n] if n < len(lines) else ""

    return _SAID.sub(fill, template)


def _plan(api: str, body: Mapping[str, Any], beh: Mapping[str, Any], raw_len: int) -> _Plan:
    if api == "chat":
        said, model = _chat_input(body), DEFAULT_OPENAI_MODEL
    elif api == "responses":
        said, model = _responses_input(body), DEFAULT_OPENAI_MODEL
    else:
        said, model = _anthropic_input(body), DEFAULT_ANTHROPIC_MODEL
    if isinstance(body.get("model"), str):
        model = body["model"]
    text = _reply_text(beh["reply"], said) if beh["reply"] is not None else ECHO_PREFIX + said
    tool_name = _first_function_tool(body.get("tools"), api) if beh["tool"] else None
    if api == "responses":
        wants_thinking = beh["thinking"] or isinstance(body.get("reasoning"), dict)
    elif api == "anthropic":
        thinking = body.get("thinking")
        wants_thinking = beh["thinking"] or (
            isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")
        )
    else:
        wants_thinking = False
    return _Plan(
        model=model,
        text=text,
        tool_name=tool_name,
        tool_input={"text": text},
        thinking=THINKING_PREFIX + said if wants_thinking else None,
        prompt_tokens=max(1, raw_len // 4),
    )


# --------------------------------------------------------------------------------------------------
# OpenAI Chat Completions


def _chat_usage(plan: _Plan, out: str) -> dict[str, Any]:
    completion = _tokens(out)
    return {
        "prompt_tokens": plan.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": plan.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def _chat_json(plan: _Plan, beh: Mapping[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": plan.text, "refusal": None, "annotations": []}
    finish = "stop"
    out = plan.text
    if plan.tool_name is not None:
        arguments = plan.arguments(beh["escape_brackets"] == "deep")
        message["content"] = None
        message["tool_calls"] = [
            {
                "id": _new_id("call_"),
                "type": "function",
                "function": {"name": plan.tool_name, "arguments": arguments},
            }
        ]
        finish, out = "tool_calls", arguments
    return {
        "id": _new_id("chatcmpl-", 29),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": plan.model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": _chat_usage(plan, out),
        "service_tier": "default",
        "system_fingerprint": "fp_fake",
    }


def _chat_events(plan: _Plan, body: Mapping[str, Any], beh: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    base: dict[str, Any] = {
        "id": _new_id("chatcmpl-", 29),
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": plan.model,
        "service_tier": "default",
        "system_fingerprint": "fp_fake",
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        event = {**base, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
        if include_usage:
            event["usage"] = None
        return event

    size = beh["delta_chars"]
    if plan.tool_name is None:
        out = plan.text
        yield chunk({"role": "assistant", "content": "", "refusal": None})
        for piece in _pieces(plan.text, size):
            yield chunk({"content": piece})
        yield chunk({}, "stop")
    else:
        out = plan.arguments(beh["escape_brackets"] == "deep")
        call = {
            "index": 0,
            "id": _new_id("call_"),
            "type": "function",
            "function": {"name": plan.tool_name, "arguments": ""},
        }
        yield chunk({"role": "assistant", "content": None, "tool_calls": [call], "refusal": None})
        for piece in _pieces(out, size):
            yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
        yield chunk({}, "tool_calls")
    if include_usage:
        yield {**base, "choices": [], "usage": _chat_usage(plan, out)}


# --------------------------------------------------------------------------------------------------
# OpenAI Responses


def _responses_usage(plan: _Plan, out: str, reasoning: str) -> dict[str, Any]:
    reasoning_tokens = _tokens(reasoning) if reasoning else 0
    output = _tokens(out) + reasoning_tokens
    return {
        "input_tokens": plan.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": plan.prompt_tokens + output,
    }


class _ResponsesBuilder:
    """Builds one Responses reply: the final ``response`` object and its SSE event sequence."""

    def __init__(self, plan: _Plan, body: Mapping[str, Any], beh: Mapping[str, Any]) -> None:
        self.plan = plan
        self.body = body
        self.size: int = beh["delta_chars"]
        self.id = _new_id("resp_", 48)
        self.created = int(time.time())
        self.arguments = plan.arguments(beh["escape_brackets"] == "deep")
        self.reasoning_id = _new_id("rs_", 48)
        self.message_id = _new_id("msg_", 48)
        self.call_item_id = _new_id("fc_", 48)
        self.call_id = _new_id("call_")
        self.seq = 0

    def reasoning_item(self, done: bool) -> dict[str, Any]:
        summary = [{"type": "summary_text", "text": self.plan.thinking or ""}] if done else []
        return {"id": self.reasoning_id, "type": "reasoning", "summary": summary}

    def message_item(self, done: bool) -> dict[str, Any]:
        content = [self.text_part(self.plan.text)] if done else []
        return {
            "id": self.message_id,
            "type": "message",
            "status": "completed" if done else "in_progress",
            "role": "assistant",
            "content": content,
        }

    @staticmethod
    def text_part(text: str) -> dict[str, Any]:
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def call_item(self, done: bool) -> dict[str, Any]:
        return {
            "id": self.call_item_id,
            "type": "function_call",
            "status": "completed" if done else "in_progress",
            "arguments": self.arguments if done else "",
            "call_id": self.call_id,
            "name": self.plan.tool_name,
        }

    def output(self) -> list[dict[str, Any]]:
        items = [self.reasoning_item(True)] if self.plan.thinking is not None else []
        items.append(self.message_item(True) if self.plan.tool_name is None else self.call_item(True))
        return items

    def response(self, done: bool) -> dict[str, Any]:
        body = self.body
        out = self.plan.text if self.plan.tool_name is None else self.arguments
        reasoning = body.get("reasoning") if isinstance(body.get("reasoning"), dict) else {}
        text_config = body.get("text") if isinstance(body.get("text"), dict) else {}
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": "completed" if done else "in_progress",
            "background": False,
            "completed_at": int(time.time()) if done else None,
            "error": None,
            "incomplete_details": None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "max_tool_calls": None,
            "model": self.plan.model,
            "output": self.output() if done else [],
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": body.get("previous_response_id"),
            "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
            "service_tier": "default",
            "store": body.get("store", True),
            "temperature": body.get("temperature", 1.0),
            "text": {"format": {"type": "text"}, "verbosity": "medium", **text_config},
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools", []),
            "top_p": body.get("top_p", 1.0),
            "truncation": body.get("truncation", "disabled"),
            "usage": _responses_usage(self.plan, out, self.plan.thinking or "") if done else None,
            "user": None,
            "metadata": body.get("metadata") or {},
        }

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return event

    def events(self) -> Iterator[dict[str, Any]]:
        plan = self.plan
        yield self.event("response.created", response=self.response(False))
        yield self.event("response.in_progress", response=self.response(False))
        index = 0
        if plan.thinking is not None:
            ids = {"item_id": self.reasoning_id, "output_index": index}
            yield self.event(
                "response.output_item.added", output_index=index, item=self.reasoning_item(False)
            )
            part = {"type": "summary_text", "text": ""}
            yield self.event("response.reasoning_summary_part.added", **ids, summary_index=0, part=part)
            for piece in _pieces(plan.thinking, self.size):
                yield self.event(
                    "response.reasoning_summary_text.delta",
                    **ids,
                    summary_index=0,
                    delta=piece,
                    obfuscation="",
                )
            yield self.event(
                "response.reasoning_summary_text.done", **ids, summary_index=0, text=plan.thinking
            )
            part = {"type": "summary_text", "text": plan.thinking}
            yield self.event("response.reasoning_summary_part.done", **ids, summary_index=0, part=part)
            yield self.event("response.output_item.done", output_index=index, item=self.reasoning_item(True))
            index += 1
        if plan.tool_name is None:
            ids = {"item_id": self.message_id, "output_index": index}
            yield self.event("response.output_item.added", output_index=index, item=self.message_item(False))
            yield self.event("response.content_part.added", **ids, content_index=0, part=self.text_part(""))
            for piece in _pieces(plan.text, self.size):
                yield self.event(
                    "response.output_text.delta",
                    **ids,
                    content_index=0,
                    delta=piece,
                    logprobs=[],
                    obfuscation="",
                )
            yield self.event("response.output_text.done", **ids, content_index=0, text=plan.text, logprobs=[])
            part = self.text_part(plan.text)
            yield self.event("response.content_part.done", **ids, content_index=0, part=part)
            yield self.event("response.output_item.done", output_index=index, item=self.message_item(True))
        else:
            ids = {"item_id": self.call_item_id, "output_index": index}
            yield self.event("response.output_item.added", output_index=index, item=self.call_item(False))
            for piece in _pieces(self.arguments, self.size):
                yield self.event("response.function_call_arguments.delta", **ids, delta=piece, obfuscation="")
            yield self.event(
                "response.function_call_arguments.done", **ids, name=plan.tool_name, arguments=self.arguments
            )
            yield self.event("response.output_item.done", output_index=index, item=self.call_item(True))
        yield self.event("response.completed", response=self.response(True))


# --------------------------------------------------------------------------------------------------
# Anthropic Messages


def _signature(text: str) -> str:
    return base64.b64encode(hashlib.sha256(text.encode()).digest() * 3).decode()


class _AnthropicBuilder:
    """Builds one Messages reply: the JSON message and its SSE event sequence."""

    def __init__(self, plan: _Plan, beh: Mapping[str, Any]) -> None:
        self.plan = plan
        self.size: int = beh["delta_chars"]
        self.deep = beh["escape_brackets"] == "deep"
        self.id = "msg_01" + uuid.uuid4().hex[:22]
        self.tool_id = "toolu_01" + uuid.uuid4().hex[:22]

    @property
    def stop_reason(self) -> str:
        return "end_turn" if self.plan.tool_name is None else "tool_use"

    def output_tokens(self) -> int:
        out = self.plan.text if self.plan.tool_name is None else self.plan.arguments(False)
        return _tokens(out) + (_tokens(self.plan.thinking) if self.plan.thinking else 0)

    def usage(self, output_tokens: int) -> dict[str, Any]:
        return {
            "input_tokens": self.plan.prompt_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": output_tokens,
            "service_tier": "standard",
        }

    def blocks(self) -> list[dict[str, Any]]:
        plan = self.plan
        blocks: list[dict[str, Any]] = []
        if plan.thinking is not None:
            blocks.append(
                {"type": "thinking", "thinking": plan.thinking, "signature": _signature(plan.thinking)}
            )
        if plan.tool_name is None:
            blocks.append({"type": "text", "text": plan.text})
        else:
            blocks.append(
                {"type": "tool_use", "id": self.tool_id, "name": plan.tool_name, "input": plan.tool_input}
            )
        return blocks

    def message(self, content: list[dict[str, Any]], done: bool) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.plan.model,
            "content": content,
            "stop_reason": self.stop_reason if done else None,
            "stop_sequence": None,
            "usage": self.usage(self.output_tokens() if done else 1),
        }

    def json(self) -> dict[str, Any]:
        return self.message(self.blocks(), True)

    def events(self) -> Iterator[dict[str, Any]]:
        plan = self.plan
        yield {"type": "message_start", "message": self.message([], False)}
        index = 0
        pinged = False

        def start(block: dict[str, Any]) -> Iterator[dict[str, Any]]:
            nonlocal pinged
            yield {"type": "content_block_start", "index": index, "content_block": block}
            if not pinged:
                pinged = True
                yield {"type": "ping"}

        def delta(payload: dict[str, Any]) -> dict[str, Any]:
            return {"type": "content_block_delta", "index": index, "delta": payload}

        if plan.thinking is not None:
            yield from start({"type": "thinking", "thinking": "", "signature": ""})
            for piece in _pieces(plan.thinking, self.size):
                yield delta({"type": "thinking_delta", "thinking": piece})
            yield delta({"type": "signature_delta", "signature": _signature(plan.thinking)})
            yield {"type": "content_block_stop", "index": index}
            index += 1
        if plan.tool_name is None:
            yield from start({"type": "text", "text": ""})
            for piece in _pieces(plan.text, self.size):
                yield delta({"type": "text_delta", "text": piece})
        else:
            yield from start({"type": "tool_use", "id": self.tool_id, "name": plan.tool_name, "input": {}})
            yield delta({"type": "input_json_delta", "partial_json": ""})
            for piece in _pieces(plan.arguments(self.deep), self.size):
                yield delta({"type": "input_json_delta", "partial_json": piece})
        yield {"type": "content_block_stop", "index": index}
        yield {
            "type": "message_delta",
            "delta": {"stop_reason": self.stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": self.output_tokens()},
        }
        yield {"type": "message_stop"}


# --------------------------------------------------------------------------------------------------
# OpenAI legacy completions, embeddings, models


def _completions_prompts(body: Mapping[str, Any]) -> list[str]:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return list(prompt)
    return [""]


def _completions(body: Mapping[str, Any], beh: Mapping[str, Any], raw_len: int) -> tuple[list[str], str, int]:
    replies = [
        beh["reply"] if beh["reply"] is not None else ECHO_PREFIX + p for p in _completions_prompts(body)
    ]
    model = body["model"] if isinstance(body.get("model"), str) else "gpt-3.5-turbo-instruct"
    return replies, model, max(1, raw_len // 4)


def _completion_usage(prompt_tokens: int, replies: list[str]) -> dict[str, Any]:
    completion = sum(_tokens(r) for r in replies)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
    }


def _completions_json(body: Mapping[str, Any], beh: Mapping[str, Any], raw_len: int) -> dict[str, Any]:
    replies, model, prompt_tokens = _completions(body, beh, raw_len)
    return {
        "id": _new_id("cmpl-", 29),
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"text": text, "index": i, "logprobs": None, "finish_reason": "stop"}
            for i, text in enumerate(replies)
        ],
        "usage": _completion_usage(prompt_tokens, replies),
    }


def _completions_events(
    body: Mapping[str, Any], beh: Mapping[str, Any], raw_len: int
) -> Iterator[dict[str, Any]]:
    replies, model, prompt_tokens = _completions(body, beh, raw_len)
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    base = {
        "id": _new_id("cmpl-", 29),
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
    }
    extra: dict[str, Any] = {"usage": None} if include_usage else {}
    for i, text in enumerate(replies):
        for piece in _pieces(text, beh["delta_chars"]):
            choice = {"text": piece, "index": i, "logprobs": None, "finish_reason": None}
            yield {**base, "choices": [choice], **extra}
        yield {
            **base,
            "choices": [{"text": "", "index": i, "logprobs": None, "finish_reason": "stop"}],
            **extra,
        }
    if include_usage:
        yield {**base, "choices": [], "usage": _completion_usage(prompt_tokens, replies)}


def _vector(text: str, dimensions: int) -> list[float]:
    """A deterministic unit-length vector for ``text``."""
    raw = b""
    counter = 0
    while len(raw) < dimensions * 4:
        raw += hashlib.sha256(f"{counter}:{text}".encode()).digest()
        counter += 1
    values = [(int.from_bytes(raw[i * 4 : i * 4 + 4], "little") / 2**32) * 2 - 1 for i in range(dimensions)]
    norm = sum(v * v for v in values) ** 0.5 or 1.0
    return [round(v / norm, 6) for v in values]


def _embeddings_json(body: Mapping[str, Any]) -> dict[str, Any]:
    raw_input = body.get("input")
    if isinstance(raw_input, list) and raw_input and all(isinstance(x, str) for x in raw_input):
        inputs = list(raw_input)
    else:
        inputs = [raw_input if isinstance(raw_input, str) else json.dumps(raw_input)]
    dims = body.get("dimensions")
    dimensions = dims if isinstance(dims, int) and 0 < dims <= 4096 else 8
    data = []
    for i, text in enumerate(inputs):
        vector = _vector(text, dimensions)
        embedding: Any = vector
        if body.get("encoding_format") == "base64":
            embedding = base64.b64encode(struct.pack(f"<{dimensions}f", *vector)).decode()
        data.append({"object": "embedding", "index": i, "embedding": embedding})
    tokens = sum(_tokens(t) for t in inputs)
    model = body["model"] if isinstance(body.get("model"), str) else "text-embedding-3-small"
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def _openai_model(model_id: str) -> dict[str, Any]:
    return {"id": model_id, "object": "model", "created": 1715367049, "owned_by": "system"}


def _anthropic_model(model_id: str) -> dict[str, Any]:
    return {"type": "model", "id": model_id, "display_name": model_id, "created_at": "2025-09-29T00:00:00Z"}


# --------------------------------------------------------------------------------------------------
# Errors

_OPENAI_ERROR_TYPES = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "unsupported_country_region_territory"),
    404: ("invalid_request_error", "unknown_url"),
    409: ("invalid_request_error", "conflict"),
    422: ("invalid_request_error", None),
    429: ("rate_limit_error", "rate_limit_exceeded"),
}
_ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def _error_body(provider: str, status: int, message: str) -> dict[str, Any]:
    """The provider's error JSON shape for ``status``."""
    if provider == "anthropic":
        kind = _ANTHROPIC_ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
        return {
            "type": "error",
            "error": {"type": kind, "message": message},
            "request_id": _new_id("req_011"),
        }
    kind, code = _OPENAI_ERROR_TYPES.get(
        status, ("server_error" if status >= 500 else "invalid_request_error", None)
    )
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


# --------------------------------------------------------------------------------------------------
# Transport


class _BodyWriter:
    """Writes a response body: chunk framing, ``chunk_bytes`` splits, delays, stalls and truncation."""

    def __init__(self, handler: _Handler, beh: Mapping[str, Any], *, chunked: bool) -> None:
        self.handler = handler
        self.chunked = chunked
        self.chunk_bytes: int = beh["chunk_bytes"]
        self.delay_s: float = beh["delay_ms"] / 1000.0
        self.pace_s: float = beh["pace_ms"] / 1000.0
        self.held = b""  # paced: the last framed piece, sent at the next write or with the end
        self.stall_after: int | None = beh["stall_after_bytes"]
        self.stall_s: float = beh["stall_s"]
        self.truncate_after: int | None = beh["truncate_after_bytes"]
        self.sent = 0
        self.writes = 0
        self.pending = bytearray()

    def write(self, data: bytes) -> None:
        """Queue ``data``; with ``chunk_bytes`` it goes out in fixed-size pieces across write calls."""
        if not self.chunk_bytes:
            self._emit(data)
            return
        self.pending += data
        while len(self.pending) >= self.chunk_bytes:
            piece = bytes(self.pending[: self.chunk_bytes])
            del self.pending[: self.chunk_bytes]
            self._emit(piece)

    def finish(self) -> None:
        """Write what is pending and end the body; at a stall or truncate point the body is never ended."""
        if self.pending:
            piece = bytes(self.pending)
            self.pending.clear()
            self._emit(piece)
        limit = self._limit()
        if limit is not None and self.sent >= limit:
            self._cut()
        end = b"0\r\n\r\n" if self.chunked else b""
        if self.held:
            self._release(end)
        elif end:
            self._send(end)

    def _limit(self) -> int | None:
        points = [p for p in (self.stall_after, self.truncate_after) if p is not None]
        return min(points) if points else None

    def _emit(self, data: bytes) -> None:
        limit = self._limit()
        if limit is not None and self.sent + len(data) > limit:
            head = data[: max(0, limit - self.sent)]
            if head:
                self._write(head)
            self._cut()
        self._write(data)

    def _write(self, piece: bytes) -> None:
        if self.writes and self.delay_s:
            time.sleep(self.delay_s)
        framed = b"%x\r\n%s\r\n" % (len(piece), piece) if self.chunked else piece
        if self.pace_s:
            if self.held:
                self._release()
            self.held = framed
        else:
            self._send(framed)
        self.sent += len(piece)
        self.writes += 1

    def _release(self, end: bytes = b"") -> None:
        """Paced: the held piece (with the body's end, when it is the last), after the pace."""
        time.sleep(self.pace_s)
        held, self.held = self.held, b""
        self._send(held + end)

    def _cut(self) -> None:
        """Stall (hold the connection until ``stall_s``, the client leaves or stop()), then close."""
        if self.held:
            self._release()
        stall = self.stall_after is not None and (
            self.truncate_after is None or self.stall_after <= self.truncate_after
        )
        if stall:
            self.handler.hold(self.stall_s)
        self.handler.abort()
        raise _Abort

    def _send(self, raw: bytes) -> None:
        try:
            self.handler.wfile.write(raw)
        except OSError as err:
            self.handler.close_connection = True
            raise _Abort from err


class _Server(ThreadingHTTPServer):
    """ThreadingHTTPServer that knows its :class:`FakeUpstream` and its open connections."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = 256

    def __init__(self, address: tuple[str, int], fake: FakeUpstream) -> None:
        self.fake = fake
        self.stopping = threading.Event()
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Connection resets and broken pipes are the clients' business; report anything else."""
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)

    def close_connections(self) -> None:
        with self.connections_lock:
            connections = list(self.connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    """One connection: reads requests (keep-alive, chunked bodies) and answers them."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: _Server
    server_version = "fake-upstream/1.0"
    sys_version = ""

    def setup(self) -> None:
        super().setup()
        with self.server.connections_lock:
            self.server.connections.add(self.connection)

    def finish(self) -> None:
        with self.server.connections_lock:
            self.server.connections.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.fake.verbose:
            super().log_message(format, *args)

    def abort(self) -> None:
        """Close the connection now (FIN both ways) without finishing the response."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def hold(self, seconds: float) -> None:
        """Keep the connection open, writing nothing, until ``seconds`` pass, the client leaves or stop()."""
        deadline = time.monotonic() + seconds
        stopping = self.server.stopping
        while not stopping.is_set() and time.monotonic() < deadline:
            try:
                readable, _, _ = select.select([self.connection], [], [], 0.05)
                if readable and not self.connection.recv(1, socket.MSG_PEEK):
                    return  # the client closed its side
            except OSError:
                return
            if readable:
                stopping.wait(0.05)  # the client sent more data (pipelining): keep holding

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_PATCH(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            body = bytearray()
            while True:
                line = self.rfile.readline(65537)
                size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return bytes(body)
                body += self.rfile.read(size)
                self.rfile.readline(65537)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _headers_dict(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        for name, value in self.headers.items():
            key = name.lower()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        return headers

    def _dispatch(self) -> None:
        try:
            body = self._read_body()
        except (ValueError, OSError):
            self.close_connection = True
            self._send_json(400, {"error": {"message": "unreadable request body"}}, {})
            return
        route = urlsplit(self.path).path
        try:
            if route.startswith("/_fake/"):
                self._control(route, body)
                return
            fake = self.server.fake
            headers = self._headers_dict()
            fake._record(Received(self.command, self.path, headers, body))
            provider = (
                "anthropic"
                if route.startswith("/v1/messages") or "anthropic-version" in headers
                else "openai"
            )
            try:
                beh = fake._effective(headers)
            except (KeyError, ValueError) as err:
                self._send_json(
                    400, _error_body(provider, 400, f"fake upstream: {err}"), {}, provider=provider
                )
                return
            self._api(route, body, beh, provider)
        except _Abort:
            self.close_connection = True

    # ---- control endpoints

    def _control(self, route: str, body: bytes) -> None:
        fake = self.server.fake
        method = self.command
        if route == "/_fake/health" and method == "GET":
            self._send_json(200, {"ok": True, "received": fake.received_count}, {})
        elif route == "/_fake/received" and method == "GET":
            self._send_json(200, [r.to_dict() for r in fake.received], {})
        elif route == "/_fake/clear" and method == "POST":
            fake.clear()
            self._send_json(200, {"ok": True}, {})
        elif route == "/_fake/behaviour" and method in ("GET", "POST", "DELETE"):
            try:
                if method == "POST":
                    settings = json.loads(body or b"{}")
                    if not isinstance(settings, dict):
                        raise ValueError("expected a JSON object")
                    fake.set_behaviour(**settings)
                elif method == "DELETE":
                    fake.reset_behaviour()
            except (KeyError, ValueError, TypeError) as err:
                self._send_json(400, {"error": {"message": str(err)}}, {})
                return
            self._send_json(200, fake.behaviour, {})
        else:
            self._send_json(404, {"error": {"message": f"no control endpoint {method} {route}"}}, {})

    # ---- API endpoints

    def _api(self, route: str, raw: bytes, beh: Mapping[str, Any], provider: str) -> None:
        self._saw: str | None = None
        if beh["fail_status"] is not None:
            status = int(beh["fail_status"])
            message = f"fake upstream: failing with status {status} as asked"
            self._send_json(status, _error_body(provider, status, message), beh, provider=provider)
            return
        if beh.get("raw") is not None:
            self._send_raw(beh)
            return
        method = self.command
        if method == "GET" and route == "/v1/models":
            if provider == "anthropic":
                models = [_anthropic_model(m) for m in _ANTHROPIC_MODELS]
                listing = {
                    "data": models,
                    "has_more": False,
                    "first_id": models[0]["id"],
                    "last_id": models[-1]["id"],
                }
                self._send_json(200, listing, beh, provider=provider)
            else:
                models = [_openai_model(m) for m in _OPENAI_MODELS]
                self._send_json(200, {"object": "list", "data": models}, beh, provider=provider)
            return
        if method == "GET" and route.startswith("/v1/models/"):
            model_id = route.removeprefix("/v1/models/")
            model = _anthropic_model(model_id) if provider == "anthropic" else _openai_model(model_id)
            self._send_json(200, model, beh, provider=provider)
            return
        handlers: dict[str, Callable[[dict[str, Any], Mapping[str, Any], int], None]] = {
            "/v1/chat/completions": self._chat,
            "/v1/responses": self._responses,
            "/v1/completions": self._completions,
            "/v1/embeddings": self._embeddings,
            "/v1/messages": self._messages,
            "/v1/messages/count_tokens": self._count_tokens,
        }
        handler = handlers.get(route) if method == "POST" else None
        if handler is None:
            message = f"fake upstream: no route for {method} {route}"
            self._send_json(404, _error_body(provider, 404, message), beh, provider=provider)
            return
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            message = "fake upstream: the body is not a JSON object"
            self._send_json(400, _error_body(provider, 400, message), beh, provider=provider)
            return
        extract = _INPUTS.get(route)
        self._saw = extract(body) if extract is not None else None
        handler(body, beh, len(raw))

    def _chat(self, body: dict[str, Any], beh: Mapping[str, Any], raw_len: int) -> None:
        plan = _plan("chat", body, beh, raw_len)
        if body.get("stream"):
            self._send_sse(((None, e) for e in _chat_events(plan, body, beh)), beh, done=True)
        else:
            self._send_json(200, _chat_json(plan, beh), beh, indent=True)

    def _responses(self, body: dict[str, Any], beh: Mapping[str, Any], raw_len: int) -> None:
        builder = _ResponsesBuilder(_plan("responses", body, beh, raw_len), body, beh)
        if body.get("stream"):
            self._send_sse(((e["type"], e) for e in builder.events()), beh)
        else:
            self._send_json(200, builder.response(True), beh, indent=True)

    def _completions(self, body: dict[str, Any], beh: Mapping[str, Any], raw_len: int) -> None:
        if body.get("stream"):
            self._send_sse(((None, e) for e in _completions_events(body, beh, raw_len)), beh, done=True)
        else:
            self._send_json(200, _completions_json(body, beh, raw_len), beh, indent=True)

    def _embeddings(self, body: dict[str, Any], beh: Mapping[str, Any], raw_len: int) -> None:
        self._send_json(200, _embeddings_json(body), beh, indent=True)

    def _messages(self, body: dict[str, Any], beh: Mapping[str, Any], raw_len: int) -> None:
        builder = _AnthropicBuilder(_plan("anthropic", body, beh, raw_len), beh)
        if body.get("stream"):
            self._send_sse(((e["type"], e) for e in builder.events()), beh, provider="anthropic")
        else:
            self._send_json(200, builder.json(), beh, provider="anthropic")

    def _count_tokens(self, body: dict[str, Any], beh: Mapping[str, Any], raw_len: int) -> None:
        self._send_json(200, {"input_tokens": max(1, raw_len // 4)}, beh, provider="anthropic")

    # ---- output

    def _common_headers(self, provider: str) -> None:
        saw = getattr(self, "_saw", None)
        if saw:
            # For the demo: the text this upstream received, as a header the processor never
            # restores, so one curl shows the redacted request beside the restored reply.
            self.send_header("x-fake-saw", json.dumps(saw[:300])[1:-1])
        request_id = _new_id("req_", 32)
        if provider == "anthropic":
            self.send_header("request-id", request_id)
            self.send_header("anthropic-organization-id", "00000000-0000-0000-0000-000000000000")
        else:
            self.send_header("x-request-id", request_id)
            self.send_header("openai-version", "2020-10-01")
            self.send_header("openai-processing-ms", "1")

    @staticmethod
    def _dumps(obj: Any, beh: Mapping[str, Any], *, indent: bool = False) -> bytes:
        text = json.dumps(
            obj, ensure_ascii=False, indent=2 if indent else None, separators=None if indent else (",", ":")
        )
        return (_escape(text) if beh.get("escape_brackets") else text).encode()

    def _send_json(
        self, status: int, obj: Any, beh: Mapping[str, Any], *, provider: str = "openai", indent: bool = False
    ) -> None:
        data = self._dumps(obj, beh, indent=indent)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self._common_headers(provider)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        writer = _BodyWriter(self, beh or BEHAVIOUR_DEFAULTS, chunked=False)
        writer.write(data)
        writer.finish()

    def _send_raw(self, beh: Mapping[str, Any]) -> None:
        """The `raw` behaviour: its bytes as the body, chunked, each piece its own write (and
        split further by `chunk_bytes`), under the headers it names."""
        self.send_response(200)
        if beh.get("raw_type"):
            self.send_header("Content-Type", beh["raw_type"])
        if beh.get("raw_encoding"):
            self.send_header("Content-Encoding", beh["raw_encoding"])
        self.send_header("Transfer-Encoding", "chunked")
        self._common_headers("openai")
        self.end_headers()
        writer = _BodyWriter(self, beh, chunked=True)
        for piece in beh["raw"]:
            writer.write(piece)
            if not writer.chunk_bytes and writer.delay_s:
                time.sleep(writer.delay_s)
        writer.finish()

    def _send_sse(
        self,
        events: Iterable[tuple[str | None, Any]],
        beh: Mapping[str, Any],
        *,
        provider: str = "openai",
        done: bool = False,
    ) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self._common_headers(provider)
        self.end_headers()
        writer = _BodyWriter(self, beh, chunked=True)
        for name, event in events:
            head = b"event: %s\n" % name.encode() if name else b""
            writer.write(head + b"data: " + self._dumps(event, beh) + b"\n\n")
        if done:
            writer.write(b"data: [DONE]\n\n")
        writer.finish()


# --------------------------------------------------------------------------------------------------
# The public object


class FakeUpstream:
    """A fake OpenAI + Anthropic upstream on ``host:port`` (0: a free port), run in a thread.

    ``defaults`` are behaviour defaults (see :data:`BEHAVIOUR_DEFAULTS`). ``max_received`` caps the
    request log (oldest dropped) so long benchmarks do not grow memory without bound.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_received: int = 10_000,
        verbose: bool = False,
        **defaults: Any,
    ) -> None:
        self.host = host
        self.verbose = verbose
        self._requested_port = port
        self._max_received = max_received
        self._defaults = {**BEHAVIOUR_DEFAULTS, **{k: _coerce(k, v) for k, v in defaults.items()}}
        self._behaviour = dict(self._defaults)
        self._cond = threading.Condition()
        self._received: list[Received] = []
        self._received_count = 0
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle

    def start(self) -> Self:
        """Bind and serve in a background thread; listening when it returns."""
        if self._server is not None:
            return self
        server = _Server((self.host, self._requested_port), self)
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-upstream", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, end stalled streams and close every open connection."""
        server, self._server = self._server, None
        if server is None:
            return
        server.stopping.set()
        server.shutdown()
        server.close_connections()
        server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The bound port (after :meth:`start`)."""
        if self._server is None:
            raise RuntimeError("FakeUpstream is not started")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` (127.0.0.1 when bound to a wildcard address)."""
        host = "127.0.0.1" if self.host in ("", "0.0.0.0") else self.host
        return f"http://{host}:{self.port}"

    # ---- request log

    def _record(self, received: Received) -> None:
        with self._cond:
            self._received.append(received)
            self._received_count += 1
            if len(self._received) > self._max_received:
                del self._received[: len(self._received) - self._max_received]
            self._cond.notify_all()

    @property
    def received(self) -> list[Received]:
        """A snapshot of the requests received since the last :meth:`clear` (control endpoints excluded)."""
        with self._cond:
            return list(self._received)

    @property
    def received_count(self) -> int:
        """How many API requests arrived since start (not reset by :meth:`clear`)."""
        with self._cond:
            return self._received_count

    def clear(self) -> None:
        """Forget the recorded requests."""
        with self._cond:
            self._received.clear()

    def reset(self) -> None:
        """Forget the recorded requests and go back to the default behaviours (between tests)."""
        self.clear()
        self.reset_behaviour()

    def take(self) -> list[Received]:
        """The recorded requests, forgotten in the same step (a long run checks them and drops
        them, so none is lost between a read and a clear and none piles up)."""
        with self._cond:
            taken, self._received = self._received, []
            return taken

    def wait_for(self, n: int, timeout: float = 5.0) -> list[Received]:
        """Wait until at least ``n`` requests are recorded and return them; TimeoutError otherwise."""
        with self._cond:
            if not self._cond.wait_for(lambda: len(self._received) >= n, timeout):
                raise TimeoutError(f"fake upstream: {len(self._received)} of {n} requests after {timeout}s")
            return list(self._received)

    # ---- behaviours

    @property
    def behaviour(self) -> dict[str, Any]:
        """The current behaviour settings (header overrides not included)."""
        with self._cond:
            return dict(self._behaviour)

    def set_behaviour(self, **kw: Any) -> None:
        """Change behaviours for every following request (values as Python or header strings).

        With no arguments, go back to the constructor's defaults (like :meth:`reset_behaviour`).
        """
        if not kw:
            self.reset_behaviour()
            return
        coerced = {k: _coerce(k, v) for k, v in kw.items()}
        with self._cond:
            self._behaviour.update(coerced)

    def reset_behaviour(self) -> None:
        """Back to the constructor's defaults."""
        with self._cond:
            self._behaviour = dict(self._defaults)

    def _effective(self, headers: Mapping[str, str]) -> dict[str, Any]:
        """The behaviours for one request: current settings overridden by ``x-fake-*`` headers."""
        beh = self.behaviour
        for key, value in headers.items():
            if not key.startswith("x-fake-"):
                continue
            name = key.removeprefix("x-fake-").replace("-", "_")
            beh[name] = _coerce(name, _header_text(value) if name == "reply" else value)
        return beh


# --------------------------------------------------------------------------------------------------
# Command line


def main(argv: list[str] | None = None) -> int:
    """Serve until SIGINT/SIGTERM: ``python -m tests.support.fake_upstream --host H --port P [--set k=v]``."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.fake_upstream", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=18080)
    parser.add_argument(
        "--set", action="append", default=[], metavar="NAME=VALUE", help="a behaviour default"
    )
    parser.add_argument("--verbose", action="store_true", help="log every request to stderr")
    args = parser.parse_args(argv)
    defaults: dict[str, Any] = {}
    for item in args.set:
        name, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set expects NAME=VALUE, got {item!r}")
        defaults[name.strip().replace("-", "_")] = value
    try:
        fake = FakeUpstream(host=args.host, port=args.port, verbose=args.verbose, **defaults)
        fake.start()
    except (KeyError, ValueError) as err:
        parser.error(str(err))
    except OSError as err:
        print(f"fake upstream: cannot listen on {args.host}:{args.port}: {err}", file=sys.stderr, flush=True)
        return 1
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    print(f"fake upstream listening on {fake.url}", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        fake.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
