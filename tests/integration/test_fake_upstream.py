"""Tests of the fake LLM upstream, driven directly (no Envoy) with the official SDKs and raw HTTP.

They pin down what the end-to-end tests rely on: the SDKs parse every reply shape (JSON and SSE,
text, tool calls, reasoning/thinking), the echo format, the request log, and the transport
behaviours (odd chunk splits, delays, stalls, truncation, errors, ``\\u003c`` escaping).
"""

from __future__ import annotations

import http.client
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import openai
import pytest

from tests.support.fake_upstream import ECHO_PREFIX, THINKING_PREFIX, FakeUpstream

SAID = 'Hello <SUBJECT1_NAME_k3x9_0>, "mail" <SUBJECT1_EMAIL_k3x9_0> & Grüße'
ECHO = ECHO_PREFIX + SAID
OPENAI_MODEL = "gpt-4o-mini"
CLAUDE = "claude-sonnet-4-6"
CHAT_TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look something up",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
        },
    },
    {"type": "function", "function": {"name": "other", "parameters": {"type": "object", "properties": {}}}},
]
RESPONSES_TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "lookup",
        "description": "Look something up",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
        "strict": False,
    }
]
ANTHROPIC_TOOLS: list[Any] = [
    {"name": "lookup", "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}}}
]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeUpstream]:
    with FakeUpstream() as server:
        yield server


@pytest.fixture(autouse=True)
def _fresh(fake: FakeUpstream) -> None:
    fake.reset_behaviour()
    fake.clear()


@pytest.fixture()
def oai(fake: FakeUpstream) -> openai.OpenAI:
    return openai.OpenAI(base_url=fake.url + "/v1", api_key="sk-test-dummy", max_retries=0, timeout=10)


@pytest.fixture()
def claude(fake: FakeUpstream) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=fake.url, api_key="sk-ant-dummy", max_retries=0, timeout=10)


def _user(text: str = SAID) -> list[Any]:
    return [{"role": "user", "content": text}]


def _raw(
    fake: FakeUpstream, path: str, body: Any, headers: dict[str, str] | None = None, method: str = "POST"
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", fake.port, timeout=5)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def _raw_chunks(fake: FakeUpstream, path: str, body: Any, headers: dict[str, str]) -> list[bytes]:
    """POST over a bare socket and return the HTTP chunks of a chunked reply, as framed."""
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
        + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        + f"Content-Length: {len(payload)}\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", fake.port), timeout=5) as sock:
        sock.sendall(head.encode() + payload)
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    headers_end = raw.index(b"\r\n\r\n") + 4
    assert b"transfer-encoding: chunked" in raw[:headers_end].lower()
    rest, chunks = raw[headers_end:], []
    while True:
        line, _, rest = rest.partition(b"\r\n")
        size = int(line, 16)
        if size == 0:
            return chunks
        chunks.append(rest[:size])
        assert rest[size : size + 2] == b"\r\n"
        rest = rest[size + 2 :]


def _sse_events(data: bytes) -> list[tuple[str | None, str]]:
    events = []
    for block in data.decode().split("\n\n"):
        if not block:
            continue
        name = None
        lines = []
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line.removeprefix("event: ")
            elif line.startswith("data: "):
                lines.append(line.removeprefix("data: "))
        events.append((name, "\n".join(lines)))
    return events


# --------------------------------------------------------------------------------------------------
# OpenAI Chat Completions


def test_chat_plain_echo_and_recorded_request(fake: FakeUpstream, oai: openai.OpenAI) -> None:
    messages: list[Any] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "an earlier turn"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": SAID}]},
    ]
    completion = oai.chat.completions.create(model=OPENAI_MODEL, messages=messages)
    assert completion.choices[0].message.content == ECHO
    assert completion.choices[0].finish_reason == "stop"
    assert completion.model == OPENAI_MODEL
    assert completion.usage is not None and completion.usage.total_tokens > 0

    (received,) = fake.received
    assert (received.method, received.path, received.route) == (
        "POST",
        "/v1/chat/completions",
        "/v1/chat/completions",
    )
    assert received.headers["authorization"] == "Bearer sk-test-dummy"
    assert received.headers["content-type"] == "application/json"
    assert received.json()["messages"] == messages


def test_chat_stream_with_usage(fake: FakeUpstream, oai: openai.OpenAI) -> None:
    stream = oai.chat.completions.create(
        model=OPENAI_MODEL, messages=_user(), stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    contents = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(contents) == ECHO
    assert len(contents) == -(-len(ECHO) // 4)  # default delta_chars=4
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert (
        chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    )
    assert all(c.usage is None for c in chunks[:-1])
    assert fake.received[0].json()["stream"] is True


def test_chat_stream_helper_without_usage(oai: openai.OpenAI) -> None:
    with oai.chat.completions.stream(
        model=OPENAI_MODEL, messages=_user(), extra_headers={"x-fake-delta-chars": "1"}
    ) as s:
        deltas = [e.delta for e in s if e.type == "content.delta" and e.delta]
        final = s.get_final_completion()
    assert len(deltas) == len(ECHO)
    assert final.choices[0].message.content == ECHO
    assert final.usage is None


def test_chat_tool_call_json(fake: FakeUpstream, oai: openai.OpenAI) -> None:
    fake.set_behaviour(tool=True)
    completion = oai.chat.completions.create(model=OPENAI_MODEL, messages=_user(), tools=CHAT_TOOLS)
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "lookup"
    assert json.loads(call.function.arguments) == {"text": ECHO}


def test_chat_tool_call_only_when_tools_declared(oai: openai.OpenAI) -> None:
    completion = oai.chat.completions.create(
        model=OPENAI_MODEL, messages=_user(), extra_headers={"x-fake-tool": "on"}
    )
    assert completion.choices[0].message.content == ECHO
    assert completion.choices[0].message.tool_calls is None


def test_chat_tool_call_streamed(oai: openai.OpenAI) -> None:
    stream = oai.chat.completions.create(
        model=OPENAI_MODEL,
        messages=_user(),
        tools=CHAT_TOOLS,
        stream=True,
        extra_headers={"x-fake-tool": "true"},
    )
    chunks = list(stream)
    first = chunks[0].choices[0].delta.tool_calls
    assert first is not None and first[0].id and first[0].type == "function"
    assert first[0].function is not None and first[0].function.name == "lookup"
    pieces = [
        tc.function.arguments
        for c in chunks
        for tc in (c.choices[0].delta.tool_calls or [])
        if tc.function is not None and tc.function.arguments
    ]
    assert len(pieces) > 5
    assert json.loads("".join(pieces)) == {"text": ECHO}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"

    with oai.chat.completions.stream(
        model=OPENAI_MODEL, messages=_user(), tools=CHAT_TOOLS, extra_headers={"x-fake-tool": "1"}
    ) as s:
        final = s.get_final_completion()
    (call,) = final.choices[0].message.tool_calls or []
    assert json.loads(call.function.arguments) == {"text": ECHO}


def test_chat_echoes_the_last_tool_result(oai: openai.OpenAI) -> None:
    messages: list[Any] = [
        {"role": "user", "content": "look it up"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "result <X>"},
    ]
    completion = oai.chat.completions.create(model=OPENAI_MODEL, messages=messages)
    assert completion.choices[0].message.content == ECHO_PREFIX + "result <X>"


# --------------------------------------------------------------------------------------------------
# OpenAI Responses


def test_responses_plain(fake: FakeUpstream, oai: openai.OpenAI) -> None:
    response = oai.responses.create(model=OPENAI_MODEL, input=SAID, instructions="Be brief.")
    assert response.output_text == ECHO
    assert response.status == "completed"
    assert response.instructions == "Be brief."
    assert [item.type for item in response.output] == ["message"]
    assert response.usage is not None and response.usage.total_tokens > 0
    assert fake.received[0].route == "/v1/responses"

    items: list[Any] = [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": SAID}]},
    ]
    assert oai.responses.create(model=OPENAI_MODEL, input=items).output_text == ECHO


def test_responses_streamed_sequence(oai: openai.OpenAI) -> None:
    stream = oai.responses.create(model=OPENAI_MODEL, input=SAID, stream=True)
    events = list(stream)
    types = [e.type for e in events]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert len(deltas) > 5 and "".join(d.delta for d in deltas) == ECHO
    assert {(d.output_index, d.content_index) for d in deltas} == {(0, 0)}
    assert len({d.item_id for d in deltas}) == 1
    assert [e.sequence_number for e in events] == list(range(len(events)))
    completed = events[-1]
    assert completed.type == "response.completed" and completed.response.output_text == ECHO

    with oai.responses.stream(model=OPENAI_MODEL, input=SAID) as s:
        final = s.get_final_response()
    assert final.output_text == ECHO


def test_responses_function_call_and_reasoning(fake: FakeUpstream, oai: openai.OpenAI) -> None:
    fake.set_behaviour(tool=True)
    response = oai.responses.create(
        model=OPENAI_MODEL, input=SAID, tools=RESPONSES_TOOLS, reasoning={"effort": "low", "summary": "auto"}
    )
    reasoning, call = response.output
    assert reasoning.type == "reasoning" and reasoning.summary[0].text == THINKING_PREFIX + SAID
    assert call.type == "function_call" and call.name == "lookup" and call.call_id.startswith("call_")
    assert json.loads(call.arguments) == {"text": ECHO}

    with oai.responses.stream(
        model=OPENAI_MODEL, input=SAID, tools=RESPONSES_TOOLS, reasoning={"effort": "low", "summary": "auto"}
    ) as s:
        events = list(s)
        final = s.get_final_response()
    arg_deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    summary_deltas = [e.delta for e in events if e.type == "response.reasoning_summary_text.delta"]
    assert len(arg_deltas) > 5 and json.loads("".join(arg_deltas)) == {"text": ECHO}
    assert "".join(summary_deltas) == THINKING_PREFIX + SAID
    assert [e.arguments for e in events if e.type == "response.function_call_arguments.done"] == [
        call.arguments
    ]
    reasoning, call = final.output
    assert reasoning.type == "reasoning" and call.type == "function_call"
    assert json.loads(call.arguments) == {"text": ECHO}


def test_responses_echoes_a_function_call_output(oai: openai.OpenAI) -> None:
    items: list[Any] = [{"type": "function_call_output", "call_id": "call_1", "output": "result <Y>"}]
    response = oai.responses.create(model=OPENAI_MODEL, input=items, previous_response_id="resp_1")
    assert response.output_text == ECHO_PREFIX + "result <Y>"
    assert response.previous_response_id == "resp_1"


# --------------------------------------------------------------------------------------------------
# Other OpenAI endpoints


def test_completions_embeddings_models(fake: FakeUpstream, oai: openai.OpenAI) -> None:
    completion = oai.completions.create(model="gpt-3.5-turbo-instruct", prompt=["one <A>", "two"])
    assert [c.text for c in completion.choices] == [ECHO_PREFIX + "one <A>", ECHO_PREFIX + "two"]
    pieces = [
        c.choices[0].text
        for c in oai.completions.create(model="gpt-3.5-turbo-instruct", prompt=SAID, stream=True)
        if c.choices
    ]
    assert "".join(pieces) == ECHO and len(pieces) > 5

    embedding = oai.embeddings.create(
        model="text-embedding-3-small", input=["a <B>", "b"]
    )  # base64 by default
    assert [len(d.embedding) for d in embedding.data] == [8, 8]
    assert embedding.data[0].embedding != embedding.data[1].embedding
    floats = oai.embeddings.create(
        model="text-embedding-3-small", input="a <B>", encoding_format="float", dimensions=3
    )
    assert len(floats.data[0].embedding) == 3

    assert OPENAI_MODEL in [m.id for m in oai.models.list()]
    assert oai.models.retrieve("gpt-4.1").id == "gpt-4.1"
    assert [r.route for r in fake.received] == [
        "/v1/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/embeddings",
        "/v1/models",
        "/v1/models/gpt-4.1",
    ]


# --------------------------------------------------------------------------------------------------
# Anthropic Messages


def test_anthropic_plain(fake: FakeUpstream, claude: anthropic.Anthropic) -> None:
    message = claude.messages.create(
        model=CLAUDE, max_tokens=256, system="Be brief.", messages=[{"role": "user", "content": SAID}]
    )
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].type == "text" and message.content[0].text == ECHO
    assert message.stop_reason == "end_turn" and message.model == CLAUDE
    assert message.usage.output_tokens > 0
    (received,) = fake.received
    assert received.route == "/v1/messages"
    # anthropic 2.x sends the key as a bearer token, not x-api-key
    assert received.headers["authorization"] == "Bearer sk-ant-dummy"
    assert "anthropic-version" in received.headers

    blocks: list[Any] = [{"type": "text", "text": "part one"}, {"type": "text", "text": "part <two>"}]
    again = claude.messages.create(
        model=CLAUDE, max_tokens=256, messages=[{"role": "user", "content": blocks}]
    )
    assert again.content[0].type == "text" and again.content[0].text == ECHO_PREFIX + "part one\npart <two>"


def test_anthropic_thinking_and_tool_use_json(claude: anthropic.Anthropic) -> None:
    message = claude.messages.create(
        model=CLAUDE,
        max_tokens=2048,
        thinking={"type": "enabled", "budget_tokens": 1024},
        tools=ANTHROPIC_TOOLS,
        messages=_user(),
        extra_headers={"x-fake-tool": "1"},
    )
    thinking, tool = message.content
    assert thinking.type == "thinking" and thinking.thinking == THINKING_PREFIX + SAID and thinking.signature
    assert tool.type == "tool_use" and tool.name == "lookup" and tool.id.startswith("toolu_")
    assert tool.input == {"text": ECHO}
    assert message.stop_reason == "tool_use"


def test_anthropic_streamed_text(claude: anthropic.Anthropic) -> None:
    with claude.messages.stream(model=CLAUDE, max_tokens=256, messages=_user()) as s:
        texts = list(s.text_stream)
        final = s.get_final_message()
    assert "".join(texts) == ECHO and len(texts) > 5
    assert final.content[0].type == "text" and final.content[0].text == ECHO
    assert final.stop_reason == "end_turn" and final.usage.output_tokens > 1


def test_anthropic_streamed_thinking_and_tool_use(claude: anthropic.Anthropic) -> None:
    with claude.messages.stream(
        model=CLAUDE,
        max_tokens=2048,
        tools=ANTHROPIC_TOOLS,
        messages=_user(),
        extra_headers={"x-fake-tool": "1", "x-fake-thinking": "1"},
    ) as s:
        events = list(s)
        final = s.get_final_message()
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    partial = [d.partial_json for d in deltas if d.type == "input_json_delta"]
    assert len(partial) > 5 and json.loads("".join(partial)) == {"text": ECHO}
    assert "".join(d.thinking for d in deltas if d.type == "thinking_delta") == THINKING_PREFIX + SAID
    assert [d.type for d in deltas if d.type == "signature_delta"] == ["signature_delta"]
    thinking, tool = final.content
    assert thinking.type == "thinking" and thinking.thinking == THINKING_PREFIX + SAID and thinking.signature
    assert tool.type == "tool_use" and tool.input == {"text": ECHO}
    assert final.stop_reason == "tool_use"


def test_anthropic_raw_event_order(fake: FakeUpstream) -> None:
    body = {"model": CLAUDE, "max_tokens": 64, "stream": True, "messages": _user("hi")}
    status, headers, data = _raw(fake, "/v1/messages", body, {"anthropic-version": "2023-06-01"})
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    assert headers["transfer-encoding"] == "chunked" and headers["request-id"].startswith("req_")
    names = [name for name, _ in _sse_events(data)]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-4:] == ["content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    for name, payload in _sse_events(data):
        assert json.loads(payload)["type"] == name


def test_anthropic_echoes_tool_results_and_counts_tokens(claude: anthropic.Anthropic) -> None:
    messages: list[Any] = [
        {"role": "user", "content": "look it up"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "found <Z>"}],
        },
    ]
    message = claude.messages.create(model=CLAUDE, max_tokens=64, messages=messages)
    assert message.content[0].type == "text" and message.content[0].text == ECHO_PREFIX + "found <Z>"
    count = claude.messages.count_tokens(model=CLAUDE, messages=_user())
    assert count.input_tokens > 0


# --------------------------------------------------------------------------------------------------
# Transport behaviours


def _all_streams(oai: openai.OpenAI, claude: anthropic.Anthropic, headers: dict[str, str]) -> list[Any]:
    """Streams every dialect (with tool calls and thinking) and returns what the SDKs made of them."""
    tool = {**headers, "x-fake-tool": "1", "x-fake-thinking": "1"}
    chat = list(
        oai.chat.completions.create(
            model=OPENAI_MODEL,
            messages=_user(),
            stream=True,
            stream_options={"include_usage": True},
            extra_headers=headers,
        )
    )
    with oai.chat.completions.stream(
        model=OPENAI_MODEL, messages=_user(), tools=CHAT_TOOLS, extra_headers=tool
    ) as s:
        chat_tool = s.get_final_completion().choices[0].message.tool_calls
    with oai.responses.stream(model=OPENAI_MODEL, input=SAID, extra_headers=headers) as s:
        responses_text = s.get_final_response().output_text
    with oai.responses.stream(model=OPENAI_MODEL, input=SAID, tools=RESPONSES_TOOLS, extra_headers=tool) as s:
        responses_tool = s.get_final_response().output
    with claude.messages.stream(model=CLAUDE, max_tokens=256, messages=_user(), extra_headers=headers) as s:
        claude_text = s.get_final_message().content
    with claude.messages.stream(
        model=CLAUDE, max_tokens=256, messages=_user(), tools=ANTHROPIC_TOOLS, extra_headers=tool
    ) as s:
        claude_tool = s.get_final_message().content
    return [
        "".join(c.choices[0].delta.content or "" for c in chat if c.choices),
        [(t.function.name, t.function.arguments) for t in chat_tool or []],
        responses_text,
        [(i.type, getattr(i, "arguments", None), getattr(i, "summary", None)) for i in responses_tool],
        [(b.type, getattr(b, "text", None)) for b in claude_text],
        [(b.type, getattr(b, "input", None), getattr(b, "thinking", None)) for b in claude_tool],
    ]


@pytest.mark.parametrize("chunk_bytes", [1, 7])
def test_odd_chunk_sizes_parse_identically(
    oai: openai.OpenAI, claude: anthropic.Anthropic, chunk_bytes: int
) -> None:
    expected = _all_streams(oai, claude, {})
    assert expected[0] == ECHO and json.loads(expected[1][0][1]) == {"text": ECHO}
    assert _all_streams(oai, claude, {"x-fake-chunk-bytes": str(chunk_bytes)}) == expected


def test_chunk_bytes_makes_one_http_chunk_per_write(fake: FakeUpstream) -> None:
    body = {"model": OPENAI_MODEL, "stream": True, "messages": _user()}
    chunks = _raw_chunks(fake, "/v1/chat/completions", body, {"x-fake-chunk-bytes": "7"})
    assert len(chunks) > 20
    assert {len(c) for c in chunks[:-1]} == {7} and 1 <= len(chunks[-1]) <= 7
    events = _sse_events(b"".join(chunks))
    assert events[-1] == (None, "[DONE]")
    text = "".join(json.loads(d)["choices"][0]["delta"].get("content") or "" for _, d in events[:-1])
    assert text == ECHO

    per_event = _raw_chunks(fake, "/v1/chat/completions", body, {})
    assert all(c.endswith(b"\n\n") for c in per_event)  # without chunk_bytes: one chunk per event


def test_json_replies_use_content_length_and_request_ids(fake: FakeUpstream) -> None:
    body = {"model": OPENAI_MODEL, "messages": _user()}
    status, headers, data = _raw(fake, "/v1/chat/completions", body, {"x-fake-chunk-bytes": "5"})
    assert status == 200 and headers["content-type"] == "application/json"
    assert int(headers["content-length"]) == len(data) and "transfer-encoding" not in headers
    assert headers["x-request-id"].startswith("req_")
    assert json.loads(data)["choices"][0]["message"]["content"] == ECHO


def test_delay_spreads_the_stream_over_time(fake: FakeUpstream) -> None:
    body = {"model": OPENAI_MODEL, "stream": True, "messages": _user("abcdefgh")}
    conn = http.client.HTTPConnection("127.0.0.1", fake.port, timeout=5)
    start = time.monotonic()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"x-fake-delay-ms": "40"})
    resp = conn.getresponse()
    first = resp.read1()
    first_at = time.monotonic() - start
    rest = resp.read()
    total = time.monotonic() - start
    conn.close()
    assert first.startswith(b"data: ")
    assert total >= 0.2 and first_at < total - 0.15  # 7 writes, 6 delays of 40 ms
    assert (first + rest).endswith(b"data: [DONE]\n\n")


def test_fail_status_gives_the_sdk_error(oai: openai.OpenAI, claude: anthropic.Anthropic) -> None:
    with pytest.raises(openai.RateLimitError) as oerr:
        oai.chat.completions.create(
            model=OPENAI_MODEL, messages=_user(), extra_headers={"x-fake-fail-status": "429"}
        )
    assert oerr.value.status_code == 429
    assert isinstance(oerr.value.body, dict) and oerr.value.body["type"] == "rate_limit_error"
    with pytest.raises(openai.InternalServerError):
        oai.responses.create(
            model=OPENAI_MODEL, input=SAID, stream=True, extra_headers={"x-fake-fail-status": "500"}
        )

    with pytest.raises(anthropic.InternalServerError) as aerr:
        claude.messages.create(
            model=CLAUDE, max_tokens=64, messages=_user(), extra_headers={"x-fake-fail-status": "529"}
        )
    assert aerr.value.status_code == 529
    assert isinstance(aerr.value.body, dict) and aerr.value.body["error"]["type"] == "overloaded_error"
    with pytest.raises(anthropic.RateLimitError):
        claude.messages.create(
            model=CLAUDE,
            max_tokens=64,
            messages=_user(),
            stream=True,
            extra_headers={"x-fake-fail-status": "429"},
        )


def test_stall_gives_a_client_timeout(fake: FakeUpstream) -> None:
    fake.set_behaviour(stall_s=10)
    oai = openai.OpenAI(base_url=fake.url + "/v1", api_key="sk-x", max_retries=0, timeout=0.5)
    claude = anthropic.Anthropic(base_url=fake.url, api_key="sk-x", max_retries=0, timeout=0.5)
    stall = {"x-fake-stall-after-bytes": "1000"}

    start = time.monotonic()
    stream = oai.chat.completions.create(
        model=OPENAI_MODEL, messages=_user(), stream=True, extra_headers=stall
    )
    got: list[str] = []
    with pytest.raises(openai.APITimeoutError):
        for chunk in stream:
            got.append(chunk.choices[0].delta.content or "")
    assert 0 < len("".join(got)) < len(ECHO)
    with pytest.raises(openai.APITimeoutError):  # a JSON reply stalled after 100 of its bytes
        oai.chat.completions.create(
            model=OPENAI_MODEL, messages=_user(), extra_headers={"x-fake-stall-after-bytes": "100"}
        )
    with (
        pytest.raises((anthropic.APITimeoutError, httpx2.TimeoutException)),
        claude.messages.stream(model=CLAUDE, max_tokens=64, messages=_user(), extra_headers=stall) as s,
    ):
        s.get_final_message()
    assert time.monotonic() - start < 4


def test_truncate_gives_a_client_error(
    fake: FakeUpstream, oai: openai.OpenAI, claude: anthropic.Anthropic
) -> None:
    cut = {"x-fake-truncate-after-bytes": "333"}
    start = time.monotonic()
    with pytest.raises(openai.APIConnectionError):
        list(
            oai.chat.completions.create(model=OPENAI_MODEL, messages=_user(), stream=True, extra_headers=cut)
        )
    with pytest.raises(openai.APIConnectionError):
        oai.chat.completions.create(model=OPENAI_MODEL, messages=_user(), extra_headers=cut)
    with (
        pytest.raises((anthropic.APIConnectionError, httpx2.TransportError)),
        claude.messages.stream(model=CLAUDE, max_tokens=64, messages=_user(), extra_headers=cut) as s,
    ):
        s.get_final_message()
    assert time.monotonic() - start < 3
    chunks = _raw_chunks_until_eof(fake, {"x-fake-truncate-after-bytes": "100", "x-fake-chunk-bytes": "30"})
    assert sum(len(c) for c in chunks) == 100


def _raw_chunks_until_eof(fake: FakeUpstream, headers: dict[str, str]) -> list[bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", fake.port, timeout=5)
    body = json.dumps({"model": OPENAI_MODEL, "stream": True, "messages": _user()})
    conn.request("POST", "/v1/chat/completions", body, headers)
    resp = conn.getresponse()
    chunks = []
    with pytest.raises(http.client.IncompleteRead):
        while chunk := resp.read1():
            chunks.append(chunk)
    conn.close()
    return chunks


def test_a_stalled_stream_does_not_block_others_and_stop_ends_it() -> None:
    with FakeUpstream(stall_after_bytes=50, stall_s=30) as fake:
        sock = socket.create_connection(("127.0.0.1", fake.port), timeout=5)
        payload = json.dumps({"model": OPENAI_MODEL, "stream": True, "messages": _user()}).encode()
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
            % (len(payload), payload)
        )
        fake.wait_for(1)
        start = time.monotonic()
        status, _, data = _raw(fake, "/v1/models", None, {"x-fake-stall-after-bytes": "none"}, method="GET")
        assert status == 200 and json.loads(data)["object"] == "list"
        assert time.monotonic() - start < 1
        stopper = threading.Thread(target=fake.stop)
        stopper.start()
        stopper.join(3)
        assert not stopper.is_alive()
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
        sock.close()
    body = raw.split(b"\r\n\r\n", 1)[1]
    assert not body.endswith(b"0\r\n\r\n") and b"[DONE]" not in body


def test_escape_brackets_on_the_wire_and_in_the_sdk(fake: FakeUpstream, oai: openai.OpenAI) -> None:
    esc = {"x-fake-escape-brackets": "1"}
    _, _, data = _raw(fake, "/v1/chat/completions", {"model": OPENAI_MODEL, "messages": _user()}, esc)
    assert b"\\u003cSUBJECT1_NAME_k3x9_0\\u003e" in data and b"<" not in data and b">" not in data
    assert "Grüße".encode() in data  # non-ASCII stays raw UTF-8, as providers send it
    stream_body = {"model": OPENAI_MODEL, "stream": True, "messages": _user()}
    _, _, sse = _raw(fake, "/v1/chat/completions", stream_body, esc)
    assert b"\\u003c" in sse and b"<" not in sse
    anthropic_body = {
        "model": CLAUDE,
        "max_tokens": 9,
        "stream": True,
        "messages": _user(),
        "tools": ANTHROPIC_TOOLS,
    }
    _, _, sse = _raw(fake, "/v1/messages", anthropic_body, {**esc, "x-fake-tool": "1"})
    assert b"\\u003c" in sse and b"<" not in sse

    plain = oai.chat.completions.create(model=OPENAI_MODEL, messages=_user(), extra_headers=esc)
    assert plain.choices[0].message.content == ECHO
    streamed = oai.chat.completions.create(
        model=OPENAI_MODEL, messages=_user(), stream=True, extra_headers=esc
    )
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == ECHO

    deep = {"x-fake-escape-brackets": "deep", "x-fake-tool": "1"}
    completion = oai.chat.completions.create(
        model=OPENAI_MODEL, messages=_user(), tools=CHAT_TOOLS, extra_headers=deep
    )
    arguments = (completion.choices[0].message.tool_calls or [])[0].function.arguments
    assert "\\u003cSUBJECT1_NAME_k3x9_0\\u003e" in arguments and "<" not in arguments
    assert json.loads(arguments) == {"text": ECHO}


# --------------------------------------------------------------------------------------------------
# Behaviour settings, request log, control endpoints, command line


def test_reply_behaviour_everywhere(
    fake: FakeUpstream, oai: openai.OpenAI, claude: anthropic.Anthropic
) -> None:
    fake.set_behaviour(reply="fixed <R>")
    assert (
        oai.chat.completions.create(model=OPENAI_MODEL, messages=_user()).choices[0].message.content
        == "fixed <R>"
    )
    message = claude.messages.create(
        model=CLAUDE, max_tokens=9, messages=_user(), extra_headers={"x-fake-reply": "hdr"}
    )
    assert message.content[0].type == "text" and message.content[0].text == "hdr"  # the header wins
    fake.set_behaviour(tool=True)
    completion = oai.chat.completions.create(model=OPENAI_MODEL, messages=_user(), tools=CHAT_TOOLS)
    assert json.loads((completion.choices[0].message.tool_calls or [])[0].function.arguments) == {
        "text": "fixed <R>"
    }
    fake.reset_behaviour()
    assert fake.behaviour["reply"] is None and fake.behaviour["tool"] is False
    fake.set_behaviour(reply="again")
    fake.set_behaviour()  # no arguments: back to the defaults
    assert fake.behaviour["reply"] is None

    utf8 = {"x-fake-reply": "Grüße <Ω>".encode().decode("latin-1")}  # raw UTF-8 bytes on the wire
    status, _, data = _raw(fake, "/v1/chat/completions", {"messages": _user()}, utf8)
    assert json.loads(data)["choices"][0]["message"]["content"] == "Grüße <Ω>"

    with pytest.raises(KeyError):
        fake.set_behaviour(nonsense=1)
    with pytest.raises(ValueError):
        fake.set_behaviour(chunk_bytes="many")
    status, _, data = _raw(fake, "/v1/chat/completions", {"messages": _user()}, {"x-fake-tool": "maybe"})
    assert status == 400 and "tool" in json.loads(data)["error"]["message"]


def test_request_log_and_control_endpoints(fake: FakeUpstream) -> None:
    status, _, data = _raw(
        fake, "/v1/chat/completions?api-version=1", {"messages": _user()}, {"X-Custom": "A"}
    )
    assert status == 200
    status, _, data = _raw(fake, "/v1/nowhere", {"a": 1})
    assert status == 404 and json.loads(data)["error"]["type"] == "invalid_request_error"
    status, _, data = _raw(fake, "/v1/nowhere", {"a": 1}, {"anthropic-version": "2023-06-01"})
    assert status == 404 and json.loads(data)["type"] == "error"
    status, _, data = _raw(fake, "/v1/messages", None)
    assert status == 400 and json.loads(data)["error"]["type"] == "invalid_request_error"

    first = fake.received[0]
    assert first.path == "/v1/chat/completions?api-version=1" and first.route == "/v1/chat/completions"
    assert first.headers["x-custom"] == "A" and first.json() == {"messages": _user()}
    assert [r.route for r in fake.received] == [
        "/v1/chat/completions",
        "/v1/nowhere",
        "/v1/nowhere",
        "/v1/messages",
    ]

    _, _, data = _raw(fake, "/_fake/received", None, method="GET")
    records = json.loads(data)
    assert len(records) == 4  # control calls are not recorded
    assert records[0]["path"] == first.path and json.loads(records[0]["body"]) == {"messages": _user()}
    assert records[0]["headers"]["x-custom"] == "A"

    _, _, data = _raw(fake, "/_fake/behaviour", {"reply": "remote", "delta_chars": "2"})
    assert json.loads(data)["reply"] == "remote" and fake.behaviour["delta_chars"] == 2
    assert _raw(fake, "/_fake/behaviour", {"bogus": 1})[0] == 400
    _raw(fake, "/_fake/behaviour", None, method="DELETE")
    assert fake.behaviour["reply"] is None
    assert json.loads(_raw(fake, "/_fake/health", None, method="GET")[2])["ok"] is True
    assert _raw(fake, "/_fake/clear", None)[0] == 200
    assert fake.received == []
    assert json.loads(_raw(fake, "/_fake/received", None, method="GET")[2]) == []


def test_keep_alive_chunked_request_and_wait_for(fake: FakeUpstream) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", fake.port, timeout=5)
    conn.request("POST", "/v1/chat/completions", json.dumps({"messages": _user("one")}))
    assert json.loads(conn.getresponse().read())["choices"][0]["message"]["content"] == ECHO_PREFIX + "one"
    sock = conn.sock
    body = json.dumps({"stream": True, "messages": _user("two")}).encode()
    conn.request("POST", "/v1/chat/completions", iter([body[:10], body[10:]]), encode_chunked=True)
    resp = conn.getresponse()
    assert resp.read().endswith(b"data: [DONE]\n\n")
    assert conn.sock is sock  # same connection
    conn.close()
    assert fake.received[1].json()["messages"] == _user("two")
    assert "chunked" in fake.received[1].headers["transfer-encoding"]

    threading.Timer(0.1, lambda: _raw(fake, "/v1/models", None, method="GET")).start()
    assert len(fake.wait_for(3, timeout=3)) == 3
    with pytest.raises(TimeoutError):
        fake.wait_for(9, timeout=0.05)


def test_concurrent_requests(fake: FakeUpstream) -> None:
    results: list[str] = []

    def call(i: int) -> None:
        oai = openai.OpenAI(base_url=fake.url + "/v1", api_key="k", max_retries=0, timeout=5)
        with oai.chat.completions.stream(
            model=OPENAI_MODEL, messages=_user(f"n{i}"), extra_headers={"x-fake-delay-ms": "5"}
        ) as s:
            results.append(s.get_final_completion().choices[0].message.content or "")

    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert sorted(results) == sorted(ECHO_PREFIX + f"n{i}" for i in range(8))
    assert time.monotonic() - start < 2


def test_command_line_serves_until_sigterm() -> None:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.fake_upstream",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--set",
            "reply=cli",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 10)
        assert ready, "no ready line"
        line = proc.stdout.readline().strip()
        assert line.startswith("fake upstream listening on http://127.0.0.1:")
        url = line.rsplit(" ", 1)[1]
        with urllib.request.urlopen(url + "/_fake/health", timeout=5) as resp:
            assert json.load(resp)["ok"] is True
        request = urllib.request.Request(
            url + "/v1/chat/completions", data=json.dumps({"messages": _user()}).encode(), method="POST"
        )
        with urllib.request.urlopen(request, timeout=5) as resp:
            assert json.load(resp)["choices"][0]["message"]["content"] == "cli"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
