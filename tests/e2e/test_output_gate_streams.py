"""The output gate under `deny` end to end, with an upstream that sends any bytes it likes.

Through real Envoy, ext_proc workers and Redis, the fake upstream answers with raw SSE bytes
(`set_behaviour(raw=[…])`, written chunk by chunk) scripted by tests/support/streams.py: catalog
values cut into 1-7 character deltas across events, blocks, parts and every delta channel of the
three APIs and the completions route, framed with `\\n`, `\\r\\n` or a bare `\\r`, ended normally,
without the terminal event or without the last blank line; and the edges a second review found:
text after the stream's end marker, invisible padding inside a value, a list-shaped Chat
`content`, a byte order mark before the first event, a Responses delta type without a schema,
and replies the gate cannot read. In every case the client gets the dialect's error (event) and
nothing recognisable before it (docs/output-gate.md says what may leave: an IBAN's country).
"""

from __future__ import annotations

import gzip
import json
import random
from collections.abc import Iterator
from typing import Any

import pytest

from tests.property.test_output_gate import (
    CATALOG,
    PATHS,
    TEXT_CHANNELS,
    VALUES,
    assert_refused_before_any_value,
    build,
)
from tests.support.e2e import request
from tests.support.harness import KEYS, RunningStack, running_stack
from tests.support.streams import ENDINGS, LINE_ENDINGS, client_texts, script

pytestmark = pytest.mark.e2e

KEY = KEYS["gate-deny"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    with running_stack(
        tmp_path_factory.mktemp("gate-streams"), tenants={"gate-deny": "outputGate: deny"}
    ) as s:
        yield s


def call(
    stack: RunningStack, dialect: str, raw: list[bytes], raw_type: str | None = "text/event-stream", **kw: Any
) -> tuple[int, bytes]:
    stack.upstream.set_behaviour(raw=raw, raw_type=raw_type, **kw)
    try:
        if dialect == "messages":
            body: dict[str, Any] = {
                "model": "claude-x",
                "max_tokens": 64,
                "stream": True,
                "messages": [{"role": "user", "content": "hi"}],
            }
            headers = {"x-api-key": KEY}
        elif dialect == "responses":
            body = {"model": "gpt-x", "stream": True, "input": "hi"}
            headers = {"authorization": f"Bearer {KEY}"}
        elif dialect == "completions":
            body = {"model": "gpt-x", "stream": True, "prompt": "hi"}
            headers = {"authorization": f"Bearer {KEY}"}
        else:
            body = {"model": "gpt-x", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            headers = {"authorization": f"Bearer {KEY}"}
        reply = request(stack.settings.listen_port, "POST", PATHS[dialect], body, headers, timeout=30)
        return reply.status, reply.body
    finally:
        stack.upstream.set_behaviour(raw=None, raw_type="text/event-stream")


def cut(data: bytes, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    out, at = [], 0
    while at < len(data):
        size = rng.randint(1, 7)
        out.append(data[at : at + size])
        at += size
    return out


def assert_refused_clean(body: bytes) -> None:
    texts, errored = client_texts(body)
    assert errored, "the stream did not end with the error event"
    for channel, text in texts.items():
        assert not CATALOG.detect(text), f"{channel}: the client got a value"


CASES = [
    (dialect, newline, ending, seed)
    for seed, (dialect, newline, ending) in enumerate(
        (d, n, e) for d in sorted(PATHS) for n in LINE_ENDINGS for e in ENDINGS
    )
]


@pytest.mark.parametrize(("dialect", "newline", "ending", "seed"), CASES)
def test_values_cut_anywhere_never_reach_the_client(
    stack: RunningStack, dialect: str, newline: str, ending: str, seed: int
) -> None:
    rng = random.Random(seed)
    kinds = rng.sample(sorted(VALUES), 2)
    pieces, _ = build(dialect, kinds, rng)
    status, body = call(stack, dialect, cut(script(dialect, pieces, newline=newline, ending=ending), seed))
    assert status == 200
    assert_refused_before_any_value(dialect, kinds, pieces, body)


@pytest.mark.parametrize("dialect", sorted(PATHS))
def test_text_after_the_end_marker_is_refused(stack: RunningStack, dialect: str) -> None:
    channel = TEXT_CHANNELS[dialect][0][0]
    card = VALUES["CREDIT_CARD"]
    raw = script(dialect, [(channel, f"card {card[:12]}")]) + script(
        dialect, [(channel, f"{card[12:]} end ")]
    )
    _, body = call(stack, dialect, cut(raw, 1))
    assert_refused_clean(body)


@pytest.mark.parametrize("dialect", ["chat", "messages", "responses"])
def test_invisible_padding_inside_a_value_is_read_through(stack: RunningStack, dialect: str) -> None:
    email = VALUES["EMAIL"]
    at = email.index("@")
    text = f"write to {email[:at]}{chr(0x200B) * 600}{email[at:]} today "
    channel = TEXT_CHANNELS[dialect][0][0]
    pieces = [(channel, text[i : i + 7]) for i in range(0, len(text), 7)]
    _, body = call(stack, dialect, cut(script(dialect, pieces), 2))
    assert_refused_clean(body)
    assert email[:at].encode() not in body


def test_list_shaped_chat_content_and_a_leading_bom_are_read(stack: RunningStack) -> None:
    card = VALUES["CREDIT_CARD"]
    text = f"card {card} end"
    base = {"id": "chatcmpl-l1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-x"}
    events = [
        {
            **base,
            "choices": [
                {
                    "index": 0,
                    "delta": {"content": [{"type": "text", "text": text[i : i + 5]}]},
                    "finish_reason": None,
                }
            ],
        }
        for i in range(0, len(text), 5)
    ]
    raw = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    _, body = call(stack, "chat", cut(b"\xef\xbb\xbf" + raw.encode(), 3))
    _, errored = client_texts(body.removeprefix(b"\xef\xbb\xbf"))
    assert errored
    assert card.replace(" ", "").encode() not in body.replace(b" ", b"")


def test_a_responses_delta_type_without_a_schema_is_read_across_events(stack: RunningStack) -> None:
    text = f"card {VALUES['CREDIT_CARD']} end"
    events = [
        {"type": "response.future_text.delta", "item_id": "it_1", "output_index": 0, "delta": text[i : i + 6]}
        for i in range(0, len(text), 6)
    ]
    events.append({"type": "response.completed", "response": {"id": "resp_1", "status": "completed"}})
    raw = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()
    _, body = call(stack, "responses", cut(raw, 4))
    _, errored = client_texts(body)
    assert errored


@pytest.mark.parametrize(
    ("raw_type", "encoding"),
    [
        ("application/json", "gzip"),
        ("application/x-ndjson", None),
        ("application/octet-stream", None),
        (None, None),
    ],
)
def test_a_reply_the_gate_cannot_read_is_refused(
    stack: RunningStack, raw_type: str | None, encoding: str | None
) -> None:
    payload = json.dumps(
        {"choices": [{"message": {"role": "assistant", "content": f"card {VALUES['CREDIT_CARD']}"}}]}
    ).encode()
    if encoding == "gzip":
        payload = gzip.compress(payload)
    status, body = call(stack, "chat", [payload], raw_type=raw_type, raw_encoding=encoding)
    assert status == 422, status
    assert VALUES["CREDIT_CARD"].encode() not in body
