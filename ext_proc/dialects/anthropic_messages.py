"""Anthropic Messages (and count_tokens, same body): the top-level `system` is system text."""

from __future__ import annotations

from collections.abc import Iterator

from ext_proc.media.parts import message_batches_media as batch_media
from ext_proc.media.parts import messages_media as media

__all__ = ["batch_media", "batch_system_positions", "media", "system_positions"]


def system_positions(doc: object) -> Iterator[tuple[object, object]]:
    if isinstance(doc, dict) and "system" in doc:
        yield doc, "system"


def batch_system_positions(doc: object) -> Iterator[tuple[object, object]]:
    """Message batches: the `system` of each request's `params`."""
    if not isinstance(doc, dict) or not isinstance(doc.get("requests"), list):
        return
    for entry in doc["requests"]:
        if isinstance(entry, dict):
            yield from system_positions(entry.get("params"))
