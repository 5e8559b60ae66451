"""OpenAI Chat Completions: `messages[]` with roles; system and developer messages are system text."""

from __future__ import annotations

from collections.abc import Iterator

from ext_proc.media.parts import chat_media as media

SYSTEM_ROLES = frozenset({"system", "developer"})

__all__ = ["media", "system_positions"]


def system_positions(doc: object) -> Iterator[tuple[object, object]]:
    if not isinstance(doc, dict) or not isinstance(doc.get("messages"), list):
        return
    messages = doc["messages"]
    for index, message in enumerate(messages):
        if isinstance(message, dict) and message.get("role") in SYSTEM_ROLES:
            yield messages, index
