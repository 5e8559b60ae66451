"""Any other JSON endpoint (completions, embeddings, endpoints added later): no schema known.

Nothing in it is system text. Everything in it is read as text by the walk, except what looks like
media: without a schema, every media-shaped part and binary data: URL counts as media. A streamed
reply has every string of every event restored in full (no channels to hold a placeholder back
across events), and a failed stream ends the way Chat Completions' does, with a `data:` error object.
"""

from __future__ import annotations

from collections.abc import Iterator

from ext_proc.dialects.base import Dialect, Position
from ext_proc.dialects.chat import CHAT, chat_part
from ext_proc.dialects.messages import anthropic_block
from ext_proc.dialects.responses import responses_part
from ext_proc.media.parts import MediaPart, dicts, is_data_url, str_at
from ext_proc.restore.sse import ChannelStream


def system_positions(doc: object) -> Iterator[Position]:
    return iter(())


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


def media(doc: object) -> Iterator[MediaPart]:
    """An endpoint whose schema is unknown: every media-shaped part and binary data: URL counts.

    Without a schema, nothing tells a tool input from a message part, so this errs towards media:
    the policy of a subject request then judges them (block refuses), and their bytes are not
    read as text (they carry no text to read).
    """
    yield from _media(doc, 0)
    if isinstance(doc, dict):
        # Items of the Responses shape sent to an endpoint this code has no schema for
        # (`/v1/responses/compact`, conversation items): their generated images are media.
        for item in dicts(doc.get("input")) if "input" in doc else dicts(doc.get("items")):
            if item.get("type") == "image_generation_call" and str_at(item, "result"):
                yield MediaPart("image", "base64", item, "result")


def _media(value: object, depth: int) -> Iterator[MediaPart]:
    if depth > 64:  # the walk refuses such nesting anyway
        return
    if isinstance(value, dict):
        kind = value.get("type")
        claimed: set[str] = set()  # keys of `value` a part function already yielded
        if kind in _PART_TYPES or (kind is None and "image_url" in value):
            for part in (*chat_part(value), *responses_part(value), *anthropic_block(value, 0)):
                if part.container is value:
                    claimed.add(part.key)
                yield part
        for key, item in value.items():
            if isinstance(item, str):
                if key not in claimed and is_data_url(item):
                    yield MediaPart("file", "data_url", value, key)
            else:
                yield from _media(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            yield from _media(item, depth + 1)


GENERIC = Dialect(
    name="generic",
    provider=None,
    paths=(),
    media=media,
    system_positions=system_positions,
    stream=ChannelStream,
    error_event=CHAT.error_event,
)
