"""A disguise generator for the property tests, and an oracle that sees through it on its own.

`disguise` composes transformations a reader (a person, or a model) still reads through over a
value: fillers and other invisible code points, look-alike letters (Cyrillic, Greek and Armenian
homoglyphs, small capitals, modifier letters, mathematical and enclosed alphanumerics, full-width
forms, accents), digits of other scripts, typographic separators, added spacing, escapes (once or
twice encoded), `(at)`/`[dot]` words, and case. `reveal` undoes exactly those transformations with
this module's own tables and decoders (never the product's canonical view or decoded views), and
`squash` keeps a text's ASCII letters and digits, case-folded, so a value is found by a plain
substring search. `tests/property/test_disguises.py` and `tests/e2e/test_disguises_property.py`
use both.
"""

from __future__ import annotations

import html
import html.entities
import random
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

ASCII_LOWER = "abcdefghijklmnopqrstuvwxyz"
ASCII_DIGITS = "0123456789"
DIGIT_NAMES = ("ZERO", "ONE", "TWO", "THREE", "FOUR", "FIVE", "SIX", "SEVEN", "EIGHT", "NINE")


def _named(pattern: str, keys: Iterable[str]) -> dict[str, str]:
    """{key: the character named `pattern` with the key}, for the names that exist."""
    table: dict[str, str] = {}
    for key in keys:
        try:
            table[key] = unicodedata.lookup(pattern.format(key.upper()))
        except KeyError:
            continue
    return table


def _letters(pattern_small: str | None, pattern_capital: str | None) -> dict[str, str]:
    """Letters keyed by the ASCII letter they imitate (lower case key: small, upper: capital)."""
    table: dict[str, str] = {}
    if pattern_small is not None:
        table.update(_named(pattern_small, ASCII_LOWER))
    if pattern_capital is not None:
        table.update({k.upper(): v for k, v in _named(pattern_capital, ASCII_LOWER).items()})
    return table


def _digits(pattern: str) -> dict[str, str]:
    table: dict[str, str] = {}
    for digit, name in zip(ASCII_DIGITS, DIGIT_NAMES, strict=True):
        try:
            table[digit] = unicodedata.lookup(pattern.format(name))
        except KeyError:
            continue
    return table


# --- look-alike letters (each table: ASCII character → its look-alike) ----------------------------

# Small capitals read as the letter whatever its case (there is no small capital X).
SMALL_CAPITALS = _named("LATIN LETTER SMALL CAPITAL {}", ASCII_LOWER)
MODIFIER_LETTERS: dict[str, str] = {
    **_letters("MODIFIER LETTER SMALL {}", "MODIFIER LETTER CAPITAL {}"),
    "i": "\u2071",  # SUPERSCRIPT LATIN SMALL LETTER I
    "n": "\u207f",  # SUPERSCRIPT LATIN SMALL LETTER N
}
_MATH_STYLES = (
    "BOLD",
    "ITALIC",
    "BOLD ITALIC",
    "SCRIPT",
    "BOLD SCRIPT",
    "FRAKTUR",
    "DOUBLE-STRUCK",
    "BOLD FRAKTUR",
    "SANS-SERIF",
    "SANS-SERIF BOLD",
    "SANS-SERIF ITALIC",
    "SANS-SERIF BOLD ITALIC",
    "MONOSPACE",
)
MATH_LETTERS = [
    _letters(f"MATHEMATICAL {style} SMALL {{}}", f"MATHEMATICAL {style} CAPITAL {{}}")
    for style in _MATH_STYLES
]
MATH_DIGITS = [
    _digits(f"MATHEMATICAL {style} DIGIT {{}}")
    for style in ("BOLD", "DOUBLE-STRUCK", "SANS-SERIF", "SANS-SERIF BOLD", "MONOSPACE")
]
ENCLOSED_LETTERS = [
    _letters("CIRCLED LATIN SMALL LETTER {}", "CIRCLED LATIN CAPITAL LETTER {}"),
    _letters(None, "NEGATIVE CIRCLED LATIN CAPITAL LETTER {}"),
    _letters(None, "SQUARED LATIN CAPITAL LETTER {}"),
    _letters(None, "NEGATIVE SQUARED LATIN CAPITAL LETTER {}"),
]
ENCLOSED_DIGITS = [
    {**_digits("CIRCLED DIGIT {}"), "0": "\u24ea"},
    {**_digits("NEGATIVE CIRCLED DIGIT {}"), "0": "\u24ff"},
    _digits("DINGBAT CIRCLED SANS-SERIF DIGIT {}"),
    _digits("DINGBAT NEGATIVE CIRCLED SANS-SERIF DIGIT {}"),
    _digits("DOUBLE CIRCLED DIGIT {}"),
]
# Enclosures that show punctuation around the character (`⒜`, `⑷`, `⒋`): a separator next to it.
PUNCTUATED = [
    _letters("PARENTHESIZED LATIN SMALL LETTER {}", None),
    _digits("PARENTHESIZED DIGIT {}"),
    _digits("DIGIT {} FULL STOP"),
]
FULLWIDTH = {chr(c): chr(c + 0xFEE0) for c in range(0x21, 0x7F) if chr(c).isalnum() or chr(c) in "@.-_+"}
# Homoglyphs of other scripts that Unicode's confusables data lists for a Latin letter.
HOMOGLYPHS: dict[str, str] = {
    # Cyrillic
    "a": "\u0430", "c": "\u0441", "e": "\u0435", "o": "\u043e", "p": "\u0440", "x": "\u0445",
    "y": "\u0443", "i": "\u0456", "j": "\u0458", "s": "\u0455", "d": "\u0501", "q": "\u051b",
    "w": "\u051d", "h": "\u04bb", "A": "\u0410", "B": "\u0412", "C": "\u0421", "E": "\u0415",
    "H": "\u041d", "I": "\u0406", "J": "\u0408", "K": "\u041a", "M": "\u041c", "O": "\u041e",
    "P": "\u0420", "S": "\u0405", "T": "\u0422", "X": "\u0425", "Y": "\u04ae",
}  # fmt: skip
GREEK: dict[str, str] = {
    "o": "\u03bf", "v": "\u03bd", "i": "\u03b9", "a": "\u03b1", "p": "\u03c1", "A": "\u0391",
    "B": "\u0392", "E": "\u0395", "Z": "\u0396", "H": "\u0397", "I": "\u0399", "K": "\u039a",
    "M": "\u039c", "N": "\u039d", "O": "\u039f", "P": "\u03a1", "T": "\u03a4", "Y": "\u03a5",
    "X": "\u03a7",
}  # fmt: skip
ARMENIAN: dict[str, str] = {"o": "\u0585", "u": "\u057d", "h": "\u0570", "n": "\u0578", "g": "\u0581"}
HOMOGLYPH_TABLES = [HOMOGLYPHS, GREEK, ARMENIAN]

# Decimal digits of other scripts (each table: the script's ten digits).
_ZEROS = (
    0x0660, 0x06F0, 0x07C0, 0x0966, 0x09E6, 0x0A66, 0x0AE6, 0x0B66, 0x0BE6, 0x0C66, 0x0CE6, 0x0D66,
    0x0DE6, 0x0E50, 0x0ED0, 0x0F20, 0x1040, 0x1090, 0x17E0, 0x1810, 0x1946, 0x19D0, 0x1A80, 0x1B50,
    0x1BB0, 0x1C40, 0x1C50, 0xA620, 0xA8D0, 0xA900, 0xA9D0, 0xAA50, 0xABF0, 0xFF10, 0x104A0,
    0x11066, 0x11136, 0x111D0, 0x116C0, 0x1E950,
)  # fmt: skip
SCRIPT_DIGITS = [{str(n): chr(zero + n) for n in range(10)} for zero in _ZEROS]

# Combining marks a reader looks through (accents, a macron, a ring, an underline).
MARKS = ("\u0301", "\u0300", "\u0302", "\u0308", "\u0303", "\u030a", "\u0304", "\u0327", "\u0332", "\u0323")
ACCENTED: dict[str, str] = {}
for _base in ASCII_LOWER + ASCII_LOWER.upper():
    for _mark in MARKS:
        _composed = unicodedata.normalize("NFC", _base + _mark)
        if len(_composed) == 1:
            ACCENTED[_composed] = _base

# --- invisible code points, separators ------------------------------------------------------------

FILLERS = (
    "\u115f", "\u1160", "\u3164", "\uffa0",  # Hangul fillers
    "\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u00ad", "\u034f", "\u180e", "\u061c",
    "\u200e", "\u200f", "\u202a", "\u202c", "\u202d", "\u2066", "\u2067", "\u2069", "\u2061",
    "\u2062", "\u2063", "\u2064", "\ufe00", "\ufe0f", "\U000e0100", "\U000e0001", "\U000e007f",
    "\U000e0041", "\u17b4", "\u17b5", "\U0001d173", "\u2800",
)  # fmt: skip
# The invisible characters that belong inside a word (a soft hyphen, the zero-width joiner and
# non-joiner, the word joiner, the combining grapheme joiner, variation selectors). The others
# (a zero-width space, the Hangul fillers, the braille blank, bidi controls, invisible operators,
# tags) set words apart: inside an ordinary word they make two words, which is not ordinary text.
JOINERS = ("\u200c", "\u200d", "\u2060", "\u00ad", "\u034f", "\ufe00", "\ufe0f", "\U000e0100")
# What sets a value apart from a word beside it (a zero-width space, a filler, a bidi control) or a
# number (a footnote mark: superscript, subscript, fraction; circled ones only after digits of
# another form, else one more digit). Not `x` as a word: before digits it marks a phone extension.
SEPARATING = tuple(f for f in FILLERS if f not in JOINERS)
FOOTNOTES = ("\u00b9", "\u00b2", "\u00b3", "\u2074", "\u2081", "\u00bd", "\u2153")
ENCLOSED_FOOTNOTES = ("\u2460", "\u2474", "\u2488")
NEIGHBOURS = ("see", "Dear", "ref", "id", "call", "re", "note")
SPACES = (
    " ", "\u00a0", "\u202f", "\u2009", "\u2007", "\u2008", "\u200a", "\u2002", "\u2003", "\u2004",
    "\u2005", "\u2006", "\u205f", "\u3000", "\u1680", "\t", "  ", " \u00a0", "\u2009\u2009", "\t ",
)  # fmt: skip
DASHES = (
    "-", "\u2010", "\u2011", "\u2012", "\u2013", "\u2014", "\u2212", "\ufe63", "\uff0d", "\u2043",
    "\u02d7", " - ", " \u2013 ",
)  # fmt: skip
OTHER_SEPARATORS = (".", "_", "/", "\u00b7", "\u2024", "\uff0e", ",", " | ", "***", ":", "\n")
AT_SIGNS = ("(at)", "[at]", " (at) ", " [at] ", "{at}", "<at>", "\ufe6b", "\uff20")
DOT_SIGNS = ("(dot)", "[dot]", " (dot) ", " [dot] ")

# --- escapes ---------------------------------------------------------------------------------------

_HTML5_NAMES: dict[str, str] = {}
for _name, _chars in html.entities.html5.items():
    if _name.endswith(";") and len(_chars) == 1:
        _HTML5_NAMES.setdefault(_chars, "&" + _name)


def _utf8(char: str) -> bytes:
    return char.encode("utf-8")


def escape(char: str, form: str) -> str | None:
    """`char` written as an escape of `form` (None: the form cannot write it)."""
    code = ord(char)
    if form == "percent":
        return "".join(f"%{b:02X}" for b in _utf8(char))
    if form == "entity_decimal":
        return f"&#{code};"
    if form == "entity_hex":
        return f"&#x{code:x};"
    if form == "entity_named":
        return _HTML5_NAMES.get(char)
    if form == "u4":  # a surrogate pair beyond the BMP, as JSON and JavaScript write it
        units = char.encode("utf-16-be")
        return "".join(f"\\u{int.from_bytes(units[i : i + 2], 'big'):04x}" for i in range(0, len(units), 2))
    if form == "u_braced":
        return f"\\u{{{code:x}}}"
    if form == "u8":
        return f"\\U{code:08X}"
    if form == "hex_bytes":
        return "".join(f"\\x{b:02x}" for b in _utf8(char))
    if form == "octal":
        return f"\\{code:03o}" if code < 0x80 else None
    if form == "named":
        name = unicodedata.name(char, "")
        return f"\\N{{{name}}}" if name else None
    if form == "css":
        return f"\\{code:x} "
    if form == "css_padded":
        return f"\\{code:06x} "
    if form == "quoted_printable":
        return "".join(f"={b:02X}" for b in _utf8(char))
    raise ValueError(form)


ESCAPE_FORMS = (
    "percent", "entity_decimal", "entity_hex", "entity_named", "u4", "u_braced", "u8", "hex_bytes",
    "octal", "named", "css", "css_padded", "quoted_printable",
)  # fmt: skip
# Encoding the escape's first character once more (`%2540`, `&amp;#64;`, `%5Cu0040`, `&#92;x40`).
WRAPPERS = ("percent", "entity_decimal", "entity_named")


def wrap(escaped: str, wrapper: str) -> str:
    sigil = escape(escaped[0], wrapper)
    return (sigil or escape(escaped[0], "entity_decimal") or "") + escaped[1:]


# Enclosed digits without a compatibility decomposition (NFKC leaves them as they are): ⓿, the
# double circled ⓵…⓽, the dingbat circled sans-serif ➀…➈ and 🄋, the dingbat negative circled
# sans-serif ➊…➒ and 🄌. Read as digits; drawn like the others, and tested one by one too.
NO_DECOMPOSITION_DIGITS = frozenset(
    "\u24ff"
    + "".join(chr(c) for c in range(0x24F5, 0x24FE))
    + "".join(chr(c) for c in (*range(0x2780, 0x2789), *range(0x278A, 0x2793)))
    + "\U0001f10b\U0001f10c"
)


# --- reported gaps -----------------------------------------------------------------------------

# Disguises the product does not see through yet (reported; each is kept in a strict xfail test of
# tests/property/test_disguises.py, which fails the day it is fixed: then drop it here). The
# generator leaves them out so that the properties test everything else.
# - a CSS escape whose terminating space is followed by a separator space (`4\38  7731` for
#   `48 7731`; also with an invisible character between the two, or the space of the text after
#   the value): the catalog reads one space, the escape's.
CSS_BEFORE_SPACE = False
# - a CSS escape whose first hex digits also read as an octal escape of a character (`\011066 `
#   for U+11066, a Brahmi digit, reads as `\011`, a tab, and `066`; `\1040 `, a Myanmar digit,
#   as `\104`, a `D`): only the octal reading is taken.
CSS_AS_OCTAL = False


def _reads_as_octal(escaped: str) -> bool:
    """Whether `escaped` (a CSS escape) starts with an octal escape `\\NNN` of a character that is
    no control character other than a tab or a line break."""
    octal = re.match(r"\\([0-3][0-7]{2})", escaped)
    if octal is None:
        return False
    char = chr(int(octal.group(1), 8))
    return unicodedata.category(char) != "Cc" or char in "\t\n\r"


# --- the generator --------------------------------------------------------------------------------

GLYPH_FAMILIES = ("homoglyphs", "small_capitals", "modifier_letters", "math", "enclosed", "fullwidth")
LETTER_FAMILIES = ("case", "accents", *GLYPH_FAMILIES)
DIGIT_FAMILIES = ("script_digits", "math", "enclosed", "fullwidth")
FAMILIES = (
    *LETTER_FAMILIES,
    "script_digits",
    "separators",
    "spacing",
    "fillers",
    "escapes",
    "double_escapes",
    "at_words",
    "boundary",
)
SPACING = (" ", "-", ".", "_", "  ", "\u00a0", "\u2009", "\u2013", "\u202f", " - ")


@dataclass(frozen=True, slots=True)
class Shape:
    """What may change in a value without it ceasing to be one.

    `letters`: its letters may change glyph and case (False where the kind depends on case).
    `separators`: "free" (any separator anywhere: a declared identifier), "class" (typographic
    spaces or dashes, one class for the whole value: a card, an SSN, a phone), "spaces" (typographic
    spaces only: an IBAN) or "keep". `spacing`: separators may be added between two letters or
    digits. `email`: its `@` and the dots after it may be written as words (`(at)`, `[dot]`, and
    with free separators `at`, `dot`).
    """

    letters: bool = True
    separators: str = "free"
    spacing: bool = True
    email: bool = False


@dataclass(frozen=True, slots=True)
class Disguised:
    text: str
    families: tuple[str, ...]
    escapes: tuple[str, ...] = ()  # the escape forms written (decoded by `reveal`)
    at_words: bool = False  # `(at)`, `[dot]` … in brackets
    spelled_at: bool = False  # `at`, `dot` as words


def applicable(shape: Shape) -> tuple[str, ...]:
    """The families that may be applied to a value of `shape`."""
    out = [f for f in LETTER_FAMILIES if shape.letters or f in DIGIT_FAMILIES]
    out += ["script_digits", "fillers", "escapes", "double_escapes"]
    if shape.separators != "keep":
        out.append("separators")
    if shape.spacing:
        out.append("spacing")
    if shape.email:
        out.append("at_words")
    out.append("boundary")
    return tuple(dict.fromkeys(out))


def _glyph(char: str, families: Sequence[str], rng: random.Random, punctuated: bool) -> str:
    """`char` as the look-alike of one of `families` that has one (or as it is)."""
    options: list[str] = []
    lower = char.lower()
    for family in families:
        if family == "homoglyphs":
            options += [t[char] for t in HOMOGLYPH_TABLES if char in t]
        elif family == "small_capitals" and lower in SMALL_CAPITALS:
            options.append(SMALL_CAPITALS[lower])
        elif family == "modifier_letters" and char in MODIFIER_LETTERS:
            options.append(MODIFIER_LETTERS[char])
        elif family == "math":
            options += [t[char] for t in (*MATH_LETTERS, *MATH_DIGITS) if char in t]
        elif family == "enclosed":
            tables = [*ENCLOSED_LETTERS, *ENCLOSED_DIGITS, *(PUNCTUATED if punctuated else ())]
            options += [t[char] for t in tables if char in t]
            options += [t[char.upper()] for t in ENCLOSED_LETTERS if char.islower() and char.upper() in t]
        elif family == "fullwidth" and char in FULLWIDTH:
            options.append(FULLWIDTH[char])
        elif family == "script_digits" and char.isdigit():
            options += [t[char] for t in SCRIPT_DIGITS]
    return rng.choice(options) if options else char


def _separator(shape: Shape, rng: random.Random, class_: str) -> str:
    if shape.separators == "spaces" or (shape.separators == "class" and class_ == "space"):
        return rng.choice(SPACES)
    if shape.separators == "class":
        return rng.choice(DASHES[:10])
    return rng.choice((*SPACES, *DASHES, *OTHER_SEPARATORS))


def _letter(cell: str, chosen: Sequence[str], rng: random.Random, punctuated: bool) -> str:
    if "case" in chosen and rng.random() < 0.4:
        cell = cell.swapcase()
    glyphs = [f for f in chosen if f in GLYPH_FAMILIES]
    if glyphs and rng.random() < 0.6:
        cell = _glyph(cell, glyphs, rng, punctuated)
    if "accents" in chosen and cell.isascii() and rng.random() < 0.35:
        mark = rng.choice(MARKS)
        composed = unicodedata.normalize("NFC", cell + mark)
        cell = composed if len(composed) == 1 and rng.random() < 0.5 else cell + mark
    return cell


def disguise(text: str, families: Sequence[str], rng: random.Random, shape: Shape) -> Disguised:
    """`text` with `families` (those `applicable` to its shape) applied at random places."""
    chosen = [f for f in families if f in applicable(shape)]
    free = shape.separators == "free"
    digit_glyphs = [f for f in chosen if f in DIGIT_FAMILIES]
    class_ = rng.choice(("space", "dash"))
    cells: list[str] = []
    at_words = spelled = seen_at = False
    for index, char in enumerate(text):
        cell = char
        if char.isascii() and char.isalpha() and shape.letters:
            cell = _letter(char, chosen, rng, free)
        elif char.isascii() and char.isdigit():
            if digit_glyphs and rng.random() < 0.6:
                cell = _glyph(char, digit_glyphs, rng, free)
        elif shape.email and char == "@":
            seen_at = True
            if "at_words" in chosen:
                if free and rng.random() < 0.3:
                    cell, spelled = rng.choice((" at ", "  at ", " AT ")), True
                else:
                    cell, at_words = rng.choice(AT_SIGNS), True
        elif shape.email and char == "." and seen_at and "at_words" in chosen and rng.random() < 0.5:
            if spelled:
                cell = " dot "
            else:
                cell, at_words = rng.choice(DOT_SIGNS), True
        elif char in " -./" and "separators" in chosen and not (shape.email and not free):
            cell = _separator(shape, rng, class_)
        cells.append(cell)
        if index + 1 < len(text):
            after = text[index + 1]
            if "spacing" in chosen and char.isalnum() and after.isalnum() and rng.random() < 0.25:
                cells.append(rng.choice(SPACING))
            if "fillers" in chosen and rng.random() < 0.3:
                cells.append(rng.choice(FILLERS))
    forms: list[str] = []
    if "escapes" in chosen or "double_escapes" in chosen:
        forms = _escape_cells(cells, rng, double="double_escapes" in chosen)
    if "boundary" in chosen:
        cells = _bounded(cells, rng, enclosed="enclosed" in chosen)
    return Disguised("".join(cells), tuple(chosen), tuple(forms), at_words, spelled)


def _bounded(cells: list[str], rng: random.Random, *, enclosed: bool) -> list[str]:
    """The value glued to a word before or after it by a character that sets words apart, and/or
    followed by a footnote mark."""
    where = rng.choice(("before", "after", "footnote", "before footnote", "before after"))
    before = [rng.choice(NEIGHBOURS), rng.choice(SEPARATING)] if "before" in where else []
    after = [rng.choice(SEPARATING), rng.choice(NEIGHBOURS)] if "after" in where else []
    marks = FOOTNOTES if enclosed else (*FOOTNOTES, *ENCLOSED_FOOTNOTES)
    return [*before, *cells, *after, *([rng.choice(marks)] if "footnote" in where else [])]


def _space_after(cells: Sequence[str], index: int) -> bool:
    """Whether a space may follow cell `index` (fillers read as nothing; after the value's last
    cell comes the text around it)."""
    for cell in cells[index + 1 :]:
        if cell not in FILLERS:
            return cell[:1].isspace()
    return True


def _escape_cells(cells: list[str], rng: random.Random, *, double: bool) -> list[str]:
    """Escape the first character of 1 to 3 cells that show a letter, a digit, `@` or `.`; the
    forms used. CSS and octal are never mixed in one value: `\\061` would read as either."""
    candidates = [i for i, cell in enumerate(cells) if cell and (cell[0].isalnum() or cell[0] in "@.")]
    if not candidates:
        return []
    picks = rng.sample(candidates, min(len(candidates), rng.randint(1, 3)))
    forms = rng.sample(ESCAPE_FORMS, 2)
    if "octal" in forms and {"css", "css_padded"} & set(forms):
        forms.remove("octal")
    used: list[str] = []
    for i in picks:
        for form in rng.sample(forms, len(forms)):
            spaced = _space_after(cells, i)
            if form.startswith("css") and spaced and not CSS_BEFORE_SPACE:
                continue
            escaped = escape(cells[i][0], form)
            if escaped is None or (form.startswith("css") and not CSS_AS_OCTAL and _reads_as_octal(escaped)):
                continue
            if double:
                wrapper = rng.choice(WRAPPERS)
                escaped = wrap(escaped, wrapper)
                used.append(wrapper)
            cells[i] = escaped + cells[i][1:]
            used.append(form)
            break
    return list(dict.fromkeys(used))


# --- ordinary text -------------------------------------------------------------------------------

_WORDS = re.compile(r"[^\W\d_]+|\d+| |-|[^\w \-]+|_")
# Latin letters for the look-alikes of other scripts (a Cyrillic or Greek word with one Latin `o`).
_LATIN_FOR = {lookalike: latin for table in HOMOGLYPH_TABLES for latin, lookalike in table.items()}
ORDINARY_FAMILIES = (*LETTER_FAMILIES, "script_digits", "separators", "fillers", "escapes", "double_escapes")


def disguise_words(
    text: str, families: Sequence[str], rng: random.Random, *, unescaped: Sequence[str] = ()
) -> str:
    """Ordinary `text` with `families` applied inside its words (letters, digits, fillers,
    escapes) and to the separators between them (spaces and hyphens), never splitting a word.
    Words holding one of `unescaped` get no escapes."""
    out: list[str] = []
    for token in _WORDS.findall(text):
        if token == " " and "separators" in families:
            out.append(rng.choice(SPACES))
        elif token == "-" and "separators" in families:
            out.append(rng.choice(DASHES[:10]))
        elif token.isalpha() and rng.random() < 0.5:
            kept = any(part in token.lower() for part in unescaped)
            out.append(_word(token, [f for f in families if not kept or "escapes" not in f], rng))
        elif token.isdigit() and rng.random() < 0.5:
            glyphs = [f for f in families if f in DIGIT_FAMILIES]
            out.append("".join(_glyph(c, glyphs, rng, False) if glyphs else c for c in token))
        else:
            out.append(token)
    return "".join(out)


def _word(word: str, families: Sequence[str], rng: random.Random) -> str:
    cells: list[str] = []
    for char in word:
        if char.isascii():
            cell = _letter(char, families, rng, False)
        else:
            cell = char.swapcase() if "case" in families and rng.random() < 0.3 else char
            if "homoglyphs" in families and char in _LATIN_FOR and rng.random() < 0.5:
                cell = _LATIN_FOR[char]
            if "accents" in families and rng.random() < 0.2:
                cell += rng.choice(MARKS)
        cells.append(cell)
        if "fillers" in families and rng.random() < 0.2:
            cells.append(rng.choice(JOINERS))
    if "escapes" in families or "double_escapes" in families:
        _escape_cells(cells, rng, double="double_escapes" in families)
    return "".join(cells)


# --- the oracle -----------------------------------------------------------------------------------

_DECODERS: dict[str, tuple[re.Pattern[str], str]] = {
    "percent": (re.compile(r"(?:%[0-9A-Fa-f]{2})+"), "bytes"),
    "quoted_printable": (re.compile(r"(?:=[0-9A-Fa-f]{2})+"), "bytes"),
    "hex_bytes": (re.compile(r"(?:\\x[0-9A-Fa-f]{2})+"), "bytes"),
    "entity_decimal": (re.compile(r"&#([0-9]{1,7});"), "int10"),
    "entity_hex": (re.compile(r"&#[xX]([0-9A-Fa-f]{1,6});"), "int16"),
    "entity_named": (re.compile(r"&[A-Za-z][A-Za-z0-9]*;"), "html"),
    "u4": (re.compile(r"(?:\\u[0-9A-Fa-f]{4})+"), "utf16"),
    "u_braced": (re.compile(r"\\u\{([0-9A-Fa-f]{1,6})\}"), "int16"),
    "u8": (re.compile(r"\\U([0-9A-Fa-f]{8})"), "int16"),
    "octal": (re.compile(r"\\([0-7]{3})"), "int8"),
    "named": (re.compile(r"\\N\{([A-Z0-9 \-]+)\}"), "name"),
    "css": (re.compile(r"\\([0-9A-Fa-f]{1,6})[ \t\n]?"), "int16"),
    "css_padded": (re.compile(r"\\([0-9A-Fa-f]{1,6})[ \t\n]?"), "int16"),
}
_AT_WORDS = re.compile(r" ?[\(\[\{<](at|dot)[\)\]\}>] ?", re.IGNORECASE)
_SPELLED = re.compile(r"\s+(at|dot)\s+", re.IGNORECASE)
INVERSE: dict[str, str] = {}
for _table in (
    SMALL_CAPITALS,
    MODIFIER_LETTERS,
    *MATH_LETTERS,
    *MATH_DIGITS,
    *ENCLOSED_LETTERS,
    *ENCLOSED_DIGITS,
    *PUNCTUATED,
    FULLWIDTH,
    *HOMOGLYPH_TABLES,
    *SCRIPT_DIGITS,
):
    for _ascii, _lookalike in _table.items():
        INVERSE.setdefault(_lookalike, _ascii)
INVERSE.update(ACCENTED)
_DROPPED = frozenset((*FILLERS, *MARKS))


def _decode_one(match: re.Match[str], how: str) -> str:
    text = match.group(0)
    try:
        if how == "bytes":
            raw = bytes(int(h, 16) for h in re.findall(r"[0-9A-Fa-f]{2}", text))
            return raw.decode("utf-8")
        if how == "utf16":
            units = b"".join(int(h, 16).to_bytes(2, "big") for h in re.findall(r"[0-9A-Fa-f]{4}", text))
            return units.decode("utf-16-be")
        if how == "html":
            return html.unescape(text)
        if how == "name":
            return unicodedata.lookup(match.group(1))
        base = {"int10": 10, "int16": 16, "int8": 8}[how]
        return chr(int(match.group(1), base))
    except (ValueError, KeyError):
        return text


def reveal(text: str, disguised: Disguised | None = None, *, forms: Iterable[str] = ()) -> str:
    """`text` with the escapes of `forms` (and the disguise's) decoded, `(at)` words read, and
    every look-alike, filler and mark of this module's tables read as the ASCII it stands for."""
    used = list(dict.fromkeys([*(disguised.escapes if disguised else ()), *forms]))
    for _ in range(4):
        before = text
        for form in used:
            pattern, how = _DECODERS[form]
            text = pattern.sub(lambda m, how=how: _decode_one(m, how), text)  # type: ignore[misc]
        if text == before:
            break
    if disguised is not None and disguised.at_words:
        text = _AT_WORDS.sub(lambda m: "@" if m.group(1).lower() == "at" else ".", text)
    if disguised is not None and disguised.spelled_at:
        text = _SPELLED.sub(lambda m: "@" if m.group(1).lower() == "at" else ".", text)
    return "".join(INVERSE.get(c, "" if c in _DROPPED else c) for c in text)


def squash(text: str) -> str:
    """`text`'s ASCII letters and digits, case-folded (everything else dropped)."""
    return "".join(c for c in text.lower() if c.isascii() and c.isalnum())
