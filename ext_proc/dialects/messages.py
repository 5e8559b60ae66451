"""Anthropic Messages (`/v1/messages`, `/v1/messages/count_tokens`) and message batches
(`/v1/messages/batches`): everything the processor knows about them.

Requests: the top-level `system` is system text (of each batch request's `params`); media sits in
`image` and `document` blocks (every source type, also in the `system` list), container uploads,
the blocks of tool and search results, the files of code execution results, and the request's
code execution `container`. Streamed replies: `content_block_delta` texts per block index, ended by
`content_block_stop`. A failed stream ends with an `error` event carrying Anthropic's error body.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

from ext_proc.dialects.base import Dialect, Position
from ext_proc.dialects.chat import CHAT
from ext_proc.dialects.providers import ANTHROPIC
from ext_proc.errors import Refusal
from ext_proc.media.parts import MediaPart, base64_part, dicts, id_part, str_at, url_part
from ext_proc.restore.sse import Channel, ChannelKey, ChannelStream, Site, SseEvent, apply_sites


def system_positions(doc: object) -> Iterator[Position]:
    if isinstance(doc, dict) and "system" in doc:
        yield doc, "system"


def batch_system_positions(doc: object) -> Iterator[Position]:
    """Message batches: the `system` of each request's `params`."""
    if not isinstance(doc, dict) or not isinstance(doc.get("requests"), list):
        return
    for entry in doc["requests"]:
        if isinstance(entry, dict):
            yield from system_positions(entry.get("params"))


# --- media ---------------------------------------------------------------------------------------


def anthropic_block(block: dict[str, Any], depth: int) -> Iterator[MediaPart]:
    """The media of one content block, nested blocks up to depth 4 (the generic dialect reads an
    Anthropic-shaped block by it too)."""
    kind = block.get("type")
    if kind in ("image", "document"):
        source = block.get("source")
        if not isinstance(source, dict):
            return
        source_type = source.get("type")
        if source_type == "base64":
            yield from base64_part(kind, source, "data")
        elif source_type == "url":
            yield from url_part(kind, source, "url")
        elif source_type == "file":
            yield from id_part(kind, source, "file_id")
        elif source_type == "content" and depth < 4:
            # A document made of blocks: its text blocks are text, its images are media.
            for inner in dicts(source.get("content")):
                yield from anthropic_block(inner, depth + 1)
        elif source_type == "text" and str_at(source, "data"):
            # A plain-text document: still a document (a document of any source type is media),
            # so a subject request's media policy judges it; its text is read and redacted like
            # any string.
            yield MediaPart(kind, "text", source, "data")
        elif str_at(source, "data"):
            # A source type this code does not know yet, carrying data: media all the same (its
            # payload is exempt only if it decodes to media).
            yield from base64_part(kind, source, "data")
    elif kind == "container_upload":
        yield from id_part("file", block, "file_id")
    elif kind in NESTING_BLOCKS and depth < 4:
        for inner in dicts(block.get("content")):
            yield from anthropic_block(inner, depth + 1)
    elif kind == "web_fetch_tool_result" and depth < 4:
        # The fetched page, as the server tool returned it: a `document` block.
        result = block.get("content")
        page = result.get("content") if isinstance(result, dict) else None
        if isinstance(page, dict):
            yield from anthropic_block(page, depth + 1)
    elif kind in CODE_EXECUTION_RESULTS:
        # Files the code wrote, replayed: `{"type": "…_output", "file_id": …}` in the result.
        result = block.get("content")
        for output in dicts(result.get("content") if isinstance(result, dict) else None):
            yield from id_part("file", output, "file_id")


# Blocks whose `content` is a list of blocks that may hold media.
NESTING_BLOCKS = frozenset({"tool_result", "mcp_tool_result", "search_result"})
CODE_EXECUTION_RESULTS = frozenset({"code_execution_tool_result", "bash_code_execution_tool_result"})


def media(doc: object) -> Iterator[MediaPart]:
    if not isinstance(doc, dict):
        return
    for message in dicts(doc.get("messages")):
        for block in dicts(message.get("content")):
            yield from anthropic_block(block, 0)
    # The system prompt takes text blocks only, but a block of any kind there is judged as media.
    for block in dicts(doc.get("system")):
        yield from anthropic_block(block, 0)
    # A code execution container holds files uploaded earlier: a reference to them.
    container = doc.get("container")
    if container and isinstance(container, (str, dict)):
        yield MediaPart("file", "reference", doc, "container")


def batch_media(doc: object) -> Iterator[MediaPart]:
    """Anthropic message batches: each request's `params` is a Messages body."""
    if not isinstance(doc, dict):
        return
    for entry in dicts(doc.get("requests")):
        yield from media(entry.get("params"))


# --- streamed replies ----------------------------------------------------------------------------


class MessagesStream(ChannelStream):
    """Anthropic Messages: `content_block_delta` texts per block index, ended by `content_block_stop`.

    The text blocks of a message are one gate channel (an SDK joins them), the thinking blocks
    another; a block's text starts with what its `content_block_start` carries. Each tool input
    is a JSON text of its own."""

    # delta.type → (text field, JSON-escaped, the gate channel the SDK joins it into or None)
    DELTAS: ClassVar[dict[str, tuple[str, bool, str | None]]] = {
        "text_delta": ("text", False, "text"),
        "thinking_delta": ("thinking", False, "thinking"),
        "input_json_delta": ("partial_json", True, None),
    }
    # A block's type → the field holding the text it starts with.
    BLOCK_TEXT: ClassVar[dict[str, str]] = {"text": "text", "thinking": "thinking"}
    ENDS_ALL = frozenset({"message_delta", "message_stop", "error"})

    def handle(self, event: SseEvent, data: Any) -> list[bytes]:
        etype = data.get("type") if isinstance(data, dict) else None
        if etype == "content_block_delta":
            delta = data.get("delta")
            kind = delta.get("type") if isinstance(delta, dict) else None
            spec = self.DELTAS.get(kind) if kind is not None else None
            if spec is None:
                return self._plain(event, data)  # signature_delta, citations_delta, …
            assert isinstance(delta, dict)
            field, json_escaped, joined = spec
            text = delta.get(field)
            if not isinstance(text, str) or not text:
                return self._plain(event, data)
            key = (field, data.get("index"))
            site = Site(key, delta, field, text, "")
            gate_key = ("messages", joined) if joined is not None else None
            site.out = self._feed(key, event, data, data, text, json_escaped=json_escaped, gate_key=gate_key)
            if not site.out:
                return self._held(event, data, [site])  # all of it is held back
            return self._plain(event, data, apply_sites([site]), [site])
        if etype == "content_block_start":
            seeds = self._block_seed(data)
            return self._plain(event, data, apply_sites(seeds), seeds)
        if etype == "content_block_stop":
            index = data.get("index")
            return self._flush_where(lambda key: key[1] == index) + self._plain(event, data)
        if etype in self.ENDS_ALL:
            return self.flush_all() + self._plain(event, data)
        return self._plain(event, data)  # message_start may carry content: restored in full

    def _block_seed(self, data: dict[str, Any]) -> list[Site]:
        """The text a block starts with: the start of its channel (an SDK appends the deltas to it)."""
        block = data.get("content_block")
        kind = block.get("type") if isinstance(block, dict) else None
        field = self.BLOCK_TEXT.get(kind) if isinstance(kind, str) else None
        if field is None:
            return []
        assert isinstance(block, dict)
        return self._seed(block, field, (field, data.get("index")), ("messages", field), json_text=False)

    def _synthetic(self, key: ChannelKey, channel: Channel, text: str) -> dict[str, Any]:
        data = dict(channel.data)
        data["delta"] = {**channel.data["delta"], key[0]: text}
        return data


def error_event(refusal: Refusal) -> bytes:
    """The refusal as Messages ends a failed stream: an `error` event with Anthropic's error body."""
    return b"event: error\ndata: " + ANTHROPIC.error_body(refusal) + b"\n\n"


MESSAGES = Dialect(
    name="messages",
    provider=ANTHROPIC,
    paths=("/v1/messages", "/v1/messages/count_tokens"),
    media=media,
    system_positions=system_positions,
    stream=MessagesStream,
    error_event=error_event,
)
# A batch is created in one request and its results fetched later: its reply is never streamed,
# so it has no stream handler of its own, and a stream error would take the plain `data:` form.
MESSAGE_BATCHES = Dialect(
    name="message_batches",
    provider=ANTHROPIC,
    paths=("/v1/messages/batches",),
    media=batch_media,
    system_positions=batch_system_positions,
    stream=ChannelStream,
    error_event=CHAT.error_event,
)
