"""End to end with raw HTTP: routing, near-miss paths, refusals, tenants, headers.

Raw HTTP sends paths exactly as written, so the path-normalisation cases reach Envoy unaltered.
"""

from __future__ import annotations

import gzip
import json

import pytest

from tests.support.e2e import SAMPLES, SENTENCE, chat_body, leaked, request
from tests.support.fake_upstream import FakeUpstream
from tests.support.harness import KEYS, RunningStack

pytestmark = pytest.mark.e2e


def port(stack: RunningStack) -> int:
    return stack.settings.listen_port


@pytest.mark.parametrize(
    "path",
    [
        "/v1/chat/completions",
        "/v1/Chat/Completions/",
        "/v1/chat/completion%73",
        "/v1/x/%2e%2e/responses",
        "/v1/./messages",
        "/v1//chat//completions",
        "/V1/MESSAGES",
        "/v1/chat%2Fcompletions",
        "/openai/v1/chat/completions",
        "/anthropic/v1/messages",
        "/v1/embeddings",
        "/v1/completions",
        "/v1/some/future/endpoint",
    ],
)
def test_near_miss_paths_never_carry_a_raw_body(
    stack: RunningStack, upstream: FakeUpstream, path: str
) -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": SENTENCE}],
        "input": SENTENCE,
        "prompt": SENTENCE,
    }
    reply = request(port(stack), "POST", path, body)
    for record in upstream.received:
        assert leaked(record.body) == [], f"{path}: leaked kinds {leaked(record.body)}"
    if reply.status < 400:
        assert len(upstream.received) == 1
        assert leaked(reply.body) == [] or SAMPLES["EMAIL"] in reply.body.decode()  # restored, if echoed


@pytest.mark.parametrize("path", ["/", "/v2/chat/completions", "/etc/passwd", "/v1", "/openai", "/admin2/x"])
def test_unlisted_paths_get_404_and_no_upstream_call(
    stack: RunningStack, upstream: FakeUpstream, path: str
) -> None:
    reply = request(port(stack), "POST", path, chat_body(SENTENCE))
    assert reply.status == 404
    assert upstream.received == []
    assert leaked(reply.body) == []


def test_prefixed_route_strips_the_prefix(stack: RunningStack, upstream: FakeUpstream) -> None:
    reply = request(port(stack), "POST", "/openai/v1/chat/completions", chat_body("hello"))
    assert reply.status == 200
    assert upstream.received[0].path == "/v1/chat/completions"
    upstream.clear()
    reply = request(
        port(stack),
        "POST",
        "/anthropic/v1/messages",
        {"model": "claude-sonnet-4-6", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert reply.status == 200
    assert upstream.received[0].path == "/v1/messages"


def test_authority_routing_for_the_egress_gateway(stack: RunningStack, upstream: FakeUpstream) -> None:
    body = {
        "model": "claude-sonnet-4-6",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": SENTENCE}],
    }
    reply = request(port(stack), "POST", "/v1/messages", body, {"host": "api.anthropic.com"})
    assert reply.status == 200, reply.body
    assert leaked(upstream.received[0].body) == []
    reply = request(port(stack), "POST", "/nope", body, {"host": "api.openai.com"})
    assert reply.status == 404


def test_healthz_and_admin_without_token(stack: RunningStack, upstream: FakeUpstream) -> None:
    """The session stack sets ADMIN_TOKEN; closed (unset) is in e2e/test_audit.py."""
    assert request(port(stack), "GET", "/healthz").status == 200
    reply = request(port(stack), "GET", "/admin/receipts?ref=x")
    assert reply.status == 401 and reply.json()["error"]["stage"] == "admin"
    assert upstream.received == []


def test_filter_headers_never_reach_the_upstream(stack: RunningStack, upstream: FakeUpstream) -> None:
    headers = {"accept-encoding": "gzip", "x-tenant": "strip", "x-redact-mode": "strip"}
    reply = request(port(stack), "POST", "/v1/chat/completions", chat_body("hello"), headers)
    assert reply.status == 200
    received = upstream.received[0].headers
    for name in ("accept-encoding", "x-tenant", "x-redact-mode", "x-cordon-subject"):
        assert name not in received


@pytest.mark.parametrize(
    ("path", "shape"),
    [("/v1/chat/completions", "openai"), ("/v1/messages", "anthropic"), ("/v1/responses", "openai")],
)
@pytest.mark.parametrize(
    "body",
    [b"not json at all", b'{"messages": [', b"\xff\xfe\x00garbage", b'{"a": 1, "a": 2}', b'{"a": NaN}'],
)
def test_non_json_body_is_400_in_the_dialect_shape(
    stack: RunningStack, upstream: FakeUpstream, path: str, shape: str, body: bytes
) -> None:
    reply = request(port(stack), "POST", path, body)
    assert reply.status == 400
    payload = reply.json()
    if shape == "anthropic":
        assert payload["type"] == "error" and payload["error"]["type"] == "invalid_request_error"
    else:
        assert payload["error"]["code"] == "invalid_json"
    assert upstream.received == []


def test_nesting_past_the_limit_is_refused(stack: RunningStack, upstream: FakeUpstream) -> None:
    deep = "[" * 100 + json.dumps(SENTENCE) + "]" * 100
    body = '{"model": "m", "messages": [{"role": "user", "content": "x"}], "metadata": {"k": ' + deep + "}}"
    reply = request(port(stack), "POST", "/v1/chat/completions", body)
    assert reply.status == 422 and reply.json()["error"]["stage"] == "detection"
    args = json.dumps({"a": json.loads(deep)})
    body2 = chat_body(
        "x",
        tools=[],
        messages=[
            {
                "role": "assistant",
                "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": args}}],
            }
        ],
    )
    assert request(port(stack), "POST", "/v1/chat/completions", body2).status == 422
    assert upstream.received == []


def test_compressed_request_body_is_refused(stack: RunningStack, upstream: FakeUpstream) -> None:
    body = gzip.compress(json.dumps(chat_body(SENTENCE)).encode())
    reply = request(port(stack), "POST", "/v1/chat/completions", body, {"content-encoding": "gzip"})
    assert reply.status == 415
    assert upstream.received == []


def test_body_length_is_correct_after_redaction(stack: RunningStack, upstream: FakeUpstream) -> None:
    reply = request(port(stack), "POST", "/v1/chat/completions", chat_body(SENTENCE))
    assert reply.status == 200
    record = upstream.received[0]
    if "content-length" in record.headers:
        assert int(record.headers["content-length"]) == len(record.body)
    assert leaked(record.body) == []


def test_get_without_body_is_forwarded(stack: RunningStack, upstream: FakeUpstream) -> None:
    reply = request(port(stack), "GET", "/v1/models", None)
    assert reply.status == 200
    assert upstream.received[0].path == "/v1/models"


# --- tenants --------------------------------------------------------------------------------------


def auth(tenant: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[tenant]}"}


def test_strip_mode_writes_kinds_and_restores_nothing(stack: RunningStack, upstream: FakeUpstream) -> None:
    reply = request(port(stack), "POST", "/v1/chat/completions", chat_body(SENTENCE), auth("strip"))
    assert reply.status == 200
    sent = upstream.received[0].json()["messages"][0]["content"]
    assert "[EMAIL]" in sent and "[CREDIT_CARD]" in sent
    assert leaked(upstream.received[0].body) == []
    assert "[EMAIL]" in reply.json()["choices"][0]["message"]["content"]


def test_mode_off_forwards_unchanged(stack: RunningStack, upstream: FakeUpstream) -> None:
    body = json.dumps(chat_body(SENTENCE)).encode()
    reply = request(port(stack), "POST", "/v1/chat/completions", body, auth("mode-off"))
    assert reply.status == 200
    assert upstream.received[0].body == body


def test_redact_system_false_keeps_the_system_prompt(stack: RunningStack, upstream: FakeUpstream) -> None:
    body = chat_body(SENTENCE)
    body["messages"].insert(0, {"role": "system", "content": "Operator: " + SAMPLES["EMAIL"]})
    reply = request(port(stack), "POST", "/v1/chat/completions", body, auth("nosystem"))
    assert reply.status == 200
    sent = upstream.received[0].json()["messages"]
    assert SAMPLES["EMAIL"] in sent[0]["content"]
    assert leaked(json.dumps(sent[1])) == []


def test_tenant_limited_to_openai_cannot_reach_anthropic(stack: RunningStack, upstream: FakeUpstream) -> None:
    body = {"model": "claude-sonnet-4-6", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    reply = request(port(stack), "POST", "/v1/messages", body, {"x-api-key": KEYS["openai-only"]})
    assert reply.status == 403
    assert reply.json()["type"] == "error" and reply.json()["error"]["stage"] == "policy"
    assert upstream.received == []


def test_upstream_error_reply_is_passed_and_restored(stack: RunningStack, upstream: FakeUpstream) -> None:
    reply = request(
        port(stack), "POST", "/v1/chat/completions", chat_body(SENTENCE), {"x-fake-fail-status": "429"}
    )
    assert reply.status == 429
    assert "error" in reply.json()
    assert leaked(upstream.received[0].body) == []
