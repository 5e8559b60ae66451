"""The output gate: what the model wrote, read for what it should not carry.

Model output is read in every channel before restore: text, reasoning/thinking, tool-call
arguments, refusals, transcripts, code, and every other string of the reply except the protocol's
own bookkeeping (ids, types, roles, stop reasons: `STRUCTURAL_KEYS`) at the positions the APIs
give them; inside what the model wrote (a tool's input, JSON inside a string) every key is read.
This request's own placeholders are taken out first (the caller passes the neutraliser), so a
placeholder is never a finding.

The catalog reads each text in its canonical view and its decoded views
(ext_proc.detect.canonical, ext_proc.detect.decode), so a card written with narrow no-break spaces,
another script's digits or escapes trips the gate like a plain one. What is counted: distinct
values per catalog kind, compared in their canonical, decoded view (kept as keyed digests, never
as text), so the figure is the same however often and in whichever form the reply says a value.
A string that repeats a streamed channel's whole text (a Responses `*.done` event, the final
response) was read in that channel and is not read again.

Streams: each delta channel (`GateWindow`) reads its text as one text, whatever the events,
blocks or parts it came in. Text is judged up to where a value could still be growing
(ext_proc.restore.holdback): the undecided tail waits for more text or the channel's end, so a
finding is judged whole and a prefix is never taken for a value (nor a value's prefix for
nothing). Judged text stays as look-behind for the next reading (`WINDOW` characters). Under
`deny` a channel is read before each chunk of the reply goes out, and a chunk goes out only once
every channel has decided the text it carries (`settled`); under `report` a channel is read every
`PENDING_CHARS` and at its end (the counts are the same, the cost one scan per few KB).
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import weakref
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any

import phonenumbers

from ext_proc.detect.canonical import canonical_text, read_char
from ext_proc.detect.catalog.engine import Catalog
from ext_proc.detect.decode import decoded_views
from ext_proc.detect.findings import Finding
from ext_proc.detect.structure import (
    PATH_STEPS,
    KeyPath,
    pair_findings,
    path_role,
    reads_number,
    value_findings,
)
from ext_proc.detect.subjects.contacts import DEFAULT_REGION
from ext_proc.restore.holdback import one_short_run, open_start
from ext_proc.restore.json_text import JsonTextReader
from ext_proc.transform.redact import resolve_overlaps
from ext_proc.transform.walk import looks_like_json

# Characters of a channel's judged text read again with what follows: the context a value's
# reading needs (a key before its value, the words some kinds need nearby).
WINDOW = 512

# Keys whose string values are protocol bookkeeping in all three APIs, not model output: skipped
# in the API's own objects (the root of a reply or event, and what API_OBJECT_KEYS lead to), read
# anywhere else: under a key the APIs do not define, in what the model wrote, in JSON text.
STRUCTURAL_KEYS = frozenset(
    {
        "id", "object", "type", "role", "model", "status", "system_fingerprint", "finish_reason",
        "stop_reason", "stop_sequence", "created", "created_at", "service_tier", "call_id",
        "item_id", "response_id", "previous_response_id", "tool_call_id", "tool_use_id", "index",
        "event", "signature", "encrypted_content",
    }
)  # fmt: skip
# Keys under which the three APIs put objects of their own (choices, messages, deltas, blocks,
# items, parts, usage, errors …): bookkeeping keys inside them are skipped. Under any other key
# (one the APIs do not define, `metadata`, what the model wrote: a tool's `input`, `arguments`,
# `parsed` output) an `id` or a `type` is read like any string.
API_OBJECT_KEYS = frozenset(
    {
        "choices", "delta", "message", "tool_calls", "function", "function_call", "usage",
        "content", "content_block", "item", "part", "response", "output", "error", "audio",
        "logprobs", "top_logprobs", "annotations", "summary", "reasoning", "text", "format",
        "completion_tokens_details", "prompt_tokens_details", "input_tokens_details",
        "output_tokens_details",
    }
)  # fmt: skip

# The names the three APIs give their own fields, for `OutputGate._read_name`: every reply and
# event repeats a few dozen of them. Only names from this code are remembered, never a reply's text.
API_NAMES = STRUCTURAL_KEYS | API_OBJECT_KEYS | frozenset(
    {
        "prompt_tokens", "completion_tokens", "total_tokens", "cached_tokens", "audio_tokens",
        "reasoning_tokens", "accepted_prediction_tokens", "rejected_prediction_tokens",
        "input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens",
        "cache_creation", "ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens",
        "server_tool_use", "web_search_requests", "refusal", "name", "arguments", "partial_json",
        "input", "thinking", "output_text", "output_index", "content_index", "sequence_number",
        "incomplete_details", "instructions", "max_output_tokens", "metadata", "parallel_tool_calls",
        "temperature", "tool_choice", "tools", "top_p", "truncation", "store", "user", "stop",
    }
)  # fmt: skip
# Per catalog, the API_NAMES it has read and found nothing in (a catalog is compiled once per set
# of policy knobs and detection is a function of catalog and text: the answer cannot change).
_CLEAN_NAMES: weakref.WeakKeyDictionary[Catalog, set[str]] = weakref.WeakKeyDictionary()

# The window's left edge moves to the first whitespace within this many characters, so it does
# not start inside a token (half a token can look like a value of its own).
WORD_EDGE_CHARS = 128

# Under `report`, a channel's new text is read once this much has collected (and at the end):
# one scan per few KB instead of one per delta.
PENDING_CHARS = 4096

# Under `deny`, a channel's new text is decided once this much has collected (or at its end):
# a decision reads the held part in every view, about as costly for a word as for a line.
DECIDE_CHARS = 24

# Short texts remembered per reply (each event of a stream repeats its keys and bookkeeping).
SEEN_TEXT_CHARS = 256
SEEN_TEXTS = 4096
# Stream events (their text left out) up to this size are remembered, this many.
SEEN_EVENT_BYTES = 2048
SEEN_EVENTS = 256

# Beyond this depth a subtree is read as its JSON text instead of walked.
MAX_DEPTH = 64

# The count of a reply the gate could not read (compressed, or of a type it does not know).
UNREAD = "UNREAD"
# What a refusal names when a channel went on after its end (under `deny`).
AFTER_END = "text after the end of its channel"

Neutraliser = Callable[[str], str]
WindowState = tuple[str, bool, tuple[str, ...], int, int, bool, str]


@dataclass(frozen=True, slots=True)
class GateCheckpoint:
    windows: tuple[tuple[Hashable, GateWindow, WindowState], ...]
    streamed: frozenset[bytes]
    tripped: bool


class OutputGate:
    """One exchange's reading of model output: the distinct findings per kind, and whether any."""

    def __init__(
        self,
        catalog: Catalog,
        neutralise: Neutraliser,
        *,
        deny: bool = False,
        open_tail: Callable[[str], int] | None = None,
        whole_at: Callable[[str, int], int] | None = None,
        owns: Callable[[str], bool] | None = None,
    ) -> None:
        self.catalog = catalog
        # A value this exchange wrote itself (a surrogate the model wrote in another layout).
        self._owns = owns or (lambda _value: False)
        self.deny = deny
        self._neutralise = neutralise
        # Where a placeholder still being written starts at the end of a channel's text: a
        # window reads up to there and takes the rest with the next delta (the stream holds it
        # back too), so half a placeholder is never read as a value.
        self._open_tail = open_tail or len
        # Where a cut would fall inside a placeholder (a surrogate holds spaces): before it.
        self._whole_at = whole_at or (lambda _text, at: at)
        self._key = secrets.token_bytes(16)
        self._seen: dict[str, set[bytes]] = {}
        self._windows: dict[Hashable, GateWindow] = {}
        self._streamed: set[bytes] = set()  # digests of streamed channels' whole texts
        self.tripped = False
        self.kinds: set[str] = set()  # every kind seen, counted or not yet (what a refusal names)
        self._read: dict[str, bool] = {}  # short texts already read, and whether they held a finding
        self._events: dict[str, bool] = {}  # small stream events read (their repr), the same
        self.unread = False  # a reply it could not read

    def counts(self) -> dict[str, int]:
        counts = {kind: len(values) for kind, values in self._seen.items()}
        if self.unread:
            counts[UNREAD] = 1
        return dict(sorted(counts.items()))

    def mark_unread(self) -> None:
        """The reply cannot be read (compressed, or of an unknown type): counted as `UNREAD`."""
        self.unread = True

    # --- whole strings ---------------------------------------------------------------------------

    def read(self, text: str) -> bool:
        """Reads a whole string; True if it carries a finding. A short string read before in this
        reply (the keys and bookkeeping every event repeats) is answered from what it gave then;
        a streamed channel's whole text, repeated, was read in its channel."""
        if not text:
            return False
        short = len(text) <= SEEN_TEXT_CHARS
        if short and text in self._read:
            found = self._read[text]
            self.tripped = self.tripped or found  # as read then (a rollback may have reset it)
            return found
        if self._streamed and self.digest(text) in self._streamed:
            return False
        if text in API_NAMES:
            found = self._read_name(text)
        else:
            found = self._take(self._neutralise(text), 0, whole=True)
        if short and len(self._read) < SEEN_TEXTS:
            self._read[text] = found
        return found

    def _read_name(self, name: str) -> bool:
        """`read` of one of the API_NAMES: the same reading, skipped where this catalog found
        nothing in the name before (the catalog's memo costs a keyed digest and two lookups a
        text, and these are most of the strings of a short reply)."""
        neutral = self._neutralise(name)
        if neutral != name:
            return self._take(neutral, 0, whole=True)
        clean = _CLEAN_NAMES.get(self.catalog)
        if clean is not None and name in clean:
            return False
        if self.detect(name):
            return self._take(name, 0, whole=True)
        _CLEAN_NAMES.setdefault(self.catalog, set()).add(name)
        return False

    def read_event(self, node: Any, size: int) -> bool:
        """`read_tree` for a stream event of `size` bytes: a small one whose other strings are all
        as in an event read before (the envelope every delta event repeats, its delta text left
        out) is answered from what that one gave."""
        if size > SEEN_EVENT_BYTES:
            return self.read_tree(node)
        shape = repr(node)  # C-level, and exact: types, keys, order and every string
        found = self._events.get(shape)
        if found is None:
            found = self.read_tree(node)
            if len(self._events) < SEEN_EVENTS:
                self._events[shape] = found
        self.tripped = self.tripped or found
        return found

    def read_tree(self, node: Any) -> bool:
        """Reads every string (and key) of a parsed JSON reply except bookkeeping values in the
        API's own objects, JSON inside strings included, each value also in its key's context
        (`password`, `phone_number`: ext_proc.detect.structure)."""
        found = False
        for text, path in _strings(node):
            found = self.read(text) or found
            if path:
                found = self._read_keyed(text, path) or found
        return found

    def _read_keyed(self, text: str, path: KeyPath) -> bool:
        """What the key path of `text` implies about it (the catalog already read the text)."""
        if path_role(path) is None:
            return False
        neutral = self._neutralise(text)
        findings = [
            f for f in value_findings(path, neutral, self.catalog) if not self._owns(neutral[f.start : f.end])
        ]
        for finding in findings:
            self._record(finding.kind, neutral[finding.start : finding.end])
        if findings:
            self.tripped = True
            self.kinds.update(f.kind for f in findings)
        return bool(findings)

    def _take(self, text: str, floor: int, *, whole: bool, edge_cut: bool = False) -> bool:
        """Reads neutralised `text` and records its findings that end after `floor` (what came
        before was read already); a finding at a left edge that cuts a token is a fragment of a
        token read from its start, and is left out. True if any finding counts."""
        found = False
        for finding in self.detect(text) if text else ():
            if finding.end <= floor or (edge_cut and finding.start == 0):
                continue
            if self._owns(text[finding.start : finding.end]):
                continue
            found = True
            self.kinds.add(finding.kind)
            if whole:
                self._record(finding.kind, text[finding.start : finding.end])
        if found:
            self.tripped = True
        return found

    def detect(self, text: str) -> list[Finding]:
        """The catalog's findings, overlaps resolved as redaction resolves them: one span, one kind."""
        return resolve_overlaps([*self.catalog.detect(text), *pair_findings(text, self.catalog)])

    # --- streamed channels ------------------------------------------------------------------------

    def window(self, key: Hashable = None, *, json_text: bool = False) -> GateWindow:
        """The window of the delta channel `key` (made on first use); `json_text`: the channel
        carries JSON text (tool-call arguments), read with its escapes undone."""
        window = self._windows.get(key)
        if window is None:
            window = self._windows[key] = GateWindow(self, json_text=json_text)
        return window

    def window_keys(self) -> list[Hashable]:
        return list(self._windows)

    def finish_window(self, key: Hashable) -> bool:
        """Channel `key` ended: read to its end. The window stays, with its look-behind: text the
        channel still gets after its end is read joined to what it had (`GateWindow.feed`)."""
        window = self._windows.get(key)
        return window.finish() if window is not None else False

    def check_windows(self) -> bool:
        """Reads every channel with new text up to what is decided (under `deny`, once per chunk
        before it goes out); True if any found."""
        found = False
        for window in self._windows.values():
            found = window.check() or found
        return found

    def finish_windows(self) -> bool:
        """The stream ended: every channel read to its end (the windows stay, as above)."""
        found = False
        for window in self._windows.values():
            found = window.finish() or found
        return found

    def after_end(self) -> None:
        """A channel got text after it ended (after its choice's `finish_reason`, the stream's
        `[DONE]`, `message_stop` or `response.completed`): no API sends that. Its held tail went
        out with the end, so under `deny` the reply is refused; under `report` it is read on."""
        if self.deny:
            self.tripped = True
            self.kinds.add(AFTER_END)

    def marks(self) -> tuple[tuple[GateWindow, int], ...]:
        """Where each channel with undecided text stands now: what a chunk produced now waits for."""
        return tuple((w, w.fed) for w in self._windows.values() if w.decided < w.fed)

    def digest(self, text: str) -> bytes:
        digest: bytes = self.hasher(text).digest()
        return digest

    def hasher(self, text: str = "") -> Any:
        """A keyed digest of a channel's text, fed as it streams (`streamed` notes the result)."""
        h = hashlib.blake2b(digest_size=16, key=self._key)
        if text:
            h.update(text.encode("utf-8", "surrogatepass"))
        return h

    def streamed(self, digest: bytes) -> None:
        """A streamed channel's whole text (its digest): read in its channel, not again when a
        later event repeats it whole."""
        self._streamed.add(digest)

    def checkpoint(self) -> GateCheckpoint:
        """The gate's state between two chunks (a chunk read again after a vault lookup must not
        be read into a window twice)."""
        windows = tuple((key, w, w.state()) for key, w in self._windows.items())
        return GateCheckpoint(windows, frozenset(self._streamed), self.tripped)

    def rollback(self, checkpoint: GateCheckpoint) -> None:
        self._windows = {}
        for key, window, state in checkpoint.windows:
            window.load(state)  # the same objects: chunks waiting for them keep their marks
            self._windows[key] = window
        self._streamed = set(checkpoint.streamed)
        self.tripped = checkpoint.tripped

    def _record(self, kind: str, value: str) -> None:
        # Counted in its canonical, decoded view, by its letters and digits alone, case folded:
        # one card written plain, with spaces or dashes, in another script's digits or as escapes,
        # one phone number in three layouts, an IBAN grouped or not, is one value.
        for decoded in decoded_views(canonical_text(value)):
            value = decoded.text
        plain = canonical_text(value)
        core = "".join(c for c in plain if c.isalnum()).casefold()
        if kind == "PHONE":
            core = _phone_core(plain, core)
        raw = core.encode("utf-8", "surrogatepass")
        digest = hashlib.blake2b(raw, digest_size=16, key=self._key).digest()
        self._seen.setdefault(kind, set()).add(digest)


def _phone_core(plain: str, digits: str) -> str:
    """A phone number as E.164 where phonenumbers reads it (`+1 212 555 0199` and `(212)
    555-0199` are one number), else its digits."""
    try:
        number = phonenumbers.parse(plain, DEFAULT_REGION)
    except phonenumbers.NumberParseException:
        return digits
    return phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.E164)


class GateWindow:
    """One delta channel of a stream: its text read as one text, a decided part at a time.

    `fed` counts the characters fed so far, `decided` those judged (released under `deny`). Each
    `check` judges the pending text up to where a value could still be growing, together with the
    last WINDOW characters already judged (so a value cut anywhere is read whole, with its
    context); the rest waits. `finish` judges everything: nothing more can complete it."""

    __slots__ = (
        "_edge_cut",
        "_gate",
        "_json",
        "_pending",
        "_pending_chars",
        "_tail",
        "decided",
        "fed",
        "finished",
    )

    def __init__(self, gate: OutputGate, *, json_text: bool = False) -> None:
        self._gate = gate
        self._json = JsonTextReader() if json_text else None
        self._tail = ""  # judged text (neutralised), the look-behind
        self._edge_cut = False  # the tail starts inside a token
        self._pending: list[str] = []
        self._pending_chars = 0
        self.fed = 0
        self.decided = 0
        self.finished = False

    def settled(self, mark: int) -> bool:
        """Whether the text fed up to `mark` is decided."""
        return self.finished or self.decided >= mark

    def state(self) -> WindowState:
        carry = self._json.carry if self._json is not None else ""
        return (
            self._tail,
            self._edge_cut,
            tuple(self._pending),
            self.fed,
            self.decided,
            self.finished,
            carry,
        )

    def load(self, state: WindowState) -> None:
        self._tail, self._edge_cut, pending, self.fed, self.decided, self.finished, carry = state
        self._pending = list(pending)
        self._pending_chars = sum(map(len, pending))
        if self._json is not None:
            self._json.load(carry)

    def feed(self, delta: str) -> None:
        if self._json is not None:
            delta = self._json.feed(delta)
        if delta:
            if self.finished:
                self.finished = False
                self._gate.after_end()
            self._pending.append(delta)
            self._pending_chars += len(delta)
            self.fed += len(delta)
            if not self._gate.deny and self._pending_chars >= PENDING_CHARS:
                self.check()

    def check(self, *, final: bool = False) -> bool:
        """Judges the pending text up to what is decided (all of it when `final`); True if a
        finding is in it."""
        if final and self._json is not None:
            rest = self._json.finish()
            if rest:
                self._pending.append(rest)
                self.fed += len(rest)
        if not self._pending:
            if final:
                self.finished = True
            return False
        gate = self._gate
        tail = self._tail
        joined = tail + "".join(self._pending)
        floor = len(tail)
        if final:
            hold = len(joined)
        elif len(joined) - floor < DECIDE_CHARS or one_short_run(joined, floor):
            # Nothing decided yet: too little new text to be worth a decision (a few words at
            # most wait), or one run, wherever a placeholder may begin.
            return False
        else:
            cut = gate._open_tail(joined)
            hold = open_start(joined[:cut], floor, gate.catalog) if cut > floor else floor
            hold = gate._whole_at(joined, hold)
            if hold <= floor:
                return False  # nothing decided yet
        judged = tail + gate._neutralise(joined[floor:hold])
        found = gate._take(judged, len(tail), whole=True, edge_cut=self._edge_cut)
        self.decided += hold - floor
        self._tail, self._edge_cut = _look_behind(judged, self._edge_cut)
        rest = joined[hold:]
        self._pending = [rest] if rest else []
        self._pending_chars = len(rest)
        if final:
            self.finished = True
            self.decided = self.fed
        return found

    def finish(self) -> bool:
        """The channel ended: read what is left; a value touching the end is now whole."""
        return self.check(final=True)


def _look_behind(text: str, edge_cut: bool) -> tuple[str, bool]:
    """The last WINDOW characters of `text` compacted (invisible characters left out, a run of
    spaces read as one: padding counts for nothing and is not kept), from after a whitespace where
    one is near; and whether that left edge falls inside a token."""
    text = _compact(text)
    if len(text) <= WINDOW:
        return text, edge_cut
    tail = text[-WINDOW:]
    space = next((i for i, ch in enumerate(tail[:WORD_EDGE_CHARS]) if ch.isspace()), -1)
    if space >= 0:
        return tail[space + 1 :], False
    return tail, not text[-WINDOW - 1].isspace() and not tail[0].isspace()


_SPACE_RUN = re.compile(r"[ \t]{2,}")
_TAGS = range(0xE0000, 0xE0080)


def _compact(text: str) -> str:
    """`text` without the characters the canonical view reads as nothing (tag characters kept:
    the hidden view reads them), runs of spaces and tabs as one space."""
    if not text.isascii():
        text = "".join(c for c in text if c.isascii() or ord(c) in _TAGS or read_char(c))
    return _SPACE_RUN.sub(" ", text) if "  " in text or "\t" in text else text


def _strings(
    node: Any, depth: int = 0, path: KeyPath = (), *, envelope: bool = True
) -> Iterator[tuple[str, KeyPath | None]]:
    """Every string of `node` with its key path (None for an object key), JSON inside a string
    walked as well, and the numbers whose key may name a value (as their digits). `envelope`:
    still in the API's own objects, where bookkeeping keys are skipped."""
    if isinstance(node, str):
        yield node, path
        if depth <= MAX_DEPTH and looks_like_json(node):
            try:
                inner = json.loads(node)
            except (ValueError, RecursionError):
                inner = None
            if isinstance(inner, (dict, list)):
                yield from _strings(inner, depth + 1, path, envelope=False)
    elif isinstance(node, int) and not isinstance(node, bool):
        if reads_number(path):
            yield str(node), path
    elif depth > MAX_DEPTH and isinstance(node, (dict, list)):
        yield json.dumps(node), None  # nested this deep: read as its JSON text, never skipped
    elif isinstance(node, dict):
        for key, value in node.items():
            yield key, None
            if envelope and key in STRUCTURAL_KEYS and not isinstance(value, (dict, list)):
                continue
            inner_path = (*path[1 - PATH_STEPS :], key) if path else (key,)
            yield from _strings(value, depth + 1, inner_path, envelope=envelope and key in API_OBJECT_KEYS)
    elif isinstance(node, list):
        for item in node:
            yield from _strings(item, depth + 1, path, envelope=envelope)
