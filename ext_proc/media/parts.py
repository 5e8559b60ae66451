"""Media parts: what a body's image, audio and file parts are, and how their payloads are judged.

Each dialect (ext_proc.dialects) finds media ONLY at the positions its API's schema defines, with
the helpers here, so that redaction, counting, masking and the egress check all agree on what is
media. A media-shaped object anywhere else (a tool input, metadata) is ordinary text and is read
as such.

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


def is_data_url(value: str) -> bool:
    """`value` is a binary data: URL (BINARY_DATA_URL) followed by base64 only: payload bytes."""
    m = BINARY_DATA_URL.match(value[:200])
    return m is not None and is_base64(value, m.end())


def str_at(container: object, key: str) -> bool:
    """`container` is a dict with a string under `key`."""
    return isinstance(container, dict) and isinstance(container.get(key), str)


def url_part(media: str, container: object, key: str) -> Iterator[MediaPart]:
    """A URL position: a binary data: URL is bytes; any other URL is text (read)."""
    if isinstance(container, dict) and str_at(container, key):
        source: Source = "data_url" if is_data_url(container[key]) else "url"
        yield MediaPart(media, source, container, key)


def file_data(media: str, container: dict[str, Any], key: str) -> Iterator[MediaPart]:
    """`file_data`: a binary data: URL or bare base64 is bytes; any other data: URL is text."""
    data = container[key]
    if is_data_url(data):
        yield MediaPart(media, "data_url", container, key)
    elif data[:5].lower() == "data:":
        yield MediaPart(media, "url", container, key)
    else:
        yield MediaPart(media, "base64", container, key)


def id_part(media: str, container: object, key: str) -> Iterator[MediaPart]:
    """A file id position: a reference to media uploaded earlier, read as text."""
    if isinstance(container, dict) and str_at(container, key):
        yield MediaPart(media, "file_id", container, key)


def dicts(value: object) -> Iterator[dict[str, Any]]:
    """The dicts of a list (nothing when `value` is not a list)."""
    if isinstance(value, list):
        for item in value:
            if isinstance(item, dict):
                yield item
