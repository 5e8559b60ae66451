"""A body that redaction grows past what Envoy forwards is refused, never failed by Envoy.

Real Envoy, workers and Redis with MAX_BODY_BYTES = 64 KiB. Short values (`a12@b.co`) become
longer placeholders (`<EMAIL_0123abcd_12>`), and under `mode: surrogate` longer surrogates still:
a body under the limit can leave over it. Envoy answers such a rewritten body with its own bare
413 after the receipt said `forwarded`; Cordon must refuse it first: 413 in the provider's error
shape (`request_too_large`), a `refused` receipt, nothing upstream. A body that grows but still
fits is forwarded.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.e2e import request
from tests.support.harness import KEYS, TENANT_SECRET, RunningStack, running_stack
from tests.support.receipts import record_for

pytestmark = pytest.mark.e2e

LIMIT = 65536
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    with running_stack(
        tmp_path_factory.mktemp("growth"),
        workers=1,
        tenants={"surrogate": "mode: surrogate"},
        MAX_BODY_BYTES=str(LIMIT),
        TENANT_SECRET=TENANT_SECRET,
    ) as s:
        yield s


@pytest.fixture
def fresh(small: RunningStack) -> RunningStack:
    small.upstream.reset()
    return small


def emails(count: int) -> str:
    return " ".join(f"a{n}@b.co" for n in range(count))


def body(dialect: str, text: str, *, stream: bool = False, size: int | None = None) -> bytes:
    """The dialect's request carrying `text`, padded with one plain word to `size` bytes."""
    doc: dict[str, Any]
    if dialect == "responses":
        doc = {"model": "gpt-4.1", "input": text, "stream": stream}
    else:
        doc = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": text}], "stream": stream}
        if dialect == "messages":
            doc["model"], doc["max_tokens"] = "claude-sonnet-4-6", 64
    raw = json.dumps(doc).encode()
    if size is None or size == len(raw):
        return raw
    assert size > len(raw) + 1
    return body(dialect, text + " " + "w" * (size - len(raw) - 1), stream=stream)


def headers(dialect: str, tenant: str | None = None, reply: str = "ok") -> dict[str, str]:
    """The request's headers; the fake upstream answers `reply` (not an echo of a body near the
    limit: the reply is read whole, and its own size is the last test's concern)."""
    key = KEYS[tenant] if tenant else "sk-test-anyone"
    if dialect == "messages":
        return {"x-api-key": key, "anthropic-version": "2023-06-01", "x-fake-reply": reply}
    return {"authorization": f"Bearer {key}", "x-fake-reply": reply}


def assert_refused_too_large(stack: RunningStack, dialect: str, reply: Any, tenant: str) -> None:
    assert reply.status == 413, reply.body[:300]
    error = json.loads(reply.body)
    if dialect == "messages":
        assert error["type"] == "error" and error["error"]["type"] == "request_too_large"
    else:
        assert error["error"]["code"] == "request_too_large"
    assert b"@b.co" not in reply.body  # the message names sizes, never a value
    assert reply.headers.get("x-cordon-stage") == "request"
    record = record_for(stack, tenant, reply.headers.get("x-cordon-receipt"))
    assert record["decision"] == "refused" and record["stage"] == "request"
    assert stack.upstream.received == []


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("dialect", list(PATHS))
def test_a_body_just_under_the_limit_that_redaction_grows_past_it_is_refused(
    fresh: RunningStack, dialect: str, stream: bool
) -> None:
    raw = body(dialect, emails(5000), stream=stream, size=LIMIT - 100)
    assert len(raw) == LIMIT - 100
    reply = request(fresh.settings.listen_port, "POST", PATHS[dialect], raw, headers(dialect))
    assert_refused_too_large(fresh, dialect, reply, "default")


@pytest.mark.parametrize("dialect", list(PATHS))
def test_a_body_that_grows_but_still_fits_is_forwarded(fresh: RunningStack, dialect: str) -> None:
    raw = body(dialect, emails(1500))
    reply = request(fresh.settings.listen_port, "POST", PATHS[dialect], raw, headers(dialect))
    assert reply.status == 200, reply.body[:300]
    (sent,) = fresh.upstream.received
    assert len(raw) < len(sent.body) <= LIMIT
    assert b"@b.co" not in sent.body


def test_surrogates_that_grow_a_body_past_the_limit_are_refused(fresh: RunningStack) -> None:
    """The same values fit as placeholders but not as surrogates (`given.familyNN@example.invalid`
    is longer than `<EMAIL_0123abcd_12>`): the limit is judged on the body that would leave."""
    values = emails(150)
    port = fresh.settings.listen_port
    assert request(port, "POST", PATHS["chat"], body("chat", values), headers("chat")).status == 200
    grown = len(fresh.upstream.received[-1].body) - len(body("chat", values))
    # Padded so that, with placeholders, it leaves 600 bytes under the limit; each surrogate
    # address is at least 8 bytes longer than its placeholder (1,200 for 150 of them).
    raw = body("chat", values, size=LIMIT - 600 - grown)
    fresh.upstream.reset()
    reply = request(port, "POST", PATHS["chat"], raw, headers("chat"))
    assert reply.status == 200 and len(fresh.upstream.received[-1].body) == LIMIT - 600
    fresh.upstream.reset()
    reply = request(port, "POST", PATHS["chat"], raw, headers("chat", "surrogate"))
    assert_refused_too_large(fresh, "chat", reply, "surrogate")


@pytest.mark.parametrize("dialect", list(PATHS))
def test_a_reply_too_large_to_read_whole_is_a_provider_error(fresh: RunningStack, dialect: str) -> None:
    """A JSON reply is read whole to restore it; one over the limit that arrives in pieces cannot
    be (Envoy lets one that arrives in one read through), and Envoy's bare 500 becomes a 502 in
    the provider's shape that says why. The same reply streamed is delivered (a stream is read in
    pieces)."""
    text = "write to a7@b.co " + "w" * 40_000
    twice = headers(dialect, reply="{{said}} {{said}}")
    twice |= {"x-fake-chunk-bytes": "16384", "x-fake-delay-ms": "20"}  # it arrives in pieces
    reply = request(fresh.settings.listen_port, "POST", PATHS[dialect], body(dialect, text), twice)
    assert reply.status == 502, reply.body[:300]
    assert reply.headers.get("x-cordon-stage") == "output"
    error = json.loads(reply.body)
    if dialect == "messages":
        assert error["type"] == "error" and error["error"]["type"] == "api_error"
        assert "MAX_BODY_BYTES" in error["error"]["message"]
    else:
        assert error["error"]["code"] == "reply_too_large"
        assert "MAX_BODY_BYTES" in error["error"]["message"]
    assert b"@b.co" not in reply.body
    fresh.upstream.reset()
    raw = body(dialect, text, stream=True)
    in_pieces = headers(dialect, reply="{{said}} {{said}}") | {"x-fake-delta-chars": "4096"}
    streamed = request(fresh.settings.listen_port, "POST", PATHS[dialect], raw, in_pieces)
    assert streamed.status == 200
    assert b"a7@b.co" in streamed.body and b"<EMAIL_" not in streamed.body  # restored
