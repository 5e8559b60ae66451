"""End to end with the official SDKs: real Envoy, real ext_proc workers, real Redis, fake upstream.

Every test asserts on what the fake upstream actually received (no catalog value in any field)
and on what the client got back (the exact original text, restored).
"""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from tests.support.e2e import SENTENCE, leaked
from tests.support.fake_upstream import FakeUpstream
from tests.support.harness import RunningStack

pytestmark = pytest.mark.e2e

ECHO = "You said: "


def oa(stack: RunningStack, **headers: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=stack.base_url + "/v1",
        api_key="sk-test-default",
        max_retries=0,
        timeout=20,
        default_headers=headers,
    )


def an(stack: RunningStack, **headers: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=stack.base_url,
        api_key="sk-ant-test-default",
        max_retries=0,
        timeout=20,
        default_headers=headers,
    )


def upstream_clean(stack: RunningStack, expected_requests: int = 1) -> None:
    received = stack.upstream.received
    assert len(received) == expected_requests
    for record in received:
        assert leaked(record.body) == [], f"leaked kinds at the upstream: {leaked(record.body)}"
        assert "x-cordon-subject" not in record.headers
        assert "accept-encoding" not in record.headers


def test_catalog_flags_every_sample() -> None:
    """Guard: the leak checks below only mean something if the catalog flags each sample."""
    from ext_proc.detect.catalog.engine import Catalog
    from tests.support.e2e import SAMPLES

    catalog = Catalog.for_sets(("pii", "pci", "secrets"))
    for kind, value in SAMPLES.items():
        findings = catalog.detect(f"value: {value} .")
        covering = [f for f in findings if f.start <= 7 and f.end >= 7 + len(value)]
        assert covering, f"the catalog does not flag the {kind} sample"


def test_chat_plain(stack: RunningStack, upstream: FakeUpstream) -> None:
    reply = oa(stack).chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": SENTENCE}]
    )
    assert reply.choices[0].message.content == ECHO + SENTENCE
    upstream_clean(stack)
    sent = upstream.received[0].json()["messages"][0]["content"]
    assert "<EMAIL_" in sent and "<CREDIT_CARD_" in sent


def test_chat_streamed_with_usage(stack: RunningStack, upstream: FakeUpstream) -> None:
    stream = oa(stack).chat.completions.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": SENTENCE}],
        stream=True,
        stream_options={"include_usage": True},
    )
    text, usage = [], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
    assert "".join(text) == ECHO + SENTENCE
    assert usage is not None and usage.total_tokens > 0
    upstream_clean(stack)


@pytest.mark.parametrize("chunk_bytes", [1, 7])
def test_chat_streamed_split_at_odd_places(
    stack: RunningStack, upstream: FakeUpstream, chunk_bytes: int
) -> None:
    client = oa(stack, **{"x-fake-chunk-bytes": str(chunk_bytes)})
    stream = client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": SENTENCE}], stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == ECHO + SENTENCE
    upstream_clean(stack)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "send_note",
            "description": "Send a note",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
        },
    }
]


def test_chat_tool_call_plain_and_streamed(stack: RunningStack, upstream: FakeUpstream) -> None:
    client = oa(stack, **{"x-fake-tool": "1"})
    messages = [{"role": "user", "content": SENTENCE}]
    reply = client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=TOOLS)
    call = reply.choices[0].message.tool_calls[0]
    assert json.loads(call.function.arguments)["text"] == ECHO + SENTENCE
    stream = client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=TOOLS, stream=True)
    arguments = []
    for chunk in stream:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                arguments.append(delta.function.arguments or "")
    assert json.loads("".join(arguments))["text"] == ECHO + SENTENCE
    upstream_clean(stack, 2)


def test_chat_history_with_tool_arguments_is_redacted(stack: RunningStack, upstream: FakeUpstream) -> None:
    args = json.dumps({"note": SENTENCE, "meta": {"cc": SENTENCE}})
    messages = [
        {"role": "system", "content": "Operator contact: " + SENTENCE},
        {"role": "user", "content": "hello"},
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "send_note", "arguments": args}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sent to " + SENTENCE},
    ]
    oa(stack).chat.completions.create(
        model="gpt-4o-mini", messages=messages, tools=TOOLS, metadata={"k": SENTENCE[:60]}
    )
    upstream_clean(stack)
    sent = upstream.received[0].json()
    forwarded_args = json.loads(sent["messages"][2]["tool_calls"][0]["function"]["arguments"])
    assert "<EMAIL_" in forwarded_args["note"] and "<EMAIL_" in forwarded_args["meta"]["cc"]
    assert sent["messages"][2]["tool_calls"][0]["function"]["name"] == "send_note"


def test_responses_plain_streamed_and_function_call(stack: RunningStack, upstream: FakeUpstream) -> None:
    client = oa(stack)
    reply = client.responses.create(model="gpt-4o-mini", input=SENTENCE, instructions="Be brief. " + SENTENCE)
    assert reply.output_text == ECHO + SENTENCE
    deltas = []
    with client.responses.stream(model="gpt-4o-mini", input=SENTENCE) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert "".join(deltas) == ECHO + SENTENCE
    assert final.output_text == ECHO + SENTENCE
    tools = [{"type": "function", "name": "send_note", "parameters": {"type": "object", "properties": {}}}]
    tool_client = oa(stack, **{"x-fake-tool": "1"})
    called = tool_client.responses.create(model="gpt-4o-mini", input=SENTENCE, tools=tools)
    calls = [item for item in called.output if item.type == "function_call"]
    assert json.loads(calls[0].arguments)["text"] == ECHO + SENTENCE
    upstream_clean(stack, 3)


def test_responses_input_items_of_every_shape_are_redacted(
    stack: RunningStack, upstream: FakeUpstream
) -> None:
    body_input = [
        {"role": "user", "content": [{"type": "input_text", "text": SENTENCE}]},
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "send_note",
            "arguments": json.dumps({"to": SENTENCE}),
        },
        {
            "type": "function_call_output",
            "call_id": "c1",
            "output": [{"type": "input_text", "text": SENTENCE}],
        },
        {"type": "custom_tool_call", "call_id": "c2", "name": "shell", "input": SENTENCE},
        {"type": "custom_tool_call_output", "call_id": "c2", "output": SENTENCE},
        {"type": "local_shell_call_output", "id": "ls1", "output": SENTENCE},
        {"type": "an_item_type_from_the_future", "payload": {"deep": [SENTENCE]}},
    ]
    oa(stack).responses.create(
        model="gpt-4o-mini",
        input=body_input,  # type: ignore[arg-type]
        prompt={"id": "pmpt_1", "variables": {"customer": SENTENCE, SENTENCE[:20]: "x"}},  # type: ignore[typeddict-item]
        tools=[{"type": "custom", "name": "shell", "description": "runs for " + SENTENCE}],  # type: ignore[list-item]
    )
    upstream_clean(stack)


def test_anthropic_plain_streamed_tool_and_thinking(stack: RunningStack, upstream: FakeUpstream) -> None:
    client = an(stack)
    messages = [{"role": "user", "content": SENTENCE}]
    reply = client.messages.create(
        model="claude-sonnet-4-6", max_tokens=256, messages=messages, system=SENTENCE
    )
    assert reply.content[0].text == ECHO + SENTENCE
    with client.messages.stream(model="claude-sonnet-4-6", max_tokens=256, messages=messages) as stream:
        streamed = "".join(stream.text_stream)
    assert streamed == ECHO + SENTENCE
    tool = {"name": "send_note", "description": "d", "input_schema": {"type": "object", "properties": {}}}
    tool_client = an(stack, **{"x-fake-tool": "1", "x-fake-thinking": "1"})
    with tool_client.messages.stream(
        model="claude-sonnet-4-6", max_tokens=256, messages=messages, tools=[tool]
    ) as stream:
        final = stream.get_final_message()
    by_type = {block.type: block for block in final.content}
    assert by_type["tool_use"].input["text"] == ECHO + SENTENCE
    assert SENTENCE in by_type["thinking"].thinking
    plain = tool_client.messages.create(
        model="claude-sonnet-4-6", max_tokens=256, messages=messages, tools=[tool]
    )
    assert next(b for b in plain.content if b.type == "tool_use").input["text"] == ECHO + SENTENCE
    count = client.messages.count_tokens(model="claude-sonnet-4-6", messages=messages)
    assert count.input_tokens > 0
    upstream_clean(stack, 5)


def test_anthropic_tool_result_history_is_redacted(stack: RunningStack, upstream: FakeUpstream) -> None:
    messages = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": SENTENCE}}],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": SENTENCE}],
                },
                {
                    "type": "document",
                    "source": {"type": "text", "media_type": "text/plain", "data": SENTENCE},
                },
            ],
        },
    ]
    an(stack).messages.create(
        model="claude-sonnet-4-6",
        max_tokens=64,
        messages=messages,
        metadata={"user_id": "u-" + SENTENCE[:40]},
    )
    upstream_clean(stack)


def test_escaped_brackets_from_the_provider_are_restored(stack: RunningStack, upstream: FakeUpstream) -> None:
    client = oa(stack, **{"x-fake-escape-brackets": "1"})
    reply = client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": SENTENCE}]
    )
    assert reply.choices[0].message.content == ECHO + SENTENCE
    stream = client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": SENTENCE}], stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == ECHO + SENTENCE


def test_a_placeholder_typed_by_the_user_is_left_alone(stack: RunningStack, upstream: FakeUpstream) -> None:
    lookalike = "keep <EMAIL_0123abcd_1> and <EMAIL_1> as typed; mail " + "jane.roe@example.com"
    reply = oa(stack).chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": lookalike}]
    )
    assert reply.choices[0].message.content == ECHO + lookalike
    sent = upstream.received[0].json()["messages"][0]["content"]
    assert "<EMAIL_0123abcd_1>" in sent and "<EMAIL_1>" in sent


def test_tls_listener(stack: RunningStack, upstream: FakeUpstream) -> None:
    import ssl

    context = ssl.create_default_context(cafile=str(stack.ca_file))
    http_client = openai.DefaultHttpx2Client(verify=context)
    client = openai.OpenAI(
        base_url=stack.tls_url + "/v1", api_key="sk-x", max_retries=0, http_client=http_client
    )
    reply = client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": SENTENCE}]
    )
    assert reply.choices[0].message.content == ECHO + SENTENCE
    upstream_clean(stack)
