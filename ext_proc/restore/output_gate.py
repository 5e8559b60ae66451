"""The output gate (SPEC §15): what the model wrote, read for what it should not carry.

Model output is read in every channel before restore: text, reasoning/thinking, tool-call
arguments, refusals, and every other string of the reply except the protocol's own bookkeeping
(ids, types, roles, stop reasons: `STRUCTURAL_KEYS`). This request's own placeholders are taken out
first (the caller passes the neutraliser), so a placeholder is never a finding.

What is counted: distinct values per catalog kind. A reply says the same thing more than once (a
Responses stream sends every delta, then the whole text in `*.done`, then the whole response in
`response.completed`); counting distinct values (kept as keyed digests, never as text) makes the
figure the same whichever way the reply was written.

Streams: each delta channel keeps a window of its last `WINDOW` characters and reads them again
with what arrived since, so a value split across chunks (or events) is read whole. No text is
held back for this: the window only looks behind. Under `deny` every chunk's new text is read
before the chunk is released; under `report` a channel is read every `PENDING_CHARS` and at its
end (the counts are the same, the cost is one scan per few KB instead of one per chunk). A finding
that touches the end of what has arrived may still grow, so it is counted once it stops growing
(or the channel ends); under `deny` it trips the gate at once. A prefix of a longer value can
therefore count as one more distinct value, and can deny a reply that the whole value would have
denied anyway: a spurious match at a window edge only ever adds a refusal, never hides one.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any

from ext_proc.detect.catalog.engine import Catalog
from ext_proc.detect.findings import Finding
from ext_proc.transform.redact import resolve_overlaps

# Characters of a channel's earlier text read again with each delta: longer than any catalog
# value that matters whole (a PEM header line, a JWT's header and payload start, API keys).
WINDOW = 512

# Keys whose string values are protocol bookkeeping in all three APIs, not model output.
STRUCTURAL_KEYS = frozenset(
    {
        "id", "object", "type", "role", "model", "status", "system_fingerprint", "finish_reason",
        "stop_reason", "stop_sequence", "created", "created_at", "service_tier", "call_id",
        "item_id", "response_id", "previous_response_id", "tool_call_id", "tool_use_id", "index",
        "event", "signature", "encrypted_content",
    }
)  # fmt: skip

# The window's left edge moves to the first whitespace within this many characters, so it does
# not start inside a token (half a token can look like a value of its own).
WORD_EDGE_CHARS = 128

# Under `report`, a channel's new text is read once this much has collected (and at the end):
# one scan per few KB instead of one per delta.
PENDING_CHARS = 4096

# Short texts remembered per reply (each event of a stream repeats its keys and bookkeeping).
SEEN_TEXT_CHARS = 256
SEEN_TEXTS = 4096

# Beyond this depth a subtree is read as its JSON text instead of walked.
MAX_DEPTH = 64

Neutraliser = Callable[[str], str]


@dataclass(frozen=True, slots=True)
class GateCheckpoint:
    windows: dict[Hashable, tuple[str, tuple[str, ...]]]


class OutputGate:
    """One exchange's reading of model output: the distinct findings per kind, and whether any."""

    def __init__(
        self,
        catalog: Catalog,
        neutralise: Neutraliser,
        *,
        deny: bool = False,
        open_tail: Callable[[str], int] | None = None,
    ) -> None:
        self.catalog = catalog
        self.deny = deny
        self._neutralise = neutralise
        # Where a placeholder still being written starts at the end of a channel's text: a
        # window reads up to there and takes the rest with the next delta (the stream holds it
        # back too), so half a placeholder is never read as a value.
        self._open_tail = open_tail or len
        self._key = secrets.token_bytes(16)
        self._seen: dict[str, set[bytes]] = {}
        self._windows: dict[Hashable, GateWindow] = {}
        self.tripped = False
        self.kinds: set[str] = set()  # every kind seen, counted or not yet (what a refusal names)
        self._read: dict[str, bool] = {}  # short texts already read, and whether they held a finding

    def counts(self) -> dict[str, int]:
        return {kind: len(values) for kind, values in sorted(self._seen.items())}

    def read(self, text: str) -> bool:
        """Reads a whole string; True if it carries a finding. A short string read before in this
        reply (the keys and bookkeeping every event repeats) is answered from what it gave then."""
        if not text:
            return False
        short = len(text) <= SEEN_TEXT_CHARS
        if short and text in self._read:
            return self._read[text]
        found = self._read_new(text)
        if short and len(self._read) < SEEN_TEXTS:
            self._read[text] = found
        return found

    def _read_new(self, text: str) -> bool:
        return self._take(self._neutralise(text), whole=True)

    def _take(self, text: str, *, whole: bool) -> bool:
        """Reads neutralised `text`: records its findings (all when `whole`, else only the settled
        ones, which end before the text does and so cannot grow), notes every kind; True if any."""
        findings = self.detect(text) if text else []
        for finding in findings:
            if whole or finding.end < len(text):
                self._record(finding.kind, text[finding.start : finding.end])
        if findings:
            self.tripped = True
            self.kinds.update(f.kind for f in findings)
        return bool(findings)

    def read_tree(self, node: Any) -> bool:
        """Reads every string (and key) of a parsed JSON reply except STRUCTURAL_KEYS' values."""
        found = False
        for text in _strings(node):
            found = self.read(text) or found
        return found

    def detect(self, text: str) -> list[Finding]:
        """The catalog's findings, overlaps resolved as redaction resolves them: one span, one kind."""
        return resolve_overlaps(self.catalog.detect(text))

    def window(self, key: Hashable = None) -> GateWindow:
        """The window of the delta channel `key` (made on first use)."""
        window = self._windows.get(key)
        if window is None:
            window = self._windows[key] = GateWindow(self)
        return window

    def finish_window(self, key: Hashable) -> bool:
        """Channel `key` ended: read to its end."""
        window = self._windows.pop(key, None)
        return window.finish() if window is not None else False

    def check_windows(self) -> bool:
        """Checks every channel with new text (under `deny`, once per chunk); True if any found."""
        found = False
        for window in self._windows.values():
            found = window.check() or found
        return found

    def finish_windows(self) -> bool:
        """The stream ended: every channel read to its end."""
        found = False
        for window in self._windows.values():
            found = window.finish() or found
        self._windows.clear()
        return found

    def checkpoint(self) -> GateCheckpoint:
        """The windows' state between two chunks (a chunk read again after a vault lookup must
        not be read into a window twice)."""
        return GateCheckpoint({key: window.state() for key, window in self._windows.items()})

    def rollback(self, checkpoint: GateCheckpoint) -> None:
        self._windows = {}
        for key, state in checkpoint.windows.items():
            self.window(key).load(state)

    def _record(self, kind: str, value: str) -> None:
        raw = value.encode("utf-8", "surrogatepass")
        digest = hashlib.blake2b(raw, digest_size=16, key=self._key).digest()
        self._seen.setdefault(kind, set()).add(digest)


class GateWindow:
    """One delta channel of a stream. Deltas collect until `check`: then the channel's last
    WINDOW characters are read again together with everything new, so a value cut anywhere is
    read whole. The caller decides how often to check: after every chunk under `deny` (before the
    chunk is released), only when `PENDING_CHARS` have collected and at the end under `report`."""

    def __init__(self, gate: OutputGate) -> None:
        self._gate = gate
        self._tail = ""
        self._pending: list[str] = []
        self._pending_chars = 0

    def state(self) -> tuple[str, tuple[str, ...]]:
        return self._tail, tuple(self._pending)

    def load(self, state: tuple[str, tuple[str, ...]]) -> None:
        self._tail, pending = state
        self._pending = list(pending)
        self._pending_chars = sum(map(len, pending))

    def feed(self, delta: str) -> None:
        if delta:
            self._pending.append(delta)
            self._pending_chars += len(delta)
            if self._pending_chars >= PENDING_CHARS:
                self.check()

    def check(self, *, final: bool = False) -> bool:
        """Reads the window and what is pending; True if anything is found in them."""
        if not self._pending and not (final and self._tail):
            return False
        gate = self._gate
        joined = self._tail + "".join(self._pending)
        cut = len(joined) if final else gate._open_tail(joined)
        raw, rest = joined[:cut], joined[cut:]
        text = gate._neutralise(raw)
        found = gate._take(text, whole=final)
        # The window looks back from the cut, over text already neutralised (no half placeholder
        # at its left edge), from a word boundary (no half token); the open tail is read next time.
        self._tail = "" if final else _look_behind(text)
        self._pending = [rest] if rest else []
        self._pending_chars = len(rest)
        return found

    def finish(self) -> bool:
        """The channel ended: read what is left; a value touching the end is now whole."""
        return self.check(final=True)


def _look_behind(text: str) -> str:
    """The last WINDOW characters of `text`, starting after a whitespace where one is near."""
    tail = text[-WINDOW:]
    if len(text) > WINDOW:
        space = next((i for i, ch in enumerate(tail[:WORD_EDGE_CHARS]) if ch.isspace()), -1)
        tail = tail[space + 1 :]
    return tail


def _strings(node: Any, depth: int = 0) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif depth > MAX_DEPTH and isinstance(node, (dict, list)):
        yield json.dumps(node)  # nested this deep: read as its JSON text, never skipped
    elif isinstance(node, dict):
        for key, value in node.items():
            yield key
            if key in STRUCTURAL_KEYS and not isinstance(value, (dict, list)):
                continue
            yield from _strings(value, depth + 1)
    elif isinstance(node, list):
        for item in node:
            yield from _strings(item, depth + 1)
