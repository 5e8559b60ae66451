"""Folding: the canonical view, case-folded, as the declared subjects compare it.

`fold` turns text into the form identifiers are compared in: the canonical view of each character
(ext_proc.detect.canonical: NFKC, look-alikes read as ASCII, invisible characters and combining
marks removed, every decimal digit as ASCII, typographic spaces and dashes as ASCII ones), then
case-folded and decomposed once more (case folding can yield a mark: `ǰ`; Hangul syllables are
compared as their letters, so composed and decomposed Korean read the same). It works one
character at a time and keeps, for every folded character, the index of the original character it
came from, so a match found in folded text maps back to an exact span of the original (redaction
needs that; the egress check only needs the folded text).

Pure ASCII text, by far the common case, takes a fast path: lower-casing is the whole fold and the
offsets are the identity (a tab or a control character reads as a separator either way).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from functools import lru_cache

from ext_proc.detect.canonical import read_char

# Invisible characters that split a word without showing: zero-width space/joiners, word joiner,
# invisible operators, BOM, soft hyphen, combining grapheme joiner, Mongolian vowel separator.
# (Folding removes every default-ignorable character; this short list is for callers that only
# tidy a value: a declared value, a placeholder's original.)
INVISIBLE = frozenset(
    "\u200b\u200c\u200d\u200e\u200f\u2060\u2061\u2062\u2063\u2064\ufeff\u00ad\u034f\u180e\u2028\u2029"
)
_MARKS = frozenset(("Mn", "Me"))


def _case_fold(char: str) -> str:
    decomposed = unicodedata.normalize("NFKD", char.casefold())
    out = "".join(c for c in decomposed if unicodedata.category(c) not in _MARKS)
    # casefold after decomposition catches what decomposition produced (e.g. a full-width capital).
    return out.casefold()


@lru_cache(maxsize=65536)
def fold_char(char: str) -> str:
    """The folded form of one character: possibly empty (invisible, combining mark), possibly longer."""
    return "".join(_case_fold(c) for c in read_char(char))


@dataclass(frozen=True, slots=True)
class Folded:
    """Folded text and, per folded character, the index of its original character (None: identity)."""

    text: str
    origin: list[int] | None
    source: str = ""  # the original text (for the combining marks right after a span)

    def span(self, start: int, end: int) -> tuple[int, int]:
        """The original span of folded characters [start, end), with the combining marks on its
        last letter (redaction never leaves a mark behind on its own)."""
        if self.origin is None:
            return start, end
        stop = self.origin[end - 1] + 1
        source = self.source
        while stop < len(source) and unicodedata.category(source[stop]) in _MARKS:
            stop += 1
        return self.origin[start], stop


def fold(text: str) -> str:
    if text.isascii():
        return text.lower()
    return "".join(map(fold_char, text))


def fold_with_offsets(text: str) -> Folded:
    if text.isascii():
        return Folded(text.lower(), None)
    pieces: list[str] = []
    origin: list[int] = []
    for index, char in enumerate(text):
        folded = fold_char(char)
        if folded:
            pieces.append(folded)
            origin.extend([index] * len(folded))
    return Folded("".join(pieces), origin, text)
