"""Media discovery (SPEC §7): the parts of a body that carry images, audio or files.

Found ONLY at the positions the provider schemas define, by one function per dialect, so that
redaction, counting and (later) masking and the egress check all agree on what is media. A
media-shaped object anywhere else (a tool input, metadata) is ordinary text and is read as such.

A `MediaPart` points at its payload as (container, key): the dict that holds the payload string and
the key under which it sits. Only payloads that are bytes (base64, data: URLs) are exempt from the
text walk; a URL or a file id is a string like any other and is read.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import regex

Source = Literal["base64", "data_url", "url", "file_id", "reference", "text"]


@dataclass(frozen=True, slots=True, eq=False)
class MediaPart:
    media: str  # image | audio | file | document
    source: Source
    container: dict[str, Any]
    key: str

    @property
    def is_bytes(self) -> bool:
        """Payload bytes, exempt from the text walk: a checked binary data: URL, or a string of
        base64 characters at a base64 position. Anything else there is read as text."""
        if self.source == "data_url":
            return True
        return self.source == "base64" and is_base64(self.container[self.key])


# A data: URL is payload bytes only when it says so, strictly: `data:<binary type>;base64,` and
# nothing else before the comma (a parameter such as `name=…` is text a caller wrote, and is read),
# followed by base64 only. Anything else (`data:text/plain,…`, parameters, a payload that is not
# base64) is text, and is read as text.
BINARY_DATA_URL = regex.compile(
    r"(?i)data:(?:(?:image|audio|video)/[a-z0-9.+\-]+|application/(?:pdf|octet-stream));base64,"
)
_BASE64 = regex.compile(r"[A-Za-z0-9+/=\s]*")
_BASE64_UNBROKEN = regex.compile(r"[A-Za-z0-9+/]*={0,2}")


def is_base64(value: str, start: int = 0) -> bool:
    """`value[start:]` holds base64 characters (and line breaks) only."""
    return _BASE64.fullmatch(value, start) is not None


# Magic numbers of the media a tool may pass around as base64: PNG, JPEG, GIF, WebP/WAV (RIFF),
# PDF, MP3 (ID3), Ogg, FLAC, MP4 (ftyp at byte 4). A credential does not decode to one of these.
MEDIA_MIN_LENGTH = 64  # characters of base64: a shorter string is not judged by its bytes
_MEDIA_MAGIC = (
    b"\x89PNG\r\n\x1a\n",
    b"\xff\xd8\xff",
    b"GIF87a",
    b"GIF89a",
    b"RIFF",
    b"%PDF-",
    b"ID3",
    b"OggS",
    b"fLaC",
)


def is_media_base64(token: str) -> bool:
    """`token` is standard base64 whose first bytes are a media file's magic number."""
    try:
        head = base64.b64decode(token[:24], validate=True)
    except (binascii.Error, ValueError):
        return False
    return head.startswith(_MEDIA_MAGIC) or head[4:8] == b"ftyp"


def is_media_payload(value: str) -> bool:
    """`value`, whole, is a media file's bytes: base64 without any whitespace (bare, or after a
    binary data: URL's prefix) of at least MEDIA_MIN_LENGTH characters whose first bytes are a
    magic number. Wherever it sits (a tool's input), there is no text in it, only the letters
    base64 happens to spell. (Words written after a PNG's base64, spaces between them, are text.)"""
    start = 0
    if value[:5].lower() == "data:":
        m = BINARY_DATA_URL.match(value[:200])
        if m is None:
            return False
        start = m.end()
    return (
        len(value) - start >= MEDIA_MIN_LENGTH
        and is_media_base64(value[start : start + 24])
        and _BASE64_UNBROKEN.fullmatch(value, start) is not None
    )


def _is_data_url(value: str) -> bool:
    m = BINARY_DATA_URL.match(value[:200])
    return m is not None and is_base64(value, m.end())


def _str_at(container: object, key: str) -> bool:
    return isinstance(container, dict) and isinstance(container.get(key), str)


def _url_part(media: str, container: object, key: str) -> Iterator[MediaPart]:
    if isinstance(container, dict) and _str_at(container, key):
        source: Source = "data_url" if _is_data_url(container[key]) else "url"
        yield MediaPart(media, source, container, key)


def _file_data(media: str, container: dict[str, Any], key: str) -> Iterator[MediaPart]:
    """`file_data`: a binary data: URL or bare base64 is bytes; any other data: URL is text."""
    data = container[key]
    if _is_data_url(data):
        yield MediaPart(media, "data_url", container, key)
    elif data[:5].lower() == "data:":
        yield MediaPart(media, "url", container, key)
    else:
        yield MediaPart(media, "base64", container, key)


def _id_part(media: str, container: object, key: str) -> Iterator[MediaPart]:
    if isinstance(container, dict) and _str_at(container, key):
        yield MediaPart(media, "file_id", container, key)


def _dicts(value: object) -> Iterator[dict[str, Any]]:
    if isinstance(value, list):
        for item in value:
            if isinstance(item, dict):
                yield item


# --- OpenAI Chat Completions -------------------------------------------------------------------


def _chat_part(part: dict[str, Any]) -> Iterator[MediaPart]:
    kind = part.get("type")
    if kind == "image_url" or (kind is None and "image_url" in part):
        # `{"url": …}` as documented; a bare string and a part without `type` are accepted by
        # OpenAI-compatible servers (vLLM), so they are images too.
        image = part.get("image_url")
        if isinstance(image, str):
            yield from _url_part("image", part, "image_url")
        else:
            yield from _url_part("image", image, "url")
    elif kind == "input_audio":
        audio = part.get("input_audio")
        if isinstance(audio, dict) and _str_at(audio, "data"):
            yield MediaPart("audio", "base64", audio, "data")
    elif kind == "file":
        file = part.get("file")
        if isinstance(file, dict):
            if _str_at(file, "file_data"):
                yield from _file_data("file", file, "file_data")
            yield from _id_part("file", file, "file_id")


def chat_media(doc: object) -> Iterator[MediaPart]:
    if not isinstance(doc, dict):
        return
    for message in _dicts(doc.get("messages")):
        for part in _dicts(message.get("content")):
            yield from _chat_part(part)
        audio = message.get("audio")
        if isinstance(audio, dict) and _str_at(audio, "id"):
            yield MediaPart("audio", "reference", audio, "id")


# --- OpenAI Responses --------------------------------------------------------------------------


def _responses_part(part: dict[str, Any]) -> Iterator[MediaPart]:
    kind = part.get("type")
    if kind in ("input_image", "computer_screenshot"):
        yield from _url_part("image", part, "image_url")
        yield from _id_part("image", part, "file_id")
    elif kind == "input_file":
        if _str_at(part, "file_data"):
            yield from _file_data("file", part, "file_data")
        yield from _url_part("file", part, "file_url")
        yield from _id_part("file", part, "file_id")
    elif kind == "input_audio":
        audio = part.get("input_audio")
        if isinstance(audio, dict) and _str_at(audio, "data"):
            yield MediaPart("audio", "base64", audio, "data")


def responses_media(doc: object) -> Iterator[MediaPart]:
    if not isinstance(doc, dict):
        return
    for item in _dicts(doc.get("input")):
        kind = item.get("type")
        if kind == "message" or (kind is None and "role" in item):
            for part in _dicts(item.get("content")):
                yield from _responses_part(part)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            for part in _dicts(item.get("output")):
                yield from _responses_part(part)
        elif kind == "computer_call_output":
            output = item.get("output")
            if isinstance(output, dict):
                yield from _responses_part(output)
        elif kind == "image_generation_call" and _str_at(item, "result"):
            yield MediaPart("image", "base64", item, "result")
    prompt = doc.get("prompt")
    variables = prompt.get("variables") if isinstance(prompt, dict) else None
    if isinstance(variables, dict):
        # A prompt variable may be an input_image / input_file part.
        for value in variables.values():
            if isinstance(value, dict):
                yield from _responses_part(value)


# --- Anthropic Messages ------------------------------------------------------------------------


def _anthropic_block(block: dict[str, Any], depth: int) -> Iterator[MediaPart]:
    kind = block.get("type")
    if kind in ("image", "document"):
        source = block.get("source")
        if not isinstance(source, dict):
            return
        source_type = source.get("type")
        if source_type == "base64" and _str_at(source, "data"):
            yield MediaPart(kind, "base64", source, "data")
        elif source_type == "url":
            yield from _url_part(kind, source, "url")
        elif source_type == "file":
            yield from _id_part(kind, source, "file_id")
        elif source_type == "content" and depth < 4:
            # A document made of blocks: its text blocks are text, its images are media.
            for inner in _dicts(source.get("content")):
                yield from _anthropic_block(inner, depth + 1)
        elif source_type == "text" and _str_at(source, "data"):
            # A plain-text document: still a document (SPEC §7, every source type), so a subject
            # request's media policy judges it; its text is read and redacted like any string.
            yield MediaPart(kind, "text", source, "data")
        elif _str_at(source, "data"):
            # A source type this code does not know yet, carrying data: bytes of an image or a
            # document all the same.
            yield MediaPart(kind, "base64", source, "data")
    elif kind == "container_upload":
        yield from _id_part("file", block, "file_id")
    elif kind in ("tool_result", "mcp_tool_result") and depth < 4:
        for inner in _dicts(block.get("content")):
            yield from _anthropic_block(inner, depth + 1)
    elif kind == "web_fetch_tool_result" and depth < 4:
        # The fetched page, as the server tool returned it: a `document` block.
        result = block.get("content")
        inner = result.get("content") if isinstance(result, dict) else None
        if isinstance(inner, dict):
            yield from _anthropic_block(inner, depth + 1)


def messages_media(doc: object) -> Iterator[MediaPart]:
    if not isinstance(doc, dict):
        return
    for message in _dicts(doc.get("messages")):
        for block in _dicts(message.get("content")):
            yield from _anthropic_block(block, 0)


def message_batches_media(doc: object) -> Iterator[MediaPart]:
    """Anthropic message batches: each request's `params` is a Messages body."""
    if not isinstance(doc, dict):
        return
    for entry in _dicts(doc.get("requests")):
        yield from messages_media(entry.get("params"))


# --- any other endpoint ------------------------------------------------------------------------

_PART_TYPES = frozenset(
    {
        "image_url",
        "input_audio",
        "file",
        "input_image",
        "input_file",
        "computer_screenshot",
        "image",
        "document",
        "container_upload",
    }
)


def any_media(doc: object) -> Iterator[MediaPart]:
    """An endpoint whose schema is unknown: every media-shaped part and binary data: URL counts.

    Without a schema, nothing tells a tool input from a message part, so this errs towards media:
    the policy of a subject request then judges them (block refuses), and their bytes are not
    read as text (they carry no text to read).
    """
    yield from _any_media(doc, 0)
    if isinstance(doc, dict):
        # Items of the Responses shape sent to an endpoint this code has no schema for
        # (`/v1/responses/compact`, conversation items): their generated images are media.
        for item in _dicts(doc.get("input")) if "input" in doc else _dicts(doc.get("items")):
            if item.get("type") == "image_generation_call" and _str_at(item, "result"):
                yield MediaPart("image", "base64", item, "result")


def _any_media(value: object, depth: int) -> Iterator[MediaPart]:
    if depth > 64:  # the walk refuses such nesting anyway
        return
    if isinstance(value, dict):
        kind = value.get("type")
        claimed: set[str] = set()  # keys of `value` a part function already yielded
        if kind in _PART_TYPES or (kind is None and "image_url" in value):
            for part in (*_chat_part(value), *_responses_part(value), *_anthropic_block(value, 0)):
                if part.container is value:
                    claimed.add(part.key)
                yield part
        for key, item in value.items():
            if isinstance(item, str):
                if key not in claimed and _is_data_url(item):
                    yield MediaPart("file", "data_url", value, key)
            else:
                yield from _any_media(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            yield from _any_media(item, depth + 1)
