"""Key context end to end: real Envoy, ext_proc workers, Redis and the fake upstream.

A record (`{"ssn": …, "phone_number": …, "password": …}`) is read with its keys wherever it
travels, in each of the three APIs: pasted as JSON, inside prose, as tool-call arguments and tool
results (JSON inside strings, at depth), as metadata, as `key: value` and form-encoded text. The
bare SSN, the bare phone numbers and the secrets never reach the upstream; the reply puts them
back; properties of a value (`phone_type`, `max_tokens`, a tool's schema) are left alone. Strip
markers never merge two keys. The output gate reads a reply's JSON with its keys too.

Values are invented (555-01xx numbers, made-up passwords).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import openai
import pytest

from ext_proc.detect.subjects.header import encode_subject_header
from tests.support.e2e import PERSON, request
from tests.support.fake_upstream import FakeUpstream
from tests.support.harness import KEYS, RunningStack, running_stack
from tests.support.receipts import record_for, records

pytestmark = pytest.mark.e2e

CHAT, RESPONSES, MESSAGES = "/v1/chat/completions", "/v1/responses", "/v1/messages"
SSN = "531470286"
PHONE = "6175550186"
MOBILE = "2125550147"
PASSWORD = "tulip-Harbor-92"
TOKEN = "q8R2kLm4ZtX7"
VALUES = {"ssn": SSN, "phone": PHONE, "mobile": MOBILE, "password": PASSWORD, "token": TOKEN}
RECORD: dict[str, Any] = {
    "customer": {"ssn": SSN, "phone_number": PHONE, "mobile": int(MOBILE), "password": PASSWORD},
    "env": [{"name": "API_TOKEN", "value": TOKEN}],
    "max_tokens": 1000,
    "phone_type": "mobile",
}
TEXT_FORM = (
    f"phone_number: {PHONE}\nsocial_security_number={SSN}&password={PASSWORD}&tel={MOBILE}&api_token={TOKEN}"
)


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    with running_stack(
        tmp_path_factory.mktemp("structure"), tenants={"gate-deny": "outputGate: deny"}
    ) as stack:
        yield stack


@pytest.fixture
def fake(keyed: RunningStack) -> FakeUpstream:
    keyed.upstream.reset()
    return keyed.upstream


def everything(value: Any, out: list[str]) -> None:
    """Every string and number a reader of `value` sees, JSON inside strings parsed too."""
    if isinstance(value, str):
        out.append(value)
        try:
            inner = json.loads(value)
        except ValueError:
            return
        if isinstance(inner, (dict, list)):
            everything(inner, out)
    elif isinstance(value, dict):
        for key, item in value.items():
            out.append(key)
            everything(item, out)
    elif isinstance(value, list):
        for item in value:
            everything(item, out)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        out.append(str(value))


def left(body: bytes) -> list[str]:
    """The labels of VALUES present in `body`, as bytes or as any JSON reader sees it."""
    seen: list[str] = [body.decode("utf-8", "replace")]
    with contextlib.suppress(ValueError):
        everything(json.loads(body), seen)
    joined = "\n".join(seen)
    return [label for label, value in VALUES.items() if value in joined]


def chat_body(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "gpt-4o", "messages": list(messages), **extra}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def messages_body(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "claude-sonnet-4-6", "max_tokens": 32, "messages": list(messages), **extra}


ARGUMENTS = json.dumps({"query": json.dumps(RECORD)})  # JSON inside a string inside a string
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat-pasted-json": (CHAT, chat_body(user(json.dumps(RECORD)))),
    "chat-json-in-prose": (CHAT, chat_body(user(f"The record is {json.dumps(RECORD)}; file it."))),
    "chat-tool-call-and-result": (
        CHAT,
        chat_body(
            user("look it up"),
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "crm", "arguments": ARGUMENTS}}
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"result": RECORD})},
        ),
    ),
    "chat-metadata": (CHAT, chat_body(user("hi"), metadata={"record": json.dumps(RECORD)})),
    "chat-key-value-text": (CHAT, chat_body(user(TEXT_FORM))),
    "responses-pasted-json": (RESPONSES, {"model": "gpt-4.1", "input": json.dumps(RECORD)}),
    "responses-function-call-and-output": (
        RESPONSES,
        {
            "model": "gpt-4.1",
            "input": [
                {"role": "user", "content": "look it up"},
                {"type": "function_call", "call_id": "call_1", "name": "crm", "arguments": ARGUMENTS},
                {"type": "function_call_output", "call_id": "call_1", "output": json.dumps(RECORD)},
            ],
        },
    ),
    "responses-metadata": (
        RESPONSES,
        {"model": "gpt-4.1", "input": "hi", "metadata": {"record": json.dumps(RECORD)}},
    ),
    "responses-key-value-text": (RESPONSES, {"model": "gpt-4.1", "input": TEXT_FORM}),
    "messages-pasted-json": (MESSAGES, messages_body(user(json.dumps(RECORD)))),
    "messages-tool-use-and-result": (
        MESSAGES,
        messages_body(
            user("look it up"),
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "crm", "input": RECORD}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": json.dumps(RECORD)}],
            },
        ),
    ),
    "messages-json-in-prose": (MESSAGES, messages_body(user(f"Record: {json.dumps(RECORD)}"))),
    "messages-key-value-text": (MESSAGES, messages_body(user(TEXT_FORM))),
}


@pytest.mark.parametrize(("path", "body"), SHAPES.values(), ids=list(SHAPES))
def test_a_record_leaves_nothing_whatever_its_shape(
    keyed: RunningStack, fake: FakeUpstream, path: str, body: dict[str, Any]
) -> None:
    reply = request(keyed.settings.listen_port, "POST", path, body)
    assert reply.status == 200, reply.body
    assert left(fake.received[0].body) == []
    counts = record_for(keyed, "default", reply.headers["x-cordon-receipt"])["counts"]
    assert {"SSN", "PHONE", "SECRET_ASSIGNMENT"} <= set(counts)
    sent = fake.received[0].text()
    if "phone_type" in json.dumps(body):  # properties of a value travel as they are
        assert "phone_type" in sent and "mobile" in sent and "1000" in sent


def test_the_openai_sdk_gets_its_record_back(keyed: RunningStack, fake: FakeUpstream) -> None:
    client = openai.OpenAI(base_url=keyed.base_url + "/v1", api_key="sk-test-no-tenant", max_retries=0)
    reply = client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": json.dumps(RECORD)}]
    )
    assert left(fake.received[0].body) == []
    text = reply.choices[0].message.content or ""
    restored = [label for label, value in VALUES.items() if value in text]
    assert sorted(restored) == sorted(VALUES)  # the echo carried placeholders; the client sees values


def test_the_anthropic_sdk_tool_use_and_result(keyed: RunningStack, fake: FakeUpstream) -> None:
    client = anthropic.Anthropic(base_url=keyed.base_url, api_key="sk-test-no-tenant", max_retries=0)
    reply = client.messages.create(
        model="claude-sonnet-4-6",
        max_tokens=64,
        messages=[
            {"role": "user", "content": "look it up"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "crm", "input": RECORD}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": json.dumps(RECORD)}],
            },
        ],
    )
    assert left(fake.received[0].body) == []
    text = "".join(block.text for block in reply.content if block.type == "text")
    restored = [label for label, value in VALUES.items() if value in text]
    assert sorted(restored) == sorted(VALUES)


SCHEMA_TOOL = {
    "type": "function",
    "function": {
        "name": "login",
        "description": "Sign in with a password and a phone number.",
        "parameters": {
            "type": "object",
            "properties": {
                "password": {"type": "string", "description": "the user's password"},
                "phone_number": {"type": "string", "pattern": "^[0-9]{10}$"},
                "max_tokens": {"type": "integer", "default": 1000},
            },
            "required": ["password", "phone_number"],
        },
    },
}
HARMLESS: dict[str, tuple[str, dict[str, Any]]] = {
    "chat-tool-schema": (CHAT, chat_body(user("sign me in"), tools=[SCHEMA_TOOL])),
    "chat-properties-of-values": (
        CHAT,
        chat_body(
            user(json.dumps({"phone_type": "mobile", "token_count": 88, "password_hint": "first pet"}))
        ),
    ),
    "responses-non-values": (
        RESPONSES,
        {
            "model": "gpt-4.1",
            "input": json.dumps(
                {"password": "${DB_PASSWORD}", "api_key": "OPENAI_API_KEY", "auth": "oauth2"}
            ),
        },
    ),
    "messages-placeholders": (
        MESSAGES,
        messages_body(user(json.dumps({"password": "********", "token": None, "phone": "ask at the desk"}))),
    ),
}


@pytest.mark.parametrize(("path", "body"), HARMLESS.values(), ids=list(HARMLESS))
def test_what_is_no_value_travels_byte_for_byte(
    keyed: RunningStack, fake: FakeUpstream, path: str, body: dict[str, Any]
) -> None:
    raw = json.dumps(body, separators=(",", ":"))
    reply = request(keyed.settings.listen_port, "POST", path, raw)
    assert reply.status == 200, reply.body
    assert fake.received[0].body == raw.encode()


COLLIDING = {
    "contact ann@example.com": "first",
    "contact bob@example.com": "second",
    "contact cy@example.com": "third",
}
STRIP_SHAPES: dict[str, tuple[str, dict[str, Any], Callable[[Any], Any]]] = {
    "chat-metadata": (CHAT, chat_body(user("hi"), metadata=COLLIDING), lambda sent: sent["metadata"]),
    "responses-metadata": (
        RESPONSES,
        {"model": "gpt-4.1", "input": "hi", "metadata": COLLIDING},
        lambda s: s["metadata"],
    ),
    "messages-tool-use-input": (
        MESSAGES,
        messages_body(
            user("x"),
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": COLLIDING}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]},
        ),
        lambda s: s["messages"][1]["content"][0]["input"],
    ),
}


@pytest.mark.parametrize(("path", "body", "pick"), STRIP_SHAPES.values(), ids=list(STRIP_SHAPES))
def test_strip_markers_never_merge_two_keys(
    keyed: RunningStack, fake: FakeUpstream, path: str, body: dict[str, Any], pick: Callable[[Any], Any]
) -> None:
    headers = {"authorization": f"Bearer {KEYS['strip']}", "x-api-key": KEYS["strip"]}
    reply = request(keyed.settings.listen_port, "POST", path, body, headers)
    assert reply.status == 200, reply.body
    sent = pick(fake.received[0].json())
    assert sorted(sent.values()) == ["first", "second", "third"]
    assert sorted(sent) == ["contact [EMAIL]", "contact [EMAIL_2]", "contact [EMAIL_3]"]


def test_declared_identifiers_in_a_record_are_verified_gone(keyed: RunningStack, fake: FakeUpstream) -> None:
    record = {**RECORD, "person": {"name": PERSON["names"][0], "phone": PERSON["phones"][0]}}
    header = encode_subject_header({"ref": "keyed", "subjects": [PERSON]})
    body = chat_body(user(json.dumps({"rows": [json.dumps(record)]})))
    reply = request(keyed.settings.listen_port, "POST", CHAT, body, {"x-cordon-subject": header})
    assert reply.status == 200, reply.body
    sent = fake.received[0].text()
    assert left(fake.received[0].body) == [] and "Marisol" not in sent
    assert record_for(keyed, "default", reply.headers["x-cordon-receipt"])["egress"] == "verified"


def gate_call(stack: RunningStack, path: str, reply_text: str, *, stream: bool) -> tuple[int, bytes, str]:
    # The reply is set on the fake itself: a header would be read (and redacted) on the way out.
    stack.upstream.set_behaviour(reply=reply_text)
    headers = {
        "authorization": f"Bearer {KEYS['gate-deny']}",
        "x-api-key": KEYS["gate-deny"],
    }
    if path == MESSAGES:
        body: dict[str, Any] = messages_body(user("what is on file?"))
    elif path == RESPONSES:
        body = {"model": "gpt-4.1", "input": "what is on file?"}
    else:
        body = chat_body(user("what is on file?"))
    if stream:
        body["stream"] = True
        headers["x-fake-delta-chars"] = "5"
    reply = request(stack.settings.listen_port, "POST", path, body, headers)
    return reply.status, reply.body, reply.headers.get("x-cordon-receipt", "")


@pytest.mark.parametrize(
    ("reply_text", "kind"),
    [
        (json.dumps({"customer": {"phone_number": PHONE}}), "PHONE"),
        (json.dumps({"result": json.dumps({"ssn": SSN})}), "SSN"),  # JSON inside a string
        (json.dumps({"password": PASSWORD}), "SECRET_ASSIGNMENT"),
    ],
    ids=["phone", "ssn", "password"],
)
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", [CHAT, RESPONSES, MESSAGES])
def test_the_output_gate_reads_a_replys_json_with_its_keys(
    keyed: RunningStack, fake: FakeUpstream, path: str, stream: bool, reply_text: str, kind: str
) -> None:
    status, body, receipt = gate_call(keyed, path, reply_text, stream=stream)
    assert left(body) == []
    if stream:
        assert status == 200 and '"stage":"output"' in body.decode()
    else:
        assert status == 422 and json.loads(body)["error"]["stage"] == "output"
    found = [r for _, r, _ in records(keyed, "gate-deny") if r.get("exchange") == receipt]
    assert found and kind in found[0]["counts"]


@pytest.mark.parametrize("path", [CHAT, RESPONSES, MESSAGES])
def test_the_output_gate_leaves_properties_of_values_alone(
    keyed: RunningStack, fake: FakeUpstream, path: str
) -> None:
    reply_text = json.dumps(
        {"phone_type": "mobile", "max_tokens": 1000, "token_count": 88, "password": "********"}
    )
    status, body, _ = gate_call(keyed, path, reply_text, stream=False)
    assert status == 200, body
