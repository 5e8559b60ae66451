"""Every media kind, and only real media, end to end: real Envoy, ext_proc workers, Redis and the
fake upstream.

- Under `block` (the default tenant, with declared subjects) every media kind of the three APIs and
  of the common compatible servers is refused before the upstream is called: video and audio URLs,
  image embeddings, document URLs, a code interpreter's files, vector stores, an image mask, a
  list-form `instructions` image, an Anthropic container, an image in `system` or in a search
  result, the files of a code execution result, a binary data: URL on a generic route.
- Under `mask` what cannot be read is refused (a video, an embedding, a container, text posing as
  an image); under `allow` it is forwarded.
- A payload is exempt from reading only when it decodes to media: prose, or base64 of text, at a
  media position is read and redacted like any string, on every route, while a real image passes
  byte for byte.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from PIL import Image

from ext_proc.detect.subjects.header import encode_subject_header
from tests.support.e2e import PERSON, SAMPLES, leaked, request
from tests.support.fake_upstream import FakeUpstream
from tests.support.harness import KEYS, RunningStack
from tests.support.receipts import record_for
from tests.support.screenshots import encode

pytestmark = pytest.mark.e2e

CHAT, RESPONSES, MESSAGES = "/v1/chat/completions", "/v1/responses", "/v1/messages"
PNG = base64.b64encode(encode(Image.new("RGB", (4, 4), "white"), "PNG")).decode()
PNG_URL = "data:image/png;base64," + PNG
MP4 = base64.b64encode(b"\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00mp42isom" + b"\x00" * 32).decode()
NPY = base64.b64encode(b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'shape': (1, 4)}" + b"\x00" * 16).decode()
CARD = SAMPLES["CREDIT_CARD"]
NAME = PERSON["names"][0]
PROSE = f"Scanned note: card {CARD}, holder {NAME}"
ENCODED_PROSE = base64.b64encode(PROSE.encode()).decode()


def subject(media: str | None = None) -> dict[str, str]:
    header: dict[str, Any] = {"ref": "media-kinds", "subjects": [PERSON]}
    if media:
        header["media"] = media
    return {"x-cordon-subject": encode_subject_header(header)}


def tenant(name: str) -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[name]}"}


def chat_parts(*parts: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": "gpt-4o",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "see"}, *parts]}],
    }


def responses_body(**extra: Any) -> dict[str, Any]:
    return {"model": "gpt-4.1", "input": "see", **extra}


def messages_body(*blocks: dict[str, Any], **extra: Any) -> dict[str, Any]:
    content = [{"type": "text", "text": "see"}, *blocks]
    return {
        "model": "claude-sonnet-4-6",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": content}],
        **extra,
    }


def anthropic_image(data: str, source_type: str = "base64") -> dict[str, Any]:
    return {"type": "image", "source": {"type": source_type, "media_type": "image/png", "data": data}}


BLOCKED: dict[str, tuple[str, dict[str, Any]]] = {
    "chat-video-url": (
        CHAT,
        chat_parts({"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + MP4}}),
    ),
    "chat-audio-url": (
        CHAT,
        chat_parts({"type": "audio_url", "audio_url": {"url": "https://example.com/a.mp3"}}),
    ),
    "chat-image-embeds": (CHAT, chat_parts({"type": "image_embeds", "image_embeds": NPY})),
    "chat-document-url": (
        CHAT,
        chat_parts({"type": "document_url", "document_url": "https://example.com/a.pdf"}),
    ),
    "responses-code-interpreter-files": (
        RESPONSES,
        responses_body(
            tools=[{"type": "code_interpreter", "container": {"type": "auto", "file_ids": ["file-9x"]}}]
        ),
    ),
    "responses-code-interpreter-container": (
        RESPONSES,
        responses_body(tools=[{"type": "code_interpreter", "container": "cntr_9x"}]),
    ),
    "responses-file-search": (
        RESPONSES,
        responses_body(tools=[{"type": "file_search", "vector_store_ids": ["vs_9x"]}]),
    ),
    "responses-instructions-image": (
        RESPONSES,
        responses_body(
            instructions=[{"role": "developer", "content": [{"type": "input_image", "image_url": PNG_URL}]}]
        ),
    ),
    "responses-image-mask": (
        RESPONSES,
        responses_body(tools=[{"type": "image_generation", "input_image_mask": {"image_url": PNG_URL}}]),
    ),
    "messages-container": (MESSAGES, messages_body(container="container_9x")),
    "messages-system-image": (MESSAGES, messages_body(system=[anthropic_image(PNG)])),
    "messages-search-result-image": (
        MESSAGES,
        messages_body(
            {
                "type": "search_result",
                "source": "https://example.com",
                "title": "t",
                "content": [anthropic_image(PNG)],
            }
        ),
    ),
    "messages-code-execution-file": (
        MESSAGES,
        messages_body(
            {
                "type": "code_execution_tool_result",
                "tool_use_id": "srvtoolu_9",
                "content": {
                    "type": "code_execution_result",
                    "content": [{"type": "code_execution_output", "file_id": "file_9x"}],
                },
            }
        ),
    ),
    "generic-embeddings-data-url": ("/v1/embeddings", {"model": "e", "input": ["hello", PNG_URL]}),
    "generic-anthropic-compatible-chat-video": (
        "/anthropic/v1/chat/completions",
        chat_parts({"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + MP4}}),
    ),
}


@pytest.mark.parametrize(("path", "body"), BLOCKED.values(), ids=list(BLOCKED))
def test_every_media_kind_is_refused_under_block(
    stack: RunningStack, upstream: FakeUpstream, path: str, body: dict[str, Any]
) -> None:
    reply = request(stack.settings.listen_port, "POST", path, body, subject())
    assert reply.status == 422, reply.body
    error = reply.json()["error"]
    assert error["stage"] == "media" and "media: block" in error["message"]
    assert upstream.received == []
    assert record_for(stack, "default", reply.headers["x-cordon-receipt"])["media"] >= 1


MASK_REFUSED: dict[str, tuple[str, dict[str, Any], str]] = {
    "video": (CHAT, BLOCKED["chat-video-url"][1], "a video part cannot be masked"),
    "embedding": (CHAT, BLOCKED["chat-image-embeds"][1], "an embedding part cannot be masked"),
    "container": (MESSAGES, BLOCKED["messages-container"][1], "a file part cannot be masked"),
    "text-posing-as-an-image": (
        CHAT,
        chat_parts({"type": "image_url", "image_url": {"url": "data:image/png;base64," + ENCODED_PROSE}}),
        "could not be decoded",
    ),
    "anthropic-prose-as-image": (MESSAGES, messages_body(anthropic_image(PROSE)), "could not be decoded"),
}


@pytest.mark.parametrize(("path", "body", "reason"), MASK_REFUSED.values(), ids=list(MASK_REFUSED))
def test_mask_refuses_what_it_cannot_read(
    stack: RunningStack, upstream: FakeUpstream, path: str, body: dict[str, Any], reason: str
) -> None:
    reply = request(stack.settings.listen_port, "POST", path, body, {**tenant("mask-media"), **subject()})
    assert reply.status == 422, reply.body
    error = reply.json()["error"]
    assert error["stage"] == "media" and reason in error["message"]
    assert upstream.received == []


def sent_payloads(upstream: FakeUpstream, pick: Any) -> str:
    return str(pick(upstream.received[0].json()))


# (route, body, where the payload is in what the upstream received)
TEXT_AT_MEDIA: dict[str, tuple[str, dict[str, Any], Any]] = {
    "chat-image-url": (
        CHAT,
        chat_parts({"type": "image_url", "image_url": {"url": "data:image/png;base64," + PROSE}}),
        lambda s: s["messages"][0]["content"][1]["image_url"]["url"],
    ),
    "chat-file-data": (
        CHAT,
        chat_parts({"type": "file", "file": {"filename": "a.pdf", "file_data": PROSE}}),
        lambda s: s["messages"][0]["content"][1]["file"]["file_data"],
    ),
    "chat-input-audio": (
        CHAT,
        chat_parts({"type": "input_audio", "input_audio": {"data": PROSE, "format": "wav"}}),
        lambda s: s["messages"][0]["content"][1]["input_audio"]["data"],
    ),
    "responses-input-image": (
        RESPONSES,
        responses_body(
            input=[
                {
                    "role": "user",
                    "content": [{"type": "input_image", "image_url": "data:image/png;base64," + PROSE}],
                }
            ]
        ),
        lambda s: s["input"][0]["content"][0]["image_url"],
    ),
    "responses-image-generation-result": (
        RESPONSES,
        responses_body(
            input=[{"type": "image_generation_call", "id": "ig_1", "status": "completed", "result": PROSE}]
        ),
        lambda s: s["input"][0]["result"],
    ),
    "messages-image-data": (
        MESSAGES,
        messages_body(anthropic_image(PROSE)),
        lambda s: s["messages"][0]["content"][1]["source"]["data"],
    ),
    "messages-unknown-source-type": (
        MESSAGES,
        messages_body(anthropic_image(PROSE, "future_kind")),
        lambda s: s["messages"][0]["content"][1]["source"]["data"],
    ),
    "generic-embeddings": (
        "/v1/embeddings",
        {"model": "e", "input": ["hello", "data:image/png;base64," + PROSE]},
        lambda s: s["input"][1],
    ),
    "generic-completions": (
        "/v1/completions",
        {"model": "c", "prompt": "data:application/pdf;base64," + PROSE},
        lambda s: s["prompt"],
    ),
    "generic-anthropic-compatible-chat": (
        "/anthropic/v1/chat/completions",
        chat_parts({"type": "image_url", "image_url": {"url": "data:image/png;base64," + PROSE}}),
        lambda s: s["messages"][0]["content"][1]["image_url"]["url"],
    ),
}


@pytest.mark.parametrize(("path", "body", "pick"), TEXT_AT_MEDIA.values(), ids=list(TEXT_AT_MEDIA))
def test_text_at_a_media_position_is_read(
    stack: RunningStack, upstream: FakeUpstream, path: str, body: dict[str, Any], pick: Any
) -> None:
    reply = request(stack.settings.listen_port, "POST", path, body)
    assert reply.status == 200, reply.body
    assert leaked(upstream.received[0].body) == []
    assert "<CREDIT_CARD_" in sent_payloads(upstream, pick)


@pytest.mark.parametrize(("path", "body", "pick"), TEXT_AT_MEDIA.values(), ids=list(TEXT_AT_MEDIA))
def test_text_at_a_media_position_is_read_under_allow_with_subjects(
    stack: RunningStack, upstream: FakeUpstream, path: str, body: dict[str, Any], pick: Any
) -> None:
    reply = request(stack.settings.listen_port, "POST", path, body, {**tenant("allow-media"), **subject()})
    assert reply.status == 200, reply.body
    payload = sent_payloads(upstream, pick)
    left = [label for label, value in (("card", CARD), ("name", NAME)) if value in payload]
    assert left == [] and leaked(upstream.received[0].body) == []
    assert record_for(stack, "allow-media", reply.headers["x-cordon-receipt"])["egress"] == "verified"


def encoded_cases() -> dict[str, tuple[str, dict[str, Any], Any]]:
    """Base64 of text at a media position: read as that text, written back as base64."""
    url = "data:image/png;base64," + ENCODED_PROSE
    return {
        "chat": (
            CHAT,
            chat_parts({"type": "image_url", "image_url": {"url": url}}),
            lambda s: s["messages"][0]["content"][1]["image_url"]["url"].split(",", 1)[1],
        ),
        "responses": (
            RESPONSES,
            responses_body(
                input=[
                    {
                        "role": "user",
                        "content": [{"type": "input_file", "filename": "n.txt", "file_data": ENCODED_PROSE}],
                    }
                ]
            ),
            lambda s: s["input"][0]["content"][0]["file_data"],
        ),
        "messages": (
            MESSAGES,
            messages_body(anthropic_image(ENCODED_PROSE)),
            lambda s: s["messages"][0]["content"][1]["source"]["data"],
        ),
    }


@pytest.mark.parametrize(("path", "body", "pick"), encoded_cases().values(), ids=list(encoded_cases()))
def test_base64_of_text_at_a_media_position_is_read_as_its_text(
    stack: RunningStack, upstream: FakeUpstream, path: str, body: dict[str, Any], pick: Any
) -> None:
    reply = request(stack.settings.listen_port, "POST", path, body, {**tenant("allow-media"), **subject()})
    assert reply.status == 200, reply.body
    decoded = base64.b64decode(sent_payloads(upstream, pick)).decode()
    left = [label for label, value in (("card", CARD), ("name", NAME)) if value in decoded]
    assert left == [] and decoded.startswith("Scanned note: card <")


REAL: dict[str, tuple[str, dict[str, Any], Any]] = {
    "chat": (
        CHAT,
        chat_parts({"type": "image_url", "image_url": {"url": PNG_URL}}),
        lambda s: s["messages"][0]["content"][1]["image_url"]["url"],
    ),
    "responses": (
        RESPONSES,
        responses_body(input=[{"role": "user", "content": [{"type": "input_image", "image_url": PNG_URL}]}]),
        lambda s: s["input"][0]["content"][0]["image_url"],
    ),
    "messages": (
        MESSAGES,
        messages_body(anthropic_image(PNG)),
        lambda s: s["messages"][0]["content"][1]["source"]["data"],
    ),
    "generic-embeddings": ("/v1/embeddings", {"model": "e", "input": [PNG_URL]}, lambda s: s["input"][0]),
}


@pytest.mark.parametrize(("path", "body", "pick"), REAL.values(), ids=list(REAL))
def test_real_media_passes_unread_under_allow(
    stack: RunningStack, upstream: FakeUpstream, path: str, body: dict[str, Any], pick: Any
) -> None:
    reply = request(stack.settings.listen_port, "POST", path, body, {**tenant("allow-media"), **subject()})
    assert reply.status == 200, reply.body
    assert pick(upstream.received[0].json()) == pick(json.loads(json.dumps(body)))
    assert record_for(stack, "allow-media", reply.headers["x-cordon-receipt"])["media"] == 1
