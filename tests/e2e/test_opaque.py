"""Opaque provider fields resent every turn, end to end: no false refusals, no fixed-shape leak.

Agents resend the providers' opaque blobs on every turn: a Responses reasoning item's
`encrypted_content`, an Anthropic thinking block's `signature`, the APIs' ids. Random base64 spells
a short declared form (a name's 3- or 4-letter join, initials) now and then, and a refusal would
stick to the whole conversation. Through real Envoy: a corpus of 240 real-looking blobs (1-20 KB
of random base64, signatures, ids) resent with subjects whose names make short forms passes
byte for byte; an API key written into such a field is still redacted; a whole declared name
written there is still refused.
"""

from __future__ import annotations

import base64
import json
import random
from typing import Any

import pytest

from ext_proc.detect.subjects.header import encode_subject_header
from tests.support.e2e import request
from tests.support.fake_upstream import FakeUpstream
from tests.support.harness import RunningStack

pytestmark = pytest.mark.e2e

# Invented people whose names make short forms (joins of 2-letter tokens, initials).
SUBJECTS = encode_subject_header(
    {
        "ref": "opaque-1",
        "subjects": [
            {"names": ["Al Ng"]},
            {"names": ["Bo Wu"]},
            {"names": ["Jo Ann Lee"]},
            {"names": ["Ed Ox Ray"]},
        ],
    }
)
_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def blob(rng: random.Random, size: int, urlsafe: bool) -> str:
    raw = rng.randbytes(size)
    return (base64.urlsafe_b64encode(raw) if urlsafe else base64.b64encode(raw)).decode("ascii")


def ident(rng: random.Random, prefix: str, length: int) -> str:
    return prefix + "".join(rng.choice(_ALPHABET) for _ in range(length))


def responses_turn(rng: random.Random) -> dict[str, Any]:
    """A Responses request resending a reasoning item (encrypted) and a function call."""
    call = ident(rng, "call_", 24)
    return {
        "model": "o4-mini",
        "input": [
            {"role": "user", "content": "Summarise the ticket."},
            {
                "type": "reasoning",
                "id": ident(rng, "rs_", 48),
                "summary": [],
                "encrypted_content": "gAAAAA" + blob(rng, rng.randint(1_000, 20_000), urlsafe=True),
            },
            {
                "type": "function_call",
                "id": ident(rng, "fc_", 48),
                "call_id": call,
                "name": "lookup",
                "arguments": "{}",
            },
            {"type": "function_call_output", "call_id": call, "output": "no open tickets"},
        ],
    }


def messages_turn(rng: random.Random) -> dict[str, Any]:
    """An Anthropic request resending a thinking block (signed) and a tool use."""
    tool = ident(rng, "toolu_", 24)
    return {
        "model": "claude-sonnet-4-6",
        "max_tokens": 64,
        "messages": [
            {"role": "user", "content": "Summarise the ticket."},
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "thinking",
                        "thinking": "Look it up first.",
                        "signature": blob(rng, rng.randint(200, 2_000), urlsafe=False),
                    },
                    {"type": "tool_use", "id": tool, "name": "lookup", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": tool, "content": "no open tickets"}],
            },
        ],
    }


def send(stack: RunningStack, body: dict[str, Any]) -> int:
    path = "/v1/responses" if "input" in body else "/v1/messages"
    reply = request(
        stack.settings.listen_port, "POST", path, body, {"x-cordon-subject": SUBJECTS}, timeout=30
    )
    return reply.status


def test_opaque_blobs_resent_every_turn_are_never_refused(
    stack: RunningStack, upstream: FakeUpstream
) -> None:
    rng = random.Random(20261202)
    bodies = [responses_turn(rng) if n % 2 == 0 else messages_turn(rng) for n in range(240)]
    refused = [n for n, body in enumerate(bodies) if send(stack, body) != 200]
    assert not refused, f"{len(refused)} of {len(bodies)} refused: {refused[:10]}"
    received = upstream.received
    assert len(received) == len(bodies)
    # Forwarded byte for byte (as JSON): nothing in them was read as a value.
    for body, seen in zip(bodies, received, strict=True):
        assert json.loads(seen.body) == body


def test_a_fixed_shape_key_in_an_opaque_field_is_redacted(
    stack: RunningStack, upstream: FakeUpstream
) -> None:
    rng = random.Random(5)
    key = "sk-proj-" + "".join(rng.choice(_ALPHABET) for _ in range(48))
    body = responses_turn(rng)
    body["input"][1]["encrypted_content"] = "gAAAAA" + blob(rng, 2_000, urlsafe=True) + key
    assert send(stack, body) == 200
    [seen] = upstream.received
    assert key.encode() not in seen.body
    assert b"OPENAI_KEY" in seen.body


def test_a_declared_name_written_into_an_opaque_field_is_refused(
    stack: RunningStack, upstream: FakeUpstream
) -> None:
    rng = random.Random(6)
    body = messages_turn(rng)
    signature = body["messages"][1]["content"][0]["signature"]
    body["messages"][1]["content"][0]["signature"] = signature[:100] + "/JoAnnLee/" + signature[100:]
    assert send(stack, body) == 422
    assert upstream.received == []
