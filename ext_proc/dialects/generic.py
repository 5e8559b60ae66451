"""Any other JSON endpoint (completions, embeddings, endpoints added later): no schema known.

Nothing in it is system text. Everything in it is read as text by the walk, except real media:
without a schema, every media-shaped part, binary data: URL (in an object or a list) and file
reference counts as media, and a payload that decodes to media bytes is not read as text. A
streamed reply has every string of every event restored in full (no channels to hold a placeholder
back across events), and a failed stream ends the way Chat Completions' does, with a `data:` error
object.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ext_proc.dialects.base import Dialect, Position
from ext_proc.dialects.chat import CHAT, URL_PARTS, ChatStream, chat_part
from ext_proc.dialects.messages import CODE_EXECUTION_RESULTS, anthropic_block
from ext_proc.dialects.responses import responses_part, tools_media
from ext_proc.media.parts import (
    MediaPart,
    base64_part,
    dicts,
    id_list,
    is_binary_data_url,
    media_kind_of,
)
from ext_proc.restore.sse import Channel, ChannelKey, ChannelStream, Site, SseEvent


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
        *URL_PARTS,
        "image_embeds",
        *CODE_EXECUTION_RESULTS,
    }
)
# Keys that name files uploaded earlier (a batch's input file, a vector store's file), or lists of
# them: references to media this code cannot read.
_FILE_KEYS = frozenset({"file_id", "input_file_id"})
_FILE_LIST_KEYS = frozenset({"file_ids", "vector_store_ids"})
MAX_DEPTH = 64  # the walk refuses deeper nesting anyway


def media(doc: object) -> Iterator[MediaPart]:
    """An endpoint whose schema is unknown: every media-shaped part, binary data: URL and file
    reference counts.

    Without a schema, nothing tells a tool input from a message part, so this errs towards media:
    the policy of a subject request then judges them (block refuses). A payload is exempt from
    the text walk only when it is real media, as at any schema position (ext_proc.media.parts).
    """
    yield from _media(doc, 0)
    if isinstance(doc, dict):
        # Items of the Responses shape sent to an endpoint this code has no schema for
        # (`/v1/responses/compact`, conversation items): their generated images are media.
        for item in dicts(doc.get("input")) if "input" in doc else dicts(doc.get("items")):
            if item.get("type") == "image_generation_call":
                yield from base64_part("image", item, "result")
        yield from tools_media(doc.get("tools"))


def _media(value: object, depth: int) -> Iterator[MediaPart]:
    if depth > MAX_DEPTH:
        return
    if isinstance(value, dict):
        kind = value.get("type")
        claimed: set[object] = set()  # keys of `value` a part function already yielded
        if kind in _PART_TYPES or (kind is None and "image_url" in value):
            for part in (*chat_part(value), *responses_part(value), *anthropic_block(value, 0)):
                if part.container is value:
                    claimed.add(part.key)
                yield part
        for key, item in value.items():
            if key in claimed:
                continue
            if isinstance(item, str):
                if is_binary_data_url(item):
                    yield MediaPart(media_kind_of(item), "data_url", value, key)
                elif key in _FILE_KEYS and item:
                    yield MediaPart("file", "file_id", value, key)
            elif key == "images" and isinstance(item, list):
                # Ollama's native chat: a message's images as bare base64 strings.
                for index in range(len(item)):
                    yield from base64_part("image", item, index)
            elif key in _FILE_LIST_KEYS:
                yield from id_list("file", value, key)
            else:
                yield from _media(item, depth + 1)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            if isinstance(item, str):
                if is_binary_data_url(item):
                    yield MediaPart(media_kind_of(item), "data_url", value, index)
            else:
                yield from _media(item, depth + 1)


# --- streamed replies ----------------------------------------------------------------------------


class GenericStream(ChatStream):
    """A stream of an endpoint without a schema here: the legacy completions `choices[i].text`
    and Chat-shaped `choices[i].delta` are channels (restored across events like Chat's); in any
    other event every string is a gate channel of its key path, since what one event cuts the
    next may go on with."""

    def handle(self, event: SseEvent, data: Any) -> list[bytes]:
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or not choices:
            return ChannelStream.handle(self, event, data)
        return super().handle(event, data)

    def _feed_choice(
        self, event: SseEvent, data: dict[str, Any], choice: dict[str, Any], ci: Any
    ) -> list[Site]:
        sites = super()._feed_choice(event, data, choice, ci)
        text = choice.get("text")
        if isinstance(text, str) and text:
            key: ChannelKey = ("chat", ci, "completion")
            out = self._feed(key, event, data, choice, text, json_escaped=False)
            sites.append(Site(key, choice, "text", text, out))
        return sites

    @staticmethod
    def _emptied(choice: dict[str, Any]) -> bool:
        if "delta" not in choice:
            return "text" not in choice and choice.get("finish_reason") is None
        return ChatStream._emptied(choice)

    def _synthetic(self, key: ChannelKey, channel: Channel, text: str) -> dict[str, Any]:
        if key[2] != "completion":
            return super()._synthetic(key, channel, text)
        data = {k: v for k, v in channel.data.items() if k != "choices"}
        if data.get("usage") is not None:
            data["usage"] = None
        choice = {**channel.part, "text": text}
        if "finish_reason" in choice:
            choice["finish_reason"] = None
        if "logprobs" in choice:
            choice["logprobs"] = None
        data["choices"] = [choice]
        return data


GENERIC = Dialect(
    name="generic",
    provider=None,
    paths=(),
    media=media,
    system_positions=system_positions,
    stream=GenericStream,
    error_event=CHAT.error_event,
)
