"""OpenAI Chat Completions (`/v1/chat/completions`): everything the processor knows about it.

Requests: `messages[]` with roles; system and developer messages are system text; media sits in
the content parts (`image_url`, `input_audio`, `file`, and the `video_url`, `audio_url`,
`image_embeds` and `document_url` parts of compatible servers) and in a message's `audio` reference.
Streamed replies: `choices[i].delta` texts and tool-call argument fragments, one channel each,
ended by the choice's `finish_reason`. A failed stream ends with a `data:` error object.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Hashable, Iterator
from typing import Any, ClassVar

from ext_proc.dialects.base import Dialect, Position
from ext_proc.dialects.providers import OPENAI, openai_error
from ext_proc.errors import Refusal
from ext_proc.media.parts import MediaPart, base64_part, dicts, file_data, id_part, str_at, url_part
from ext_proc.restore.output_gate import API_OBJECT_KEYS, STRUCTURAL_KEYS
from ext_proc.restore.sse import Channel, ChannelKey, ChannelStream, Site, SseEvent, apply_sites

SYSTEM_ROLES = frozenset({"system", "developer"})


def system_positions(doc: object) -> Iterator[Position]:
    if not isinstance(doc, dict) or not isinstance(doc.get("messages"), list):
        return
    messages = doc["messages"]
    for index, message in enumerate(messages):
        if isinstance(message, dict) and message.get("role") in SYSTEM_ROLES:
            yield messages, index


# --- media ---------------------------------------------------------------------------------------


def chat_part(part: dict[str, Any]) -> Iterator[MediaPart]:
    """The media of one content part (the generic dialect reads a Chat-shaped part by it too).

    Besides OpenAI's own parts (`image_url`, `input_audio`, `file`), the parts OpenAI-compatible
    servers accept: `video_url` and `audio_url` (vLLM, SGLang), `image_embeds` (vLLM: a serialised
    tensor, or a dict of them), `document_url` and a bare-string `input_audio` (Mistral)."""
    kind = part.get("type")
    if kind == "image_url" or (kind is None and "image_url" in part):
        # `{"url": …}` as documented; a bare string and a part without `type` are accepted by
        # OpenAI-compatible servers (vLLM), so they are images too.
        image = part.get("image_url")
        if isinstance(image, str):
            yield from url_part("image", part, "image_url")
        else:
            yield from url_part("image", image, "url")
    elif kind in URL_PARTS:
        media, field = URL_PARTS[kind]
        value = part.get(field)
        if isinstance(value, str):
            yield from url_part(media, part, field)
        else:
            yield from url_part(media, value, "url")
    elif kind == "input_audio":
        audio = part.get("input_audio")
        if isinstance(audio, dict):
            yield from base64_part("audio", audio, "data")
        else:
            yield from base64_part("audio", part, "input_audio")
    elif kind == "image_embeds":
        embeds = part.get("image_embeds")
        if isinstance(embeds, dict):
            for key in embeds:
                yield from base64_part("embedding", embeds, key)
        else:
            yield from base64_part("embedding", part, "image_embeds")
    elif kind == "file":
        file = part.get("file")
        if isinstance(file, dict):
            if str_at(file, "file_data"):
                yield from file_data("file", file, "file_data")
            yield from id_part("file", file, "file_id")


# Part type → (media, the field holding `{"url": …}` or the URL itself).
URL_PARTS: dict[str, tuple[str, str]] = {
    "video_url": ("video", "video_url"),
    "audio_url": ("audio", "audio_url"),
    "document_url": ("file", "document_url"),
}


def media(doc: object) -> Iterator[MediaPart]:
    if not isinstance(doc, dict):
        return
    for message in dicts(doc.get("messages")):
        for part in dicts(message.get("content")):
            yield from chat_part(part)
        audio = message.get("audio")
        if isinstance(audio, dict) and str_at(audio, "id"):
            yield MediaPart("audio", "reference", audio, "id")


# --- streamed replies ----------------------------------------------------------------------------


class ChatStream(ChannelStream):
    """OpenAI Chat Completions: every string of `choices[i].delta`, which the SDK joins chunk by
    chunk. Restored as channels: the texts (`content`, `refusal`, the reasoning fields, the audio
    `transcript`) and the JSON text of tool-call and legacy `function_call` arguments; every other
    string of a delta is a gate channel of its key path (`audio.data` is base64 audio: media, not
    read). A choice's channels end with its `finish_reason`."""

    TEXT_FIELDS = ("content", "refusal", "reasoning_content", "reasoning")
    # Nested delta fields with channels of their own: (object, field) → JSON text.
    NESTED: ClassVar[dict[tuple[str, str], bool]] = {
        ("audio", "transcript"): False,
        ("function_call", "arguments"): True,
    }
    MEDIA: ClassVar[frozenset[tuple[str, str]]] = frozenset({("audio", "data")})

    def handle(self, event: SseEvent, data: Any) -> list[bytes]:
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or not choices:
            return self._plain(event, data)  # the usage chunk, an error object
        before: list[bytes] = []
        changed = False
        kept: list[Any] = []
        fed: list[Site] = []
        for pos, choice in enumerate(choices):
            if not isinstance(choice, dict):
                kept.append(choice)
                continue
            ci = choice.get("index", pos)
            sites = self._feed_choice(event, data, choice, ci)
            fed += sites
            if choice.get("finish_reason") is not None:
                # The choice ends here: what its channels hold goes out now, into this event for
                # the channels it carries text for, as synthetic events before it for the others.
                by_key = {site.key: site for site in sites}
                for key in [k for k in self._channels if k[1] == ci]:
                    site = by_key.get(key)
                    if site is not None:
                        site.out += self._end(key)[1]
                    else:
                        before.extend(self._flush([key]))
                self._finish_gate(functools.partial(_owned_by, ci=ci))
            if apply_sites(sites):
                changed = True
                if self._emptied(choice):
                    continue  # everything it carried is held back: leave the choice out
            kept.append(choice)
        if changed:
            data["choices"] = kept
            if not kept and data.get("usage") is None:
                return before + self._held(event, data, fed)  # the whole chunk is held back
        return before + self._plain(event, data, changed, fed)

    def _feed_choice(
        self, event: SseEvent, data: dict[str, Any], choice: dict[str, Any], ci: Any
    ) -> list[Site]:
        sites: list[Site] = []
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return sites
        for field in self.TEXT_FIELDS:
            text = delta.get(field)
            if isinstance(text, str) and text:
                key: ChannelKey = ("chat", ci, field)
                out = self._feed(key, event, data, choice, text, json_escaped=False)
                sites.append(Site(key, delta, field, text, out))
        if delta.keys() <= _PLAIN_FIELDS and (
            self._gate is None or all(isinstance(value, str) for value in delta.values())
        ):
            return sites  # texts and bookkeeping only (most deltas): nothing else to read
        for (outer, field), json_escaped in self.NESTED.items():
            inner = delta.get(outer)
            text = inner.get(field) if isinstance(inner, dict) else None
            if isinstance(text, str) and text:
                assert isinstance(inner, dict)
                key = ("chat", ci, outer, field)
                out = self._feed(key, event, data, choice, text, json_escaped=json_escaped)
                sites.append(Site(key, inner, field, text, out))
        for outer, field in self.MEDIA:
            inner = delta.get(outer)
            if isinstance(inner, dict) and isinstance(inner.get(field), str):
                value = inner[field]
                sites.append(Site(("chat", ci, outer, field), inner, field, value, value))
        tool_calls = delta.get("tool_calls")
        if isinstance(tool_calls, list):
            for tpos, call in enumerate(tool_calls):
                if not isinstance(call, dict):
                    continue
                index = call.get("index", tpos)
                function = call.get("function")
                args = function.get("arguments") if isinstance(function, dict) else None
                if isinstance(args, str) and args:
                    assert isinstance(function, dict)
                    key = ("chat", ci, "tool", index)
                    out = self._feed(key, event, data, choice, args, json_escaped=True)
                    sites.append(Site(key, function, "arguments", args, out))
                # The call's other strings (its name, fields this code does not know).
                sites += self._path_sites(call, ("chat", ci, "tool", index, "call"), frozenset({"arguments"}))
        # Every other string of the delta: a gate channel of its key path.
        # A text field that is not a string (`content` as a list of parts, which no stream
        # should send) is read by its key paths like any other value.
        for field, value in delta.items():
            if isinstance(value, str):
                if value and field not in self.TEXT_FIELDS and field not in STRUCTURAL_KEYS:
                    prefix: ChannelKey = ("chat", ci, "delta", field)
                    self._gate_path(prefix, value)
                    sites.append(Site(prefix, delta, field, value, self._whole(value, field)))
            elif isinstance(value, dict) or (isinstance(value, list) and field != "tool_calls"):
                prefix = ("chat", ci, "delta", field)
                sites += self._path_sites(
                    value, prefix, _HANDLED.get(field, frozenset()), envelope=field in API_OBJECT_KEYS
                )
        return sites

    @staticmethod
    def _emptied(choice: dict[str, Any]) -> bool:
        """Drop tool-call entries left without content; True if the choice now carries nothing."""
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return False
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            calls = [c for c in calls if not (isinstance(c, dict) and _bare_tool_call(c))]
            if calls:
                delta["tool_calls"] = calls
            else:
                del delta["tool_calls"]
        for outer, _ in ChatStream.NESTED:
            if outer in delta and delta[outer] == {}:
                del delta[outer]
        return not delta and choice.get("finish_reason") is None and not choice.get("logprobs")

    def _synthetic(self, key: ChannelKey, channel: Channel, text: str) -> dict[str, Any]:
        data = {k: v for k, v in channel.data.items() if k != "choices"}
        if data.get("usage") is not None:
            data["usage"] = None
        choice = {k: v for k, v in channel.part.items() if k != "delta"}
        if "finish_reason" in choice:
            choice["finish_reason"] = None
        if "logprobs" in choice:
            choice["logprobs"] = None  # SDKs append logprobs: the clone must not repeat them
        if key[2] == "tool":
            # Only index and the fragment: SDKs concatenate every string field of a delta, so a
            # repeated `id` or `name` would be doubled.
            choice["delta"] = {"tool_calls": [{"index": key[3], "function": {"arguments": text}}]}
        elif len(key) == 4:
            choice["delta"] = {key[2]: {key[3]: text}}
        else:
            choice["delta"] = {key[2]: text}
        data["choices"] = [choice]
        return data


# The string fields of a delta that are read above as texts, or are bookkeeping.
_PLAIN_FIELDS = frozenset(ChatStream.TEXT_FIELDS) | STRUCTURAL_KEYS

# The fields of a delta's nested objects that have channels (or are media) of their own: the
# rest of such an object is read by its key paths.
_HANDLED: dict[str, frozenset[str]] = {
    outer: frozenset(f for o, f in (*ChatStream.NESTED, *ChatStream.MEDIA) if o == outer)
    for outer, _ in (*ChatStream.NESTED, *ChatStream.MEDIA)
}


def _owned_by(key: Hashable, ci: Any) -> bool:
    """Whether gate channel `key` belongs to choice `ci` of a Chat stream."""
    return isinstance(key, tuple) and len(key) > 1 and key[0] == "chat" and key[1] == ci


def _bare_tool_call(call: dict[str, Any]) -> bool:
    function = call.get("function")
    if isinstance(function, dict) and not function:
        del call["function"]
    return set(call) <= {"index", "type"}


def error_event(refusal: Refusal) -> bytes:
    """The refusal as Chat Completions ends a failed stream: a `data:` line with the error object."""
    error = json.dumps({"error": openai_error(refusal)}, separators=(",", ":")).encode("utf-8")
    return b"data: " + error + b"\n\n"


CHAT = Dialect(
    name="chat",
    provider=OPENAI,
    paths=("/v1/chat/completions",),
    media=media,
    system_positions=system_positions,
    stream=ChatStream,
    error_event=error_event,
)
