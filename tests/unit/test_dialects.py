"""Route + path → provider and dialect; media found exactly at the positions each API's schema defines."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import pytest

from ext_proc.dialects import DIALECTS, classify
from ext_proc.dialects.routes import ROUTE_PROVIDERS
from ext_proc.runtime.bootstrap import ADMIN_ROUTE, NOT_FOUND_ROUTE

# --- classification -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("route", "path", "provider", "dialect"),
    [
        ("openai", "/v1/chat/completions", "openai", "chat"),
        ("openai", "/v1/Chat/Completions/", "openai", "chat"),
        ("openai", "/V1/CHAT/COMPLETIONS", "openai", "chat"),
        ("openai", "/v1/chat/completions?stream=true", "openai", "chat"),
        ("openai", "/v1/responses", "openai", "responses"),
        ("openai", "/v1/responses/", "openai", "responses"),
        ("openai", "/v1/responses?x=1&y=/v1/chat/completions", "openai", "responses"),
        ("openai", "/v1/embeddings", "openai", "generic"),
        ("openai", "/v1/completions", "openai", "generic"),
        ("openai", "/v1/responses/resp_123/input_items", "openai", "generic"),
        ("openai", "/v1/chat/completions/extra", "openai", "generic"),
        ("openai", "/v1/messages", "openai", "generic"),
        ("anthropic", "/v1/messages", "anthropic", "messages"),
        ("anthropic", "/v1/messages/", "anthropic", "messages"),
        ("anthropic", "/v1/messages?beta=true", "anthropic", "messages"),
        ("anthropic", "/v1/messages/count_tokens", "anthropic", "messages"),
        ("anthropic", "/v1/Messages/Count_Tokens?beta=true", "anthropic", "messages"),
        ("anthropic", "/v1/messages/batches", "anthropic", "message_batches"),
        ("anthropic", "/v1/chat/completions", "anthropic", "generic"),
        ("openai-prefixed", "/openai/v1/chat/completions", "openai", "chat"),
        ("openai-prefixed", "/OpenAI/v1/responses?stream=true", "openai", "responses"),
        ("openai-prefixed", "/openai/v1/embeddings", "openai", "generic"),
        ("anthropic-prefixed", "/anthropic/v1/messages", "anthropic", "messages"),
        ("anthropic-prefixed", "/anthropic/v1/messages/count_tokens/", "anthropic", "messages"),
        ("openai-authority", "/v1/chat/completions", "openai", "chat"),
        ("openai-authority", "/v1/responses?x=1", "openai", "responses"),
        ("anthropic-authority", "/v1/messages", "anthropic", "messages"),
        ("anthropic-authority", "/v1/messages/count_tokens", "anthropic", "messages"),
    ],
)
def test_classify(route: str, path: str, provider: str, dialect: str) -> None:
    """Each upstream route and path lands on the provider and dialect it means."""
    info = classify(route, path)
    assert info is not None
    assert (info.provider.name, info.dialect.name) == (provider, dialect)
    assert info.dialect is DIALECTS[dialect]


@pytest.mark.parametrize(
    ("route", "path", "normalised"),
    [
        ("openai-prefixed", "/openai/v1/chat/completions", "/v1/chat/completions"),
        ("anthropic-prefixed", "/Anthropic/v1/Messages/?beta=true", "/v1/messages"),
        ("openai", "/v1/Chat/Completions/", "/v1/chat/completions"),
        ("openai", "/", "/"),
    ],
)
def test_classify_normalises_the_path(route: str, path: str, normalised: str) -> None:
    """The path is lower-cased, stripped of query, trailing slash and provider prefix."""
    info = classify(route, path)
    assert info is not None
    assert info.path == normalised


@pytest.mark.parametrize("route", [ADMIN_ROUTE, NOT_FOUND_ROUTE, "healthz", "", "OpenAI", "local"])
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/admin/receipts"])
def test_routes_without_upstream_classify_as_none(route: str, path: str) -> None:
    """A route that goes to no upstream (admin, 404, unknown, empty) has no dialect."""
    assert classify(route, path) is None


def test_every_upstream_route_is_classified() -> None:
    """Every route name the bootstrap renders for an upstream is known to classify."""
    for route, (provider, _prefix) in ROUTE_PROVIDERS.items():
        info = classify(route, "/v1/embeddings")
        assert info is not None
        assert info.provider == provider


# --- media discovery ------------------------------------------------------------------------------

B64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAAB"
WAV = "UklGRiQAAABXQVZFZm10IBAAAAABAAEA"  # the start of a WAV file (RIFF, WAVE, fmt)
MP4 = "AAAAGGZ0eXBtcDQyAAAAAG1wNDJpc29t"  # the start of an MP4 file (ftyp box)
MP3 = "SUQzBAAAAAAAAA=="  # an ID3 header
NPY = "k05VTVBZAQB2AHsnZGVzY3InOiAnPGY0Jw=="  # the start of a NumPy array file
DATA_URL = "data:image/png;base64," + B64
PDF_DATA_URL = "data:application/pdf;base64,JVBERi0xLjcKJeLjz9MK"  # a PDF header and its binary comment line
URL = "https://example.com/cat.png"
FILE_ID = "file-abc123"

Steps = tuple[str | int, ...]


@dataclass(frozen=True)
class Expect:
    media: str
    source: str
    path: Steps  # from the document root to the dict holding the payload
    key: str
    payload: str


def at(doc: Any, path: Steps) -> Any:
    for step in path:
        doc = doc[step]
    return doc


def chat(*content: dict[str, Any], **message: Any) -> dict[str, Any]:
    return {"model": "gpt-4o", "messages": [{"role": "user", "content": [*content], **message}]}


def responses(*items: dict[str, Any]) -> dict[str, Any]:
    return {"model": "gpt-4.1", "input": [*items]}


def user_message(*content: dict[str, Any]) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [*content]}


def messages(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": "claude-sonnet-4-6",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": [*blocks]}],
    }


def block(kind: str, source: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "source": source}


TEXT = {"type": "text", "text": "look at this"}
INPUT_TEXT = {"type": "input_text", "text": "look at this"}
ANTHROPIC_IMAGE = block("image", {"type": "base64", "media_type": "image/png", "data": B64})
PDF_SOURCE = {"type": "base64", "media_type": "application/pdf", "data": B64}
MSG0 = ("messages", 0, "content")
IN0 = ("input", 0, "content")

MEDIA_CASES: dict[str, tuple[str, dict[str, Any], list[Expect]]] = {
    # OpenAI Chat Completions
    "chat-image-data-url": (
        "chat",
        chat(TEXT, {"type": "image_url", "image_url": {"url": DATA_URL, "detail": "low"}}),
        [Expect("image", "data_url", (*MSG0, 1, "image_url"), "url", DATA_URL)],
    ),
    "chat-image-https-url": (
        "chat",
        chat({"type": "image_url", "image_url": {"url": URL}}),
        [Expect("image", "url", (*MSG0, 0, "image_url"), "url", URL)],
    ),
    "chat-image-url-as-a-string": (
        "chat",
        chat({"type": "image_url", "image_url": DATA_URL}),
        [Expect("image", "data_url", (*MSG0, 0), "image_url", DATA_URL)],
    ),
    "chat-image-url-part-without-type": (
        "chat",
        chat({"image_url": {"url": DATA_URL}}),
        [Expect("image", "data_url", (*MSG0, 0, "image_url"), "url", DATA_URL)],
    ),
    "chat-input-audio": (
        "chat",
        chat({"type": "input_audio", "input_audio": {"data": WAV, "format": "wav"}}),
        [Expect("audio", "base64", (*MSG0, 0, "input_audio"), "data", WAV)],
    ),
    "chat-file-data-url": (
        "chat",
        chat({"type": "file", "file": {"filename": "a.pdf", "file_data": PDF_DATA_URL}}),
        [Expect("file", "data_url", (*MSG0, 0, "file"), "file_data", PDF_DATA_URL)],
    ),
    "chat-file-raw-base64": (
        "chat",
        chat({"type": "file", "file": {"filename": "a.pdf", "file_data": B64}}),
        [Expect("file", "base64", (*MSG0, 0, "file"), "file_data", B64)],
    ),
    "chat-file-id": (
        "chat",
        chat({"type": "file", "file": {"file_id": FILE_ID}}),
        [Expect("file", "file_id", (*MSG0, 0, "file"), "file_id", FILE_ID)],
    ),
    "chat-message-audio-reference": (
        "chat",
        {
            "model": "gpt-4o-audio-preview",
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "audio": {"id": "audio_abc123"}},
            ],
        },
        [Expect("audio", "reference", ("messages", 1, "audio"), "id", "audio_abc123")],
    ),
    "chat-several-parts-in-order": (
        "chat",
        chat(
            {"type": "image_url", "image_url": {"url": URL}},
            TEXT,
            {"type": "input_audio", "input_audio": {"data": WAV, "format": "mp3"}},
        ),
        [
            Expect("image", "url", (*MSG0, 0, "image_url"), "url", URL),
            Expect("audio", "base64", (*MSG0, 2, "input_audio"), "data", WAV),
        ],
    ),
    # Parts of OpenAI-compatible servers (vLLM, SGLang, Mistral)
    "chat-video-url-data-url": (
        "chat",
        chat({"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + MP4}}),
        [Expect("video", "data_url", (*MSG0, 0, "video_url"), "url", "data:video/mp4;base64," + MP4)],
    ),
    "chat-audio-url-data-url": (
        "chat",
        chat({"type": "audio_url", "audio_url": {"url": "data:audio/mpeg;base64," + MP3}}),
        [Expect("audio", "data_url", (*MSG0, 0, "audio_url"), "url", "data:audio/mpeg;base64," + MP3)],
    ),
    "chat-video-url-url": (
        "chat",
        chat({"type": "video_url", "video_url": {"url": "https://example.com/a.mp4"}}),
        [Expect("video", "url", (*MSG0, 0, "video_url"), "url", "https://example.com/a.mp4")],
    ),
    "chat-image-embeds": (
        "chat",
        chat({"type": "image_embeds", "image_embeds": NPY}),
        [Expect("embedding", "base64", (*MSG0, 0), "image_embeds", NPY)],
    ),
    "chat-image-embeds-dict": (
        "chat",
        chat({"type": "image_embeds", "image_embeds": {"image_embeds": NPY, "image_grid_thw": NPY}}),
        [
            Expect("embedding", "base64", (*MSG0, 0, "image_embeds"), "image_embeds", NPY),
            Expect("embedding", "base64", (*MSG0, 0, "image_embeds"), "image_grid_thw", NPY),
        ],
    ),
    "chat-document-url": (
        "chat",
        chat({"type": "document_url", "document_url": "https://example.com/a.pdf"}),
        [Expect("file", "url", (*MSG0, 0), "document_url", "https://example.com/a.pdf")],
    ),
    "chat-input-audio-string": (
        "chat",
        chat({"type": "input_audio", "input_audio": WAV}),
        [Expect("audio", "base64", (*MSG0, 0), "input_audio", WAV)],
    ),
    # OpenAI Responses
    "responses-instructions-list-image": (
        "responses",
        {
            "model": "gpt-4.1",
            "input": "hi",
            "instructions": [user_message(INPUT_TEXT, {"type": "input_image", "image_url": DATA_URL})],
        },
        [Expect("image", "data_url", ("instructions", 0, "content", 1), "image_url", DATA_URL)],
    ),
    "responses-code-interpreter-files": (
        "responses",
        {
            "model": "gpt-4.1",
            "input": "hi",
            "tools": [{"type": "code_interpreter", "container": {"type": "auto", "file_ids": [FILE_ID]}}],
        },
        [Expect("file", "reference", ("tools", 0, "container", "file_ids"), 0, FILE_ID)],
    ),
    "responses-code-interpreter-container-id": (
        "responses",
        {"model": "gpt-4.1", "input": "hi", "tools": [{"type": "code_interpreter", "container": "cntr_1"}]},
        [Expect("file", "reference", ("tools", 0), "container", "cntr_1")],
    ),
    "responses-file-search-vector-stores": (
        "responses",
        {"model": "gpt-4.1", "input": "hi", "tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}]},
        [Expect("file", "reference", ("tools", 0, "vector_store_ids"), 0, "vs_1")],
    ),
    "responses-image-generation-mask": (
        "responses",
        {
            "model": "gpt-4.1",
            "input": "hi",
            "tools": [{"type": "image_generation", "input_image_mask": {"image_url": DATA_URL}}],
        },
        [Expect("image", "data_url", ("tools", 0, "input_image_mask"), "image_url", DATA_URL)],
    ),
    "responses-input-image-data-url": (
        "responses",
        responses(user_message(INPUT_TEXT, {"type": "input_image", "image_url": DATA_URL, "detail": "auto"})),
        [Expect("image", "data_url", (*IN0, 1), "image_url", DATA_URL)],
    ),
    "responses-input-image-url": (
        "responses",
        responses(user_message({"type": "input_image", "image_url": URL})),
        [Expect("image", "url", (*IN0, 0), "image_url", URL)],
    ),
    "responses-input-image-file-id": (
        "responses",
        responses(user_message({"type": "input_image", "file_id": FILE_ID})),
        [Expect("image", "file_id", (*IN0, 0), "file_id", FILE_ID)],
    ),
    "responses-easy-message-without-type": (
        "responses",
        responses({"role": "user", "content": [{"type": "input_image", "image_url": DATA_URL}]}),
        [Expect("image", "data_url", (*IN0, 0), "image_url", DATA_URL)],
    ),
    "responses-input-file-data": (
        "responses",
        responses(user_message({"type": "input_file", "filename": "a.pdf", "file_data": PDF_DATA_URL})),
        [Expect("file", "data_url", (*IN0, 0), "file_data", PDF_DATA_URL)],
    ),
    "responses-input-file-url": (
        "responses",
        responses(user_message({"type": "input_file", "file_url": "https://example.com/a.pdf"})),
        [Expect("file", "url", (*IN0, 0), "file_url", "https://example.com/a.pdf")],
    ),
    "responses-input-file-id": (
        "responses",
        responses(user_message({"type": "input_file", "file_id": FILE_ID})),
        [Expect("file", "file_id", (*IN0, 0), "file_id", FILE_ID)],
    ),
    "responses-input-audio": (
        "responses",
        responses(user_message({"type": "input_audio", "input_audio": {"data": WAV, "format": "wav"}})),
        [Expect("audio", "base64", (*IN0, 0, "input_audio"), "data", WAV)],
    ),
    "responses-function-call-output-parts": (
        "responses",
        responses(
            {
                "type": "function_call_output",
                "call_id": "call_1",
                "output": [
                    INPUT_TEXT,
                    {"type": "input_image", "image_url": DATA_URL},
                    {"type": "input_file", "file_id": FILE_ID},
                ],
            }
        ),
        [
            Expect("image", "data_url", ("input", 0, "output", 1), "image_url", DATA_URL),
            Expect("file", "file_id", ("input", 0, "output", 2), "file_id", FILE_ID),
        ],
    ),
    "responses-computer-call-output": (
        "responses",
        responses(
            {
                "type": "computer_call_output",
                "call_id": "call_2",
                "output": {"type": "computer_screenshot", "image_url": DATA_URL},
            }
        ),
        [Expect("image", "data_url", ("input", 0, "output"), "image_url", DATA_URL)],
    ),
    "responses-image-generation-call": (
        "responses",
        responses({"type": "image_generation_call", "id": "ig_1", "status": "completed", "result": B64}),
        [Expect("image", "base64", ("input", 0), "result", B64)],
    ),
    # Anthropic Messages
    "anthropic-image-base64": (
        "messages",
        messages(TEXT, ANTHROPIC_IMAGE),
        [Expect("image", "base64", (*MSG0, 1, "source"), "data", B64)],
    ),
    "anthropic-image-url": (
        "messages",
        messages(block("image", {"type": "url", "url": URL})),
        [Expect("image", "url", (*MSG0, 0, "source"), "url", URL)],
    ),
    "anthropic-image-file": (
        "messages",
        messages(block("image", {"type": "file", "file_id": FILE_ID})),
        [Expect("image", "file_id", (*MSG0, 0, "source"), "file_id", FILE_ID)],
    ),
    "anthropic-document-base64": (
        "messages",
        messages(
            block(
                "document",
                {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0xLjcKJeLjz9MK"},
            )
        ),
        [Expect("document", "base64", (*MSG0, 0, "source"), "data", "JVBERi0xLjcKJeLjz9MK")],
    ),
    "anthropic-document-url": (
        "messages",
        messages(block("document", {"type": "url", "url": "https://example.com/a.pdf"})),
        [Expect("document", "url", (*MSG0, 0, "source"), "url", "https://example.com/a.pdf")],
    ),
    "anthropic-document-file": (
        "messages",
        messages(block("document", {"type": "file", "file_id": FILE_ID})),
        [Expect("document", "file_id", (*MSG0, 0, "source"), "file_id", FILE_ID)],
    ),
    "anthropic-document-content-with-nested-image": (
        "messages",
        messages(block("document", {"type": "content", "content": [TEXT, ANTHROPIC_IMAGE]})),
        [Expect("image", "base64", (*MSG0, 0, "source", "content", 1, "source"), "data", B64)],
    ),
    "anthropic-image-of-an-unknown-source-type-with-data": (
        "messages",
        messages(block("image", {"type": "mystery", "data": B64})),
        [Expect("image", "base64", (*MSG0, 0, "source"), "data", B64)],
    ),
    "anthropic-container-upload": (
        "messages",
        messages({"type": "container_upload", "file_id": FILE_ID}),
        [Expect("file", "file_id", (*MSG0, 0), "file_id", FILE_ID)],
    ),
    "anthropic-web-fetch-result-document": (
        "messages",
        messages(
            {
                "type": "web_fetch_tool_result",
                "tool_use_id": "srvtoolu_1",
                "content": {
                    "type": "web_fetch_result",
                    "url": URL,
                    "content": block(
                        "document", {"type": "base64", "media_type": "application/pdf", "data": B64}
                    ),
                },
            }
        ),
        [Expect("document", "base64", (*MSG0, 0, "content", "content", "source"), "data", B64)],
    ),
    "anthropic-document-text": (  # a document of any source type is media; its text is read as text
        "messages",
        messages(block("document", {"type": "text", "media_type": "text/plain", "data": "plain words"})),
        [Expect("document", "text", (*MSG0, 0, "source"), "data", "plain words")],
    ),
    "anthropic-system-block": (  # the system list takes text only, but an image there is judged too
        "messages",
        {**messages(TEXT), "system": [ANTHROPIC_IMAGE]},
        [Expect("image", "base64", ("system", 0, "source"), "data", B64)],
    ),
    "anthropic-search-result-image": (
        "messages",
        messages({"type": "search_result", "source": URL, "title": "t", "content": [TEXT, ANTHROPIC_IMAGE]}),
        [Expect("image", "base64", (*MSG0, 0, "content", 1, "source"), "data", B64)],
    ),
    "anthropic-container": (
        "messages",
        {**messages(TEXT), "container": "container_1"},
        [Expect("file", "reference", (), "container", "container_1")],
    ),
    "anthropic-code-execution-output-file": (
        "messages",
        messages(
            {
                "type": "bash_code_execution_tool_result",
                "tool_use_id": "srvtoolu_1",
                "content": {
                    "type": "bash_code_execution_result",
                    "content": [{"type": "bash_code_execution_output", "file_id": FILE_ID}],
                },
            }
        ),
        [Expect("file", "file_id", (*MSG0, 0, "content", "content", 0), "file_id", FILE_ID)],
    ),
    "anthropic-tool-result-image": (
        "messages",
        messages({"type": "tool_result", "tool_use_id": "toolu_1", "content": [TEXT, ANTHROPIC_IMAGE]}),
        [Expect("image", "base64", (*MSG0, 0, "content", 1, "source"), "data", B64)],
    ),
    "anthropic-mcp-tool-result-image": (
        "messages",
        messages({"type": "mcp_tool_result", "tool_use_id": "mcptoolu_1", "content": [ANTHROPIC_IMAGE]}),
        [Expect("image", "base64", (*MSG0, 0, "content", 0, "source"), "data", B64)],
    ),
    "anthropic-tool-result-document": (
        "messages",
        messages(
            {
                "type": "tool_result",
                "tool_use_id": "toolu_2",
                "content": [block("document", {"type": "url", "url": "https://example.com/a.pdf"})],
            }
        ),
        [Expect("document", "url", (*MSG0, 0, "content", 0, "source"), "url", "https://example.com/a.pdf")],
    ),
    "anthropic-tool-result-document-content-image": (
        "messages",
        messages(
            {
                "type": "tool_result",
                "tool_use_id": "toolu_3",
                "content": [block("document", {"type": "content", "content": [ANTHROPIC_IMAGE]})],
            }
        ),
        [Expect("image", "base64", (*MSG0, 0, "content", 0, "source", "content", 0, "source"), "data", B64)],
    ),
}

# A media-shaped object outside the schema positions is ordinary text: never discovered.
NOT_MEDIA_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat-tool-call-arguments-object": (
        "chat",
        {
            "messages": [
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {
                                "name": "show",
                                "arguments": {"type": "image_url", "image_url": {"url": DATA_URL}},
                            },
                        }
                    ],
                }
            ]
        },
    ),
    "chat-tool-call-arguments-string": (
        "chat",
        {
            "messages": [
                {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {
                                "name": "show",
                                "arguments": '{"type":"image_url","image_url":{"url":"x"}}',
                            },
                        }
                    ],
                }
            ]
        },
    ),
    "chat-metadata": (
        "chat",
        {**chat(TEXT), "metadata": {"result": {"type": "image_url", "image_url": {"url": DATA_URL}}}},
    ),
    "chat-top-level": (
        "chat",
        {"type": "image_url", "image_url": {"url": DATA_URL}, "audio": {"id": "audio_1"}, "messages": []},
    ),
    "chat-anthropic-shaped-block": ("chat", chat(ANTHROPIC_IMAGE)),
    "responses-function-call-arguments": (
        "responses",
        responses(
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "show",
                "arguments": {"type": "input_image", "image_url": DATA_URL},
            }
        ),
    ),
    "responses-metadata": (
        "responses",
        {
            **responses(user_message(INPUT_TEXT)),
            "metadata": {"result": {"type": "input_image", "image_url": DATA_URL}},
        },
    ),
    "responses-top-level": (
        "responses",
        {"type": "input_image", "image_url": DATA_URL, "result": B64, "input": "hello"},
    ),
    "responses-unknown-item-type": (
        "responses",
        responses({"type": "something_new", "content": [{"type": "input_image", "image_url": DATA_URL}]}),
    ),
    "anthropic-tool-use-input": (
        "messages",
        {
            "messages": [
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": "toolu_1", "name": "show", "input": ANTHROPIC_IMAGE}
                    ],
                }
            ]
        },
    ),
    "anthropic-tool-use-input-nested": (
        "messages",
        {
            "messages": [
                {
                    "role": "assistant",
                    "content": [
                        {
                            "type": "tool_use",
                            "id": "toolu_1",
                            "name": "show",
                            "input": {"content": [ANTHROPIC_IMAGE]},
                        }
                    ],
                }
            ]
        },
    ),
    "anthropic-metadata": (
        "messages",
        {**messages(TEXT), "metadata": {"user_id": "u1", "result": ANTHROPIC_IMAGE}},
    ),
    "anthropic-top-level": ("messages", {**ANTHROPIC_IMAGE, "messages": []}),
    "anthropic-openai-shaped-part": (
        "messages",
        messages({"type": "image_url", "image_url": {"url": DATA_URL}}),
    ),
}


@pytest.mark.parametrize(("dialect", "doc", "expected"), MEDIA_CASES.values(), ids=list(MEDIA_CASES))
def test_media_found_at_schema_positions(dialect: str, doc: dict[str, Any], expected: list[Expect]) -> None:
    """Every §7 position yields one part of the right media and source, pointing at the payload."""
    before = copy.deepcopy(doc)
    parts = list(DIALECTS[dialect].media(doc))
    assert [(p.media, p.source) for p in parts] == [(e.media, e.source) for e in expected]
    for part, expect in zip(parts, expected, strict=True):
        assert part.container is at(doc, expect.path)
        assert part.key == expect.key
        assert part.container[part.key] == expect.payload
        assert part.is_bytes == (expect.source in ("base64", "data_url"))
    assert doc == before  # discovery only reads


UNKNOWN_SCHEMA_CASES: dict[str, dict[str, Any]] = {
    "embeddings-with-a-chat-part": {
        "model": "text-embedding-3-small",
        "input": [chat({"type": "image_url", "image_url": {"url": DATA_URL}})],
    },
    "chat-shaped": chat({"type": "image_url", "image_url": {"url": DATA_URL}}),
    "chat-shaped-url-as-a-string": chat({"type": "image_url", "image_url": DATA_URL}),
    "chat-shaped-without-type": chat({"image_url": {"url": DATA_URL}}),
    "bare-data-url": {"payload": {"attachment": DATA_URL}},
}


@pytest.mark.parametrize("doc", UNKNOWN_SCHEMA_CASES.values(), ids=list(UNKNOWN_SCHEMA_CASES))
def test_an_unknown_schema_counts_every_media_shaped_part(doc: dict[str, Any]) -> None:
    """Without a schema nothing tells a tool input from a message part: media-shaped means media."""
    parts = list(DIALECTS["generic"].media(doc))
    assert parts and all(p.container[p.key] == DATA_URL and p.is_bytes for p in parts)


def test_a_text_data_url_is_not_bytes() -> None:
    """Only base64 of a binary media type is payload bytes; a data: URL carrying text is read as text."""
    doc = chat({"type": "image_url", "image_url": {"url": "data:text/plain,hello"}})
    parts = list(DIALECTS["chat"].media(doc))
    assert [(p.source, p.is_bytes) for p in parts] == [("url", False)]


@pytest.mark.parametrize(("dialect", "doc"), NOT_MEDIA_CASES.values(), ids=list(NOT_MEDIA_CASES))
def test_media_shaped_objects_elsewhere_are_not_media(dialect: str, doc: dict[str, Any]) -> None:
    """Tool arguments/inputs, metadata, the top level, unknown items: no media part."""
    assert list(DIALECTS[dialect].media(doc)) == []


@pytest.mark.parametrize("dialect", sorted(DIALECTS))
@pytest.mark.parametrize(
    "doc",
    [
        None,
        "text",
        42,
        [],
        {},
        {"messages": "hi"},
        {"input": "hi"},
        {"messages": [None, 1, "x", {"content": 5}]},
    ],
)
def test_media_discovery_tolerates_odd_shapes(dialect: str, doc: Any) -> None:
    """Bodies that are not the dialect's shape yield nothing rather than failing."""
    assert list(DIALECTS[dialect].media(doc)) == []


@pytest.mark.parametrize(
    ("dialect", "doc"),
    [
        ("chat", chat({"type": "image_url", "image_url": {"url": 42}})),
        ("chat", chat({"type": "input_audio", "input_audio": {"format": "wav"}})),
        ("chat", chat({"type": "file", "file": {"filename": "a.pdf"}})),
        ("chat", {"messages": [{"role": "assistant", "audio": {"id": None}}]}),
        ("responses", responses(user_message({"type": "input_image", "image_url": None}))),
        ("responses", responses({"type": "image_generation_call", "result": None})),
        ("responses", responses({"type": "computer_call_output", "output": [DATA_URL]})),
        ("messages", messages({"type": "image", "source": DATA_URL})),
        ("messages", messages(block("image", {"type": "base64", "data": 7}))),
        ("messages", messages(block("image", {"type": "mystery", "data": 7}))),
    ],
)
def test_malformed_media_parts_yield_nothing(dialect: str, doc: dict[str, Any]) -> None:
    """A part of a media type without a string payload is not media (its strings stay text)."""
    assert list(DIALECTS[dialect].media(doc)) == []
