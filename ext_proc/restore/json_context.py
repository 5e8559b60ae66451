"""Where in JSON text a restored value lands, and how it must be written there.

Where it sits: restore (ext_proc.restore.restorers, .stream, .json_body) puts the caller's values
back into reply text. Much of that text is JSON: structured output (`response_format`,
`text.format`), tool-call arguments, a JSON document carried inside a JSON string. A value put
raw into a JSON string could end the string and add keys of its own (`", "admin": true`), or make
the text unreadable (a `\\`). `JsonContext` reads such text as it is emitted, one character class
at a time, and says at each position what the client will read there:

- prose (the text is not JSON, or no longer looks like it): the value goes in as it is;
- inside a JSON string: the value goes in JSON-escaped, once for every string it sits in (a
  string whose content is itself JSON text, `"{\\"to\\": \\"…\\"}"`, is read the same way, level by
  level);
- outside any string, in text already seen to be JSON (an object key was read): the value goes
  in as a JSON value of its own, a number when it is written as one, else a string, so it can
  never add structure;
- right after a backslash or inside a `\\u` escape (text no valid JSON would hold there): nothing
  can be inserted safely, and the model's text stays as it was.

A text is JSON when its first non-blank character is `{` or `[` (or when the caller says so: a
tool call's arguments); a strict reader gives up at the first character that JSON cannot hold
outside a string (prose that merely starts with a bracket), a lenient one never does. The reader
always tracks what the client reads, inserted values included. Each character is looked at once
(runs are skipped with one regex match), so a stream costs time linear in its length.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

# A level's mode.
UNDECIDED = 0  # only blanks so far: prose or JSON is decided by the first other character
TEXT = 1  # prose: nothing more is tracked here or below
OUT = 2  # JSON, outside any string
STR = 3  # inside a string (the next level reads its content)
ESC = 4  # inside a string, right after a backslash
HEX = 5  # inside a string, within a `\u` escape

# Deeper than this, a string's content is not read as JSON (each level at least doubles the
# escapes a character needs, so real text never comes close).
MAX_LEVELS = 24
# Text read but not lexed yet is lexed at the latest once it is this long (memory stays bounded).
_PENDING_CHARS = 16384

# What JSON text holds outside strings: blanks, punctuation, numbers and the literals' letters.
_OUT_RUN = re.compile(r"[\s,:\[\]{}0-9+\-.eEtruefalsn]*")
_STR_RUN = re.compile(r'[^"\\]*')
_BLANKS = re.compile(r"\s*")
_HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
_SIMPLE_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")


@dataclass(frozen=True, slots=True)
class Spot:
    """Where an insertion lands: how many strings enclose it, and what it must be at the
    innermost level (`literal`: a JSON value of its own; else the text as it is)."""

    level: int  # the innermost level: the one whose text the value becomes part of
    strings: int  # the JSON strings around it, each adding one round of escaping
    literal: bool


def escape(text: str) -> str:
    """`text` as the inside of a JSON string."""
    return json.dumps(text, ensure_ascii=False)[1:-1]


def literal(text: str) -> str:
    """`text` as a JSON value of its own: a number when it is written as one, else a string."""
    return text if _NUMBER.fullmatch(text) else json.dumps(text, ensure_ascii=False)


def encode(original: str, spot: Spot) -> str:
    """`original` as it must be written at `spot`, in the text's own (outermost) form."""
    text = literal(original) if spot.literal else original
    for _ in range(spot.strings):
        text = escape(text)
    return text


def innermost(original: str, spot: Spot) -> str:
    """What the innermost level reads once `original` is inserted at `spot`."""
    return literal(original) if spot.literal else original


def looks_like_json(text: str) -> bool:
    """Whether a text begins as JSON text: its first non-blank character is `{` or `[`."""
    stripped = text.lstrip()
    return stripped[:1] in ("{", "[")


class _Level:
    __slots__ = ("confirmed", "hex", "mode", "strict")

    def __init__(self, mode: int, *, strict: bool, confirmed: bool = False) -> None:
        self.mode = mode
        self.strict = strict
        self.confirmed = confirmed  # a string was opened outside strings: surely JSON
        self.hex = ""

    def state(self) -> tuple[int, bool, bool, str]:
        return self.mode, self.strict, self.confirmed, self.hex


LevelState = tuple[int, bool, bool, str]
Snapshot = tuple[LevelState, ...]


class JsonContext:
    """Incremental reader of one text (a channel, a string value): where each position sits.

    `lenient`: the text is known to be JSON (tool-call arguments): read as JSON from its first
    character and never given up on. Otherwise the text is JSON only if it begins like JSON, and
    a character JSON cannot hold outside a string ends that reading (the rest is prose).
    """

    __slots__ = ("_levels", "_pending", "_pending_chars")

    def __init__(self, *, lenient: bool = False) -> None:
        first = _Level(OUT, strict=False, confirmed=True) if lenient else _Level(UNDECIDED, strict=True)
        self._levels: list[_Level] = [first]
        # Text read but not yet lexed: lexed in one pass when a position is asked for (or once it
        # is long), so a stream of small deltas costs one regex run per token, not per delta.
        self._pending: list[str] = []
        self._pending_chars = 0

    @property
    def prose(self) -> bool:
        """The text is prose for good: nothing more needs reading (the cheap common case)."""
        self._lex_pending()
        return self._levels[0].mode == TEXT

    @property
    def read_as_prose(self) -> bool:
        """Prose for good, as far as read (no lexing: a cheap check per delta)."""
        return self._levels[0].mode == TEXT

    def snapshot(self) -> Snapshot:
        self._lex_pending()
        return tuple(level.state() for level in self._levels)

    def restore(self, snapshot: Snapshot) -> None:
        self._pending, self._pending_chars = [], 0
        levels = []
        for mode, strict, confirmed, hexdigits in snapshot:
            level = _Level(mode, strict=strict, confirmed=confirmed)
            level.hex = hexdigits
            levels.append(level)
        self._levels = levels

    def feed(self, text: str) -> None:
        """Read `text`, which the client reads next (the model's own text)."""
        if not text:
            return
        mode = self._levels[0].mode
        if mode == TEXT:
            return
        if mode == UNDECIDED:
            self._feed(0, text)  # decided at the first non-blank character: prose costs nothing more
            return
        self._pending.append(text)
        self._pending_chars += len(text)
        if self._pending_chars > _PENDING_CHARS:
            self._lex_pending()

    def _lex_pending(self) -> None:
        if self._pending:
            text = "".join(self._pending)
            self._pending, self._pending_chars = [], 0
            self._feed(0, text)

    def spot(self) -> Spot | None:
        """Where a value inserted now lands; None where nothing can be inserted safely (right
        after a backslash or inside a `\\u` escape, at any level)."""
        self._lex_pending()
        strings = 0
        for i, level in enumerate(self._levels):
            mode = level.mode
            if mode == STR:
                strings += 1
                continue
            if mode in (ESC, HEX):
                return None
            # UNDECIDED or TEXT: prose here; OUT: a value of its own once the text is surely JSON.
            return Spot(i, strings, mode == OUT and level.confirmed)
        raise AssertionError("the innermost level is never inside a string")

    def inserted(self, spot: Spot, original: str) -> None:
        """`original` was inserted at `spot` (as `encode` wrote it): the innermost level reads it;
        the enclosing strings only gained escaped, balanced content. Right after `spot`."""
        if self._levels[spot.level].mode != TEXT:
            self._feed(spot.level, innermost(original, spot))

    # --- the reader -----------------------------------------------------------------------------

    def _feed(self, index: int, text: str) -> None:
        levels = self._levels
        level = levels[index]
        pos, n = 0, len(text)
        while pos < n:
            mode = level.mode
            if mode == TEXT:
                return
            if mode == UNDECIDED:
                pos = _BLANKS.match(text, pos).end()  # type: ignore[union-attr]
                if pos == n:
                    return
                if text[pos] in "{[":
                    level.mode = OUT
                else:
                    level.mode = TEXT
                    return
            elif mode == OUT:
                pos = _OUT_RUN.match(text, pos).end()  # type: ignore[union-attr]
                if pos == n:
                    return
                if text[pos] == '"':
                    level.mode = STR
                    level.confirmed = True
                    self._open_string(index)
                elif level.strict:
                    level.mode = TEXT  # not JSON after all: prose from here on
                    del levels[index + 1 :]
                    return
                pos += 1
            elif mode == STR:
                end = _STR_RUN.match(text, pos).end()  # type: ignore[union-attr]
                if end > pos:
                    child = levels[index + 1]
                    if child.mode == UNDECIDED:
                        # Most strings are prose: decided here by their first non-blank
                        # character, without reading them as a level of their own.
                        first = _BLANKS.match(text, pos, end).end()  # type: ignore[union-attr]
                        if first < end and text[first] not in "{[":
                            child.mode = TEXT
                    if child.mode != TEXT:
                        self._feed(index + 1, text[pos:end])
                pos = end
                if pos == n:
                    return
                if text[pos] == '"':
                    level.mode = OUT
                    del levels[index + 1 :]
                else:
                    level.mode = ESC
                pos += 1
            elif mode == ESC:
                char = text[pos]
                pos += 1
                if char == "u":
                    level.mode, level.hex = HEX, ""
                    continue
                level.mode = STR
                decoded = _SIMPLE_ESCAPES.get(char, char)  # an invalid escape: read as the character
                self._to_content(index, decoded)
            else:  # HEX
                char = text[pos]
                if char not in _HEX_DIGITS:
                    level.mode, level.hex = STR, ""  # an invalid escape: ended here
                    continue
                pos += 1
                level.hex += char
                if len(level.hex) == 4:
                    decoded = chr(int(level.hex, 16))
                    level.mode, level.hex = STR, ""
                    self._to_content(index, decoded)

    def _open_string(self, index: int) -> None:
        levels = self._levels
        del levels[index + 1 :]
        # Past MAX_LEVELS a string's content is prose: not read any deeper.
        mode = UNDECIDED if index + 1 < MAX_LEVELS else TEXT
        levels.append(_Level(mode, strict=True))

    def _to_content(self, index: int, decoded: str) -> None:
        levels = self._levels
        if index + 1 < len(levels) and levels[index + 1].mode != TEXT:
            self._feed(index + 1, decoded)
