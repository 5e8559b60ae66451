"""OpenAI Responses: `instructions` and system/developer input items are system text.

Every input item type is walked fail-closed, including types the API adds later; only the media
positions of `ext_proc.media.parts.responses_media` are exempt.
"""

from __future__ import annotations

from collections.abc import Iterator

from ext_proc.media.parts import responses_media as media

SYSTEM_ROLES = frozenset({"system", "developer"})

__all__ = ["media", "system_positions"]


def system_positions(doc: object) -> Iterator[tuple[object, object]]:
    if not isinstance(doc, dict):
        return
    if "instructions" in doc:
        yield doc, "instructions"
    items = doc.get("input")
    if isinstance(items, list):
        for index, item in enumerate(items):
            if isinstance(item, dict) and item.get("role") in SYSTEM_ROLES:
                yield items, index
