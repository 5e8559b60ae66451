"""Declared subjects end to end: every rendering replaced upstream, restored for the client, and
any survivor refused by the egress check with 422 before the upstream is called.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import unquote

import openai
import pytest

from ext_proc.detect.normalize import fold
from ext_proc.detect.subjects.header import encode_subject_header
from tests.support.e2e import PERSON, chat_body, request
from tests.support.fake_upstream import FakeUpstream
from tests.support.harness import KEYS, RunningStack

pytestmark = pytest.mark.e2e

HEADER = encode_subject_header({"ref": "case-4411", "subjects": [PERSON]})
# The alphanumeric cores that must not appear in any string or key the upstream receives.
CORES = [
    "marisol", "quinterovance", "vancequintero", "mqexamplecom", "4045550187", "1428elm",
    "a1234567", "mqvance77", "projectbluebird", "19860714", "14071986", "07141986", "july141986",
]  # fmt: skip

RENDERINGS = (
    "Marisol Quintero-Vance called. Quintero-Vance, Marisol again; M. Quintero-Vance; "
    "mail MQ@Example.com, phone (404) 555-0187 or +1 404 555 0187, she lives at 1428 Elm St, "
    "born July 14, 1986 (14/07/1986), id A-123-4567, handle mqvance77, on Project Bluebird."
)


def cores_in(body: bytes) -> list[str]:
    """Which identifier cores appear in any string or key of a JSON body (never the values)."""
    found: set[str] = set()

    def visit(value: Any) -> None:
        if isinstance(value, str):
            alnum = "".join(c for c in fold(value) if c.isalnum())
            found.update(core for core in CORES if core in alnum)
            try:
                inner = json.loads(value)
            except ValueError:
                return
            if isinstance(inner, (dict, list)):
                visit(inner)
        elif isinstance(value, dict):
            for key, item in value.items():
                visit(key)
                visit(item)
        elif isinstance(value, list):
            for item in value:
                visit(item)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            visit(str(value))

    visit(json.loads(body))
    return sorted(found)


def port(stack: RunningStack) -> int:
    return stack.settings.listen_port


def subject_headers(**extra: str) -> dict[str, str]:
    return {"x-cordon-subject": HEADER, **extra}


def test_every_rendering_is_replaced_and_restored(stack: RunningStack, upstream: FakeUpstream) -> None:
    client = openai.OpenAI(
        base_url=stack.base_url + "/v1", api_key="sk-x", max_retries=0, default_headers=subject_headers()
    )
    reply = client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": RENDERINGS}]
    )
    assert reply.choices[0].message.content == "You said: " + RENDERINGS
    record = upstream.received[0]
    assert cores_in(record.body) == []
    assert "x-cordon-subject" not in record.headers
    sent = record.json()["messages"][0]["content"]
    assert "<SUBJECT1_NAME_" in sent and "<SUBJECT1_PHONE_" in sent
    stream = client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": RENDERINGS}], stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "You said: " + RENDERINGS
    assert cores_in(upstream.received[1].body) == []


def test_identifiers_in_keys_metadata_tools_and_numbers_are_replaced(
    stack: RunningStack, upstream: FakeUpstream
) -> None:
    body = chat_body("hello")
    body["metadata"] = {"Marisol Quintero-Vance": "customer", "phone": 4045550187, "f": 4.045550187e9}
    body["tools"] = [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "description": "Looks up mq@example.com",
                "parameters": {"type": "object", "properties": {"mqvance77": {"type": "string"}}},
            },
        }
    ]
    body["messages"].append(
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {
                        "name": "lookup",
                        "arguments": json.dumps({"who": {"n": "Quintero-Vance M."}}),
                    },
                }
            ],
        }
    )
    reply = request(port(stack), "POST", "/v1/chat/completions", body, subject_headers())
    assert reply.status == 200, reply.body
    assert cores_in(upstream.received[0].body) == []


def test_anthropic_and_responses_with_subjects(stack: RunningStack, upstream: FakeUpstream) -> None:
    messages_body = {
        "model": "claude-sonnet-4-6",
        "max_tokens": 64,
        "system": "Case of Marisol Quintero-Vance",
        "messages": [
            {"role": "user", "content": RENDERINGS},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"q": "A1234567"}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "mq@example.com"}],
            },
        ],
    }
    reply = request(port(stack), "POST", "/v1/messages", messages_body, subject_headers())
    assert reply.status == 200, reply.body
    assert reply.json()["content"][0]["text"].startswith("You said: ")
    responses_body = {
        "model": "gpt-4o-mini",
        "instructions": "About Marisol",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": RENDERINGS}]},
            {"type": "some_future_item", "data": {"who": "mqvance77"}},
        ],
        "prompt": {"id": "p", "variables": {"name": "Marisol Quintero-Vance"}},
    }
    reply = request(port(stack), "POST", "/v1/responses", responses_body, subject_headers())
    assert reply.status == 200, reply.body
    for record in upstream.received:
        assert cores_in(record.body) == []


@pytest.mark.parametrize(
    "header",
    [
        "",
        "not base64 !!!",
        "e30",  # {}
        encode_subject_header({"subjects": []}),
        encode_subject_header({"subjects": [{}]}),
        encode_subject_header({"subjects": [{"names": ["Marisol"], "nicknames": ["Mari"]}]}),
        encode_subject_header({"subjects": [{"names": "Marisol"}]}),
        encode_subject_header({"subjects": [{"names": ["x" * 300]}]}),
        encode_subject_header({"subjects": [{"names": ["a"]}] * 9}),
        encode_subject_header({"subjects": [{"names": ["Marisol"]}], "media": "sometimes"}),
        encode_subject_header({"subjects": [{"phones": ["not a phone"]}]}),
    ],
)
@pytest.mark.parametrize(
    ("path", "shape"), [("/v1/chat/completions", "openai"), ("/v1/messages", "anthropic")]
)
def test_malformed_headers_are_400_without_upstream_call(
    stack: RunningStack, upstream: FakeUpstream, header: str, path: str, shape: str
) -> None:
    reply = request(port(stack), "POST", path, chat_body("hello Marisol"), {"x-cordon-subject": header})
    assert reply.status == 400, reply.body
    error = reply.json()["error"]
    assert "X-Cordon-Subject" in error["message"]
    if shape == "anthropic":
        assert reply.json()["type"] == "error"
    assert "Marisol" not in reply.body.decode() and "x" * 50 not in reply.body.decode()
    assert upstream.received == []


def test_system_prompt_left_by_policy_is_refused_by_egress(
    stack: RunningStack, upstream: FakeUpstream
) -> None:
    body = chat_body("hello")
    body["messages"].insert(0, {"role": "system", "content": "Customer: Marisol Quintero-Vance"})
    reply = request(
        port(stack),
        "POST",
        "/v1/chat/completions",
        body,
        subject_headers(authorization=f"Bearer {KEYS['nosystem']}"),
    )
    assert reply.status == 422
    error = reply.json()["error"]
    assert error["stage"] == "egress" and error["kind"] == "SUBJECT1_NAME"
    assert "Marisol" not in reply.body.decode()
    assert upstream.received == []


def test_a_number_that_hides_a_phone_is_refused(stack: RunningStack, upstream: FakeUpstream) -> None:
    body = '{"model": "m", "messages": [{"role": "user", "content": "hi"}], "metadata": {"x": NUMBER}}'
    raw = body.replace("NUMBER", "4.0455501870001e9")  # a float, so the walk does not read it as text
    reply = request(port(stack), "POST", "/v1/chat/completions", raw, subject_headers())
    assert reply.status == 422 and reply.json()["error"]["kind"] == "SUBJECT1_PHONE"
    assert upstream.received == []


def test_subject_request_to_mode_off_is_refused(stack: RunningStack, upstream: FakeUpstream) -> None:
    reply = request(
        port(stack),
        "POST",
        "/v1/chat/completions",
        chat_body("hi"),
        subject_headers(authorization=f"Bearer {KEYS['mode-off']}"),
    )
    assert reply.status == 422 and reply.json()["error"]["stage"] == "policy"
    assert upstream.received == []


def test_require_subject(stack: RunningStack, upstream: FakeUpstream) -> None:
    auth = {"authorization": f"Bearer {KEYS['require']}"}
    reply = request(port(stack), "POST", "/v1/chat/completions", chat_body("hi"), auth)
    assert reply.status == 400 and reply.json()["error"]["code"] == "subject_required"
    assert upstream.received == []
    reply = request(
        port(stack), "POST", "/v1/chat/completions", chat_body("hi"), {**auth, "x-cordon-subject": HEADER}
    )
    assert reply.status == 200


PNG_URL = "data:image/png;base64,iVBORw0KGgo="
IMAGES = {
    "documented": {"type": "image_url", "image_url": {"url": PNG_URL}},
    # Shapes OpenAI-compatible servers accept too: the URL as a string, a part without `type`.
    "url-as-a-string": {"type": "image_url", "image_url": PNG_URL},
    "without-type": {"image_url": {"url": PNG_URL}},
}


@pytest.mark.parametrize("image", IMAGES.values(), ids=list(IMAGES))
def test_media_is_blocked_by_default_and_allowed_by_policy(
    stack: RunningStack, upstream: FakeUpstream, image: dict[str, Any]
) -> None:
    body = chat_body("hi")
    body["messages"][0]["content"] = [{"type": "text", "text": "look"}, image]
    reply = request(port(stack), "POST", "/v1/chat/completions", body, subject_headers())
    assert reply.status == 422 and reply.json()["error"]["stage"] == "media"
    assert upstream.received == []
    allowed = subject_headers(authorization=f"Bearer {KEYS['allow-media']}")
    assert request(port(stack), "POST", "/v1/chat/completions", body, allowed).status == 200
    tightened = {
        **allowed,
        "x-cordon-subject": encode_subject_header({"media": "block", "subjects": [PERSON]}),
    }
    reply = request(port(stack), "POST", "/v1/chat/completions", body, tightened)
    assert reply.status == 422 and reply.json()["error"]["stage"] == "media"
    assert len(upstream.received) == 1


def test_identifier_in_the_query_string_is_rewritten(stack: RunningStack, upstream: FakeUpstream) -> None:
    """Read decoded, like a body string, and written back percent-encoded (a path segment, which
    redaction cannot rewrite, is refused: e2e/test_edges.py)."""
    for query in ("owner=mq%40example.com", "owner=mqvance77", "q=Marisol%20Quintero%2DVance"):
        reply = request(port(stack), "GET", "/v1/models?" + query, None, subject_headers())
        assert reply.status == 200, query
    for n, record in enumerate(upstream.received):
        alnum = "".join(c for c in fold(unquote(record.path)) if c.isalnum())
        assert [core for core in CORES if core in alnum] == [], f"query {n}"
        assert "%3CSUBJECT1_" in record.path
    assert request(port(stack), "GET", "/v1/models?limit=5", None, subject_headers()).status == 200
    assert upstream.received[-1].path == "/v1/models?limit=5"
