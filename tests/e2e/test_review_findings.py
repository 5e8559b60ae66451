"""Review findings: suspected leak paths, each proved (xfail strict: a real hole) or dismissed.

Every value here is invented. Assertion messages name kinds and labels, never a value. End-to-end
tests use the session stack of tests/conftest.py (real Envoy, ext_proc workers, Redis, fake
upstream) and read what the fake upstream received.
"""

from __future__ import annotations

import base64
import http.client
import json
from typing import Any

import pytest

from ext_proc.detect.subjects.header import encode_subject_header, parse_subject_header
from ext_proc.detect.subjects.matcher import compile_subjects
from ext_proc.dialects import DIALECTS
from ext_proc.transform.egress import check_body
from tests.support.e2e import PERSON, SAMPLES, SENTENCE, chat_body, leaked, request
from tests.support.fake_upstream import FakeUpstream
from tests.support.harness import KEYS, RunningStack

pytestmark = pytest.mark.e2e

HEADER = encode_subject_header({"ref": "case-review", "subjects": [PERSON]})
# A 1x1 PNG: media bytes whose content the media policy (not the text walk) must judge.
PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
    )
).decode()
DATA_IMAGE = "data:image/png;base64," + PNG
# The phone 404-555-0187 written as an exponent literal whose expansion ends in ".0".
PHONE_LITERAL = "40455501870e-1"


def port(stack: RunningStack) -> int:
    return stack.settings.listen_port


def reached(upstream: FakeUpstream) -> int:
    """How many requests the upstream received (a count: assertions never show a body)."""
    return len(upstream.received)


def outcome(reply: Any) -> tuple[int, str | None]:
    """(status, refusal stage or None): what a test may show of a reply."""
    stage = reply.headers.get("x-cordon-stage")
    return reply.status, stage


def subject_headers(**extra: str) -> dict[str, str]:
    return {"x-cordon-subject": HEADER, **extra}


def compiled() -> Any:
    return compile_subjects(parse_subject_header(HEADER))


# --- egress: object keys are read with less care than string values -----------------------------


@pytest.mark.parametrize(
    "key",
    [
        pytest.param(PHONE_LITERAL, id="number-literal-in-key"),
        pytest.param('{"p": ' + PHONE_LITERAL + "}", id="json-with-number-in-key"),
    ],
)
def test_value_reading_of_the_same_text_is_caught(key: str) -> None:
    """Dismissal half: as a string *value*, egress expands the literal and parses the JSON."""
    body = json.dumps({"model": "m", "metadata": {"k": key}}).encode()
    hit = check_body(body, DIALECTS["chat"], compiled())
    assert hit is not None and hit.label == "SUBJECT1_PHONE"


@pytest.mark.parametrize(
    "key",
    [
        pytest.param(PHONE_LITERAL, id="number-literal-in-key"),
        pytest.param('{"p": ' + PHONE_LITERAL + "}", id="json-with-number-in-key"),
    ],
)
def test_identifier_in_an_object_key_literal_is_refused(
    stack: RunningStack, upstream: FakeUpstream, key: str
) -> None:
    body = chat_body("hello", metadata={key: "x"})
    reply = request(port(stack), "POST", "/v1/chat/completions", body, subject_headers())
    assert reached(upstream) == 0, "a declared PHONE in an object key reached the upstream"
    assert outcome(reply) == (422, "egress")


# --- media policy: media outside the positions one dialect knows is never counted ---------------

MEDIA_BYPASSES = [
    pytest.param(
        "/v1/responses",
        {
            "model": "gpt-4o-mini",
            "input": [
                {"type": "custom_tool_call", "call_id": "c1", "name": "shot", "input": "take it"},
                {
                    "type": "custom_tool_call_output",
                    "call_id": "c1",
                    "output": [{"type": "input_image", "image_url": DATA_IMAGE}],
                },
            ],
        },
        id="responses-custom_tool_call_output-image",
    ),
    pytest.param(
        "/v1/responses",
        {
            "model": "gpt-4o-mini",
            "prompt": {
                "id": "pmpt_1",
                "variables": {"scan": {"type": "input_image", "image_url": DATA_IMAGE}},
            },
            "input": "describe the scan",
        },
        id="responses-prompt-variable-image",
    ),
    pytest.param(
        "/v1/responses/input_tokens",
        {
            "model": "gpt-4o-mini",
            "input": [{"role": "user", "content": [{"type": "input_image", "image_url": DATA_IMAGE}]}],
        },
        id="responses-input_tokens-image",
    ),
    pytest.param(
        "/v1/messages/batches",
        {
            "requests": [
                {
                    "custom_id": "r1",
                    "params": {
                        "model": "claude-sonnet-4-6",
                        "max_tokens": 16,
                        "messages": [
                            {
                                "role": "user",
                                "content": [
                                    {
                                        "type": "image",
                                        "source": {"type": "base64", "media_type": "image/png", "data": PNG},
                                    }
                                ],
                            }
                        ],
                    },
                }
            ]
        },
        id="anthropic-message-batches-image",
    ),
]


def test_media_at_a_known_position_is_blocked(stack: RunningStack, upstream: FakeUpstream) -> None:
    """Dismissal half: the same image in a Responses message is refused (media: block)."""
    body = {
        "model": "gpt-4o-mini",
        "input": [{"role": "user", "content": [{"type": "input_image", "image_url": DATA_IMAGE}]}],
    }
    reply = request(port(stack), "POST", "/v1/responses", body, subject_headers())
    assert outcome(reply) == (422, "media")
    assert reached(upstream) == 0


@pytest.mark.parametrize(("path", "body"), MEDIA_BYPASSES)
def test_media_outside_known_positions_is_blocked(
    stack: RunningStack, upstream: FakeUpstream, path: str, body: dict[str, Any]
) -> None:
    reply = request(port(stack), "POST", path, body, subject_headers())
    assert reached(upstream) == 0, "an image left in a subject request under media: block"
    assert outcome(reply) == (422, "media")


# --- data: URLs at media positions that carry text, not media ----------------------------------


def test_text_data_url_in_an_image_part_is_redacted(stack: RunningStack, upstream: FakeUpstream) -> None:
    body = chat_body("see attachment")
    url = "data:text/plain," + SAMPLES["EMAIL"] + " " + SAMPLES["SSN"]
    body["messages"][0]["content"] = [
        {"type": "text", "text": "see"},
        {"type": "image_url", "image_url": {"url": url}},
    ]
    request(port(stack), "POST", "/v1/chat/completions", body)
    assert reached(upstream) == 1
    kinds = leaked(upstream.received[0].body)
    assert kinds == [], f"kinds {kinds}"


def test_text_data_url_with_a_declared_identifier_is_read_as_text_under_allow(
    stack: RunningStack, upstream: FakeUpstream
) -> None:
    """A data: URL that carries text is text: the declared email in it is redacted, not skipped."""
    body = chat_body("see attachment")
    body["messages"][0]["content"] = [
        {"type": "text", "text": "see"},
        {"type": "image_url", "image_url": {"url": "data:text/plain,owner mq@example.com"}},
    ]
    headers = subject_headers(authorization=f"Bearer {KEYS['allow-media']}")
    reply = request(port(stack), "POST", "/v1/chat/completions", body, headers)
    assert outcome(reply) == (200, None)
    assert reached(upstream) == 1
    url = upstream.received[0].json()["messages"][0]["content"][1]["image_url"]["url"]
    assert "mq@example" not in url.lower(), "a declared EMAIL in a text data: URL reached the upstream"
    assert "<SUBJECT1_EMAIL_" in url


# --- headers other than the filter's own are read too ---------------------------------------------


def test_declared_identifier_in_a_header_never_reaches_the_upstream(
    stack: RunningStack, upstream: FakeUpstream
) -> None:
    """Rewritten like a body string (e2e/test_edges.py has the header cases redaction cannot take)."""
    headers = subject_headers(**{"x-end-user": "mq@example.com"})
    reply = request(port(stack), "POST", "/v1/chat/completions", chat_body("hello"), headers)
    assert outcome(reply) == (200, None)
    sent = upstream.received[0].headers["x-end-user"]
    assert "mq@example" not in sent.lower(), "a declared EMAIL in a request header reached the upstream"
    assert sent.startswith("<SUBJECT1_EMAIL_")


# --- JSON inside strings: duplicate keys make the walk fall back to raw text --------------------


def test_duplicate_keys_inside_tool_arguments_are_not_a_way_around_the_catalog(
    stack: RunningStack, upstream: FakeUpstream
) -> None:
    local, domain = SAMPLES["EMAIL"].split("@")
    arguments = '{"to":"' + local + "\\u0040" + domain + '","to":"x"}'
    body = chat_body("send it")
    body["messages"].append(
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "send", "arguments": arguments}}
            ],
        }
    )
    reply = request(port(stack), "POST", "/v1/chat/completions", body)
    for record in upstream.received:
        sent = record.json()["messages"][1]["tool_calls"][0]["function"]["arguments"]
        first_wins = json.loads(sent, object_pairs_hook=lambda pairs: dict(reversed(pairs)))
        kinds = leaked(json.dumps(first_wins, ensure_ascii=False))
        assert kinds == [], f"kinds {kinds} in the decoded tool arguments"
    assert outcome(reply)[0] >= 400 or reached(upstream) == 1


# --- numbers: a huge exponent becomes a non-JSON token when the body is re-serialised -----------


def test_a_number_no_float_can_hold_is_refused_not_rewritten(
    stack: RunningStack, upstream: FakeUpstream
) -> None:
    """1E400 would be re-serialised as the non-JSON token Infinity: the body is refused instead."""
    raw = json.dumps(chat_body(SENTENCE))[:-1] + ', "metadata": {"big": 1E400}}'
    reply = request(port(stack), "POST", "/v1/chat/completions", raw)
    assert outcome(reply) == (400, "request")
    assert reached(upstream) == 0


# --- dismissed suspicions that add coverage ----------------------------------------------------


def test_two_subject_headers_are_400_not_a_partial_reading(
    stack: RunningStack, upstream: FakeUpstream
) -> None:
    other = encode_subject_header({"subjects": [{"names": ["Orrin Blackwood-Tate"]}]})
    connection_headers = [("x-cordon-subject", HEADER), ("X-Cordon-Subject", other)]
    connection = http.client.HTTPConnection("127.0.0.1", port(stack), timeout=15)
    try:
        connection.putrequest("POST", "/v1/chat/completions")
        body = json.dumps(chat_body("Marisol Quintero-Vance and Orrin Blackwood-Tate")).encode()
        connection.putheader("content-type", "application/json")
        connection.putheader("content-length", str(len(body)))
        for name, value in connection_headers:
            connection.putheader(name, value)
        connection.endheaders(body)
        response = connection.getresponse()
        status, payload = response.status, response.read()
    finally:
        connection.close()
    assert status == 400, status
    echoed = b"Marisol" in payload or b"Orrin" in payload
    assert not echoed, "the refusal echoed a declared NAME"
    assert reached(upstream) == 0


def test_lone_surrogate_with_a_redaction_never_goes_upstream(
    stack: RunningStack, upstream: FakeUpstream
) -> None:
    """A lone surrogate cannot be encoded once the body is rewritten: a clear 400, no upstream call."""
    raw = json.dumps(chat_body(SENTENCE))[:-1] + ', "metadata": {"s": "\\ud800"}}'
    no_subject = request(port(stack), "POST", "/v1/chat/completions", raw)
    with_subject = request(port(stack), "POST", "/v1/chat/completions", raw, subject_headers())
    assert outcome(no_subject) == (400, "request")
    assert outcome(with_subject) == (400, "request")
    assert reached(upstream) == 0


def test_subject_header_with_json_body_on_get_is_read(stack: RunningStack, upstream: FakeUpstream) -> None:
    """A body on a GET is buffered and read like any other: the declared phone is replaced."""
    body = chat_body("call +1 404 555 0187")
    reply = request(port(stack), "GET", "/v1/chat/completions", body, subject_headers())
    survived = ["5550187" in record.body.decode() for record in upstream.received]
    assert not any(survived), "a declared PHONE reached the upstream"
    assert outcome(reply)[0] < 500


def test_chunked_body_with_expect_continue_is_read(stack: RunningStack, upstream: FakeUpstream) -> None:
    """Transfer-encoding: chunked plus expect: 100-continue is buffered and redacted like any body."""
    payload = json.dumps(chat_body(SENTENCE)).encode()
    connection = http.client.HTTPConnection("127.0.0.1", port(stack), timeout=15)
    try:
        connection.putrequest("POST", "/v1/chat/completions")
        connection.putheader("content-type", "text/plain")  # a lie: the body is JSON anyway
        connection.putheader("transfer-encoding", "chunked")
        connection.putheader("expect", "100-continue")
        connection.endheaders()
        for start in range(0, len(payload), 37):
            piece = payload[start : start + 37]
            connection.send(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
        connection.send(b"0\r\n\r\n")
        response = connection.getresponse()
        response.read()
    finally:
        connection.close()
    assert reached(upstream) == 1
    kinds = leaked(upstream.received[0].body)
    assert kinds == [], f"kinds {kinds}"


# --- second review (issue 4): found by a helper, each fixed ----------------------------------


def test_a_ref_with_a_lone_surrogate_is_a_400(stack: RunningStack, upstream: FakeUpstream) -> None:
    """`"\\ud800"` is valid JSON but no text: it cannot be HMACed; it used to end in a 500."""
    text = '{"ref":"case-\\ud800","subjects":[{"names":["Marisol Quintero-Vance"]}]}'
    raw = base64.urlsafe_b64encode(text.encode("ascii")).decode("ascii").rstrip("=")
    with pytest.raises(Exception, match="ref must be non-empty Unicode text"):
        parse_subject_header(raw)
    reply = request(port(stack), "POST", "/v1/chat/completions", chat_body("hi"), {"x-cordon-subject": raw})
    assert reply.status == 400 and reply.json()["error"]["stage"] == "request"
    assert upstream.received == []


def test_a_junk_bearer_beside_a_real_key_does_not_pick_the_lenient_tenant(
    stack: RunningStack, upstream: FakeUpstream
) -> None:
    """x-api-key selects a `requireSubject` tenant; a junk bearer token selects the default. Two
    credentials naming two tenants are refused instead of resolved in the lenient direction."""
    body = {"model": "claude-sonnet-4-6", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    only_key = request(port(stack), "POST", "/v1/messages", body, {"x-api-key": KEYS["require"]})
    assert only_key.status == 400 and "requires" in only_key.json()["error"]["message"]
    both = request(
        port(stack),
        "POST",
        "/v1/messages",
        body,
        {"x-api-key": KEYS["require"], "authorization": "Bearer junk"},
    )
    assert both.status == 400 and "different tenants" in both.json()["error"]["message"]
    same = request(
        port(stack),
        "POST",
        "/v1/messages",
        body,
        {"x-api-key": KEYS["strip"], "authorization": f"Bearer {KEYS['strip']}"},
    )
    assert same.status == 200
    assert len(upstream.received) == 1
