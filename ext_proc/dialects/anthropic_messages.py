"""Anthropic Messages (and count_tokens, same body): the top-level `system` is system text."""

from __future__ import annotations

from collections.abc import Iterator

from ext_proc.media import messages_media as media

__all__ = ["media", "system_positions"]


def system_positions(doc: object) -> Iterator[tuple[object, object]]:
    if isinstance(doc, dict) and "system" in doc:
        yield doc, "system"
