"""A streamed (SSE) reply restored and read: events framed from chunks cut anywhere, channels per dialect.

Where it sits: Envoy hands a streamed reply over in chunks cut at arbitrary byte positions;
`SseRestorer` frames them into events (lines end in `\\n`, `\\r\\n` or a bare `\\r`, as the SSE
format allows and the SDKs accept) and hands each to the dialect's stream handler (a
`ChannelStream` subclass in ext_proc.dialects, named by the `Dialect`). A handler feeds each delta
text to its channel's `StreamRestorer` (ext_proc.restore.stream) and to the output gate's window of
the text the SDK joins it into, and restores every other string of the event in full. When a
channel ends, its held tail goes out in a synthetic delta event, cloned from the channel's last
delta, just before the event that ended the channel.

Under `outputGate: deny` nothing leaves before the gate has decided it: the events a chunk
produces wait in order until every gate channel has judged the text they carry (a tail that could
still grow into a value waits for more text); a finding drops them all and the reader ends the
stream with the dialect's error event. The end of the reply (a last event without its blank line,
channels still holding text) is judged the same way before anything of it goes.

Nothing here logs: the originals are in every event this module produces.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import regex

from ext_proc.restore.json_body import JSON_STRING_KEYS, compact, restore_tree
from ext_proc.restore.output_gate import (
    API_OBJECT_KEYS,
    STRUCTURAL_KEYS,
    GateCheckpoint,
    GateWindow,
    OutputGate,
)
from ext_proc.restore.restorers import Restorer
from ext_proc.restore.stream import StreamRestorer

if TYPE_CHECKING:
    # Only a type here: the dialects import this module for the handlers they extend.
    from ext_proc.dialects.base import Dialect


# An event ends at the first empty line: a line ending followed by another, each `\r\n`, `\n` or
# a `\r` not followed by `\n` (a `\r` that ends the buffer waits for the next byte).
_EVENT_END = regex.compile(rb"(\r\n|\r(?!\n)|\n)(?:\r\n|\r(?!\n)|\n)")
_LINE_END = regex.compile(rb"\r\n|\r|\n")
_BOM = b"\xef\xbb\xbf"

# Gate channels made from the key paths of a stream this code has no schema for; past this many,
# its strings are read whole.
MAX_PATH_CHANNELS = 64


@dataclass(slots=True)
class SseEvent:
    """One SSE event as received: its raw bytes and its field lines (terminators removed)."""

    raw: bytes
    lines: list[bytes]
    newline: bytes
    payload: bytes | None  # the `data:` lines joined by `\n`; None when there are none

    def render(self, data: Any, *, synthetic: bool = False) -> bytes:
        """The event with its data replaced; other lines (`event:`, comments) kept in place.

        A synthetic clone drops `id:` so it does not repeat the id of the event it was cloned from.
        """
        payload = compact(data) if not isinstance(data, str) else data.encode("utf-8")
        return self._with_payload(payload, synthetic)

    def _with_payload(self, payload: bytes, synthetic: bool) -> bytes:
        out: list[bytes] = []
        placed = False
        for line in self.lines:
            if line.startswith(b"data:"):
                if not placed:
                    out.extend(b"data: " + part for part in payload.split(b"\n"))
                    placed = True
            elif not (synthetic and line.startswith(b"id:")):
                out.append(line)
        nl = self.newline
        return nl.join(out) + nl + nl


def parse_event(raw: bytes, body_end: int, newline: bytes = b"\n") -> SseEvent:
    """The event whose field lines are `raw[:body_end]` (`newline`: how its lines end)."""
    head = raw[:body_end]
    lines = _LINE_END.split(head) if b"\r" in head else head.split(b"\n")
    if lines[0].startswith(_BOM):
        # A byte order mark before the stream's first field: the SSE format strips it (a browser's
        # EventSource reads the event; the Python SDKs skip it), so the event is read as data.
        lines[0] = lines[0][len(_BOM) :]
    data_parts = [line[5:] for line in lines if line.startswith(b"data:")]
    if not data_parts:
        return SseEvent(raw, lines, newline, None)
    parts = [part[1:] if part.startswith(b" ") else part for part in data_parts]
    payload = parts[0] if len(parts) == 1 else b"\n".join(parts)
    return SseEvent(raw, lines, newline, payload)


# A delta channel's identity within its stream, e.g. ("chat", choice, "content") or
# ("chat", choice, "tool", tool_call_index); the dialect decides, position 1 is always the owner
# (choice index, item id, block index) whose end flushes it.
ChannelKey = tuple[Hashable, ...]


@dataclass(slots=True)
class Channel:
    """One delta channel: its restorer, its last delta event (the template for a synthetic flush),
    and the gate channel its text belongs to (`joined`: shared with other channels, as the SDK
    joins their texts, so it does not end with this one)."""

    stream: StreamRestorer
    event: SseEvent
    data: dict[str, Any]
    part: dict[str, Any]  # the sub-object holding the delta (Chat: the choice); else `data`
    gate_key: ChannelKey
    joined: bool


@dataclass(frozen=True, slots=True)
class SavedChannel:
    key: ChannelKey
    channel: Channel
    state: tuple[str, str]
    event: SseEvent
    data: dict[str, Any]
    part: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SseCheckpoint:
    """An `SseRestorer`'s state between two chunks (`SseRestorer.checkpoint`)."""

    buffer: bytes
    scan: int
    channels: list[SavedChannel]
    texts: dict[ChannelKey, Any]
    queue: tuple[Queued, ...]
    gate: GateCheckpoint | None = None


@dataclass(slots=True)
class Site:
    """Where one delta text of the current event sits, and what goes there instead."""

    key: ChannelKey
    container: dict[str, Any]
    field: str
    text: str
    out: str


# Output waiting for the gate: its bytes, and where each gate channel stood when it was made.
Queued = tuple[bytes, tuple[tuple[GateWindow, int], ...]]


class ChannelStream:
    """The delta channels of one stream, which each dialect's handler extends (ext_proc.dialects).

    A handler overrides `handle` (which texts of an event are deltas, on which channel, and which
    events end channels) and `_synthetic` (the event that carries a channel's held tail). This
    base restores every string of every event in full, with no hold-back across events, and
    reads each string into the gate channel of its key path (a stream whose deltas this code does
    not know: what one event cuts, the next may go on with).
    """

    def __init__(self, restorer: Restorer, gate: OutputGate | None = None) -> None:
        self._restorer = restorer
        self._gate = gate
        self._channels: dict[ChannelKey, Channel] = {}
        # The digest of each channel's text so far (seeds included): a later event that repeats
        # the whole text is not read again.
        self._texts: dict[ChannelKey, Any] = {}
        self._paths: set[ChannelKey] = set()

    def handle(self, event: SseEvent, data: Any) -> list[bytes]:
        return self._plain(event, data, fed=self._path_sites(data, ("path",)))

    def checkpoint(self) -> tuple[list[SavedChannel], dict[ChannelKey, Any]]:
        # A channel's templates are never mutated once stored (synthetic events copy them), so
        # keeping the references is enough.
        saved = [
            SavedChannel(key, ch, ch.stream.save(), ch.event, ch.data, ch.part)
            for key, ch in self._channels.items()
        ]
        return saved, {key: h.copy() for key, h in self._texts.items()}

    def rollback(self, saved: list[SavedChannel], texts: dict[ChannelKey, Any]) -> None:
        self._channels = {}
        for entry in saved:
            channel = entry.channel
            channel.stream.load(entry.state)
            channel.event, channel.data, channel.part = entry.event, entry.data, entry.part
            self._channels[entry.key] = channel
        self._texts = {key: h.copy() for key, h in texts.items()}

    def flush_all(self) -> list[bytes]:
        """Every channel ends (the stream, or the message, is over): gate channels too."""
        out = self._flush(list(self._channels))
        if self._gate is not None:
            self._gate.finish_windows()
        for key in list(self._texts):
            self._note_text(key)
        return out

    def _synthetic(self, key: ChannelKey, channel: Channel, text: str) -> dict[str, Any]:
        raise NotImplementedError

    def _feed(
        self,
        key: ChannelKey,
        event: SseEvent,
        data: dict[str, Any],
        part: dict[str, Any],
        text: str,
        *,
        json_escaped: bool,
        gate_key: ChannelKey | None = None,
    ) -> str:
        """A delta of restore channel `key` (and of gate channel `gate_key`, `key` by default)."""
        channel = self._channels.get(key)
        if channel is None:
            stream = StreamRestorer(self._restorer, json_escaped=json_escaped)
            joined = gate_key is not None and gate_key != key
            channel = Channel(stream, event, data, part, gate_key or key, joined)
            self._channels[key] = channel
        else:
            channel.event, channel.data, channel.part = event, data, part
        self._gate_feed(channel.gate_key, text, json_text=json_escaped, text_key=key)
        return channel.stream.feed(text)

    def _gate_feed(
        self, gate_key: ChannelKey, text: str, *, json_text: bool = False, text_key: ChannelKey | None = None
    ) -> None:
        """`text` read by the gate as part of channel `gate_key` (before restore); `text_key`:
        the channel whose whole text it is part of, for a later event that repeats it."""
        gate = self._gate
        if gate is None or not text:
            return
        gate.window(gate_key, json_text=json_text).feed(text)
        if text_key is not None:
            digest = self._texts.get(text_key)
            if digest is None:
                digest = self._texts[text_key] = gate.hasher()
            digest.update(text.encode("utf-8", "surrogatepass"))

    def _gate_path(self, key: ChannelKey, text: str) -> None:
        """A string with no schema (a field or an event type the API does not define): read as a
        channel of its key path across events, and on its own, as an SDK shows it event by event
        (joined, a value could read glued to the text before it)."""
        if self._gate is not None and text:
            self._gate_feed(key, text)
            self._gate.read(text)

    def _note_text(self, key: ChannelKey) -> None:
        digest = self._texts.pop(key, None)
        if digest is not None and self._gate is not None:
            self._gate.streamed(digest.digest())

    def _end(self, key: ChannelKey) -> tuple[Channel, str]:
        """Ends one channel: its restorer's held text, and its gate channel read to the end
        unless other channels go on with it."""
        channel = self._channels.pop(key)
        if self._gate is not None and not channel.joined:
            self._gate.finish_window(channel.gate_key)
        self._note_text(key)
        return channel, channel.stream.flush()

    def _finish_gate(self, match: Callable[[Hashable], bool]) -> None:
        """Gate channels that end here (their owner, a choice or an item, is done)."""
        gate = self._gate
        if gate is not None:
            for key in [k for k in gate.window_keys() if match(k)]:
                gate.finish_window(key)

    def _flush(self, keys: Iterable[ChannelKey]) -> list[bytes]:
        """Ends channels: their held text goes out as synthetic delta events (none when empty)."""
        out: list[bytes] = []
        for key in keys:
            channel, text = self._end(key)
            if text:
                out.append(channel.event.render(self._synthetic(key, channel, text), synthetic=True))
        return out

    def _flush_where(self, match: Callable[[ChannelKey], bool]) -> list[bytes]:
        return self._flush([key for key in self._channels if match(key)])

    def _path_sites(
        self, node: Any, prefix: ChannelKey, skip: frozenset[str] = frozenset(), *, envelope: bool = True
    ) -> list[Site]:
        """Every string of `node` outside bookkeeping (and `skip`ped keys), fed to the gate
        channel of its key path: Sites the full read then leaves out."""
        if self._gate is None:
            return []
        sites: list[Site] = []
        for container, field, path in _leaves(node, prefix, skip, envelope=envelope):
            text = container[field]
            if path not in self._paths and len(self._paths) >= MAX_PATH_CHANNELS:
                continue  # too many: read whole with the rest of the event
            self._paths.add(path)
            self._gate_path(path, text)
            sites.append(Site(path, container, field, text, self._whole(text, field)))
        return sites

    def _seed(
        self, container: dict[str, Any], field: str, key: ChannelKey, gate_key: ChannelKey, *, json_text: bool
    ) -> list[Site]:
        """The text a block, part or item starts with (an SDK appends the deltas to it): read as
        the start of gate channel `gate_key`, restored whole."""
        text = container.get(field)
        if not isinstance(text, str) or not text:
            return []
        self._gate_feed(gate_key, text, json_text=json_text, text_key=key)
        return [Site(key, container, field, text, self._whole(text, field))]

    def _whole(self, text: str, field: Any) -> str:
        """A string that is no restore channel (read whole by the gate, left out of the event's
        full restore), restored in one piece."""
        if not self._restorer.has_any(text):
            return text
        return self._restorer.restore_text(text, json_escaped=field in JSON_STRING_KEYS)

    def _plain(
        self, event: SseEvent, data: Any, changed: bool = False, fed: Iterable[Site] = ()
    ) -> list[bytes]:
        """The event with every other string restored in full; raw when nothing changed.

        The texts already `fed` to their channels are left out of the full restore and of the
        gate's whole reading: read alone, a delta could look like a placeholder that its channel,
        reading it after what came before, rightly did not take for one (`x` + `EMAIL_…` is
        inside a word), or like a value that its channel's next delta shows to be none.
        """
        assert event.payload is not None
        restore = self._restorer.has_any(event.payload)
        if restore or self._gate is not None:
            saved = _set_aside(fed)
            for site, _ in saved:
                site.container[site.field] = None
            if self._gate is not None:
                self._gate.read_event(data, len(event.payload))  # its other strings, before restore
            if restore:
                data, tree_changed = restore_tree(data, self._restorer)
                changed = changed or tree_changed
            for site, value in saved:
                site.container[site.field] = value
        return [event.render(data) if changed else event.raw]

    def _held(self, event: SseEvent, data: Any, fed: Iterable[Site]) -> list[bytes]:
        """An event whose delta text is all held back goes out as nothing; the gate still reads
        the rest of it."""
        if self._gate is not None:
            assert event.payload is not None
            saved = _set_aside(fed)
            for site, _ in saved:
                site.container[site.field] = None
            self._gate.read_event(data, len(event.payload))
            for site, value in saved:
                site.container[site.field] = value
        return []


def _leaves(
    node: Any, path: ChannelKey, skip: frozenset[str], depth: int = 0, *, envelope: bool = True
) -> Iterable[tuple[Any, Any, ChannelKey]]:
    """(container, key, path) of every string below `node`: the `skip`ped keys of `node` itself
    left out, and bookkeeping keys while still in the API's own objects (`envelope`)."""
    if depth > 32:
        return
    if isinstance(node, dict):
        for key, value in node.items():
            if (envelope and key in STRUCTURAL_KEYS) or (depth == 0 and key in skip):
                continue
            if isinstance(value, str):
                if value:
                    yield node, key, (*path, key)
            elif isinstance(value, (dict, list)):
                inner = envelope and key in API_OBJECT_KEYS
                yield from _leaves(value, (*path, key), skip, depth + 1, envelope=inner)
    elif isinstance(node, list):
        for index, item in enumerate(node):
            if isinstance(item, str):
                if item:
                    yield node, index, (*path, index)
            elif isinstance(item, (dict, list)):
                yield from _leaves(item, (*path, index), skip, depth + 1, envelope=envelope)


def _set_aside(fed: Iterable[Site]) -> list[tuple[Site, Any]]:
    """The fed texts still in their event, each with its value (a dict field may have been
    dropped, emptied; a list keeps its items)."""
    return [
        (site, site.container[site.field])
        for site in fed
        if (
            site.field in site.container
            if isinstance(site.container, dict)
            else 0 <= site.field < len(site.container)
        )
    ]


def apply_sites(sites: list[Site]) -> bool:
    """Writes the restored delta texts back; an emptied text loses its key. True if anything changed."""
    changed = False
    for site in sites:
        if site.out == site.text:
            continue
        changed = True
        if site.out:
            site.container[site.field] = site.out
        else:
            del site.container[site.field]
    return changed


class SseRestorer:
    """Restores (and gates) a streamed (SSE) reply handed over in chunks split at arbitrary byte positions.

    Complete events are emitted restored; an event left exactly as received when nothing in it
    changed. The bytes of an event not yet complete wait in a buffer (so a UTF-8 sequence or a
    `\\r\\n` cut by a chunk boundary is never looked at half). Under `deny` (a gate that denies),
    the events wait in `_queue` until the gate has decided what they carry; `gate.tripped` then
    says the reply is refused and nothing more of it goes.
    """

    def __init__(self, restorer: Restorer, dialect: Dialect, gate: OutputGate | None = None) -> None:
        self._restorer = restorer
        self._gate = gate
        self._stream = dialect.stream(restorer, gate)
        self._buf = bytearray()
        self._scan = 0  # where the search for the end of the pending event resumes
        self._queue: list[Queued] = []
        # Under `deny`, output waits for the gate's decision.
        self._holds = gate is not None and gate.deny
        self._cr = False  # a carriage return seen: events are found by the general pattern

    def checkpoint(self) -> SseCheckpoint:
        """The state before a chunk, so the chunk can be restored again from it (`rollback`): how
        consistent pseudonyms go back over a chunk once the vault has answered."""
        gate = self._gate.checkpoint() if self._gate is not None else None
        channels, texts = self._stream.checkpoint()
        return SseCheckpoint(bytes(self._buf), self._scan, channels, texts, tuple(self._queue), gate)

    def rollback(self, checkpoint: SseCheckpoint) -> None:
        self._buf = bytearray(checkpoint.buffer)
        self._scan = checkpoint.scan
        self._stream.rollback(checkpoint.channels, checkpoint.texts)
        self._queue = list(checkpoint.queue)
        if self._gate is not None and checkpoint.gate is not None:
            self._gate.rollback(checkpoint.gate)

    def feed(self, chunk: bytes) -> bytes:
        """What of the reply goes out now (under `deny`: only what the gate has decided)."""
        if not self._restorer.active and self._gate is None:
            return chunk
        buf = self._buf
        buf += chunk
        if not self._cr and b"\r" in chunk:
            self._cr = True
        out: list[bytes] = []
        start = 0
        while True:
            if self._cr:
                m = _EVENT_END.search(buf, max(start, self._scan))
                if m is None or (m.end() == len(buf) and buf[-1:] == b"\r"):
                    # Resume three bytes back: the end of an event may be cut inside `\r\n\r\n`.
                    self._scan = max(start, len(buf) - 3)
                    break
                body_end, end, newline = m.start(), m.end(), m.group(1)
            else:  # no carriage return so far (most streams): events end with a blank line
                body_end = buf.find(b"\n\n", max(start, self._scan))
                if body_end < 0:
                    self._scan = max(start, len(buf) - 1)
                    break
                end, newline = body_end + 2, b"\n"
            self._emit(out, self._event(bytes(buf[start:end]), body_end - start, newline))
            start = self._scan = end
        if start:
            del buf[:start]  # cheap: bytearray drops a prefix without moving the rest
            self._scan -= start
        if self._holds:
            assert self._gate is not None
            self._gate.check_windows()
            return self._release(final=False)
        return b"".join(out)

    def finish(self) -> bytes:
        """End of the reply: a last event without its blank line is read as an event, every
        channel ends; under `deny` all of it is judged before any of it goes."""
        if not self._restorer.active and self._gate is None:
            return b""
        out: list[bytes] = []
        if self._buf:
            raw = bytes(self._buf)
            self._buf.clear()
            ending = _LINE_END.search(raw)
            newline = ending.group() if ending is not None else b"\n"
            body = raw[: -len(newline)] if raw.endswith(newline) else raw
            pieces = self._event(raw, len(body), newline)
            if pieces and pieces[-1] != raw and pieces[-1].endswith(newline * 2):
                # Rewritten, it still ends as it came: without the blank line that would
                # dispatch it.
                pieces[-1] = pieces[-1][: -2 * len(newline)] + raw[len(body) :]
            self._emit(out, pieces)
        self._emit(out, self._stream.flush_all())
        self._scan = 0
        if self._gate is not None:
            self._gate.finish_windows()
        if self._holds:
            return self._release(final=True)
        return b"".join(out)

    def _emit(self, out: list[bytes], pieces: list[bytes]) -> None:
        if self._holds:
            assert self._gate is not None
            self._queue.append((b"".join(pieces), self._gate.marks()))
        else:
            out.extend(pieces)

    def _release(self, *, final: bool) -> bytes:
        """The waiting output whose text every gate channel has decided, in order; nothing once
        the gate has found a value."""
        assert self._gate is not None
        if self._gate.tripped:
            self._queue.clear()
            return b""
        queue = self._queue
        n = len(queue) if final else 0
        if not final:
            while n < len(queue) and all(window.settled(mark) for window, mark in queue[n][1]):
                n += 1
        released = b"".join(data for data, _ in queue[:n])
        del queue[:n]
        return released

    def _event(self, raw: bytes, body_end: int, newline: bytes) -> list[bytes]:
        event = parse_event(raw, body_end, newline)
        if self._gate is not None:
            # Comments and other fields reach a raw client too (`id:` and `event:` are the
            # stream's bookkeeping).
            for line in event.lines:
                if line and not line.startswith((b"data:", b"id:", b"event:")):
                    self._gate.read(line.decode("utf-8", "replace"))
        payload = event.payload
        if payload is None:
            return [raw]  # comments, keep-alives, events without data
        if payload == b"[DONE]":
            return [*self._stream.flush_all(), raw]
        try:
            data = json.loads(payload)
        except ValueError:
            text = payload.decode("utf-8", "replace")
            if self._gate is not None:
                # Text that is not JSON: one channel of the stream, like a delta.
                self._stream._gate_feed(("sse-text",), text)
            try:
                exact = payload.decode("utf-8")
            except UnicodeDecodeError:
                return [raw]
            restored = self._restorer.restore_text(exact)
            return [raw] if restored == exact else [event.render(restored)]
        return self._stream.handle(event, data)
