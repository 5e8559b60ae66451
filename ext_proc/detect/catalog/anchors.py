"""Anchors: the few windows of a long text where a detector's pattern can match at all.

The regex module spends about 100 ns on every position where a pattern's first character class
matches; for patterns that start with a letter class that is every word of a text. An anchor
finds the windows worth scanning with C-speed `bytes` operations instead, on the views of the
text that `Scratch` computes once per `Catalog.detect` call. Each anchor is a necessary
condition of a match: skipping the rest of the text never loses a finding.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import regex

from ext_proc.detect.catalog.entropy import HIGH_ENTROPY_MIN_LENGTH
from ext_proc.detect.catalog.regexes import Span

_TOKEN_CHARS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/_-="
_IDENT_CHARS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-"


def _class_table(chars: bytes) -> bytes:
    table = bytearray(b" " * 256)
    for ch in chars:
        table[ch] = ord("a")
    return bytes(table)


_TOKEN_TABLE = _class_table(_TOKEN_CHARS)
_IDENT_TABLE = _class_table(_IDENT_CHARS)
# Every secret key contains one of these (lower-cased): the words the assignment anchors look for.
SECRET_KEYWORDS = (b"pass", b"pwd", b"secret", b"token", b"key", b"auth", b"credential", b"contrase")
# The longest assignment: key and index (84), quotes and spaces around the operator (134), a
# scheme (20) and an escaped quoted value (2 + 2 x 1024 + 2).
KEY_WINDOW = 2400


@dataclass(slots=True)
class Scratch:
    """Per-call views of one text, computed on first use."""

    text: str
    _ascii: bytes | None = None
    _lower: bytes | None = None
    _ident: bytes | None = None
    _tokens: bytes | None = None
    cache: dict[str, list[Span]] = field(default_factory=dict)
    _counts: dict[str, int] = field(default_factory=dict)

    def count(self, chars: str) -> int:
        """How many characters of the text are in `chars` (ASCII)."""
        if chars not in self._counts:
            ascii_ = self.ascii
            self._counts[chars] = len(ascii_) - len(ascii_.translate(None, chars.encode()))
        return self._counts[chars]

    def present(self, literals: Iterable[tuple[str, bytes]]) -> set[str]:
        """Which ASCII literals occur in the text."""
        text = self.text
        if len(text) <= 4096 or text.isascii():
            return {literal for literal, _ in literals if literal in text}
        # A long text with wide characters: searching its one-byte view is several times faster.
        ascii_ = self.ascii
        return {literal for literal, encoded in literals if encoded in ascii_}

    @property
    def ascii(self) -> bytes:
        # One byte per character: offsets in the bytes are offsets in the text.
        if self._ascii is None:
            self._ascii = self.text.encode("ascii", "replace")
        return self._ascii

    @property
    def lower(self) -> bytes:
        if self._lower is None:
            self._lower = self.ascii.lower()
        return self._lower

    @property
    def ident(self) -> bytes:
        if self._ident is None:
            self._ident = self.ascii.translate(_IDENT_TABLE)
        return self._ident

    @property
    def tokens(self) -> bytes:
        if self._tokens is None:
            self._tokens = self.ascii.translate(_TOKEN_TABLE)
        return self._tokens


def _runs(mapped: bytes, min_length: int) -> list[Span]:
    """Maximal runs of b"a" at least `min_length` long, widened by one byte on each side."""
    out: list[Span] = []
    needle = b"a" * min_length
    n = len(mapped)
    pos = mapped.find(needle)
    while pos >= 0:
        start = mapped.rfind(b" ", 0, pos) + 1
        end = mapped.find(b" ", pos)
        if end < 0:
            end = n
        out.append((max(0, start - 1), min(n, end + 1)))
        pos = mapped.find(needle, end)
    return out


def _token_runs_20(scratch: Scratch) -> list[Span]:
    if "runs20" not in scratch.cache:
        scratch.cache["runs20"] = _runs(scratch.tokens, HIGH_ENTROPY_MIN_LENGTH)
    return scratch.cache["runs20"]


# What can follow an `@` in an address the EMAIL pattern accepts (labels, dots, "[dot]" forms),
# and what a local part is made of.
_DOMAIN_RUN = regex.compile(rb"[A-Za-z0-9.\-\[\](){} ]*")
_LOCAL_TABLE = _class_table(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._%+-")
EMAIL_LOCAL_MAX = 64


def _at_starts(scratch: Scratch) -> list[Span]:
    """Where an EMAIL match can start, one window per `@`: at the first character of the run of
    local-part characters that ends at the `@` (the pattern's look-behind allows no other start),
    up to the end of the domain characters after it plus the look-ahead character. A run longer
    than the longest local part cannot match (a later start fails the look-behind): no window."""
    if "at" not in scratch.cache:
        ascii_ = scratch.ascii
        local = ascii_.translate(_LOCAL_TABLE)
        n = len(ascii_)
        out: list[Span] = []
        pos = ascii_.find(b"@")
        while pos >= 0:
            low = max(0, pos - EMAIL_LOCAL_MAX - 1)
            start = local.rfind(b" ", low, pos) + 1
            if start == 0 and low > 0:
                start = -1  # no boundary within reach: the run is too long to be a local part
            if 0 <= start < pos:
                run = _DOMAIN_RUN.match(ascii_, pos + 1)
                end = run.end() if run is not None else pos + 1
                out.append((start, min(n, end + 1)))
            pos = ascii_.find(b"@", pos + 1)
        scratch.cache["at"] = out
    return scratch.cache["at"]


def _token_runs_40(scratch: Scratch) -> list[Span]:
    return [(s, e) for s, e in _token_runs_20(scratch) if e - s >= 40]


_AFTER_KEY = frozenset(b"\"'`\\] \t[")
_OPERATOR_START = frozenset(b":=(,!i\"'`@")


def _operator_follows(lower: bytes, end: int) -> bool:
    """Whether an assignment operator (or a quoted value) can follow an identifier ending at
    `end`: the pattern's own grammar, read cheaply, so most keyword hits in prose cost nothing."""
    # Only whitespace, quotes and one short index can stand between a key and its operator, so
    # this walk stays inside the gap after one identifier: linear over all identifiers.
    limit = len(lower)
    i = end
    while i < limit and lower[i] in _AFTER_KEY:
        if lower[i] in b"\"'`" and i > end and lower[i - 1] in b" \t":
            return True  # `password "value"`
        if lower[i] == 0x5B:  # `secret[25] = …`: skip the index (at most 16 characters)
            close = lower.find(b"]", i, i + 18)
            if close < 0:
                return False
            i = close
        i += 1
    return i < limit and lower[i] in _OPERATOR_START


def _all_keyword_identifiers(scratch: Scratch) -> list[Span]:
    """Every identifier with a secret keyword, whatever follows (`"value" == password)`)."""
    return _keyword_identifiers(scratch, any_follower=True)


def _keyword_identifiers(scratch: Scratch, *, any_follower: bool = False) -> list[Span]:
    """Start of every identifier that contains a secret keyword and that an operator follows;
    windows for an anchored match."""
    cache_key = "identifiers" if any_follower else "keywords"
    if cache_key in scratch.cache:
        return scratch.cache[cache_key]
    lower, ident = scratch.lower, scratch.ident
    n = len(lower)
    starts: set[int] = set()
    for word in SECRET_KEYWORDS:
        pos = lower.find(word)
        while pos >= 0:
            start = ident.rfind(b" ", max(0, pos - 64), pos) + 1
            if start == 0 and pos > 64:
                start = pos  # an identifier longer than any key: not a key
            end = ident.find(b" ", pos)
            if end < 0:
                end = n
            if start not in starts and (any_follower or _operator_follows(lower, end)):
                starts.add(start)
            if end >= n:
                break  # this identifier runs to the end of the text
            pos = lower.find(word, max(pos + 1, end))
    out = [(s, min(n, s + KEY_WINDOW)) for s in sorted(starts)]
    scratch.cache[cache_key] = out
    return out


Anchor = Callable[[Scratch], list[Span]]
ANCHORS: dict[str, Anchor] = {
    "token_runs_20": _token_runs_20,
    "at_starts": _at_starts,
    "token_runs_40": _token_runs_40,
    "keyword_identifiers": _keyword_identifiers,
    "all_keyword_identifiers": _all_keyword_identifiers,
}


def merge_windows(windows: list[Span]) -> list[Span]:
    """Sorted union of windows that overlap or touch, so no text is scanned twice."""
    merged: list[Span] = []
    for start, end in sorted(windows):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged
