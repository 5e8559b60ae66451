"""Text folding shared by the subject matchers and the egress check.

`fold` turns text into the form identifiers are compared in: NFKC (full-width digits become
ASCII), zero-width and soft-hyphen characters removed, case-folded, accents stripped. It works one
character at a time and keeps, for every folded character, the index of the original character it
came from, so a match found in folded text maps back to an exact span of the original (redaction
needs that; the egress check only needs the folded text).

Pure ASCII text, by far the common case, takes a fast path: lower-casing is the whole fold and the
offsets are the identity.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from functools import lru_cache

# Invisible characters that split a word without showing: zero-width space/joiners, word joiner,
# invisible operators, BOM, soft hyphen, combining grapheme joiner, Mongolian vowel separator.
INVISIBLE = frozenset(
    "\u200b\u200c\u200d\u200e\u200f\u2060\u2061\u2062\u2063\u2064\ufeff\u00ad\u034f\u180e\u2028\u2029"
)


@lru_cache(maxsize=65536)
def fold_char(char: str) -> str:
    """The folded form of one character: possibly empty (invisible, combining mark), possibly longer."""
    if char in INVISIBLE:
        return ""
    decomposed = unicodedata.normalize("NFKD", char.casefold())
    out = "".join(c for c in decomposed if not unicodedata.combining(c) and c not in INVISIBLE)
    # casefold after decomposition catches what decomposition produced (e.g. a full-width capital).
    return out.casefold()


@dataclass(frozen=True, slots=True)
class Folded:
    """Folded text and, per folded character, the index of its original character (None: identity)."""

    text: str
    origin: list[int] | None

    def span(self, start: int, end: int) -> tuple[int, int]:
        """The original span of folded characters [start, end)."""
        if self.origin is None:
            return start, end
        return self.origin[start], self.origin[end - 1] + 1


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
    return Folded("".join(pieces), origin)
