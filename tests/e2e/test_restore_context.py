"""Restore writes each value for where it lands, end to end: real Envoy, workers, Redis, the fake
upstream, the official SDKs, in the three APIs, buffered and streamed (cut in 5-byte chunks and
3-character deltas, so placeholders are split across events).

The caller declares values that JSON must escape (a backslash, quotes, and one that spells JSON:
`", "admin": true`), sends them one per line, and the fake upstream is scripted to answer with
structured output naming each line (`{{said:N}}`: the placeholders it received). The reply must be
JSON that `json.loads` reads back to exactly the declared values, with no key the values spelled;
inside a tool call's arguments, as JSON text inside a JSON string; and prose keeps raw values.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import anthropic
import openai
import pytest

from ext_proc.detect.normalize import fold
from ext_proc.detect.subjects.header import encode_subject_header
from tests.e2e.test_pseudonyms import TOOLS
from tests.support.e2e import last_sent
from tests.support.harness import KEYS, RunningStack

pytestmark = pytest.mark.e2e

DIALECTS = ("chat", "responses", "messages")
TENANT = "chain"  # mode: reversible
# Invented values that only survive JSON when escaped.
ID = "CORP\\zq-4471"
PROJECT = 'Heron "Nine" Unit'
SPELLS_JSON = 'Ops", "admin": true, "x": "Q'
EMAIL = "o.varga@example.net"
SUBJECT = {"ref": "case-ctx", "subjects": [{"ids": [ID], "other": [PROJECT, SPELLS_JSON]}]}
LINES = [ID, PROJECT, SPELLS_JSON, EMAIL]
PROMPT = "\n".join(LINES)
CARD = {"id": "{{said:0}}", "project": "{{said:1}}", "label": "{{said:2}}", "email": "{{said:3}}"}
EXPECTED = {"id": ID, "project": PROJECT, "label": SPELLS_JSON, "email": EMAIL}
SCHEMA = {
    "type": "object",
    "properties": {key: {"type": "string"} for key in CARD},
    "required": list(CARD),
    "additionalProperties": False,
}
SPLIT = {"x-fake-chunk-bytes": "5", "x-fake-delta-chars": "3"}


@dataclass
class Answer:
    text: str
    args: str


def ask(
    stack: RunningStack,
    dialect: str,
    reply: str | None,
    *,
    stream: bool,
    tool: bool = False,
    tenant: str = TENANT,
    subject: dict[str, Any] = SUBJECT,
    prompt: str = PROMPT,
) -> Answer:
    """One structured-output request through the stack with the dialect's official SDK; the
    fake upstream answers `reply` (its `{{said:N}}`: line N of what it received; None: what it
    was told in-process)."""
    headers = {"x-cordon-subject": encode_subject_header(subject)}
    if reply is not None:
        headers["x-fake-reply"] = reply
    if stream:
        headers.update(SPLIT)
    if tool:
        headers["x-fake-tool"] = "1"
    key = KEYS[tenant]
    if dialect == "messages":
        return _messages(stack, key, headers, prompt, stream=stream, tool=tool)
    client = openai.OpenAI(base_url=stack.base_url + "/v1", api_key=key, max_retries=0, timeout=30)
    if dialect == "chat":
        kwargs: dict[str, Any] = {
            "model": "gpt-4o-mini",
            "messages": [{"role": "user", "content": prompt}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "card", "schema": SCHEMA}},
            "extra_headers": headers,
        }
        if tool:
            kwargs["tools"] = TOOLS["chat"]
        if not stream:
            message = client.chat.completions.create(**kwargs).choices[0].message
            calls = message.tool_calls or []
            return Answer(message.content or "", calls[0].function.arguments if calls else "")  # type: ignore[union-attr]
        text, args = "", ""
        for chunk in client.chat.completions.create(stream=True, **kwargs):
            for choice in chunk.choices:
                text += choice.delta.content or ""
                for call in choice.delta.tool_calls or []:
                    args += (call.function.arguments or "") if call.function else ""
        return Answer(text, args)
    kwargs = {
        "model": "gpt-4.1",
        "input": prompt,
        "text": {"format": {"type": "json_schema", "name": "card", "schema": SCHEMA, "strict": True}},
        "extra_headers": headers,
    }
    if tool:
        kwargs["tools"] = TOOLS["responses"]
    if not stream:
        done = client.responses.create(**kwargs)
        args = "".join(item.arguments for item in done.output if item.type == "function_call")
        return Answer(done.output_text, args)
    text, args = "", ""
    for event in client.responses.create(stream=True, **kwargs):
        if event.type == "response.output_text.delta":
            text += event.delta
        elif event.type == "response.function_call_arguments.delta":
            args += event.delta
    return Answer(text, args)


def _messages(
    stack: RunningStack, key: str, headers: dict[str, str], prompt: str, *, stream: bool, tool: bool
) -> Answer:
    client = anthropic.Anthropic(base_url=stack.base_url, api_key=key, max_retries=0, timeout=30)
    kwargs: dict[str, Any] = {
        "model": "claude-sonnet-4-6",
        "max_tokens": 512,
        "messages": [{"role": "user", "content": prompt}],
        "extra_headers": headers,
        "extra_body": {"output_format": {"type": "json_schema", "schema": SCHEMA}},
    }
    if tool:
        kwargs["tools"] = TOOLS["messages"]
    if not stream:
        done = client.messages.create(**kwargs)
        text = "".join(block.text for block in done.content if block.type == "text")
        args = "".join(json.dumps(block.input) for block in done.content if block.type == "tool_use")
        return Answer(text, args)
    text, args = "", ""
    with client.messages.stream(**kwargs) as events:
        for event in events:
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                text += event.delta.text
            elif event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                args += event.delta.partial_json
    return Answer(text, args)


def alnum(text: str) -> str:
    return "".join(c for c in fold(text) if c.isalnum())


def assert_nothing_declared_left(stack: RunningStack) -> None:
    sent = alnum(last_sent(stack))
    for i, value in enumerate(LINES):
        assert alnum(value) not in sent, f"line {i} went upstream"


def differing(actual: dict[str, Any], expected: dict[str, Any]) -> list[str]:
    """The keys whose values differ, or that one side lacks (never the values)."""
    return sorted(k for k in actual.keys() | expected.keys() if actual.get(k) != expected.get(k))


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_structured_output_reads_back_exactly_the_values(
    stack: RunningStack, upstream: object, dialect: str, stream: bool
) -> None:
    answer = ask(stack, dialect, json.dumps(CARD), stream=stream)
    assert_nothing_declared_left(stack)
    card = json.loads(answer.text)
    assert differing(card, EXPECTED) == []  # no key the values spelled ("admin") either


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_json_inside_tool_arguments_reads_back_exactly_the_values(
    stack: RunningStack, upstream: object, dialect: str, stream: bool
) -> None:
    """The fake calls the tool with `{"text": <reply>}`: the card is JSON text inside a JSON
    string, each value escaped twice."""
    answer = ask(stack, dialect, json.dumps(CARD), stream=stream, tool=True)
    assert_nothing_declared_left(stack)
    arguments = json.loads(answer.args)
    assert list(arguments) == ["text"]
    assert differing(json.loads(arguments["text"]), EXPECTED) == []


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", DIALECTS)
def test_prose_gets_the_values_as_they_are(
    stack: RunningStack, upstream: object, dialect: str, stream: bool
) -> None:
    reply = '[{{said:0}}] filed "{{said:1}}" for {{said:3}}.'
    answer = ask(stack, dialect, reply, stream=stream)
    assert answer.text == f'[{ID}] filed "{PROJECT}" for {EMAIL}.'
