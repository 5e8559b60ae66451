"""A streamed (SSE) reply restored: events framed from chunks cut anywhere, channels kept per dialect.

Where it sits: Envoy hands a streamed reply over in chunks cut at arbitrary byte positions;
`SseRestorer` frames them into events and hands each to the dialect's stream handler (a
`ChannelStream` subclass in ext_proc.dialects, named by the `Dialect`). A handler feeds each delta
text to its channel's `StreamRestorer` (ext_proc.restore.stream) and restores every other string
of the event in full. When a channel ends, its held tail goes out in a synthetic delta event,
cloned from the channel's last delta, just before the event that ended the channel.

Nothing here logs: the originals are in every event this module produces.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import regex

from ext_proc.restore.json_body import compact, restore_tree
from ext_proc.restore.output_gate import GateCheckpoint, OutputGate
from ext_proc.restore.restorers import Restorer
from ext_proc.restore.stream import StreamRestorer

if TYPE_CHECKING:
    # Only a type here: the dialects import this module for the handlers they extend.
    from ext_proc.dialects.base import Dialect


# An event ends at the first empty line: a line break followed by another (`\n` or `\r\n`).
_EVENT_END = regex.compile(rb"\n\r?\n")


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


def parse_event(raw: bytes, body_end: int) -> SseEvent:
    lines = raw[:body_end].split(b"\n")
    if raw[body_end - 1 : body_end] == b"\r" or len(raw) - body_end == 3:
        newline = b"\r\n"
        lines = [line[:-1] if line.endswith(b"\r") else line for line in lines]
    else:
        newline = b"\n"
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
    """One delta channel: its restorer and its last delta event, the template for a synthetic flush."""

    stream: StreamRestorer
    event: SseEvent
    data: dict[str, Any]
    part: dict[str, Any]  # the sub-object holding the delta (Chat: the choice); else `data`


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
    gate: GateCheckpoint | None = None


@dataclass(slots=True)
class Site:
    """Where one delta text of the current event sits, and what goes there instead."""

    key: ChannelKey
    container: dict[str, Any]
    field: str
    text: str
    out: str


class ChannelStream:
    """The delta channels of one stream, which each dialect's handler extends (ext_proc.dialects).

    A handler overrides `handle` (which texts of an event are deltas, on which channel, and which
    events end channels) and `_synthetic` (the event that carries a channel's held tail). This
    base restores every string of every event in full, with no hold-back across events: the
    handler of a stream whose deltas this code does not know.
    """

    def __init__(self, restorer: Restorer, gate: OutputGate | None = None) -> None:
        self._restorer = restorer
        self._gate = gate
        self._channels: dict[ChannelKey, Channel] = {}

    def handle(self, event: SseEvent, data: Any) -> list[bytes]:
        return self._plain(event, data)

    def checkpoint(self) -> list[SavedChannel]:
        # A channel's templates are never mutated once stored (synthetic events copy them), so
        # keeping the references is enough.
        return [
            SavedChannel(key, ch, ch.stream.save(), ch.event, ch.data, ch.part)
            for key, ch in self._channels.items()
        ]

    def rollback(self, saved: list[SavedChannel]) -> None:
        self._channels = {}
        for entry in saved:
            channel = entry.channel
            channel.stream.load(entry.state)
            channel.event, channel.data, channel.part = entry.event, entry.data, entry.part
            self._channels[entry.key] = channel

    def flush_all(self) -> list[bytes]:
        return self._flush(list(self._channels))

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
    ) -> str:
        channel = self._channels.get(key)
        if channel is None:
            stream = StreamRestorer(self._restorer, json_escaped=json_escaped)
            channel = self._channels[key] = Channel(stream, event, data, part)
        else:
            channel.event, channel.data, channel.part = event, data, part
        if self._gate is not None:
            self._gate.window(key).feed(text)  # the raw delta, before restore
        return channel.stream.feed(text)

    def _end(self, key: ChannelKey) -> tuple[Channel, str]:
        """Ends one channel: its restorer's held text, and its gate window read to the end."""
        channel = self._channels.pop(key)
        if self._gate is not None:
            self._gate.finish_window(key)
        return channel, channel.stream.flush()

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

    def _plain(
        self, event: SseEvent, data: Any, changed: bool = False, fed: Iterable[Site] = ()
    ) -> list[bytes]:
        """The event with every other string restored in full; raw when nothing changed.

        The texts already `fed` to their channels are left out of the full restore: read alone, a
        delta could look like a placeholder that its channel, reading it after what came before,
        rightly did not take for one (`x` + `EMAIL_…` is inside a word).
        """
        assert event.payload is not None
        restore = self._restorer.has_any(event.payload)
        if restore or self._gate is not None:
            saved = [(site, site.container[site.field]) for site in fed if site.field in site.container]
            for site, _ in saved:
                site.container[site.field] = None
            if self._gate is not None:
                self._gate.read_tree(data)  # every other string of the event, before restore
            if restore:
                data, tree_changed = restore_tree(data, self._restorer)
                changed = changed or tree_changed
            for site, value in saved:
                site.container[site.field] = value
        return [event.render(data) if changed else event.raw]

    def _held(self, data: Any, fed: Iterable[Site]) -> list[bytes]:
        """An event whose delta text is all held back goes out as nothing; the gate still reads
        the rest of it."""
        if self._gate is not None:
            saved = [(site, site.container[site.field]) for site in fed if site.field in site.container]
            for site, _ in saved:
                site.container[site.field] = None
            self._gate.read_tree(data)
            for site, value in saved:
                site.container[site.field] = value
        return []


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
    """Restores a streamed (SSE) reply handed over in chunks split at arbitrary byte positions.

    Complete events are emitted restored; an event left exactly as received when nothing in it
    changed. The bytes of an event not yet complete wait in a buffer (so a UTF-8 sequence or a
    `\\r\\n` cut by a chunk boundary is never looked at half).
    """

    def __init__(self, restorer: Restorer, dialect: Dialect, gate: OutputGate | None = None) -> None:
        self._restorer = restorer
        self._gate = gate
        self._stream = dialect.stream(restorer, gate)
        self._buf = bytearray()
        self._scan = 0  # where the search for the end of the pending event resumes

    def checkpoint(self) -> SseCheckpoint:
        """The state before a chunk, so the chunk can be restored again from it (`rollback`): how
        consistent pseudonyms go back over a chunk once the vault has answered."""
        gate = self._gate.checkpoint() if self._gate is not None else None
        return SseCheckpoint(bytes(self._buf), self._scan, self._stream.checkpoint(), gate)

    def rollback(self, checkpoint: SseCheckpoint) -> None:
        self._buf = bytearray(checkpoint.buffer)
        self._scan = checkpoint.scan
        self._stream.rollback(checkpoint.channels)
        if self._gate is not None and checkpoint.gate is not None:
            self._gate.rollback(checkpoint.gate)

    def feed(self, chunk: bytes) -> bytes:
        if not self._restorer.active and self._gate is None:
            return chunk
        buf = self._buf
        buf += chunk
        out: list[bytes] = []
        start = 0
        while True:
            m = _EVENT_END.search(buf, max(start, self._scan))
            if m is None:
                # Resume two bytes back: the end of an event may be cut between `\n`, `\r`, `\n`.
                self._scan = max(start, len(buf) - 2)
                break
            raw = bytes(buf[start : m.end()])
            out.extend(self._event(raw, m.start() - start))
            start = self._scan = m.end()
        if start:
            del buf[:start]  # cheap: bytearray drops a prefix without moving the rest
            self._scan -= start
        return b"".join(out)

    def finish(self) -> bytes:
        """End of the reply: flush every channel; a last event without its blank line is restored as text."""
        if not self._restorer.active and self._gate is None:
            return b""
        out = self._stream.flush_all()
        if self._buf:
            text = bytes(self._buf).decode("utf-8", "surrogateescape")
            if self._gate is not None:
                self._gate.read(text)
            out.append(self._restorer.restore_text(text).encode("utf-8", "surrogateescape"))
            self._buf.clear()
        self._scan = 0
        return b"".join(out)

    def _event(self, raw: bytes, body_end: int) -> list[bytes]:
        event = parse_event(raw, body_end)
        payload = event.payload
        if payload is None:
            return [raw]  # comments, keep-alives, events without data
        if payload == b"[DONE]":
            return [*self._stream.flush_all(), raw]
        try:
            data = json.loads(payload)
        except ValueError:
            try:
                text = payload.decode("utf-8")
            except UnicodeDecodeError:
                if self._gate is not None:
                    self._gate.read(payload.decode("utf-8", "replace"))
                return [raw]
            if self._gate is not None:
                self._gate.read(text)
            restored = self._restorer.restore_text(text)
            return [raw] if restored == text else [event.render(restored)]
        return self._stream.handle(event, data)
