"""Reading text as class segments: the comparable form of a text, with offsets back to it.

Both readers of the compiled subjects (ext_proc.detect.subjects.matcher: redaction's `detect` and
the egress check's `first_survivor`) and the form generators (a declared value is read the same way)
start here. Text is folded (ext_proc.detect.normalize: the canonical view of
ext_proc.detect.canonical, case-folded) and cut into maximal runs of letters and of digits; every
other character is a separator, and a space is inserted where a letter meets a digit.

The cheapest exact route is taken: byte tables for Latin-1 text and for text whose wide characters
each fold to one Latin-1 character; fold tables filled on first sight otherwise; the per-character
offset map of `fold_with_offsets` only when a character folds to more or fewer than one.
"""

from __future__ import annotations

import itertools
import re
import unicodedata
from bisect import bisect_left
from functools import lru_cache
from typing import NamedTuple, TypeVar

from ext_proc.detect.decode import NO_WORD_ESCAPES, word_escapes
from ext_proc.detect.normalize import Folded, fold_char, fold_with_offsets

# The canonical view reads letters with a stroke as their base letter (`ø`, `ł`, `đ`); eth is
# written `d` on a plain keyboard. Modifier-letter apostrophes are letters in Unicode; they
# separate like an apostrophe does. One for one, so offsets are unchanged.
_EXTRA_FOLD = {
    "ð": "d",
    "ʼ": " ",
    "ʻ": " ",
    "ʹ": " ",
    "ʽ": " ",
    "ˈ": " ",
}
_CLASS_CACHE_LIMIT = 1 << 16


@lru_cache(maxsize=_CLASS_CACHE_LIMIT)
def _classify(char: str) -> tuple[str, str]:
    """(the character as matched, its class: 'a' Latin letter, 'k' letter of another script, '0'
    digit, ' ' separator)."""
    mapped = _EXTRA_FOLD.get(char, char)
    if mapped == " ":
        return " ", " "
    category = unicodedata.category(mapped)
    if category[0] == "L":
        return mapped, "a" if _latin(mapped) else "k"
    if category[0] == "N":
        # Other scripts' decimal digits (Arabic-Indic, Devanagari ...) read as ASCII digits.
        value = unicodedata.decimal(mapped, None)
        return (str(value) if value is not None else mapped), "0"
    return " ", " "


def _latin(letter: str) -> bool:
    """Whether a (folded) letter is Latin: look-alikes of other scripts are folded to Latin before,
    so a letter of another script here is one a reader sees as such. Where a Latin word touches a
    word of another script (`Marisolさん`, `番号A1234567`: Japanese, Chinese, Korean and Thai write a
    Latin name or code against their own words), the two are apart."""
    code = ord(letter)
    return code < 0x0370 or 0x1D00 <= code < 0x1F00 or 0x2C60 <= code < 0x2C80 or 0xA720 <= code < 0xA800


def _latin_tables() -> tuple[bytes, bytes, bytes]:
    """Byte tables reading Latin-1 text exactly as fold + _classify would, one byte for one.

    Returns (characters, classes, the bytes whose fold is not one Latin-1 character: soft hyphen,
    ß, ½, µ ...; a text holding one of them takes the general path)."""
    chars = bytearray(256)
    classes = bytearray(256)
    odd = bytearray()
    for code in range(256):
        folded = fold_char(chr(code))
        mapped, kind = _classify(folded) if len(folded) == 1 else (" ", " ")
        if len(folded) != 1 or ord(mapped) > 255:
            odd.append(code)
            mapped, kind = " ", " "
        chars[code] = ord(mapped)
        classes[code] = ord(kind)
    return bytes(chars), bytes(classes), bytes(odd)


_LATIN_CHARS, _LATIN_CLASSES, _LATIN_ODD = _latin_tables()
_LATIN_NOT_ODD = bytes(b for b in range(256) if b not in _LATIN_ODD)
_WIDE_LIMIT = 1 << 14
WIDE_REPLACE_LOOP = 8  # up to this many distinct wide characters: str.replace each (C, fast)
_wide: dict[str, str | None] = {}


def _wide_replacement(char: str) -> str | None:
    """A character beyond Latin-1 as one Latin-1 character that reads the same (a separator, or a
    letter/digit whose fold is one Latin-1 character: ő → o, ’ → space, ４ → 4), or None."""
    known = _wide.get(char, "")
    if known != "":
        return known
    folded = fold_char(char)
    replacement: str | None = None
    if len(folded) == 1:
        mapped, kind = _classify(folded)
        replacement = " " if kind == " " else (mapped if ord(mapped) <= 255 else None)
    if len(_wide) < _WIDE_LIMIT:
        _wide[char] = replacement
    return replacement


_Text = TypeVar("_Text", str, bytes)


def _transitions(classes: str | bytes) -> list[int]:
    """Positions p where a letter meets a digit, or a Latin letter one of another script
    (classes[p-1] and classes[p] differ, neither a space)."""
    if isinstance(classes, str):
        if "k" in classes:
            return _pairs_at(classes, ("a0", "0a", "k0", "0k", "ak", "ka"))
        return _pairs_at(classes, ("a0", "0a"))
    return _pairs_at(classes, (b"a0", b"0a"))


def _pairs_at(classes: _Text, pairs: tuple[_Text, ...]) -> list[int]:
    if all(pair not in classes for pair in pairs):
        return []  # the common case, decided in C
    found: list[int] = []
    for pair in pairs:
        at = classes.find(pair)
        while at != -1:
            found.append(at + 1)
            at = classes.find(pair, at + 1)
    found.sort()
    return found


def _cut(spaced: str, cuts: list[int]) -> tuple[str, list[int]]:
    if not cuts:
        return spaced, []
    pieces: list[str] = []
    inserted: list[int] = []
    last = 0
    for offset, cut in enumerate(cuts):
        pieces.append(spaced[last:cut])
        inserted.append(cut + offset)
        last = cut
    pieces.append(spaced[last:])
    return " ".join(pieces), inserted


def _disguised(original: str, kind: str) -> str:
    """The class of a folded letter, 'c' where it was read from a look-alike of another script:
    Latin inside a Latin word (`Mаrisol`, Cyrillic `а`), of its own script inside a word of it
    (the `о` of `спасибо`), which `_resolved` decides by the run it is in."""
    if kind == "a" and unicodedata.category(original)[0] == "L" and not _latin(original):
        return "c"
    return kind


_LOOKALIKE_RUN = re.compile(r"[ck]*c[ck]*")


def _resolved(classes: str) -> str:
    """Each run of letters of other scripts and their look-alikes: of another script ('k') if any
    letter in it is one that imitates no Latin letter, else Latin ('a', a disguised Latin word)."""
    if "c" not in classes:
        return classes
    return _LOOKALIKE_RUN.sub(lambda m: ("k" if "k" in m.group() else "a") * len(m.group()), classes)


def _segmented(folded: str, source: Folded | None = None) -> tuple[str, list[int]]:
    """`folded` with every separator as a space and a space inserted where a letter meets a digit.

    Returns the new text and the positions (in it) of the inserted spaces, so that a position p in
    the new text is `p - bisect_left(inserted, p)` in `folded`. Splitting the new text on spaces
    gives the class segments in order.
    """
    if folded.isascii():
        raw = folded.encode("ascii")
        return _cut(
            raw.translate(_LATIN_CHARS).decode("latin-1"), _transitions(raw.translate(_LATIN_CLASSES))
        )
    pairs = [_classify(c) for c in folded]  # one character each: positions are kept
    kinds = [p[1] for p in pairs]
    if source is not None:
        origin = source.origin
        kinds = [
            _disguised(source.source[origin[i] if origin is not None else i], kind)
            for i, kind in enumerate(kinds)
        ]
    return _cut("".join(p[0] for p in pairs), _transitions(_resolved("".join(kinds))))


class Reading(NamedTuple):
    """A text read for matching: `spaced` (see _segmented), and how to map its positions back.
    (A NamedTuple: built for every string the egress check reads, so it must be cheap.)"""

    spaced: str
    inserted: list[int]
    folded: Folded | None  # None: positions (less the inserted spaces) are the original text's


def _read_fast(text: str) -> Reading | None:
    """The one-for-one reading of raw text when every character folds to exactly one character
    that fits a byte table (ASCII, Latin-1, and the wide separators and letters _wide_replacement
    maps): C-speed and with the original offsets. None when the text needs the general path."""
    if text.isascii():
        raw = text.encode("ascii")
    else:
        try:
            raw = text.encode("latin-1")
        except UnicodeEncodeError:
            wide = [c for c in set(text) if c > "\xff"]
            replacements = {}
            for char in wide:
                replacement = _wide_replacement(char)
                if replacement is None:
                    return None
                replacements[ord(char)] = replacement
            if len(wide) <= WIDE_REPLACE_LOOP:
                for char in wide:
                    text = text.replace(char, replacements[ord(char)])
            else:  # many distinct characters: one pass, not one per character
                text = text.translate(replacements)
            raw = text.encode("latin-1")
        if raw.translate(None, _LATIN_NOT_ODD):
            return None
    spaced, inserted = _cut(
        raw.translate(_LATIN_CHARS).decode("latin-1"), _transitions(raw.translate(_LATIN_CLASSES))
    )
    return Reading(spaced, inserted, None)


class _FoldTable(dict[int, str]):
    """str.translate table: a character → its fold read as spaced text (`part` 0) or as classes
    (`part` 1). Filled on first sight of each character, up to _CLASS_CACHE_LIMIT entries."""

    def __init__(self, part: int) -> None:
        super().__init__()
        self.part = part

    def __missing__(self, code: int) -> str:
        char = chr(code)
        folded = fold_char(char)
        if len(folded) != 1:
            _ODD_CHARS.add(char)  # always recorded: read's one-for-one test depends on it
        value = "".join(_classify(c)[self.part] for c in folded)
        if self.part:
            value = "".join(_disguised(char, kind) for kind in value)
        if len(self) < _CLASS_CACHE_LIMIT:
            self[code] = value
        return value


_ODD_CHARS: set[str] = set()  # characters whose fold is not one character (marks, ß, ligatures …)
_FOLD_SPACED = _FoldTable(0)
_FOLD_CLASSES = _FoldTable(1)


def read(text: str, offsets: bool) -> Reading:
    """`text` (raw, unfolded) read as class segments; `offsets=False` when no position is needed
    (the egress check), which spares the offset map of a text whose fold changes its length."""
    fast = _read_fast(text)
    if fast is not None:
        return fast
    # Any script: two C-level passes over the text with the fold tables. The offsets are the
    # original ones when every character folded to exactly one; otherwise (a combining mark, an
    # invisible character, ß …) detect needs the per-character map of fold_with_offsets.
    spaced = text.translate(_FOLD_SPACED)
    classes = text.translate(_FOLD_CLASSES)
    if not offsets or _ODD_CHARS.isdisjoint(text):
        cut, inserted = _cut(spaced, _transitions(_resolved(classes)))
        return Reading(cut, inserted, None)
    folded = fold_with_offsets(text)
    cut, inserted = _segmented(folded.text, folded)
    return Reading(cut, inserted, folded)


class Located:
    """A reading's class segments, and where each run of them is in the original text."""

    __slots__ = ("_folded", "_inserted", "_piece_of", "_pieces", "_starts", "segments")

    def __init__(self, reading: Reading, pieces: list[str] | None = None) -> None:
        pieces = reading.spaced.split(" ") if pieces is None else pieces
        self.segments = list(filter(None, pieces))
        self._pieces = pieces
        self._piece_of = list(itertools.compress(itertools.count(), pieces))
        self._starts = list(itertools.accumulate(map(len, pieces), initial=0))
        self._inserted = reading.inserted
        self._folded = reading.folded

    def original(self, segment: int, end: bool) -> int:
        """Where segment `segment` starts (or ends) in the folded text."""
        piece = self._piece_of[segment]
        at = self._starts[piece] + piece + (len(self._pieces[piece]) if end else 0)
        return at - bisect_left(self._inserted, at) if self._inserted else at

    def span(self, first: int, last: int) -> tuple[int, int]:
        """Segments first..last as a span of the original text."""
        start, end = self.original(first, False), self.original(last, True)
        return self._folded.span(start, end) if self._folded is not None else (start, end)


class EscapedWords:
    """Whether segments of an egress reading are cut out of a word by an escaped letter
    (ext_proc.detect.decode.WordEscapes). Positions are read only for a text that holds one."""

    __slots__ = ("_escapes", "_located")

    def __init__(self, text: str, segments: list[str]) -> None:
        self._escapes = word_escapes(text)
        located = None
        if self._escapes is not NO_WORD_ESCAPES:
            located = Located(read(text, offsets=True))
            # Both readings cut the same segments; were they ever to differ, every hit stands.
            located = located if located.segments == segments else None
        self._located = located

    def cut(self, first: int, last: int) -> bool:
        """Whether segments first..last begin right after such an escape or end right before one."""
        located = self._located
        return located is not None and self._escapes.cut(*located.span(first, last))


def segments_of(folded: str) -> list[str]:
    """A folded value's class segments, in order."""
    return _segmented(folded)[0].split()


def key_of(folded: str) -> str:
    """A folded value's letters and digits, in order: what a form is made of."""
    return "".join(segments_of(folded))
