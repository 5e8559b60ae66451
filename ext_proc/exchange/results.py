"""What a request phase decides, as values: the exchange turns each into Envoy's answer.

The request-headers phase ends in `AdminCall`, `Refuse`, `Release` (forward without reading the
body) or `ReadBody`; the request-body phase in `Forward`, `Refuse` or `NeedsOcr` (images to mask,
off the event loop, before the body can be decided). No phase sets a flag for another to read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ext_proc.errors import Refusal
from ext_proc.exchange.headers import Headers
from ext_proc.media.parts import MediaPart

Released = Literal["forwarded", "reported"]


@dataclass(frozen=True, slots=True)
class AdminCall:
    """`/admin/*`: answered by the admin API, no receipt."""

    headers: Headers


@dataclass(frozen=True, slots=True)
class Refuse:
    refusal: Refusal


@dataclass(frozen=True, slots=True)
class Release:
    """Forward the request without reading its body (nothing to redact, or report-only)."""

    decision: Released


@dataclass(frozen=True, slots=True)
class ReadBody:
    """The body must be read before the request can go."""


@dataclass(frozen=True, slots=True)
class Forward:
    """The request goes upstream; `body` replaces its body when given."""

    decision: Released = "forwarded"
    body: bytes | None = None


@dataclass(frozen=True, slots=True)
class MaskJob:
    """A request's images to mask before its body is redacted (and, with subjects, checked)."""

    raw: bytes
    doc: Any
    parts: list[MediaPart] = field(default_factory=list)  # every media part of the body
    masked: list[MediaPart] = field(default_factory=list)  # those to mask (images as bytes)


@dataclass(frozen=True, slots=True)
class NeedsOcr:
    job: MaskJob


HeadersResult = AdminCall | Refuse | Release | ReadBody
BodyResult = Forward | Refuse | NeedsOcr
