"""OpenAI Responses (`/v1/responses`, `/v1/responses/input_tokens`): everything the processor knows about it.

Requests: `instructions` and system/developer input items are system text. Every input item type
is walked, including types the API adds later; media sits in `input_image`, `input_file`,
`input_audio` and `computer_screenshot` parts (in messages, tool outputs, prompt variables and a
list-form `instructions`), in generated images and a code interpreter's image outputs, and in the
files a request hands its tools (container file ids, vector stores, an image mask). Streamed
replies: `response.*.delta` events, one channel per item and part, ended by their `.done`, the
part's or item's end, or the response's. A failed stream ends with an `error` event.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from ext_proc.dialects.base import Dialect, Position
from ext_proc.dialects.providers import OPENAI, openai_error
from ext_proc.errors import Refusal
from ext_proc.media.parts import (
    MediaPart,
    base64_part,
    dicts,
    file_data,
    id_list,
    id_part,
    str_at,
    url_part,
)
from ext_proc.restore.sse import Channel, ChannelKey, ChannelStream, Site, SseEvent, apply_sites

SYSTEM_ROLES = frozenset({"system", "developer"})


def system_positions(doc: object) -> Iterator[Position]:
    if not isinstance(doc, dict):
        return
    if "instructions" in doc:
        yield doc, "instructions"
    items = doc.get("input")
    if isinstance(items, list):
        for index, item in enumerate(items):
            if isinstance(item, dict) and item.get("role") in SYSTEM_ROLES:
                yield items, index


# --- media ---------------------------------------------------------------------------------------


def responses_part(part: dict[str, Any]) -> Iterator[MediaPart]:
    """The media of one input part (the generic dialect reads a Responses-shaped part by it too)."""
    kind = part.get("type")
    if kind in ("input_image", "computer_screenshot"):
        yield from url_part("image", part, "image_url")
        yield from id_part("image", part, "file_id")
    elif kind == "input_file":
        if str_at(part, "file_data"):
            yield from file_data("file", part, "file_data")
        yield from url_part("file", part, "file_url")
        yield from id_part("file", part, "file_id")
    elif kind == "input_audio":
        audio = part.get("input_audio")
        if isinstance(audio, dict):
            yield from base64_part("audio", audio, "data")


def items_media(items: object) -> Iterator[MediaPart]:
    """The media of a list of input items (`input`, and `instructions` in its list form)."""
    for item in dicts(items):
        kind = item.get("type")
        if kind == "message" or (kind is None and "role" in item):
            for part in dicts(item.get("content")):
                yield from responses_part(part)
        elif kind in ("function_call_output", "custom_tool_call_output"):
            for part in dicts(item.get("output")):
                yield from responses_part(part)
        elif kind == "computer_call_output":
            output = item.get("output")
            if isinstance(output, dict):
                yield from responses_part(output)
        elif kind == "image_generation_call":
            yield from base64_part("image", item, "result")
        elif kind == "code_interpreter_call":
            # Images the code produced, replayed: `{"type": "image", "url": …}` outputs.
            for output in dicts(item.get("outputs")):
                if output.get("type") == "image":
                    yield from url_part("image", output, "url")


def tools_media(tools: object) -> Iterator[MediaPart]:
    """Files a request hands its tools: a code interpreter's container (its file ids, or a
    container id), file search's vector stores, an image generation's input mask."""
    for tool in dicts(tools):
        kind = tool.get("type")
        if kind == "code_interpreter":
            container = tool.get("container")
            if isinstance(container, str) and container:
                yield MediaPart("file", "reference", tool, "container")
            elif isinstance(container, dict):
                yield from id_list("file", container, "file_ids")
        elif kind == "file_search":
            yield from id_list("file", tool, "vector_store_ids")
        elif kind == "image_generation":
            mask = tool.get("input_image_mask")
            if isinstance(mask, dict):
                yield from url_part("image", mask, "image_url")
                yield from id_part("image", mask, "file_id")


def media(doc: object) -> Iterator[MediaPart]:
    if not isinstance(doc, dict):
        return
    yield from items_media(doc.get("input"))
    yield from items_media(doc.get("instructions"))
    yield from tools_media(doc.get("tools"))
    prompt = doc.get("prompt")
    variables = prompt.get("variables") if isinstance(prompt, dict) else None
    if isinstance(variables, dict):
        # A prompt variable may be an input_image / input_file part.
        for value in variables.values():
            if isinstance(value, dict):
                yield from responses_part(value)


# --- streamed replies ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Delta:
    index_field: str | None  # which index, besides item_id, tells the channel apart
    json_escaped: bool
    # The gate channel the SDK joins this text into across parts and items (`output_text`), or
    # None: one per item (a tool call's arguments are a text of their own).
    joined: str | None


class ResponsesStream(ChannelStream):
    """OpenAI Responses: `response.*.delta` events, ended by their `.done` or the item's end.

    The output text is one gate channel across every part and item (the SDK's `output_text` joins
    them), and so are the refusal, the reasoning text and summary, and the audio transcript; a
    part's text starts with what `*.part.added` carries. `response.audio.delta` is base64 audio:
    media, not read.
    """

    DELTAS: ClassVar[dict[str, _Delta]] = {
        "response.output_text.delta": _Delta("content_index", False, "output_text"),
        "response.refusal.delta": _Delta("content_index", False, "refusal"),
        "response.reasoning_text.delta": _Delta("content_index", False, "reasoning_text"),
        "response.reasoning_summary_text.delta": _Delta("summary_index", False, "reasoning_summary"),
        "response.audio.transcript.delta": _Delta(None, False, "audio_transcript"),
        "response.function_call_arguments.delta": _Delta(None, True, None),
        "response.custom_tool_call_input.delta": _Delta(None, False, None),
        "response.mcp_call_arguments.delta": _Delta(None, True, None),
        "response.code_interpreter_call_code.delta": _Delta(None, False, None),
    }
    # Part ends: `*.part.done` carries item_id and the index of the part.
    PART_DONE: ClassVar[dict[str, str]] = {
        "response.content_part.done": "content_index",
        "response.reasoning_summary_part.done": "summary_index",
    }
    # Part starts: the part's type → (its delta type, the field holding its text).
    PART_TEXT: ClassVar[dict[str, tuple[str, str]]] = {
        "output_text": ("response.output_text.delta", "text"),
        "refusal": ("response.refusal.delta", "refusal"),
        "reasoning_text": ("response.reasoning_text.delta", "text"),
        "summary_text": ("response.reasoning_summary_text.delta", "text"),
    }
    PART_ADDED = frozenset({"response.content_part.added", "response.reasoning_summary_part.added"})
    MEDIA_DELTAS = frozenset({"response.audio.delta"})
    TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed", "error"})

    def handle(self, event: SseEvent, data: Any) -> list[bytes]:
        etype = data.get("type") if isinstance(data, dict) else None
        if not isinstance(etype, str):
            return self._plain(event, data)
        spec = self.DELTAS.get(etype)
        if spec is not None:
            text = data.get("delta")
            if not isinstance(text, str) or not text:
                return self._plain(event, data)
            key = (etype, data.get("item_id"), data.get(spec.index_field) if spec.index_field else None)
            site = Site(key, data, "delta", text, "")
            site.out = self._feed(
                key, event, data, data, text, json_escaped=spec.json_escaped, gate_key=_gate_key(key, spec)
            )
            if not site.out:
                return self._held(event, data, [site])  # all of it is held back
            return self._plain(event, data, apply_sites([site]), [site])
        if etype in self.MEDIA_DELTAS and isinstance(data.get("delta"), str):
            return self._plain(event, data, fed=[Site((etype,), data, "delta", data["delta"], data["delta"])])
        text = data.get("delta")
        if etype.endswith(".delta") and isinstance(text, str) and text:
            # A delta type this code does not know: its text is one gate channel across events
            # (per item and part), restored in full.
            channel: ChannelKey = (
                etype,
                data.get("item_id"),
                data.get("output_index"),
                data.get("content_index"),
            )
            self._gate_path(channel, text)
            site = Site(channel, data, "delta", text, self._restorer.restore_text(text))
            return self._plain(event, data, apply_sites([site]), [site])
        seeds: list[Site] = []
        if etype in self.PART_ADDED:
            seeds = self._part_seed(data)
        elif etype == "response.output_item.added":
            seeds = self._item_seeds(data)
        flushed = self._flush_where(self._ended_by(etype, data))
        return flushed + self._plain(event, data, apply_sites(seeds), seeds)

    def _part_seed(self, data: dict[str, Any]) -> list[Site]:
        """A part's first text, carried by its `*.part.added` event: the start of its channel."""
        part = data.get("part")
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(kind, str) or kind not in self.PART_TEXT:
            return []
        assert isinstance(part, dict)
        delta_type, field = self.PART_TEXT[kind]
        spec = self.DELTAS[delta_type]
        index = data.get(spec.index_field) if spec.index_field else None
        return self._seed_of(part, field, (delta_type, data.get("item_id"), index), spec)

    def _item_seeds(self, data: dict[str, Any]) -> list[Site]:
        """An item's first texts, carried by `response.output_item.added` (an upstream may put the
        start of a part's text, or of a call's arguments, there): the start of their channels."""
        item = data.get("item")
        if not isinstance(item, dict):
            return []
        item_id = item.get("id")
        seeds: list[Site] = []
        lists = (("content", "content_index"), ("summary", "summary_index"))
        for field, index_field in lists:
            parts = item.get(field)
            if not isinstance(parts, list):
                continue
            for index, part in enumerate(parts):
                kind = part.get("type") if isinstance(part, dict) else None
                if not isinstance(kind, str) or kind not in self.PART_TEXT:
                    continue
                assert isinstance(part, dict)
                delta_type, text_field = self.PART_TEXT[kind]
                spec = self.DELTAS[delta_type]
                if spec.index_field != index_field:
                    continue
                seeds += self._seed_of(part, text_field, (delta_type, item_id, index), spec)
        if item.get("type") == "function_call":
            delta_type = "response.function_call_arguments.delta"
            seeds += self._seed_of(item, "arguments", (delta_type, item_id, None), self.DELTAS[delta_type])
        return seeds

    def _seed_of(self, container: dict[str, Any], field: str, key: ChannelKey, spec: _Delta) -> list[Site]:
        return self._seed(container, field, key, _gate_key(key, spec), json_text=spec.json_escaped)

    def _ended_by(self, etype: str, data: dict[str, Any]) -> Callable[[ChannelKey], bool]:
        item_id = data.get("item_id")
        if etype.endswith(".done") and (delta_type := etype[: -len(".done")] + ".delta") in self.DELTAS:
            spec = self.DELTAS[delta_type]
            index = data.get(spec.index_field) if spec.index_field else None
            return lambda key: key == (delta_type, item_id, index)
        index_field = self.PART_DONE.get(etype)
        if index_field is not None:
            index = data.get(index_field)
            return lambda key: key[1] == item_id and self._index_field(key) == index_field and key[2] == index
        if etype == "response.output_item.done":
            item = data.get("item")
            done_id = item.get("id") if isinstance(item, dict) else None
            return lambda key: key[1] == done_id
        if etype in self.TERMINAL:
            if self._gate is not None:
                self._gate.finish_windows()  # the response is over: every joined text too
            return lambda key: True
        return lambda key: False

    def _index_field(self, key: ChannelKey) -> str | None:
        delta_type = key[0]
        assert isinstance(delta_type, str)  # this handler's channels are keyed by their delta type
        return self.DELTAS[delta_type].index_field

    def _synthetic(self, key: ChannelKey, channel: Channel, text: str) -> dict[str, Any]:
        data = dict(channel.data)
        data["delta"] = text
        if isinstance(data.get("logprobs"), list):
            data["logprobs"] = []
        return data


def _gate_key(key: ChannelKey, spec: _Delta) -> ChannelKey:
    return ("responses", spec.joined) if spec.joined is not None else key


def error_event(refusal: Refusal) -> bytes:
    """The refusal as Responses ends a failed stream: an `error` event, which also carries the
    error object (what the SDKs look for in a data payload)."""
    event = {
        "type": "error",
        "code": refusal.code,
        "message": refusal.message,
        "param": None,
        "error": openai_error(refusal),
    }
    return b"event: error\ndata: " + json.dumps(event, separators=(",", ":")).encode("utf-8") + b"\n\n"


RESPONSES = Dialect(
    name="responses",
    provider=OPENAI,
    paths=("/v1/responses", "/v1/responses/input_tokens"),
    media=media,
    system_positions=system_positions,
    stream=ResponsesStream,
    error_event=error_event,
)
