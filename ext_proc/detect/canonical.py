"""The canonical view of a text: one reading of what a person (or a model) sees in it.

Every reader of text starts here: the pattern catalog (ext_proc.detect.catalog.engine) reads the
view itself; the subject matcher, the egress check and the folding of declared values
(ext_proc.detect.normalize, ext_proc.detect.subjects.reading) read it case-folded; the output gate
reads model output through the catalog. Per character, the view:

* applies NFKC (full-width and mathematical letters and digits, ligatures, circled digits);
* removes combining marks (`é` reads `e`, `4̲` reads `4`), default-ignorable, format, control
  and filler code points (zero-width characters, bidi controls, variation selectors, tags, the
  Hangul fillers, the braille blank);
* reads look-alikes as the ASCII letter or digit they imitate (small capitals, modifier letters,
  Cyrillic and Greek homoglyphs, negative circled letters), from a table generated from Unicode's
  confusables data (`data/confusables_ascii.txt`, see its header), regional indicators as their
  letter, and every decimal digit of any script (and circled or dingbat digits) as its ASCII digit;
* removes the modifier letters that imitate no letter (`ˑ`, the Arabic tatweel, `ー`), which are
  put between letters or digits, not read as one;
* reads every Unicode space and tab as a space, every dash, hyphen and minus as `-`, and the
  Unicode line and paragraph separators as a newline; newlines stay newlines;

and then a run of spaces within a line reads as one (indentation stays). Case is kept (some
catalog kinds are case-sensitive).

`canonical(text)` returns a `View`: the text and the map back to the original offsets, so a
finding in the view becomes the exact span of the original that shows it. Pure ASCII text without
a tab, a double space or a control character (most traffic) is its own view, at the cost of one
scan; any other text costs two `str.translate` passes, plus a step per character that does not
read as exactly one character.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import regex

from ext_proc.detect.offsets import Edit, EditMap, Span, apply_edits, chain_span

_DATA = "confusables_ascii.txt"
_TABLE_LIMIT = 1 << 16  # characters remembered per table; any further one is computed each time

# Removed: default-ignorable code points (zero-width characters, bidi controls, variation
# selectors, tags, the Hangul fillers U+115F U+1160 U+3164 U+FFA0, the combining grapheme
# joiner), every other format character, and control characters (tab and line breaks are read
# below, before this applies).
_REMOVED = regex.compile(r"[\p{Default_Ignorable_Code_Point}\p{Cf}\p{Cc}]")
_DASH = regex.compile(r"\p{Dash}")
# Fillers that are not default-ignorable but show as blank: the braille pattern blank.
_FILLERS = frozenset("\u2800")
# Hyphen-like signs outside the Dash property: hyphen bullet, modifier-letter minus, heavy minus.
_HYPHENS = frozenset("\u2043\u02d7\u2796")
_REGIONAL_A, _REGIONAL_Z = "\U0001f1e6", "\U0001f1ff"
_LINE_BREAKS = frozenset("\x85\u2028\u2029")
_ASCII_KEPT_CONTROLS = frozenset("\n\r\x0b\x0c")
_MARKS = frozenset(("Mn", "Me"))


def _load_lookalikes() -> dict[str, str]:
    table: dict[str, str] = {}
    text = resources.files("ext_proc.detect").joinpath("data", _DATA).read_text(encoding="utf-8")
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        code, reading, _source = line.split(";")
        table[chr(int(code, 16))] = reading
    return table


_LOOKALIKES = _load_lookalikes()
# The values a digit-like sign of another kind may stand for.
_SINGLE_DIGITS = frozenset(float(d) for d in range(10))


def _plain(char: str) -> str:
    """NFKC, with combining marks removed (recomposed, so a Hangul syllable stays one)."""
    compatible = unicodedata.normalize("NFKC", char)
    if compatible.isascii():
        return compatible
    decomposed = unicodedata.normalize("NFD", compatible)
    stripped = "".join(c for c in decomposed if unicodedata.category(c) not in _MARKS)
    return unicodedata.normalize("NFC", stripped)


def _read_char(char: str, depth: int = 0) -> str:
    if char.isascii():
        if char == "\t":
            return " "
        if (char < " " and char not in _ASCII_KEPT_CONTROLS) or char == "\x7f":
            return ""
        return char  # ASCII is never remapped
    if char in _LINE_BREAKS:
        return "\n"
    if char in _FILLERS or _REMOVED.match(char) is not None:
        return ""
    if unicodedata.category(char) == "Zs":
        return " "
    if char in _HYPHENS or _DASH.match(char) is not None:
        return "-"
    digit = unicodedata.decimal(char, None)
    if digit is not None:
        return str(digit)
    if unicodedata.category(char) == "No":
        # A digit in a circle or a dingbat (`⓵`, `➊`, `🄋`) that NFKC leaves as it is.
        value = unicodedata.numeric(char, None)
        if value is not None and value in _SINGLE_DIGITS:
            return str(int(value))
    lookalike = _LOOKALIKES.get(char)
    if lookalike is not None:
        return lookalike
    if _REGIONAL_A <= char <= _REGIONAL_Z:
        # A regional indicator (two of them make a flag) shows its letter.
        return chr(ord("A") + ord(char) - ord(_REGIONAL_A))
    plain = _plain(char)
    if unicodedata.category(char) == "Lm":
        # A modifier letter that imitates no Latin letter (`ˑ`, the Arabic tatweel, `ー`) is a
        # mark put between letters or digits, not one of them: it is read as nothing.
        reading = plain if plain == char or depth > 2 else "".join(_read_char(c, depth + 1) for c in plain)
        return reading if reading.isascii() and reading.isalnum() else ""
    if plain == char or depth > 2:
        return plain
    if plain and not plain.strip():
        # A spacing accent (`¨`, `´`, `¸`) is a space and a mark to NFKC, but a visible sign in
        # a text, not a separator: it stays what it is.
        return char
    # NFKC may yield several characters, each read again (`⒜` → `(a)`, `ǆ` → `dž` → `dz`).
    return "".join(_read_char(c, depth + 1) for c in plain)


@lru_cache(maxsize=_TABLE_LIMIT)
def read_char(char: str) -> str:
    """The canonical reading of one character: possibly empty, possibly several characters."""
    return _read_char(char)


class _OneForOne(dict[int, str]):
    """str.translate table: a character → its reading when that is one character, else NUL (a
    character whose reading is not one character; NUL itself reads as nothing, so a NUL in the
    translated text always marks such a character). Filled on first sight."""

    def __missing__(self, code: int) -> str:
        reading = read_char(chr(code))
        value = reading if len(reading) == 1 else "\x00"
        if len(self) < _TABLE_LIMIT:
            self[code] = value
        return value


_ONE = _OneForOne()
# ASCII bytes that are their own view (`bytes.translate` deletes them, leaving any other: a tab, a
# control character).
_ASCII_KEPT = bytes(b for b in range(128) if (b >= 0x20 and b != 0x7F) or chr(b) in _ASCII_KEPT_CONTROLS)
_SPACE_RUN = re.compile(r"  +")
_NUL = re.compile(r"\x00")


@dataclass(frozen=True, slots=True)
class View:
    """A text's canonical view: `text`, and the maps back to the original (empty: identical)."""

    text: str
    maps: tuple[EditMap, ...] = ()

    @property
    def identical(self) -> bool:
        return not self.maps

    def span(self, start: int, end: int) -> Span:
        """The original span that view characters [start, end) were read from."""
        if not self.maps:
            return start, end
        return chain_span(self.maps, start, end)


def _odd_edits(text: str, translated: str) -> list[Edit]:
    """An edit for each character whose reading is not one character (NUL in `translated`). A
    combining mark goes with the character before it, so a span that ends on a letter takes its
    mark along (redaction never leaves a mark behind on its own)."""
    edits: list[Edit] = []
    for m in _NUL.finditer(translated):
        at = m.start()
        char = text[at]
        reading = read_char(char)
        if not reading and at and unicodedata.category(char) in _MARKS:
            if edits and edits[-1][1] == at:
                start, _, before = edits[-1]
                edits[-1] = (start, at + 1, before)
            else:
                edits.append((at - 1, at + 1, translated[at - 1]))
            continue
        if not reading and edits and edits[-1][1] == at and not edits[-1][2]:
            # A run of characters read as nothing is one edit (padding costs one, not one each).
            edits[-1] = (edits[-1][0], at + 1, "")
            continue
        edits.append((at, at + 1, reading))
    return edits


def canonical(text: str) -> View:
    """The canonical view of `text` (see the module docstring)."""
    if text.isascii() and "  " not in text and not text.encode("ascii").translate(None, _ASCII_KEPT):
        return View(text)
    maps: list[EditMap] = []
    translated = text.translate(_ONE)
    if "\x00" in translated:
        translated, mapping = apply_edits(translated, _odd_edits(text, translated))
        if mapping is not None:
            maps.append(mapping)
    if "  " in translated:
        # Indentation (a run at the start of a line) stays: it holds no value, and code is full of it.
        runs: list[Edit] = [
            (m.start(), m.end(), " ")
            for m in _SPACE_RUN.finditer(translated)
            if m.start() and translated[m.start() - 1] != "\n"
        ]
        translated, mapping = apply_edits(translated, runs)
        if mapping is not None:
            maps.append(mapping)
    maps.reverse()  # the last rewrite is undone first
    return View(translated, tuple(maps))


# The blank readings. What the canonical view removes as invisible or filler (not the combining
# marks, nor the modifier letters that imitate none) reads as a space; and, in further readings, so
# do the digits it reads from a compatibility form that is no decimal digit: first superscripts,
# subscripts and fractions, then every such form (circled, parenthesised, dingbat: `\p{No}`). A
# number written in those reads as a number in the canonical view, but beside digits of another
# form a reader sees a mark (`0187¹`, `0187①`: a number and its footnote), while a footnote of the
# very form of the digits before it is one more digit to any reader.
_INVISIBLE = r"\p{Default_Ignorable_Code_Point}\p{Cf}\u2800\x00-\x08\x0e-\x1f\x7f-\x9f"
# The invisible characters that belong inside a word (a soft hyphen, the zero-width joiner and
# non-joiner of Persian and Indic words and emoji, the word joiner, the combining grapheme joiner,
# variation selectors and Mongolian ones) are kept by readers of words: set apart by these,
# ordinary syllables would read as short names. Between two words they glue them, as no separator
# at all does.
_JOINERS = r"\u00ad\u034f\u200c\u200d\u2060\u180b-\u180d\u180f\ufe00-\ufe0f\U000e0100-\U000e01ef"
_INVISIBLES = {
    False: regex.compile(rf"[{_INVISIBLE}]"),
    True: regex.compile(rf"(?V1)[[{_INVISIBLE}]--[{_JOINERS}]]"),  # within words
}
_INVISIBLE_RUN = regex.compile(rf"[{_INVISIBLE}]+")
_FORMS = (r"\p{Decomposition_Type=Super}", r"\p{Decomposition_Type=Sub}", r"\p{Decomposition_Type=Fraction}")
_NUMBER_FORMS = {
    # each form apart, so a value written in one with a mark of another after it reads apart from
    # it; for patterns, superscript letters too (`ª`, `ᵃ` after a card), for words digits only (a
    # word may be written in modifier letters, which are superscript ones)
    False: tuple(regex.compile(form) for form in (*_FORMS, r"\p{No}")),
    True: tuple(regex.compile(rf"(?V1)[{form}&&\p{{N}}]") for form in (*_FORMS, r"\p{No}")),
}
_ANY_NUMBER_FORM = regex.compile(rf"[{''.join(_FORMS)}\p{{No}}]")
# Modifier letters the canonical view reads as nothing (`ː`, `ー`, `ߺ`): they show as a separator.
_MODIFIERS = regex.compile(r"\p{Lm}")
# Letters of other scripts than Latin: a number or a Latin code written against them is apart
# from them to a reader (`312-555-0146です`, `DE89…です`, `карта4111 …`), though the canonical view
# reads the look-alikes among them (Cyrillic `а`, Greek `α`) as Latin letters.
_OTHER_LETTER = r"[\p{L}--[\p{Latin}\p{Common}]]"
_OTHER_SCRIPTS = regex.compile(rf"(?V1){_OTHER_LETTER}")
_AGAINST_OTHER_SCRIPT = regex.compile(rf"(?V1)[0-9A-Za-z]{_OTHER_LETTER}|{_OTHER_LETTER}[0-9A-Za-z+]")
_ASCII_BLANKABLE = re.compile(r"[\x00-\x08\x0e-\x1f\x7f]")


def _edge(run: regex.Match[str]) -> str:
    """A run of invisible characters between a letter and anything but a letter (a digit, a sign)
    as spaces; any other as it is."""
    text, start, end = run.string, run.start(), run.end()
    before = text[start - 1] if start else " "
    after = text[end] if end < len(text) else " "
    return " " * (end - start) if before.isalpha() != after.isalpha() else run.group()


def _removed_modifier(match: regex.Match[str]) -> str:
    return " " if read_char(match.group()) == "" else match.group()


def separates(char: str) -> bool:
    """Whether `char` sets words apart in the blank reading of words (`blankings(within_words=True)`)."""
    return _INVISIBLES[True].match(char) is not None


def blankings(text: str, *, within_words: bool = False) -> list[str]:
    """`text` with blanks, each one for one (so offsets are the text's), or none when it has
    nothing to blank. Invisible and filler characters read as spaces, or (for a value they also pad
    inside, `4` U+2061 `929` …, which spaces would break up) only beside a letter and something
    else (a digit, a sign); superscript, subscript and fraction forms, then every compatibility
    digit, read as spaces, with the invisible characters blanked either way or not at all.
    `within_words`: the characters that belong inside a word are kept, and letters next to digits
    are apart anyway (a reader of words, not of patterns)."""
    if text.isascii():
        if _ASCII_BLANKABLE.search(text) is None:
            return []
        return [_ASCII_BLANKABLE.sub(" ", text)]
    bases = [text]
    invisible = _INVISIBLES[within_words]
    if _MODIFIERS.search(text) is not None:
        text_blank = _MODIFIERS.sub(_removed_modifier, text)
        if text_blank != text:
            bases.append(text_blank)
    if invisible.search(text) is not None:
        bases.append(invisible.sub(" ", bases[-1]))
        if not within_words:
            bases.append(_INVISIBLE_RUN.sub(_edge, text))
    if not within_words and _AGAINST_OTHER_SCRIPT.search(text) is not None:
        bases.append(_OTHER_SCRIPTS.sub(" ", bases[-1]))
    forms = _NUMBER_FORMS[within_words] if _ANY_NUMBER_FORM.search(text) is not None else ()
    out: list[str] = []
    for base in bases:
        for spaced in (base, *(form.sub(" ", base) for form in forms)):
            if spaced != text and spaced not in out:
                out.append(spaced)
    return out


def blank_views(text: str) -> list[View]:
    """The canonical views of `blankings(text)`. The canonical view removes invisible characters,
    which joins what they separate, and reads a superscript as a digit: a name padded inside reads
    whole, but a value they set apart from a word (`card` + U+2800 + a card number, shown as a
    space; a phone and its footnote mark) would read glued to it. Readers that find values read
    these views too; their offsets are the text's."""
    return [canonical(spaced) for spaced in blankings(text)]


def canonical_text(text: str) -> str:
    """The view's text alone (no offsets needed)."""
    return canonical(text).text
