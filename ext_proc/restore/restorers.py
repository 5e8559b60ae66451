"""Restore: placeholders in the reply → the caller's own values (SPEC §8).

Where it sits: the request went upstream with `<{LABEL}_{nonce}_{i}>` in place of each detected
value (redact.py fills the exchange's `PlaceholderMap`); the reply comes back through Envoy and,
before the caller sees it, this module puts the originals back. A non-streamed reply is one JSON
body (`restore_json_body`); a streamed one is SSE, handed over by Envoy in chunks cut at arbitrary
byte positions (`SseRestorer`). Both rest on `Restorer`, which knows the one map of the exchange.

Only this exchange's placeholders are touched: the nonce is part of the pattern, so `<EMAIL_1>`
typed by a user, or a placeholder of another request, comes back as it was. The pattern tolerates
what models do to placeholders: dropped angle brackets, changed case, markdown-escaped underscores
(`\\_`) and brackets written as the JSON escapes `\\u003c` / `\\u003e`.

Consistent pseudonyms (`<EMAIL_{20 hex}>`, ext_proc.transform.placeholders) are stable across requests, so a
reply may mention one this request never sent: `PseudonymRestorer` restores this request's map
first and collects the others for the exchange to look up in the tenant's vault (ext_proc.storage.vault)
before the same bytes are restored again. Only what this request's map or the tenant's vault
holds is restored; a look-alike a user typed is neither.

Realistic surrogates (`mode: surrogate`, ext_proc.transform.surrogates) are ordinary-looking text:
`SurrogateRestorer` matches this request's surrogates themselves, case-insensitively and on word
boundaries, and fits the same streaming machinery.

Streaming: a placeholder may be split over any number of deltas. Each delta channel (one choice's
content, one tool call's arguments, one Anthropic content block, …) has a `StreamRestorer` that
emits everything that can no longer be part of a placeholder at once and holds back only the tail
that could still be one. When a channel ends, its held tail goes out in a synthetic delta event,
cloned from the channel's last delta, just before the event that ended the channel.

Nothing here logs: the originals are in every string this module produces.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import regex

from ext_proc.restore.output_gate import GateCheckpoint, OutputGate
from ext_proc.transform.placeholders import (
    NONCE_HEX_CHARS,
    PSEUDONYM_HEX_CHARS,
    PSEUDONYM_LABELS,
    PlaceholderMap,
    PseudonymMap,
    format_placeholder,
    format_pseudonym,
)
from ext_proc.transform.surrogates import SURROGATE_DOMAIN

# Strings that are themselves JSON text: an original inserted there must be JSON-string-escaped,
# because the placeholder sits inside a JSON string inside that text (tool-call arguments).
JSON_STRING_KEYS = frozenset({"arguments", "partial_json"})

_CLOSER_ESCAPE = "\\u003e"
# How far back the pattern's look-behind reads (`x__EMAIL`): a stream keeps that much context.
_LOOKBEHIND = 3


# The grammar of placeholders.py, for checking a map's keys.
_CANONICAL = regex.compile(rf"<([A-Z0-9_]+)_([0-9a-f]{{{NONCE_HEX_CHARS}}})_([0-9]+)>")
_CANONICAL_PSEUDONYM = regex.compile(rf"<([A-Z0-9_]+)_([0-9a-f]{{{PSEUDONYM_HEX_CHARS}}})>")

# Where a placeholder may start: an opening bracket (`<` or its JSON escape), or else a word start:
# neither `xEMAIL_…` nor `SUBJECT2_EMAIL_…` is read as a placeholder of `EMAIL`. Markdown emphasis
# (`_`, `__`) before a word start is no part of the word; nor is the `n` of a JSON `\n`.
_OPENING = r"(?:<|\\u003c|(?<![A-Za-z0-9_])|(?<=(?<![A-Za-z0-9_\\])_{1,2})|(?<=\\[nrt]))"
_CLOSING = r"(?P<close>>|\\u003e)?"


def _label_alternation(labels: Iterable[str]) -> str:
    # Longest label first: where two labels could both match from one position, the longer wins.
    return "|".join(
        regex.escape(label).replace("_", r"\\?_") for label in sorted(labels, key=lambda lb: (-len(lb), lb))
    )


@functools.lru_cache(maxsize=512)
def _pattern_for(labels: tuple[str, ...], digits: int) -> regex.Pattern[str]:
    """The pattern that finds placeholders of these labels in every tolerated form, with any
    nonce (the match's nonce is compared with the exchange's in `Restorer.replacement`).

    Compiled once per set of labels, not once per exchange: compiling costs about 0.5 ms, and the
    label sets repeat (EMAIL, PHONE, SUBJECT1_NAME, ...) while every exchange has its own nonce.
    """
    return regex.compile(
        _OPENING
        + rf"(?P<label>{_label_alternation(labels)})\\?_(?P<nonce>[0-9a-f]{{{NONCE_HEX_CHARS}}})\\?_"
        # The index ends at a non-digit: `_12` is never read as `_1` followed by `2`.
        + rf"(?P<index>[0-9]{{1,{digits}}})(?![0-9])"
        + _CLOSING,
        regex.IGNORECASE | regex.ASCII,
    )


@functools.lru_cache(maxsize=1)
def _pseudonym_pattern() -> regex.Pattern[str]:
    """Consistent pseudonyms of every label, in every tolerated form. The digest ends at a
    character that cannot continue it: `EMAIL_<20 hex>f` is a longer token, not a placeholder."""
    return regex.compile(
        _OPENING
        + rf"(?P<label>{_label_alternation(PSEUDONYM_LABELS)})\\?_"
        + rf"(?P<digest>[0-9a-f]{{{PSEUDONYM_HEX_CHARS}}})(?![0-9a-z])"
        + _CLOSING,
        regex.IGNORECASE | regex.ASCII,
    )


# The cheap pre-check for consistent pseudonyms: a digest right after an underscore, whole.
_DIGEST_HINT = regex.compile(rf"_[0-9a-fA-F]{{{PSEUDONYM_HEX_CHARS}}}(?![0-9a-zA-Z])")
_DIGEST_HINT_BYTES = regex.compile(rf"_[0-9a-fA-F]{{{PSEUDONYM_HEX_CHARS}}}(?![0-9a-zA-Z])".encode())


# The longest placeholder in any tolerated form (label, digest or nonce and index, escapes).
_OPEN_TAIL_CHARS = 160


def _compact(data: Any) -> bytes:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


class Restorer:
    """The placeholders of one exchange and the compiled pattern that finds them, in any tolerated form.

    Build it once the request's map is final (after redaction); it takes a snapshot of the map.
    """

    __slots__ = ("_escaped", "_nonce_bytes", "_originals", "nonce", "pattern")

    def __init__(self, pmap: PlaceholderMap) -> None:
        self.nonce = pmap.nonce
        self._originals: dict[str, str] = dict(pmap.originals)
        self._escaped: dict[str, str] = {}
        self.pattern: regex.Pattern[str] | None = None
        self._nonce_bytes = self.nonce.encode("ascii")
        if not self._originals:
            return
        labels: set[str] = set()
        digits = 1
        for text in self._originals:
            m = _CANONICAL.fullmatch(text)
            if m is None or m.group(2) != self.nonce:
                # Not the grammar of placeholders.py: a programming error, not something to skip
                # silently (the value would then never be restored).
                raise ValueError("placeholder map holds a key outside the placeholder grammar")
            labels.add(m.group(1))
            digits = max(digits, len(m.group(3)))
        self.pattern = _pattern_for(tuple(sorted(labels)), digits)

    @property
    def active(self) -> bool:
        """Whether there is anything to restore at all (the request had placeholders)."""
        return self.pattern is not None

    def neutralise(self, text: str) -> str:
        """`text` with every form of placeholder this restorer matches read as a space: the output
        gate's view of model output (a placeholder is never a finding)."""
        if self.pattern is None or not self.has_any(text):
            return text
        return self.pattern.sub(" ", text)

    def open_tail(self, text: str) -> int:
        """Where a placeholder that more text could still complete begins at the end of `text`
        (len(text) if none): what a stream holds back, and the output gate reads later."""
        pattern = self.pattern
        if pattern is None:
            return len(text)
        i = max(0, len(text) - _OPEN_TAIL_CHARS)
        while (m := pattern.search(text, i, partial=True)) is not None:
            if m.partial or not _decided(text, m):
                return m.start()
            i = m.end()
        return len(text)

    def has_any(self, data: bytes | str) -> bool:
        """Cheap pre-check: could `data` hold one of this exchange's placeholders (its nonce, any case)?"""
        if self.pattern is None:
            return False
        if isinstance(data, str):
            return self.nonce in data or self.nonce in data.lower()
        return self._nonce_bytes in data or self._nonce_bytes in data.lower()

    def restore_text(self, text: str, *, json_escaped: bool = False) -> str:
        """`text` with every placeholder of this exchange replaced by its original.

        `json_escaped`: `text` is the inside of a JSON string (tool-call arguments), so the original
        goes in JSON-escaped and the text stays valid JSON. Returns `text` itself when unchanged.
        """
        if self.pattern is None or not self.has_any(text):
            return text
        return self._restore_from(text, 0, json_escaped)

    def _restore_from(self, s: str, start: int, json_escaped: bool) -> str:
        """Restore `s[start:]`; `s[:start]` is only context for the word-start look-behind."""
        assert self.pattern is not None
        out: list[str] = []
        i = start
        for m in self.pattern.finditer(s, start):
            out.append(s[i : m.start()])
            out.append(self.replacement(m, json_escaped))
            i = m.end()
        if i == start:
            return s[start:] if start else s
        out.append(s[i:])
        return "".join(out)

    def key_of(self, m: regex.Match[str]) -> str | None:
        """The canonical placeholder a match stands for, or None when it cannot be one of ours."""
        index = m.group("index")
        if index.startswith("0") or m.group("nonce").lower() != self.nonce:
            return None  # `_01`, or another request's nonce: not ours
        return format_placeholder(m.group("label").replace("\\", "").upper(), self.nonce, int(index))

    def replacement(self, m: regex.Match[str], json_escaped: bool) -> str:
        """The original for a match, or the matched text as it was when it is not in the map."""
        key = self.key_of(m)
        original = self._originals.get(key) if key is not None else None
        if original is None:
            return m.group(0)
        if not json_escaped:
            return original
        assert key is not None
        escaped = self._escaped.get(key)
        if escaped is None:
            escaped = self._escaped[key] = json.dumps(original, ensure_ascii=False)[1:-1]
        return escaped


class PseudonymRestorer(Restorer):
    """Restores consistent pseudonyms: this request's map first, then what the vault returned.

    Matching does not depend on what is known, so restore runs in two steps where a reply mentions
    a placeholder the map lacks: a first run restores what it can and collects those placeholders
    in `unresolved` (at most `max_lookups` per exchange; any further one is counted in `skipped`
    and left as it is); the caller looks them up (asynchronously, in the vault), hands the answer
    to `learn`, rolls its stream state back (`SseRestorer.checkpoint`) and runs again. A
    placeholder the vault does not hold (expired, another tenant's, or typed by a user) is
    remembered as absent and left as it is.
    """

    __slots__ = ("_absent", "_budget", "skipped", "unresolved")

    def __init__(self, pmap: PseudonymMap, *, max_lookups: int = 256) -> None:
        self.nonce = pmap.nonce
        self._originals = dict(pmap.originals)
        self._escaped = {}
        self._nonce_bytes = b""
        for text in self._originals:
            m = _CANONICAL_PSEUDONYM.fullmatch(text)
            if m is None or m.group(1) not in PSEUDONYM_LABELS:
                raise ValueError("pseudonym map holds a key outside the pseudonym grammar")
        self.pattern = _pseudonym_pattern()  # always: the vault may know what this request did not send
        self._absent: set[str] = set()
        self._budget = max_lookups
        self.unresolved: set[str] = set()
        self.skipped = 0

    def has_any(self, data: bytes | str) -> bool:
        """Cheap pre-check: does `data` hold a whole digest right after an underscore?"""
        if isinstance(data, str):
            return _DIGEST_HINT.search(data) is not None
        return _DIGEST_HINT_BYTES.search(data) is not None

    def key_of(self, m: regex.Match[str]) -> str | None:
        return format_pseudonym(m.group("label").replace("\\", "").upper(), m.group("digest").lower())

    def replacement(self, m: regex.Match[str], json_escaped: bool) -> str:
        key = self.key_of(m)
        if key is not None and not self._known(key):
            if self._budget > 0:
                self._budget -= 1
                self.unresolved.add(key)
            else:
                self._absent.add(key)
                self.skipped += 1
        return super().replacement(m, json_escaped)

    def _known(self, key: str) -> bool:
        return key in self._originals or key in self._absent or key in self.unresolved

    def take_unresolved(self) -> set[str]:
        wanted, self.unresolved = self.unresolved, set()
        return wanted

    def learn(self, found: Mapping[str, str], asked: Iterable[str]) -> None:
        """The vault's answer: `found` is restored from now on, the rest of `asked` stays as it is."""
        for placeholder in asked:
            original = found.get(placeholder)
            if original is None:
                self._absent.add(placeholder)
            else:
                self._originals[placeholder] = original


class SurrogateRestorer(Restorer):
    """Restores this request's realistic surrogates (`mode: surrogate`, ext_proc.transform.surrogates).

    A surrogate is ordinary-looking text (`Nadia Okafor`, `nadia.okafor07@example.invalid`), so
    the pattern is the alternation of this request's surrogates themselves, longest first, matched
    case-insensitively (the registry never gives two values surrogates that differ only in case)
    and on word boundaries: an edge of a surrogate that is a word character must not continue a
    word (`Nadia Okaforson` is not `Nadia Okafor`). An earlier turn's surrogates come back with the
    history the caller resends (its values are in the request again, and get the same surrogates).

    The `close` group, which `StreamRestorer` reads to decide whether a match could still grow,
    is set when the text after the match (or the surrogate's own last character) ends the word; a
    match that ends where the text ends stays held back until more text, or the channel's end,
    decides it.
    """

    __slots__ = ()

    def __init__(self, originals: Mapping[str, str], nonce: str) -> None:
        self.nonce = nonce  # the request's placeholder nonce: what the gate reads strip markers by
        self._nonce_bytes = b""
        self._escaped = {}
        self._originals = {}
        self.pattern = None
        for surrogate, original in originals.items():
            folded = surrogate.casefold()
            if folded in self._originals and self._originals[folded] != original:
                raise ValueError("two values of one request share a surrogate")
            self._originals[folded] = original
        if originals:
            self.pattern = _surrogate_pattern(tuple(sorted(originals, key=lambda t: (-len(t), t))))

    def has_any(self, data: bytes | str) -> bool:
        """Cheap pre-check: does `data` hold one of this request's surrogates, in any case (one
        substring search each, in C; the pattern then decides about word boundaries)."""
        if self.pattern is None:
            return False
        text = data if isinstance(data, str) else data.decode("utf-8", "surrogateescape")
        folded = text.casefold()
        return any(surrogate in folded for surrogate in self._originals)

    def key_of(self, m: regex.Match[str]) -> str | None:
        return m.group("surrogate").casefold()

    def neutralise(self, text: str) -> str:
        """This request's surrogates, and every address at the surrogate domain (an earlier turn's
        surrogate, which the catalog would read as an email), read as a space: the output gate's
        view of model output."""
        text = super().neutralise(text)
        if SURROGATE_DOMAIN in text or SURROGATE_DOMAIN in text.lower():
            text = _SURROGATE_EMAIL.sub(" ", text)
        return text


@functools.lru_cache(maxsize=256)
def _surrogate_pattern(surrogates: tuple[str, ...]) -> regex.Pattern[str]:
    alternation = "|".join(regex.escape(text) for text in surrogates)
    return regex.compile(
        rf"(?:(?<!\w)|(?=\W))(?P<surrogate>{alternation})(?:(?P<close>(?<=\W)|(?=\W))|(?!\w))",
        regex.IGNORECASE,
    )


_SURROGATE_EMAIL = regex.compile(rf"[\w.+-]+@{regex.escape(SURROGATE_DOMAIN)}(?![\w.-])", regex.IGNORECASE)


def restorer_for(pmap: PlaceholderMap | PseudonymMap) -> Restorer:
    """The restorer of an exchange's map, per-request or consistent."""
    if isinstance(pmap, PseudonymMap):
        return PseudonymRestorer(pmap)
    return Restorer(pmap)


class StreamRestorer:
    """Restores one stream channel (a sequence of text deltas) as if it were one text.

    `feed` returns what can be emitted now: everything up to the first position that could still be
    the start of a placeholder of this exchange. Held back is that tail only: a strict prefix of a
    placeholder in some tolerated form (`<`, `EM`, `<EMAIL_ab12`, `\\u00`), or a complete one whose
    index or closing bracket could still grow (`<EMAIL_ab12cd34_1`, `EMAIL_ab12cd34_1\\u00`). So it
    is never longer than the longest placeholder form (2 × label + index digits + 23 characters),
    and text that cannot start a placeholder goes out at once. Each `feed` scans only the held tail
    plus the new text, so a stream costs time linear in its length.
    """

    __slots__ = ("_ctx", "_held", "_json_escaped", "_restorer")

    def __init__(self, restorer: Restorer, *, json_escaped: bool = False) -> None:
        self._restorer = restorer
        self._json_escaped = json_escaped
        self._held = ""
        # The characters before the held tail that the word-start look-behind reads.
        self._ctx = ""

    @property
    def held(self) -> str:
        return self._held

    def save(self) -> tuple[str, str]:
        """The held tail and its context, for `load` to put back (`SseRestorer.checkpoint`)."""
        return self._held, self._ctx

    def load(self, state: tuple[str, str]) -> None:
        self._held, self._ctx = state

    def feed(self, text: str) -> str:
        pattern = self._restorer.pattern
        if pattern is None:
            return text
        if not text:
            return ""
        held = self._held
        s = self._ctx + held + text
        start = i = len(self._ctx)
        n = len(s)
        out: list[str] = []
        while True:
            # partial=True also reports a match that runs into the end of `s`: a possible prefix.
            m = pattern.search(s, i, partial=True)
            if m is None:
                cut = n
                break
            if m.partial or not _decided(s, m):
                cut = m.start()
                break
            out.append(s[i : m.start()])
            out.append(self._restorer.replacement(m, self._json_escaped))
            i = m.end()
        self._held = s[cut:]
        self._ctx = s[max(0, cut - _LOOKBEHIND) : cut]
        if i == start and cut == n:
            return held + text if held else text  # the common case: nothing held, nothing found
        out.append(s[i:cut])
        return "".join(out)

    def flush(self) -> str:
        """The held tail, restored: the channel has ended, nothing more can complete it."""
        held, ctx = self._held, self._ctx
        self._held = self._ctx = ""
        if not held or self._restorer.pattern is None:
            return held
        return self._restorer._restore_from(ctx + held, len(ctx), self._json_escaped)


def _decided(s: str, m: regex.Match[str]) -> bool:
    """Whether a complete match is final, i.e. more text could not make it a different match.

    It is not while its index could take another digit or a closing bracket could still follow
    (nothing after it yet, or only a beginning of `\\u003e`).
    """
    if m.group("close") is not None:
        return True
    rest = s[m.end() : m.end() + len(_CLOSER_ESCAPE)]
    return bool(rest) and not _CLOSER_ESCAPE.startswith(rest.lower())


# --- JSON trees -------------------------------------------------------------------------------


def restore_tree(node: Any, restorer: Restorer) -> tuple[Any, bool]:
    """Restore every string value and object key of a parsed JSON value, in place where possible.

    Returns the (possibly new) value and whether anything changed. Strings under a key in
    `JSON_STRING_KEYS` carry JSON text: their originals go in JSON-escaped.
    """
    if isinstance(node, str):
        new = restorer.restore_text(node)
        return new, new is not node and new != node
    if isinstance(node, list):
        changed = False
        for i, item in enumerate(node):
            new_item, item_changed = restore_tree(item, restorer)
            if item_changed:
                node[i] = new_item
                changed = True
        return node, changed
    if isinstance(node, dict):
        changed = keys_changed = False
        pairs: list[tuple[str, Any]] = []
        for key, value in node.items():
            new_key = restorer.restore_text(key)
            if new_key != key:
                keys_changed = True
            if isinstance(value, str) and key in JSON_STRING_KEYS:
                new_value: Any = restorer.restore_text(value, json_escaped=True)
                value_changed = new_value != value
            else:
                new_value, value_changed = restore_tree(value, restorer)
            if value_changed and not keys_changed:
                node[key] = new_value
            changed = changed or value_changed
            pairs.append((new_key, new_value))
        if keys_changed:
            # Rebuilt in place: callers hold references into the tree (the delta they fed).
            node.clear()
            node.update(pairs)
            return node, True
        return node, changed
    return node, False


def restore_json_body(body: bytes, dialect: str, restorer: Restorer, gate: OutputGate | None = None) -> bytes:
    """A non-streamed reply body with this exchange's placeholders restored (and, with `gate`,
    read by the output gate first, as the model wrote it).

    Without the nonce the body comes back as the same bytes. Otherwise it is parsed, restored
    (every string and key; JSON-carrying strings such as tool-call `arguments` with JSON-escaped
    insertion) and written back compactly. Where text and tool calls sit differs per dialect, but
    the rule is the same for all of them today: every string, plus the `arguments` key rule; the
    `dialect` is taken so that a dialect with its own rule fits here without changing callers.
    """
    del dialect  # the same rule for every dialect, see above
    if gate is None and not restorer.has_any(body):
        return body
    try:
        data = json.loads(body)  # parsed once, for the gate and for restore
        if gate is not None:
            gate.read_tree(data)
        if not restorer.has_any(body):
            return body
        new, changed = restore_tree(data, restorer)
    except (ValueError, RecursionError):
        if gate is not None:
            gate.read(body.decode("utf-8", "replace"))
        if not restorer.has_any(body):
            return body
        # Not JSON (or nested past what the parser takes): restore as text. Inside a JSON body a
        # placeholder sits in a string, so the JSON-escaped insertion keeps it valid.
        text = body.decode("utf-8", "surrogateescape")
        restored = restorer.restore_text(text, json_escaped=text.lstrip()[:1] in ("{", "["))
        return restored.encode("utf-8", "surrogateescape")
    if not changed:
        return body
    return _compact(new)


# --- SSE --------------------------------------------------------------------------------------

# An event ends at the first empty line: a line break followed by another (`\n` or `\r\n`).
_EVENT_END = regex.compile(rb"\n\r?\n")


@dataclass(slots=True)
class _Event:
    """One SSE event as received: its raw bytes and its field lines (terminators removed)."""

    raw: bytes
    lines: list[bytes]
    newline: bytes
    payload: bytes | None  # the `data:` lines joined by `\n`; None when there are none

    def render(self, data: Any, *, synthetic: bool = False) -> bytes:
        """The event with its data replaced; other lines (`event:`, comments) kept in place.

        A synthetic clone drops `id:` so it does not repeat the id of the event it was cloned from.
        """
        payload = _compact(data) if not isinstance(data, str) else data.encode("utf-8")
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


def _parse_event(raw: bytes, body_end: int) -> _Event:
    lines = raw[:body_end].split(b"\n")
    if raw[body_end - 1 : body_end] == b"\r" or len(raw) - body_end == 3:
        newline = b"\r\n"
        lines = [line[:-1] if line.endswith(b"\r") else line for line in lines]
    else:
        newline = b"\n"
    data_parts = [line[5:] for line in lines if line.startswith(b"data:")]
    if not data_parts:
        return _Event(raw, lines, newline, None)
    parts = [part[1:] if part.startswith(b" ") else part for part in data_parts]
    payload = parts[0] if len(parts) == 1 else b"\n".join(parts)
    return _Event(raw, lines, newline, payload)


# A delta channel's identity within its stream, e.g. ("chat", choice, "content") or
# ("chat", choice, "tool", tool_call_index); the dialect decides, position 1 is always the owner
# (choice index, item id, block index) whose end flushes it.
ChannelKey = tuple[Hashable, ...]


@dataclass(slots=True)
class _Channel:
    """One delta channel: its restorer and its last delta event, the template for a synthetic flush."""

    stream: StreamRestorer
    event: _Event
    data: dict[str, Any]
    part: dict[str, Any]  # the sub-object holding the delta (Chat: the choice); else `data`


@dataclass(frozen=True, slots=True)
class _SavedChannel:
    key: ChannelKey
    channel: _Channel
    state: tuple[str, str]
    event: _Event
    data: dict[str, Any]
    part: dict[str, Any]


@dataclass(frozen=True, slots=True)
class SseCheckpoint:
    """An `SseRestorer`'s state between two chunks (`SseRestorer.checkpoint`)."""

    buffer: bytes
    scan: int
    channels: list[_SavedChannel]
    gate: GateCheckpoint | None = None


@dataclass(slots=True)
class _Site:
    """Where one delta text of the current event sits, and what goes there instead."""

    key: ChannelKey
    container: dict[str, Any]
    field: str
    text: str
    out: str


class _DialectStream:
    """Per-dialect event handling on top of the shared channel bookkeeping."""

    def __init__(self, restorer: Restorer, gate: OutputGate | None = None) -> None:
        self._restorer = restorer
        self._gate = gate
        self._channels: dict[ChannelKey, _Channel] = {}

    def handle(self, event: _Event, data: Any) -> list[bytes]:
        return self._plain(event, data)

    def checkpoint(self) -> list[_SavedChannel]:
        # A channel's templates are never mutated once stored (synthetic events copy them), so
        # keeping the references is enough.
        return [
            _SavedChannel(key, ch, ch.stream.save(), ch.event, ch.data, ch.part)
            for key, ch in self._channels.items()
        ]

    def rollback(self, saved: list[_SavedChannel]) -> None:
        self._channels = {}
        for entry in saved:
            channel = entry.channel
            channel.stream.load(entry.state)
            channel.event, channel.data, channel.part = entry.event, entry.data, entry.part
            self._channels[entry.key] = channel

    def flush_all(self) -> list[bytes]:
        return self._flush(list(self._channels))

    def _synthetic(self, key: ChannelKey, channel: _Channel, text: str) -> dict[str, Any]:
        raise NotImplementedError

    def _feed(
        self,
        key: ChannelKey,
        event: _Event,
        data: dict[str, Any],
        part: dict[str, Any],
        text: str,
        *,
        json_escaped: bool,
    ) -> str:
        channel = self._channels.get(key)
        if channel is None:
            stream = StreamRestorer(self._restorer, json_escaped=json_escaped)
            channel = self._channels[key] = _Channel(stream, event, data, part)
        else:
            channel.event, channel.data, channel.part = event, data, part
        if self._gate is not None:
            self._gate.window(key).feed(text)  # the raw delta, before restore
        return channel.stream.feed(text)

    def _end(self, key: ChannelKey) -> tuple[_Channel, str]:
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
        self, event: _Event, data: Any, changed: bool = False, fed: Iterable[_Site] = ()
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

    def _held(self, data: Any, fed: Iterable[_Site]) -> list[bytes]:
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


def _apply(sites: list[_Site]) -> bool:
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


class _ChatStream(_DialectStream):
    """OpenAI Chat Completions: `choices[i].delta` texts and tool-call argument fragments."""

    TEXT_FIELDS = ("content", "refusal", "reasoning_content", "reasoning")

    def handle(self, event: _Event, data: Any) -> list[bytes]:
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or not choices:
            return self._plain(event, data)  # the usage chunk, an error object
        before: list[bytes] = []
        changed = False
        kept: list[Any] = []
        fed: list[_Site] = []
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
            if _apply(sites):
                changed = True
                if self._emptied(choice):
                    continue  # everything it carried is held back: leave the choice out
            kept.append(choice)
        if changed:
            data["choices"] = kept
            if not kept and data.get("usage") is None:
                return before + self._held(data, fed)  # the whole chunk is held back
        return before + self._plain(event, data, changed, fed)

    def _feed_choice(
        self, event: _Event, data: dict[str, Any], choice: dict[str, Any], ci: Any
    ) -> list[_Site]:
        sites: list[_Site] = []
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            return sites
        for field in self.TEXT_FIELDS:
            text = delta.get(field)
            if isinstance(text, str) and text:
                key = ("chat", ci, field)
                out = self._feed(key, event, data, choice, text, json_escaped=False)
                sites.append(_Site(key, delta, field, text, out))
        tool_calls = delta.get("tool_calls")
        if isinstance(tool_calls, list):
            for tpos, call in enumerate(tool_calls):
                function = call.get("function") if isinstance(call, dict) else None
                args = function.get("arguments") if isinstance(function, dict) else None
                if isinstance(args, str) and args:
                    assert isinstance(call, dict) and isinstance(function, dict)
                    key = ("chat", ci, "tool", call.get("index", tpos))
                    out = self._feed(key, event, data, choice, args, json_escaped=True)
                    sites.append(_Site(key, function, "arguments", args, out))
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
        return not delta and choice.get("finish_reason") is None and not choice.get("logprobs")

    def _synthetic(self, key: ChannelKey, channel: _Channel, text: str) -> dict[str, Any]:
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
        else:
            choice["delta"] = {key[2]: text}
        data["choices"] = [choice]
        return data


def _bare_tool_call(call: dict[str, Any]) -> bool:
    function = call.get("function")
    if isinstance(function, dict) and not function:
        del call["function"]
    return set(call) <= {"index", "type"}


@dataclass(frozen=True, slots=True)
class _ResponsesDelta:
    index_field: str | None  # which index, besides item_id, tells the channel apart
    json_escaped: bool


class _ResponsesStream(_DialectStream):
    """OpenAI Responses: `response.*.delta` events, ended by their `.done` or the item's end."""

    DELTAS: ClassVar[dict[str, _ResponsesDelta]] = {
        "response.output_text.delta": _ResponsesDelta("content_index", False),
        "response.refusal.delta": _ResponsesDelta("content_index", False),
        "response.reasoning_text.delta": _ResponsesDelta("content_index", False),
        "response.reasoning_summary_text.delta": _ResponsesDelta("summary_index", False),
        "response.function_call_arguments.delta": _ResponsesDelta(None, True),
        "response.custom_tool_call_input.delta": _ResponsesDelta(None, False),
        "response.mcp_call_arguments.delta": _ResponsesDelta(None, True),
    }
    # Part ends: `*.part.done` carries item_id and the index of the part.
    PART_DONE: ClassVar[dict[str, str]] = {
        "response.content_part.done": "content_index",
        "response.reasoning_summary_part.done": "summary_index",
    }
    TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed", "error"})

    def handle(self, event: _Event, data: Any) -> list[bytes]:
        etype = data.get("type") if isinstance(data, dict) else None
        if not isinstance(etype, str):
            return self._plain(event, data)
        spec = self.DELTAS.get(etype)
        if spec is not None:
            text = data.get("delta")
            if not isinstance(text, str) or not text:
                return self._plain(event, data)
            key = (etype, data.get("item_id"), data.get(spec.index_field) if spec.index_field else None)
            site = _Site(key, data, "delta", text, "")
            site.out = self._feed(key, event, data, data, text, json_escaped=spec.json_escaped)
            if not site.out:
                return self._held(data, [site])  # all of it is held back
            return self._plain(event, data, _apply([site]), [site])
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
            return lambda key: (
                key[1] == item_id and self.DELTAS[key[0]].index_field == index_field and key[2] == index
            )
        if etype == "response.output_item.done":
            item = data.get("item")
            done_id = item.get("id") if isinstance(item, dict) else None
            return lambda key: key[1] == done_id
        if etype in self.TERMINAL:
            return lambda key: True
        return lambda key: False

    def _synthetic(self, key: ChannelKey, channel: _Channel, text: str) -> dict[str, Any]:
        data = dict(channel.data)
        data["delta"] = text
        if isinstance(data.get("logprobs"), list):
            data["logprobs"] = []
        return data


class _MessagesStream(_DialectStream):
    """Anthropic Messages: `content_block_delta` texts per block index, ended by `content_block_stop`."""

    DELTAS: ClassVar[dict[str, tuple[str, bool]]] = {  # delta.type → (text field, JSON-escaped)
        "text_delta": ("text", False),
        "thinking_delta": ("thinking", False),
        "input_json_delta": ("partial_json", True),
    }
    ENDS_ALL = frozenset({"message_delta", "message_stop", "error"})

    def handle(self, event: _Event, data: Any) -> list[bytes]:
        etype = data.get("type") if isinstance(data, dict) else None
        if etype == "content_block_delta":
            delta = data.get("delta")
            spec = self.DELTAS.get(delta.get("type")) if isinstance(delta, dict) else None
            if spec is None:
                return self._plain(event, data)  # signature_delta, citations_delta, …
            assert isinstance(delta, dict)
            field, json_escaped = spec
            text = delta.get(field)
            if not isinstance(text, str) or not text:
                return self._plain(event, data)
            key = (field, data.get("index"))
            site = _Site(key, delta, field, text, "")
            site.out = self._feed(key, event, data, data, text, json_escaped=json_escaped)
            if not site.out:
                return self._held(data, [site])  # all of it is held back
            return self._plain(event, data, _apply([site]), [site])
        if etype == "content_block_stop":
            index = data.get("index")
            return self._flush_where(lambda key: key[1] == index) + self._plain(event, data)
        if etype in self.ENDS_ALL:
            return self.flush_all() + self._plain(event, data)
        return self._plain(event, data)  # message_start may carry content: restored in full

    def _synthetic(self, key: ChannelKey, channel: _Channel, text: str) -> dict[str, Any]:
        data = dict(channel.data)
        data["delta"] = {**channel.data["delta"], key[0]: text}
        return data


SSE_DIALECTS: dict[str, type[_DialectStream]] = {
    "chat": _ChatStream,
    "responses": _ResponsesStream,
    "messages": _MessagesStream,
    "generic": _DialectStream,  # every string of every event in full, no hold-back across events
}


class SseRestorer:
    """Restores a streamed (SSE) reply handed over in chunks split at arbitrary byte positions.

    Complete events are emitted restored; an event left exactly as received when nothing in it
    changed. The bytes of an event not yet complete wait in a buffer (so a UTF-8 sequence or a
    `\\r\\n` cut by a chunk boundary is never looked at half).
    """

    def __init__(self, restorer: Restorer, dialect: str, gate: OutputGate | None = None) -> None:
        self._restorer = restorer
        self._gate = gate
        self._dialect = SSE_DIALECTS.get(dialect, _DialectStream)(restorer, gate)
        self._buf = bytearray()
        self._scan = 0  # where the search for the end of the pending event resumes

    def checkpoint(self) -> SseCheckpoint:
        """The state before a chunk, so the chunk can be restored again from it (`rollback`): how
        consistent pseudonyms go back over a chunk once the vault has answered."""
        gate = self._gate.checkpoint() if self._gate is not None else None
        return SseCheckpoint(bytes(self._buf), self._scan, self._dialect.checkpoint(), gate)

    def rollback(self, checkpoint: SseCheckpoint) -> None:
        self._buf = bytearray(checkpoint.buffer)
        self._scan = checkpoint.scan
        self._dialect.rollback(checkpoint.channels)
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
        out = self._dialect.flush_all()
        if self._buf:
            text = bytes(self._buf).decode("utf-8", "surrogateescape")
            if self._gate is not None:
                self._gate.read(text)
            out.append(self._restorer.restore_text(text).encode("utf-8", "surrogateescape"))
            self._buf.clear()
        self._scan = 0
        return b"".join(out)

    def _event(self, raw: bytes, body_end: int) -> list[bytes]:
        event = _parse_event(raw, body_end)
        payload = event.payload
        if payload is None:
            return [raw]  # comments, keep-alives, events without data
        if payload == b"[DONE]":
            return [*self._dialect.flush_all(), raw]
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
        return self._dialect.handle(event, data)
