"""Refusals: one type, carrying everything the client is told, turned into a reply in one place.

A `Refusal` names its HTTP status, the pipeline stage that refused, optionally the kind of data
that caused it, and a message. None of these ever contains a detected or declared value: messages
are written by this code, never interpolated from the body.
"""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Literal

Stage = Literal[
    "request", "policy", "detection", "egress", "media", "vault", "audit", "routing", "admin", "output"
]


class CordonError(Exception):
    """The root of every error this package raises on purpose. A message never holds a value."""


class Refusal(CordonError):
    """The request is answered here and never reaches an upstream."""

    def __init__(
        self,
        status: int,
        stage: Stage,
        message: str,
        *,
        kind: str | None = None,
        code: str = "request_refused",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.stage = stage
        self.message = message
        self.kind = kind
        self.code = code

    def __repr__(self) -> str:
        return f"Refusal({self.status}, {self.stage!r}, {self.message!r}, kind={self.kind!r})"


class DetectionError(CordonError):
    """A detector could not finish (regex timeout, nesting too deep): the text was not fully read.

    Never a silent skip: the exchange turns it into a refusal or, for a request without declared
    subjects under `failMode: open`, into a forwarded request with the gap recorded.
    """


def describe(exc: BaseException) -> dict[str, str]:
    """An unexpected exception for the log: its type and innermost frame, never its message.

    A message can quote what the code was handling (a KeyError on a body-derived key prints the
    key), and logs never hold a value.
    """
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"
    return {"error": type(exc).__name__, "where": where}
