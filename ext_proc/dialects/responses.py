"""OpenAI Responses (`/v1/responses`, `/v1/responses/input_tokens`): everything the processor knows about it.

Requests: `instructions` and system/developer input items are system text. Every input item type
is walked, including types the API adds later; only the media positions below are exempt
(`input_image`, `input_file`, `input_audio` and `computer_screenshot` parts, in messages, tool
outputs and prompt variables, and generated images). Streamed replies: `response.*.delta` events,
one channel per item and part, ended by their `.done`, the part's or item's end, or the response's.
A failed stream ends with an `error` event.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from ext_proc.dialects.base import Dialect, Position
from ext_proc.dialects.providers import OPENAI, openai_error
from ext_proc.errors import Refusal
from ext_proc.media.parts import MediaPart, dicts, file_data, id_part, str_at, url_part
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
        if isinstance(audio, dict) and str_at(audio, "data"):
            yield MediaPart("audio", "base64", audio, "data")


def media(doc: object) -> Iterator[MediaPart]:
    if not isinstance(doc, dict):
        return
    for item in dicts(doc.get("input")):
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
        elif kind == "image_generation_call" and str_at(item, "result"):
            yield MediaPart("image", "base64", item, "result")
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


class ResponsesStream(ChannelStream):
    """OpenAI Responses: `response.*.delta` events, ended by their `.done` or the item's end."""

    DELTAS: ClassVar[dict[str, _Delta]] = {
        "response.output_text.delta": _Delta("content_index", False),
        "response.refusal.delta": _Delta("content_index", False),
        "response.reasoning_text.delta": _Delta("content_index", False),
        "response.reasoning_summary_text.delta": _Delta("summary_index", False),
        "response.function_call_arguments.delta": _Delta(None, True),
        "response.custom_tool_call_input.delta": _Delta(None, False),
        "response.mcp_call_arguments.delta": _Delta(None, True),
    }
    # Part ends: `*.part.done` carries item_id and the index of the part.
    PART_DONE: ClassVar[dict[str, str]] = {
        "response.content_part.done": "content_index",
        "response.reasoning_summary_part.done": "summary_index",
    }
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
            site.out = self._feed(key, event, data, data, text, json_escaped=spec.json_escaped)
            if not site.out:
                return self._held(data, [site])  # all of it is held back
            return self._plain(event, data, apply_sites([site]), [site])
        return self._flush_where(self._ended_by(etype, data)) + self._plain(event, data)

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
