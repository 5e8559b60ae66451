"""One stream channel restored as if it were one text: what `StreamRestorer` emits and holds back.

Where it sits: a streamed reply (ext_proc.restore.sse) carries each text as a sequence of deltas
on its channel (one choice's content, one tool call's arguments, one Anthropic content block, …),
and a placeholder may be split over any number of them. Each channel has a `StreamRestorer`,
which emits everything that can no longer be part of a placeholder at once and holds back only
the tail that could still be one, until more text or the channel's end decides it. It also reads
the channel as the client will (ext_proc.restore.json_context): a channel whose text begins with
`{` or `[` (structured output), or one the dialect says is JSON (tool-call arguments), gets each
original written for where it lands in that JSON, however the deltas cut it.
"""

from __future__ import annotations

from ext_proc.restore.json_context import JsonContext, Snapshot
from ext_proc.restore.restorers import Restorer
from ext_proc.transform.grammar import LOOKBEHIND_CHARS


class StreamState(tuple[str, str]):
    """A channel's state between two chunks: the held tail and its look-behind context (the
    pair callers store), carrying the JSON reader's state along (`StreamRestorer.load`)."""

    json: Snapshot

    def __new__(cls, held: str, ctx: str, json: Snapshot) -> StreamState:
        state = super().__new__(cls, (held, ctx))
        state.json = json
        return state


class StreamRestorer:
    """Restores one stream channel (a sequence of text deltas) as if it were one text.

    `feed` returns what can be emitted now: everything up to the first position that could still be
    the start of a placeholder of this exchange. Held back is that tail only: a strict prefix of a
    placeholder in some tolerated form (`<`, `EM`, `<EMAIL_ab12`, `\\u00`), or a complete one whose
    index or closing bracket could still grow (`<EMAIL_ab12cd34_1`, `EMAIL_ab12cd34_1\\u00`). So it
    is never longer than the longest placeholder form (2 × label + index digits + 23 characters),
    and text that cannot start a placeholder goes out at once. Each `feed` scans only the held tail
    plus the new text, so a stream costs time linear in its length.

    `json_escaped`: the channel is JSON text whatever its first character (tool-call arguments);
    otherwise it is read as JSON when it begins with `{` or `[`, and as prose else.
    """

    __slots__ = ("_context", "_ctx", "_held", "_prose", "_restorer")

    def __init__(self, restorer: Restorer, *, json_escaped: bool = False) -> None:
        self._restorer = restorer
        self._context = JsonContext(lenient=json_escaped)
        self._prose = False  # the channel reads as prose for good: its JSON reader has nothing to do
        self._held = ""
        # The characters before the held tail that the word-start look-behind reads.
        self._ctx = ""

    @property
    def held(self) -> str:
        return self._held

    def save(self) -> StreamState:
        """The held tail, its context and the JSON reader's state, for `load` to put back
        (`SseRestorer.checkpoint`)."""
        return StreamState(self._held, self._ctx, self._context.snapshot())

    def load(self, state: tuple[str, str]) -> None:
        self._held, self._ctx = state
        if isinstance(state, StreamState):
            self._context.restore(state.json)
            self._prose = False

    def feed(self, text: str) -> str:
        pattern = self._restorer.pattern
        if pattern is None:
            return text
        if not text:
            return ""
        held = self._held
        context = self._context
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
            if m.partial or not self._restorer.final(s, m):
                cut = m.start()
                break
            before = s[i : m.start()]
            out.append(before)
            if not self._prose:
                context.feed(before)
            out.append(self._restorer.emit(m, context))
            i = m.end()
        self._held = s[cut:]
        self._ctx = s[max(0, cut - LOOKBEHIND_CHARS) : cut]
        rest = s[i:cut]
        if not self._prose:
            context.feed(rest)
            self._prose = context.read_as_prose
        if i == start and cut == n:
            return held + text if held else text  # the common case: nothing held, nothing found
        out.append(rest)
        return "".join(out)

    def flush(self) -> str:
        """The held tail, restored: the channel has ended, nothing more can complete it."""
        held, ctx = self._held, self._ctx
        self._held = self._ctx = ""
        if not held or self._restorer.pattern is None:
            return held
        return self._restorer.restore_span(ctx + held, len(ctx), self._context)
