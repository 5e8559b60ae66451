"""Media parts: what a body's image, audio, video and file parts are, and how their payloads are judged.

Each dialect (ext_proc.dialects) finds media ONLY at the positions its API's schema defines, with
the helpers here, so that redaction, counting, masking and the egress check all agree on what is
media. A media-shaped object anywhere else (a tool input, metadata) is ordinary text and is read
as such.

A `MediaPart` points at its payload as (container, key): the dict (or list) that holds the payload
and the key (or index) under which it sits. A payload is exempt from the text walk only when it is
real media: strict base64 (bare, or after a `data:<binary type>;base64,` prefix and nothing else)
that decodes to bytes (not text) whose signature is a media type the position accepts (PNG,
JPEG, GIF, WebP, PDF, the audio and video containers; documents and tensors where a file or
embedding goes).
Anything else at a media position is text and is read: prose, a URL, a file id, and base64 that
decodes to text, whose decoded text is read too (`encoded_text`). Each payload is decoded once, on
first use, and kept with its part.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import regex

Source = Literal["base64", "data_url", "url", "file_id", "reference", "text"]

# --- signatures ----------------------------------------------------------------------------------

# The media families a signature belongs to, and what each kind of position accepts. Audio and
# video share containers (MP4, WebM, Ogg); a file or document position takes documents, office
# files (ZIP and OLE containers) and images; an embedding position takes serialised tensors.
Family = Literal["image", "audio", "video", "document", "archive", "tensor"]
ACCEPTS: dict[str, frozenset[str]] = {
    "image": frozenset({"image"}),
    "audio": frozenset({"audio", "video"}),
    "video": frozenset({"video", "audio"}),
    "file": frozenset({"document", "archive", "image"}),
    "document": frozenset({"document", "archive", "image"}),
    "embedding": frozenset({"tensor", "archive"}),
}
_MP3_FRAMES = (b"\xff\xfb", b"\xff\xf3", b"\xff\xf2", b"\xff\xf1", b"\xff\xf9")
_IMAGE_BRANDS = (b"heic", b"heix", b"mif1", b"msf1", b"avif")
_AUDIO_BRANDS = (b"M4A ", b"M4B ", b"M4P ")


def signature_family(data: bytes) -> Family | None:
    """The media family whose signature `data` starts with, or None. Where a format has a second
    fixed field (a PNG's IHDR chunk, a RIFF's form type, an ISO file's `ftyp` box), it is checked too."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image" if data[12:16] == b"IHDR" else None
    if data.startswith(b"\xff\xd8\xff") or data.startswith((b"GIF87a", b"GIF89a")):
        return "image"
    if data.startswith(b"RIFF"):
        form = data[8:12]
        return (
            "image"
            if form == b"WEBP"
            else "audio"
            if form == b"WAVE"
            else "video"
            if form == b"AVI "
            else None
        )
    if data[4:8] == b"ftyp":
        brand = data[8:12]
        return "image" if brand in _IMAGE_BRANDS else "audio" if brand in _AUDIO_BRANDS else "video"
    if data.startswith(b"%PDF-"):
        return "document"
    if data.startswith((b"ID3", b"OggS", b"fLaC")) or data.startswith(_MP3_FRAMES):
        return "audio"
    if data.startswith(b"FORM") and data[8:12] in (b"AIFF", b"AIFC"):
        return "audio"
    if data.startswith((b"\x1a\x45\xdf\xa3", b"\x00\x00\x01\xba", b"\x00\x00\x01\xb3")):
        return "video"
    if data.startswith((b"PK\x03\x04", b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1")):
        return "archive"
    if data.startswith(b"\x93NUMPY") or (len(data) > 2 and data[0] == 0x80 and 2 <= data[1] <= 5):
        return "tensor"
    return None


def declared_family(media_type: str) -> str | None:
    """The family a data: URL's type declares (`image/png` → image); None for
    `application/octet-stream` (any); `text` for every type that is not media."""
    media_type = media_type.strip().lower()
    major = media_type.split("/", 1)[0]
    if major in ("image", "audio", "video"):
        return major
    if media_type == "application/pdf":
        return "document"
    if media_type == "application/octet-stream":
        return None
    if media_type in ("application/zip", "application/msword") or media_type.startswith(
        ("application/vnd.openxmlformats", "application/vnd.ms-", "application/vnd.oasis")
    ):
        return "archive"
    return "text"


def _compatible(declared: str | None, family: str) -> bool:
    if declared is None or declared == family:
        return True
    return {declared, family} <= {"audio", "video"}


# --- payloads ------------------------------------------------------------------------------------

# `data:<type>[;param…];base64,` (the head is read from the first 256 characters only).
_DATA_URL_HEAD = regex.compile(r"(?i)data:(?P<type>[^;,]{0,127})(?P<params>(?:;[^;,]{0,127}){0,8}?);base64,")
# A strict media header: a type and `;base64`, nothing else (a parameter is text a caller wrote).
_STRICT_HEAD = regex.compile(r"(?i)data:[a-z0-9.+\-]+/[a-z0-9.+\-]+;base64,")
_LINE_BREAKS = regex.compile(r"\r?\n")
# Text a payload may decode to: no control characters but tab, line and page breaks.
_CONTROL = regex.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f]")
MIN_ENCODED_TEXT = 3  # decoded text shorter than this cannot hold a finding


def strict_b64decode(text: str) -> bytes | None:
    """The bytes of standard base64 (line breaks allowed, missing padding restored), else None.

    Strict mode admits the base64 alphabet and final `=` padding only, in one pass in C."""
    if "\n" in text:
        text = _LINE_BREAKS.sub("", text)
    if len(text) % 4:
        body = text.rstrip("=")
        if len(body) % 4 == 1:
            return None
        text = body + "=" * (-len(body) % 4)
    try:
        return binascii.a2b_base64(text, strict_mode=True)
    except (binascii.Error, ValueError):
        return None


@dataclass(frozen=True, slots=True)
class Payload:
    """A base64 payload decoded once: what precedes the base64, the bytes (None when the string
    is not strict base64) and the media family of their signature."""

    prefix: str  # "" or the data: URL's head up to and including the comma
    data: bytes | None
    family: Family | None
    declared: str | None  # the family the data: URL's type declares (None: any or bare base64)
    strict_head: bool  # no prefix, or a prefix with a type and `;base64` only

    def media_for(self, media: str) -> bool:
        """Real media of a family a `media` position accepts."""
        return (
            self.family is not None
            and self.strict_head
            and self.family in ACCEPTS.get(media, frozenset())
            and _compatible(self.declared, self.family)
        )

    def text(self) -> str | None:
        """The decoded bytes as text, when they are UTF-8 without control characters."""
        if self.data is None or len(self.data) < MIN_ENCODED_TEXT:
            return None
        return _as_text(self.data)

    def encode(self, text: str, prefix: str | None = None) -> str:
        """`text` written back in the payload's own form (its prefix, or `prefix`; standard base64)."""
        head = self.prefix if prefix is None else prefix
        return head + base64.b64encode(text.encode("utf-8", "surrogatepass")).decode("ascii")


def read_payload(value: str) -> Payload:
    """Decode a bare base64 string or a `data:…;base64,` URL."""
    prefix = ""
    declared: str | None = None
    strict = True
    if value[:5].lower() == "data:":
        m = _DATA_URL_HEAD.match(value[:256])
        if m is None:
            return Payload("", None, None, None, False)
        prefix = m.group()
        declared = declared_family(m.group("type"))
        strict = _STRICT_HEAD.fullmatch(prefix) is not None
    data = strict_b64decode(value[len(prefix) :])
    family = signature_family(data) if data is not None else None
    if family is not None and data is not None and _as_text(data) is not None:
        family = None  # text that starts like a file (`%PDF-1.4 …`): text, and read as text
    return Payload(prefix, data, family, declared, strict)


def _as_text(data: bytes) -> str | None:
    """`data` as text: UTF-8 without control characters but tab, line and page breaks."""
    try:
        decoded = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None if _CONTROL.search(decoded) else decoded


@dataclass(frozen=True, slots=True, eq=False)
class MediaPart:
    media: str  # image | audio | video | file | document | embedding
    source: Source
    container: Any  # the dict (or list) holding the payload
    key: Any  # its key (or index)
    _decoded: list[Payload] = field(default_factory=list, init=False, repr=False)

    @property
    def payload(self) -> Payload | None:
        """The decoded payload of a base64 or data: URL source (decoded on first use), else None."""
        if self.source not in ("base64", "data_url"):
            return None
        if not self._decoded:
            value = self.container[self.key]
            self._decoded.append(
                read_payload(value) if isinstance(value, str) else Payload("", None, None, None, False)
            )
        return self._decoded[0]

    @property
    def is_bytes(self) -> bool:
        """Real media bytes, exempt from the text walk: strict base64 whose signature is a media
        type this position accepts. Anything else here is read as text."""
        payload = self.payload
        return payload is not None and payload.media_for(self.media)

    @property
    def encoded_text(self) -> str | None:
        """The text a base64 payload that is not media decodes to (read as well as the string)."""
        payload = self.payload
        return payload.text() if payload is not None and not self.is_bytes else None


# --- the helpers each dialect finds media with ---------------------------------------------------

_DATA_BASE64 = regex.compile(r"(?i)data:[^,]{0,255};base64,")

# The binary data: URL of the older check (kept for the detectors that judge base64 anywhere).
BINARY_DATA_URL = regex.compile(
    r"(?i)data:(?:(?:image|audio|video)/[a-z0-9.+\-]+|application/(?:pdf|octet-stream));base64,"
)
_BASE64_UNBROKEN = regex.compile(r"[A-Za-z0-9+/]*={0,2}")


def is_base64_data_url(value: str) -> bool:
    """`value` is a data: URL whose payload is declared base64 (whatever its type)."""
    return value[:5].lower() == "data:" and _DATA_BASE64.match(value[:300]) is not None


def is_binary_data_url(value: str) -> bool:
    """`value` is a data: URL declaring a binary type (image, audio, video, pdf, office,
    octet-stream) as base64: media by its own say-so, whatever it decodes to."""
    m = _DATA_URL_HEAD.match(value[:256]) if value[:5].lower() == "data:" else None
    return m is not None and declared_family(m.group("type")) != "text"


def media_kind_of(value: str) -> str:
    """The media kind a data: URL's type names (image, audio, video), else `file`."""
    m = _DATA_URL_HEAD.match(value[:256])
    family = declared_family(m.group("type")) if m is not None else None
    return family if family in ("image", "audio", "video") else "file"


# Magic numbers of the media a tool may pass around as base64 (read by the detectors, which skip
# base64 media wherever it is): PNG, JPEG, GIF, WebP/WAV (RIFF), PDF, MP3 (ID3), Ogg, FLAC, MP4.
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


def str_at(container: object, key: str) -> bool:
    """`container` is a dict with a string under `key`."""
    return isinstance(container, dict) and isinstance(container.get(key), str)


def url_part(media: str, container: object, key: str) -> Iterator[MediaPart]:
    """A URL position: a base64 data: URL is a payload (media when it decodes to media); any other
    URL is text (read)."""
    if isinstance(container, dict) and str_at(container, key):
        source: Source = "data_url" if is_base64_data_url(container[key]) else "url"
        yield MediaPart(media, source, container, key)


def file_data(media: str, container: dict[str, Any], key: str) -> Iterator[MediaPart]:
    """`file_data`: a base64 data: URL or bare base64 is a payload; any other data: URL is text."""
    data = container[key]
    if is_base64_data_url(data):
        yield MediaPart(media, "data_url", container, key)
    elif data[:5].lower() == "data:":
        yield MediaPart(media, "url", container, key)
    else:
        yield MediaPart(media, "base64", container, key)


def base64_part(media: str, container: object, key: Any) -> Iterator[MediaPart]:
    """A position of bare base64 (a data: URL there is read as one)."""
    if isinstance(container, (dict, list)):
        value = container[key] if isinstance(container, list) else container.get(key)
        if isinstance(value, str):
            yield MediaPart(media, "data_url" if is_base64_data_url(value) else "base64", container, key)


def id_part(media: str, container: object, key: str) -> Iterator[MediaPart]:
    """A file id position: a reference to media uploaded earlier, read as text."""
    if isinstance(container, dict) and str_at(container, key):
        yield MediaPart(media, "file_id", container, key)


def id_list(media: str, container: object, key: str) -> Iterator[MediaPart]:
    """A list of file (or store) ids: each a reference, read as text."""
    ids = container.get(key) if isinstance(container, dict) else None
    if isinstance(ids, list):
        for index, item in enumerate(ids):
            if isinstance(item, str):
                yield MediaPart(media, "reference", ids, index)


def dicts(value: object) -> Iterator[dict[str, Any]]:
    """The dicts of a list (nothing when `value` is not a list)."""
    if isinstance(value, list):
        for item in value:
            if isinstance(item, dict):
                yield item
