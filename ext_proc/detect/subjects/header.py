"""The `X-Cordon-Subject` header → a validated, typed `SubjectHeader`.

base64url (padding optional) of UTF-8 JSON naming up to 8 subjects. Parsing is total: any input,
however malformed, yields either a `SubjectHeader` or a `SubjectHeaderError` whose message names
the problem (a field path such as `subjects[0].phones[1]`) and never a value. Values are
NFKC-normalised and stripped of invisible characters here, once, and keep their Unicode letters.

Compiling the header into matchers (ext_proc.detect.subjects.matcher) and into the egress check
(ext_proc.transform.egress) starts from this object; `digest` keys their caches.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import json
import unicodedata
from dataclasses import dataclass
from typing import Any, Literal

from ext_proc.detect.normalize import INVISIBLE
from ext_proc.errors import CordonError

MediaChoice = Literal["block", "mask", "allow"]

MAX_HEADER_BYTES = 16384
MAX_SUBJECTS = 8
MAX_VALUES_PER_FIELD = 16
MAX_VALUES_PER_SUBJECT = 64
MAX_VALUE_CHARS = 256
MAX_REF_CHARS = 128

# Header field → the KIND its matches carry in placeholders (`SUBJECT1_PHONE`).
FIELDS: dict[str, str] = {
    "names": "NAME",
    "emails": "EMAIL",
    "phones": "PHONE",
    "addresses": "ADDRESS",
    "dates": "DOB",
    "ids": "ID",
    "handles": "HANDLE",
    "other": "OTHER",
}
KINDS: tuple[str, ...] = tuple(FIELDS.values())
TOP_LEVEL = ("ref", "media", "subjects")
MEDIA_CHOICES: tuple[MediaChoice, ...] = ("block", "mask", "allow")


class SubjectHeaderError(CordonError, ValueError):
    """The header cannot be read; the message names the problem, never a value."""


@dataclass(frozen=True, slots=True)
class Subject:
    """One declared person: values per kind, normalised. `index` is 1-based (the n of SUBJECTn)."""

    index: int
    values: dict[str, tuple[str, ...]]  # KIND -> values

    def of(self, kind: str) -> tuple[str, ...]:
        return self.values.get(kind, ())


@dataclass(frozen=True, slots=True)
class SubjectHeader:
    subjects: tuple[Subject, ...]
    ref: str | None
    media: MediaChoice | None
    digest: str  # sha256 of the raw header: the cache key of everything compiled from it

    def counts(self) -> dict[str, int]:
        """Declared values per kind, over all subjects (fine for logs: counts only)."""
        out: dict[str, int] = {}
        for subject in self.subjects:
            for kind, values in subject.values.items():
                out[kind] = out.get(kind, 0) + len(values)
        return out


def normalise_value(value: str) -> str:
    text = unicodedata.normalize("NFKC", value)
    return "".join(c for c in text if c not in INVISIBLE).strip()


def _decode(raw: str) -> Any:
    if not raw or not raw.strip():
        raise SubjectHeaderError("X-Cordon-Subject is empty")
    if len(raw) > MAX_HEADER_BYTES:
        raise SubjectHeaderError(f"X-Cordon-Subject is longer than {MAX_HEADER_BYTES} bytes")
    text = raw.strip()
    try:
        data = base64.b64decode(
            text.replace("-", "+").replace("_", "/") + "=" * (-len(text) % 4), validate=True
        )
    except (binascii.Error, ValueError):
        raise SubjectHeaderError("X-Cordon-Subject is not base64url") from None
    try:
        decoded = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SubjectHeaderError("X-Cordon-Subject does not decode to UTF-8") from None
    try:
        return json.loads(decoded)
    except (ValueError, RecursionError):
        raise SubjectHeaderError("X-Cordon-Subject does not decode to JSON") from None


def _value(path: str, value: object) -> str:
    if not isinstance(value, str):
        raise SubjectHeaderError(f"{path} must be a string")
    if len(value) > MAX_VALUE_CHARS:
        raise SubjectHeaderError(f"{path} is longer than {MAX_VALUE_CHARS} characters")
    normalised = normalise_value(value)
    if not normalised:
        raise SubjectHeaderError(f"{path} is empty")
    if not any(c.isalnum() for c in normalised):
        raise SubjectHeaderError(f"{path} has no letter or digit")
    return normalised


def _subject(position: int, data: object) -> Subject:
    path = f"subjects[{position}]"
    if not isinstance(data, dict):
        raise SubjectHeaderError(f"{path} must be an object")
    values: dict[str, tuple[str, ...]] = {}
    total = 0
    for field, raw_values in data.items():
        kind = FIELDS.get(field) if isinstance(field, str) else None
        if kind is None:
            raise SubjectHeaderError(f"{path} has an unknown field; known: " + ", ".join(FIELDS))
        field_path = f"{path}.{field}"
        if not isinstance(raw_values, list):
            raise SubjectHeaderError(f"{field_path} must be a list of strings")
        if len(raw_values) > MAX_VALUES_PER_FIELD:
            raise SubjectHeaderError(f"{field_path} has more than {MAX_VALUES_PER_FIELD} values")
        cleaned = [_value(f"{field_path}[{i}]", v) for i, v in enumerate(raw_values)]
        total += len(cleaned)
        if cleaned:
            values[kind] = tuple(dict.fromkeys(cleaned))  # drop repeats, keep order
    if total == 0:
        raise SubjectHeaderError(f"{path} declares no value")
    if total > MAX_VALUES_PER_SUBJECT:
        raise SubjectHeaderError(f"{path} has more than {MAX_VALUES_PER_SUBJECT} values")
    return Subject(index=position + 1, values=values)


@functools.lru_cache(maxsize=256)
def parse_subject_header(raw: str) -> SubjectHeader:
    """The header, validated; SubjectHeaderError (naming the problem, never a value) otherwise.

    Cached by the raw text (only headers that parse are kept): an agent sends the same header with
    every turn, and reading eight subjects (decoding, normalising, validating every value) costs
    about 0.3 ms. The parsed header is immutable.
    """
    return _parse_subject_header(raw)


def _parse_subject_header(raw: str) -> SubjectHeader:
    data = _decode(raw)
    if not isinstance(data, dict):
        raise SubjectHeaderError("X-Cordon-Subject must be a JSON object")
    for key in data:
        if key not in TOP_LEVEL:
            raise SubjectHeaderError("X-Cordon-Subject has an unknown field; known: ref, media, subjects")
    ref = data.get("ref")
    if ref is not None:
        if not isinstance(ref, str):
            raise SubjectHeaderError("ref must be a string")
        if len(ref) > MAX_REF_CHARS:
            raise SubjectHeaderError(f"ref is longer than {MAX_REF_CHARS} characters")
        if not ref or any(0xD800 <= ord(c) <= 0xDFFF for c in ref):
            # A lone surrogate ("\ud800" is valid JSON) is no text: it cannot be HMACed as UTF-8.
            raise SubjectHeaderError("ref must be non-empty Unicode text")
    media = data.get("media")
    if media is not None and media not in MEDIA_CHOICES:
        raise SubjectHeaderError("media must be one of block, mask, allow")
    subjects = data.get("subjects")
    if not isinstance(subjects, list):
        raise SubjectHeaderError("subjects must be a list of 1 to 8 subjects")
    if not 1 <= len(subjects) <= MAX_SUBJECTS:
        raise SubjectHeaderError(f"subjects must hold 1 to {MAX_SUBJECTS} subjects")
    parsed = tuple(_subject(i, s) for i, s in enumerate(subjects))
    digest = hashlib.sha256(raw.strip().encode("utf-8", "surrogatepass")).hexdigest()
    return SubjectHeader(subjects=parsed, ref=ref, media=media, digest=digest)


def encode_subject_header(payload: dict[str, Any]) -> str:
    """The header value for a payload (for clients and tests): unpadded base64url of compact JSON."""
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")
