"""Declared subjects (SPEC §5, §6): a parsed `X-Cordon-Subject` header → matchers for every rendering.

Where it sits: `exchange` parses the header (ext_proc.detect.subjects.header) and calls `compile_subjects`
once per distinct header (an LRU keyed by `SubjectHeader.digest`). The compiled object then serves
two readers of the same renderings:

* `detect(text)` for redaction: every occurrence as a `Finding` over the caller's original
  offsets, labelled `SUBJECT{n}_{KIND}`, priority below 10 so it wins over the catalog;
* `first_survivor(text)` for the egress check (ext_proc.transform.egress): the label of the first declared
  identifier still readable in a string of the final body, or None.

How matching works
------------------
Text is folded (ext_proc.detect.normalize: NFKC, invisible characters removed, case-folded, accents
stripped) and then read as *class segments*: maximal runs of letters (`\\p{L}`) and maximal runs of
digits (`\\p{N}`); everything else is a separator. Each declared value is compiled into *forms*:
strings of letters and digits (its renderings with the separators taken out). A form matches where
the concatenation of consecutive segments of the text equals it. That single rule is the whole
"separator-blind with word/number boundaries" contract of SPEC §6:

* any run of separators, of any length, may sit between any two characters of an identifier
  ("4 0 4 - 5 5 5 . 0 1 8 7", "M a r i s o l", "A-123 45 67"), and none need to ("mqvance77");
* a match starts where a segment starts and ends where one ends, so a match starting with a digit is
  never preceded directly by a digit, one starting with a letter never by a letter, and the same at
  the end: "2140455501870" is not 404-555-0187, "wlis" is not "W Li", "willing" is not "Will",
  while "tel4045550187" and "mqvance77" are read (a letter next to a digit is a boundary).

A few forms also require a separator at given positions (a date written `7/14/1986` must not be
read from `7141986`); they carry the offsets, and a match must have a segment boundary there.

Reading a text costs C-level passes, by the cheapest exact route:
* ASCII, Latin-1, and text whose other characters each fold to one Latin-1 character or to a
  separator (curly quotes, dashes, emoji, full-width forms, ő, ł …): `bytes.translate` with two
  256-entry tables (characters and classes), offsets unchanged;
* any other text: `str.translate` with fold tables filled on first sight of each character;
  offsets unchanged when every character folds to exactly one, else (a combining mark, an
  invisible character, ß, a ligature) `detect` maps them back with `fold_with_offsets`.
Then `split`, a set test (can any segment start a form?) and a short Python loop over the few
segments that can.

Why not one big regex: a trie-shaped `regex` alternation over 1,352 forms took 515 ms to compile
and 72 ms to scan 8 KB on the reference machine (the engine tries branches one after another; a
`timeout=` argument alone makes `regex` scans ~4× slower). Sets of forms and of their prefixes
compile in a few milliseconds. The scan has no regex in it; its work is bounded
(`STEPS_PER_SEGMENT`) and a text that exceeds the bound raises `DetectionError`, as a regex
timeout would. The regexes used while compiling a header (tokenising declared values) and for the
egress decodings carry a timeout. A header at the 16 KB limit compiles in at most ~60 ms (47 names
of 60 tokens each); compiled headers are cached by digest and compiled values across headers.

Renderings per kind (the README lists the same)
-----------------------------------------------
* NAME: tokens are split on spaces, hyphens, periods and commas; apostrophes join ("O'Neil" is one
  token `oneil`, matched as "O'Neil", "ONeil", "O Neil"). Honorifics and generational suffixes
  (Dr, Mr, Jr, III ...) are dropped from the tokens. A declaration with a comma is read
  surname-first ("Quintero-Vance, Marisol"); otherwise the last word is the surname.
  - the full name in every token order, and every ordered selection of two or more tokens that
    holds at least one *significant* token (≥ 3 letters, not a particle, not a common word), for
    names of up to 4 tokens (longer names: the significant tokens, up to 4, the same way, plus the
    declared order, the reversed order and surname-first);
  - given initials + surname and surname + given initials, with the first given initial or all of
    them, the surname whole or (hyphenated) each part ("M. Quintero-Vance", "Quintero-Vance M",
    "M Vance", "M.Q. Vance" / `mqvance`);
  - all initials when there are at least three ("M.Q.V.", "MQV");
  - a significant given name + the surname initials ("Marisol Q.V.", `marisolqv`, "Marisol Q");
  - handles are the same forms written without separators (`marisol.quinterovance`,
    `mquinterovance`, `quinterovance_m`);
  - a single significant token alone. `detect` takes it only where the original text has a capital
    letter in it ("Vance said", "VANCE"); `first_survivor` reads case-folded text and takes it in
    any case (it is not a common word, so "vance" alone is still the person).
  - a name of one token that is a common word or shorter than 3 letters ("Will", "Li"): `detect`
    takes it only where it has a capital letter ("Will said"); `first_survivor` never reports it
    ("we will help" must pass).
  A multi-token form whose letters spell a common word without separators ("Will Ow" → `willow`)
  matches only with a separator between its tokens.
* EMAIL: the address with any separators (`mq @ example . com`, `mqexamplecom`), also with `at` /
  `dot` spelled out (`mq at example dot com`), with and without a `+tag`; the local part alone when
  it has at least 4 letters or digits and is neither a common word nor a role (info, support ...).
* PHONE: phonenumbers parses the declaration (default region `DEFAULT_REGION` = US when it has no
  `+`). Forms: the national significant number, the national format (with its trunk prefix), the
  country code + number, `00`/`011` + country code + number, country code + national format
  ("+44 (0)20 ..."), and the declared digits as written. "(404) 555 0187", "404.555.0187",
  "14045550187", "+1-404-555-0187" and "0014045550187" all match "+1 404-555-0187"; a longer digit
  run that merely contains the number does not.
* ADDRESS: the street line: house number, street name, suffix and directions, each suffix /
  direction / ordinal / Saint-Mount-Fort prefix in its long and abbreviated spelling ("Street"/
  "St", "North"/"N", "5th"/"Fifth", "...strasse"/"...str"); the street line without its suffix
  when it has a house number and a street name that is not a common word ("1428 Quintana" for
  "1428 Quintana Ave"); the whole declaration as written. A unit is split off the declaration with
  or without a comma before it ("Apt 4", "Apartment 4", "Unit 4", "#4", "No 4", "Suite"/"Ste",
  "Fl"/"Floor", "Rm", "Bldg", "Lot", "Dept"), so the street line alone is the identifier for both
  readers; `detect` extends an address match over a unit written right after it (any designator
  or a number sign, separator-blind, then digit runs and single letters up to 8 characters, or
  one or two letters: "Apt 4", "#4b", "Suite 2 0 0", "Apt B"). The city, or any other trailing
  part, alone is never a form.
* DOB: python-dateutil reads the declaration (ISO dates are year-month-day; an all-numeric
  declaration whose first two numbers could both be a month, such as `07/08/1986`, is protected
  under both readings). Forms: numeric Y-M-D, D-M-Y and M-D-Y, month and day padded or not, 4- or
  2-digit year, with any separators (one is required next to an unpadded number); spelled out with
  the full or 3-letter month name (and "Sept"), day with or without its ordinal suffix: "July 14,
  1986", "14 July 1986", "14th of July 1986", "Jul 14 '86", "1986 July 14".
* ID, HANDLE, OTHER: the value's letters and digits in order (Unicode letters kept: "É1234" is
  `e1234`, never `1234`), any separators, any case.

Where forms of several labels match at one place, `detect` reports the union of all matches
labelled by the longest, and `first_survivor` the longest form at the first place a form starts.

Residuals (what this does not catch)
------------------------------------
* homoglyphs across scripts (Cyrillic "а" for Latin "a"), leetspeak ("m4ris0l"), spelled-out
  digits ("four oh four"), transliterations (Мариса / Marisa), reversed or encoded text (base64,
  rot13); ligature letters only one way (a declared "Æsa" matches "Aesa", a declared "Aesa" does not
  match "Æsa");
* renderings that insert letters or digits: `detect` does not decode percent-encoding, HTML
  entities or `\\u` escapes; `first_survivor` also reads a percent-decoded, an HTML-unescaped and a
  `\\u`/`\\x`-unescaped copy of a string, so such a text is refused at egress rather than passed;
* nicknames and diminutives (Bill for William), a given name or surname alone when it is a common
  word (only its combinations with the other tokens are read), a one-token name shorter than 3
  letters or common at egress, partial dates (a birthday without its year), other address
  spellings (a different house-number format, a city-only mention);
* scripts whose words are not made of `\\p{L}`/`\\p{N}` runs (spacing combining marks split a word
  into segments, so word boundaries there are weaker);
* one-token names and single tokens lower-cased in the text are left to the egress check, which
  refuses them (fail closed), rather than redacted;
* a letter touching a digit is a boundary (SPEC §6 bounds letters by letters and digits by
  digits): "mqvance77x" holds the handle and "Vance2024" the name token; a unit written before
  its street line ("Apt 4, 1428 Elm St") is not taken with it; the egress decodings are one level
  deep (a percent-encoded HTML entity is not read);
* internationalised email domains are compared as written after folding (an `xn--` punycode form
  of a declared Unicode domain is not matched).
"""

from __future__ import annotations

import html
import itertools
import threading
import unicodedata
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import date, datetime
from enum import IntEnum
from functools import cache, lru_cache
from importlib import resources
from typing import NamedTuple
from urllib.parse import unquote

import phonenumbers
import regex
from dateutil import parser as date_parser

from ext_proc.detect.findings import Finding
from ext_proc.detect.memo import MEMO
from ext_proc.detect.normalize import Folded, fold, fold_char, fold_with_offsets
from ext_proc.detect.subjects.header import FIELDS, SubjectHeader, SubjectHeaderError
from ext_proc.errors import DetectionError
from ext_proc.media.parts import MEDIA_MIN_LENGTH, is_media_payload

CACHE_SIZE = 256  # compiled headers kept (an agent session reuses one header many times)
FORM_CACHE_SIZE = 4096  # compiled values kept across headers (a header that changes one value)
DEFAULT_REGION = "US"  # phonenumbers' region for a declared phone without a `+` country code
REGEX_TIMEOUT = 0.25  # seconds per regex call, per TIMEOUT_CHARS characters read
TIMEOUT_CHARS = 250_000
# The scan extends a candidate segment by segment while the concatenation is a prefix of a form;
# ordinary text stops after a step or two. A text needing more than this many steps per segment
# on average is pathological (thousands of spaced-out single letters that all prefix forms), and
# is refused like a regex timeout rather than read slowly.
STEPS_PER_SEGMENT = 64
STEPS_FLOOR = 100_000

# Tie-break between overlapping findings of equal length (lower wins; all < 10 so that subjects
# win over the catalog, ext_proc.transform.redact.SUBJECT_PRIORITY_LIMIT). The more specific kinds first.
KIND_PRIORITY: dict[str, int] = {
    "EMAIL": 0,
    "PHONE": 1,
    "ID": 2,
    "DOB": 3,
    "ADDRESS": 4,
    "HANDLE": 5,
    "NAME": 6,
    "OTHER": 7,
}
FIELD_OF_KIND: dict[str, str] = {kind: field for field, kind in FIELDS.items()}

MARK = "\x00"  # in a form string: a separator is required here


class Case(IntEnum):
    """When a form counts, by the case of the original text (detect) and at egress."""

    ANY = 0  # any case, both readers
    CAPITALISED = 1  # detect: only with a capital letter in the match; egress: any case
    CAPITALISED_ONLY = 2  # detect: only with a capital letter; egress: never (a common word)


class _Unreadable(ValueError):
    """A declared value this module cannot understand; the message names the problem, not the value."""


# ---------------------------------------------------------------------------------------------
# Reading text as class segments


# Letters that are not accented forms of a base letter (so folding keeps them) but are written
# without their stroke on a plain keyboard; one for one, so offsets are unchanged. Modifier-letter
# apostrophes are letters in Unicode; they separate like an apostrophe does.
_EXTRA_FOLD = {
    "ø": "o",
    "ł": "l",
    "đ": "d",
    "ð": "d",
    "ħ": "h",
    "ı": "i",
    "ŧ": "t",
    "ƚ": "l",
    "ʼ": " ",
    "ʻ": " ",
    "ʹ": " ",
    "ʽ": " ",
    "ˈ": " ",
}
_CLASS_CACHE_LIMIT = 1 << 16


@lru_cache(maxsize=_CLASS_CACHE_LIMIT)
def _classify(char: str) -> tuple[str, str]:
    """(the character as matched, its class: 'a' letter, '0' digit, ' ' separator)."""
    mapped = _EXTRA_FOLD.get(char, char)
    if mapped == " ":
        return " ", " "
    category = unicodedata.category(mapped)
    if category[0] == "L":
        return mapped, "a"
    if category[0] == "N":
        # Other scripts' decimal digits (Arabic-Indic, Devanagari ...) read as ASCII digits.
        value = unicodedata.decimal(mapped, None)
        return (str(value) if value is not None else mapped), "0"
    return " ", " "


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


def _transitions(classes: str | bytes) -> list[int]:
    """Positions p where a letter meets a digit (classes[p-1] and classes[p] differ, neither a space)."""
    pairs = ("a0", "0a") if isinstance(classes, str) else (b"a0", b"0a")
    if pairs[0] not in classes and pairs[1] not in classes:  # type: ignore[operator]
        return []  # the common case, decided in C
    found: list[int] = []
    for pair in ("a0", "0a") if isinstance(classes, str) else (b"a0", b"0a"):
        at = classes.find(pair)  # type: ignore[arg-type]
        while at != -1:
            found.append(at + 1)
            at = classes.find(pair, at + 1)  # type: ignore[arg-type]
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


def _segmented(folded: str) -> tuple[str, list[int]]:
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
    return _cut("".join(p[0] for p in pairs), _transitions("".join(p[1] for p in pairs)))


class _Reading(NamedTuple):
    """A text read for matching: `spaced` (see _segmented), and how to map its positions back.
    (A NamedTuple: built for every string the egress check reads, so it must be cheap.)"""

    spaced: str
    inserted: list[int]
    folded: Folded | None  # None: positions (less the inserted spaces) are the original text's


def _read_fast(text: str) -> _Reading | None:
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
    return _Reading(spaced, inserted, None)


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
            _ODD_CHARS.add(char)  # always recorded: _read's one-for-one test depends on it
        value = "".join(_classify(c)[self.part] for c in folded)
        if len(self) < _CLASS_CACHE_LIMIT:
            self[code] = value
        return value


_ODD_CHARS: set[str] = set()  # characters whose fold is not one character (marks, ß, ligatures …)
_FOLD_SPACED = _FoldTable(0)
_FOLD_CLASSES = _FoldTable(1)


def _read(text: str, offsets: bool) -> _Reading:
    fast = _read_fast(text)
    if fast is not None:
        return fast
    # Any script: two C-level passes over the text with the fold tables. The offsets are the
    # original ones when every character folded to exactly one; otherwise (a combining mark, an
    # invisible character, ß …) detect needs the per-character map of fold_with_offsets.
    spaced = text.translate(_FOLD_SPACED)
    classes = text.translate(_FOLD_CLASSES)
    if not offsets or _ODD_CHARS.isdisjoint(text):
        cut, inserted = _cut(spaced, _transitions(classes))
        return _Reading(cut, inserted, None)
    folded = fold_with_offsets(text)
    cut, inserted = _segmented(folded.text)
    return _Reading(cut, inserted, folded)


def _segments(folded: str) -> list[str]:
    return _segmented(folded)[0].split()


def _key(folded: str) -> str:
    """A folded value's letters and digits, in order: what a form is made of."""
    return "".join(_segments(folded))


# ---------------------------------------------------------------------------------------------
# Common words


@cache
def common_words() -> frozenset[str]:
    """The shipped list of common English words (ext_proc/data/common_words.txt)."""
    text = (
        resources.files("ext_proc.detect.subjects")
        .joinpath("data/common_words.txt")
        .read_text(encoding="utf-8")
    )
    return frozenset(line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#"))


_PLURAL_ES = ("s", "x", "z", "ch", "sh")


def _words(text: str) -> tuple[str, ...]:
    """A word list written as one string (easier to read and edit than a list literal)."""
    return tuple(text.split())


def is_common_word(token: str) -> bool:
    """A common word, or a regular plural of one ("wells", "banks", "boxes", "daisies")."""
    words = common_words()
    if token in words:
        return True
    if token.endswith("ies") and token[:-3] + "y" in words:
        return True
    if token.endswith("es") and token[:-2].endswith(_PLURAL_ES) and token[:-2] in words:
        return True
    return token.endswith("s") and token[:-1] in words


# ---------------------------------------------------------------------------------------------
# Forms per kind. Each generator takes one normalised declared value and returns
# (form, Case, weak) triples; a form is a string of letters and digits, with MARK where a
# separator is required. A weak form is a partial rendering (an email's local part alone): where
# its key is also a full form of another label, the other label names the match.

FormList = tuple[tuple[str, Case, bool], ...]


class _Forms:
    """An ordered set of forms; a form added twice keeps its most permissive Case."""

    def __init__(self) -> None:
        self.items: dict[str, tuple[Case, bool]] = {}

    def add(self, form: str, case: Case = Case.ANY, weak: bool = False) -> None:
        if not form.replace(MARK, ""):
            return
        known = self.items.get(form)
        if known is None:
            self.items[form] = (case, weak)
        else:
            self.items[form] = (min(case, known[0]), weak and known[1])

    def result(self) -> FormList:
        return tuple((form, case, weak) for form, (case, weak) in self.items.items())


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(i for i in items if i))


# --- names

HONORIFICS = frozenset(
    _words("mr mrs ms mx miss mister dr prof sir dame madam madame rev fr sr jr ii iii iv esq phd md")
)
PARTICLES = frozenset(
    _words(
        "de da das dos do del della dello di du la le les van von der den ter ten bin binti ibn bint al el "
        "y e st mac"
    )
)
_APOSTROPHES = regex.compile(r"['’‘`´ʼʻʹ]")
_NAME_WORDS = regex.compile(r"[\s.,;/]+")
MAX_ARRANGED_TOKENS = 4


def _significant(token: str) -> bool:
    return len(token) >= 3 and not token.isdigit() and token not in PARTICLES and not is_common_word(token)


def _name_words(text: str) -> list[list[str]]:
    words = []
    for word in _NAME_WORDS.split(text, timeout=REGEX_TIMEOUT):
        parts = _segments(word)
        if parts and "".join(parts) not in HONORIFICS:
            words.append(parts)
    return words


def _name_forms(value: str) -> FormList:
    folded = _APOSTROPHES.sub("", fold(value), timeout=REGEX_TIMEOUT)
    forms = _Forms()
    everything = _key(folded)
    head, comma, tail = folded.partition(",")
    if comma and _name_words(head) and _name_words(tail):
        surname_words, given_words = _name_words(head), _name_words(tail)
    else:
        words = _name_words(folded)
        surname_words, given_words = words[-1:], words[:-1]
    given = [p for w in given_words for p in w]
    surname = [p for w in surname_words for p in w]
    # Particles just before the surname belong to it ("Ludwig van Beethoven").
    while given and given[-1] in PARTICLES:
        surname.insert(0, given.pop())
    tokens = given + surname
    if len(tokens) <= 1:
        token = tokens[0] if tokens else everything
        forms.add(token, Case.CAPITALISED if _significant(token) else Case.CAPITALISED_ONLY)
        if everything != token:
            forms.add(everything, Case.ANY if len(everything) >= 3 else Case.CAPITALISED_ONLY)
        return forms.result()

    def add(parts: list[str], case: Case = Case.ANY) -> None:
        parts = [p for p in parts if p]
        key = "".join(parts)
        if len(key) < 3:
            return
        # Tokens that spell a common word when joined ("will" + "ow") keep their separator.
        form = MARK.join(parts) if len(parts) > 1 and is_common_word(key) else key
        forms.add(form, case)

    add(_segments(folded))  # as declared, honorifics included
    add(tokens)
    significant = [t for t in _unique(tokens) if _significant(t)]
    pool = tokens if len(tokens) <= MAX_ARRANGED_TOKENS else significant[:MAX_ARRANGED_TOKENS]
    if len(tokens) > MAX_ARRANGED_TOKENS:
        add(list(reversed(tokens)))
        add(surname + given)
    for size in range(2, len(pool) + 1):
        for arrangement in itertools.permutations(pool, size):
            if size == len(pool) or any(_significant(t) for t in arrangement):
                add(list(arrangement))

    core_given = [t for t in given if t not in PARTICLES]
    core_surname = [t for t in surname if t not in PARTICLES] or surname
    if core_given and surname:
        initials = "".join(t[0] for t in core_given)
        for surname_parts in _unique_lists([surname, core_surname]):
            for initial in _unique([initials, core_given[0][0]]):
                add([initial, *surname_parts])
                add([*surname_parts, initial])
                if len(surname_parts) > 1:
                    add([initial, *(p[0] for p in surname_parts[:-1]), surname_parts[-1]])
        if len(core_surname) > 1:
            for part in core_surname:
                for initial in _unique([initials, core_given[0][0]]):
                    add([initial, part])
                    add([part, initial])
        surname_initials = "".join(t[0] for t in core_surname)
        if len(initials) + len(surname_initials) >= 3:
            add(list(initials + surname_initials))  # one part per letter: "and" needs "A.N.D."
        for name in core_given:
            if _significant(name):
                add([name, surname_initials])
                add([name, core_surname[0][0]])
    for token in tokens:
        if _significant(token):
            forms.add(token, Case.CAPITALISED)
    return forms.result()


def _unique_lists(lists: list[list[str]]) -> list[list[str]]:
    seen: dict[tuple[str, ...], list[str]] = {}
    for item in lists:
        if item:
            seen.setdefault(tuple(item), item)
    return list(seen.values())


# --- emails

ROLE_LOCAL_PARTS = frozenset(
    _words(
        "info admin administrator support contact sales hello help office mail email team noreply "
        "donotreply postmaster webmaster hostmaster billing abuse security privacy hr jobs careers press "
        "media marketing service enquiries inquiries feedback accounts orders legal news newsletter "
        "root test user"
    )
)


def _email_forms(value: str) -> FormList:
    folded = fold(value)
    local, at, domain = folded.rpartition("@")
    if not at or not _key(local) or not _key(domain):
        raise _Unreadable("is not an email address (local part, @, domain)")
    forms = _Forms()
    domain_key = _key(domain)
    domain_dots = _key(domain.replace(".", " dot "))
    locals_ = _unique([_key(local), _key(local.split("+", 1)[0])])
    for local_key in locals_:
        for middle in ("", "at"):
            forms.add(local_key + middle + domain_key)
            forms.add(local_key + middle + domain_dots)
        if len(local_key) >= 4 and not is_common_word(local_key) and local_key not in ROLE_LOCAL_PARTS:
            forms.add(local_key, weak=True)
    return forms.result()


# --- phones


def _digits(text: str) -> str:
    return "".join(s for s in _segments(text) if s[0].isdigit())


def _phone_forms(value: str) -> FormList:
    try:
        number = phonenumbers.parse(value, DEFAULT_REGION)
        significant = phonenumbers.national_significant_number(number)
        national = _digits(phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.NATIONAL))
    except Exception:  # phonenumbers raises NumberParseException and, on odd input, others
        raise _Unreadable("is not a phone number phonenumbers can read") from None
    if not significant or not number.country_code:
        raise _Unreadable("is not a phone number phonenumbers can read")
    code = str(number.country_code)
    forms = _Forms()
    for form in (
        significant,
        national,
        _digits(fold(value)),
        code + significant,
        "00" + code + significant,
        "011" + code + significant,
        code + national,
    ):
        if form:
            forms.add(form)
    return forms.result()


# --- dates

MONTHS = _words("january february march april may june july august september october november december")
_ISO_DATE = regex.compile(r"[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}")
_YEAR_FIRST = regex.compile(r"\s*\d{4}\D")
_ALL_NUMERIC = regex.compile(r"[\d\s./\-]+")
_DEFAULTS = (datetime(2000, 1, 1), datetime(2001, 2, 2))


def _parse_dates(value: str) -> list[date]:
    """The date(s) a declaration names: one, or two for an ambiguous numeric day/month order."""
    text = value.strip()
    if _ISO_DATE.fullmatch(text, timeout=REGEX_TIMEOUT):
        try:
            return [date_parser.isoparse(text).date()]
        except (ValueError, OverflowError):
            raise _Unreadable("is not a date python-dateutil can read") from None
    readings: list[date] = []
    year_first = bool(_YEAR_FIRST.match(text, timeout=REGEX_TIMEOUT))
    orders = [False]
    if not year_first and _ALL_NUMERIC.fullmatch(text, timeout=REGEX_TIMEOUT):
        orders.append(True)  # 07/08/1986: July 8 or 7 August; protect both
    for dayfirst in orders:
        try:
            first, second = (
                date_parser.parse(text, default=d, dayfirst=dayfirst, yearfirst=year_first) for d in _DEFAULTS
            )
        except Exception:  # ParserError, OverflowError and, on odd input, others
            raise _Unreadable("is not a date python-dateutil can read") from None
        if first != second:
            raise _Unreadable("is not a full date (day, month and year)")
        if first.date() not in readings:
            readings.append(first.date())
    return readings


def _ordinal(day: int) -> str:
    if 10 <= day % 100 <= 20:
        return "th"
    return {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")


def _date_units(*units: str) -> str:
    # Two numbers side by side need a separator when either is unpadded: "7/14/1986" but not
    # "7141986", which could as well be 1986-11-4 or 1986-1-14.
    out = units[0]
    for previous, unit in itertools.pairwise(units):
        joint = previous[-1].isdigit() and unit[0].isdigit() and (len(previous) == 1 or len(unit) == 1)
        out += (MARK if joint else "") + unit
    return out


def _date_forms_for(day: date) -> list[str]:
    year4 = f"{day.year:04d}"
    years = _unique([year4, year4[-2:]])
    months = _unique([f"{day.month:02d}", str(day.month)])
    days = _unique([f"{day.day:02d}", str(day.day)])
    out: list[str] = []
    for year in years:
        for month in months:
            for d in days:
                out += [_date_units(year, month, d), _date_units(d, month, year), _date_units(month, d, year)]
    name = MONTHS[day.month - 1]
    names = _unique([name, name[:3], "sept" if day.month == 9 else ""])
    spelled_days = _unique([*days, str(day.day) + _ordinal(day.day)])
    for year in years:
        for month in names:
            for d in spelled_days:
                out += [_date_units(month, d, year), _date_units(d, month, year)]
                if not d[-1].isdigit():
                    out.append(_date_units(d, "of", month, year))
                if year == year4:
                    out.append(_date_units(year, month, d))
    return out


def _date_forms(value: str) -> FormList:
    forms = _Forms()
    for day in _parse_dates(fold(value)):
        for form in _date_forms_for(day):
            forms.add(form)
    return forms.result()


# --- addresses

_SUFFIX_GROUPS: tuple[tuple[str, ...], ...] = (
    ("street", "st", "str"),
    ("avenue", "ave", "av"),
    ("road", "rd"),
    ("boulevard", "blvd"),
    ("drive", "dr"),
    ("lane", "ln"),
    ("court", "ct"),
    ("place", "pl"),
    ("square", "sq"),
    ("terrace", "ter", "terr"),
    ("highway", "hwy"),
    ("parkway", "pkwy"),
    ("circle", "cir"),
    ("trail", "trl"),
    ("crescent", "cres"),
    ("alley", "aly"),
    ("expressway", "expy"),
    ("freeway", "fwy"),
    ("turnpike", "tpke"),
    ("plaza", "plz"),
    ("point", "pt"),
    ("heights", "hts"),
    ("grove", "grv"),
    ("gardens", "gdns"),
    ("park", "pk"),
    ("way", "wy"),
    ("close", "cl"),
    ("crossing", "xing"),
    ("center", "ctr", "centre"),
    ("junction", "jct"),
    ("harbor", "hbr"),
    ("route", "rte"),
    ("mews",),
    ("row",),
    ("walk",),
)
_DIRECTION_GROUPS: tuple[tuple[str, ...], ...] = (
    ("north", "n"),
    ("south", "s"),
    ("east", "e"),
    ("west", "w"),
    ("northeast", "ne"),
    ("northwest", "nw"),
    ("southeast", "se"),
    ("southwest", "sw"),
)
_PREFIX_GROUPS: tuple[tuple[str, ...], ...] = (("saint", "st"), ("mount", "mt"), ("fort", "ft"))
_UNIT_GROUPS: tuple[tuple[str, ...], ...] = (
    ("apt", "apartment", "unit", "no", "number", ""),
    ("suite", "ste", "unit", ""),
    ("fl", "floor", "flr", ""),
    ("rm", "room", ""),
    ("bldg", "building", "bld", ""),
    ("lot", ""),
    ("dept", "department", ""),
)
_ORDINAL_WORDS = _words(
    "first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth thirteenth "
    "fourteenth fifteenth sixteenth seventeenth eighteenth nineteenth twentieth"
)


def _group_index(groups: tuple[tuple[str, ...], ...]) -> dict[str, tuple[str, ...]]:
    index: dict[str, tuple[str, ...]] = {}
    for group in groups:
        for spelling in group:
            if spelling:
                index.setdefault(spelling, group)
    return index


_SUFFIXES = _group_index(_SUFFIX_GROUPS)
_DIRECTIONS = _group_index(_DIRECTION_GROUPS)
_PREFIXES = _group_index(_PREFIX_GROUPS)
_UNITS = _group_index(_UNIT_GROUPS)
_UNITS["#"] = _UNIT_GROUPS[0]
MAX_DESIGNATOR = max(map(len, _UNITS))
_ADDRESS_TOKENS = regex.compile(r"#|[\p{L}\p{N}]+")
_ADDRESS_PARTS = regex.compile(r"[,;\n]+")
MAX_STREET_VARIANTS = 32


def _ordinal_variants(token: str) -> list[str]:
    if token in _ORDINAL_WORDS:
        n = _ORDINAL_WORDS.index(token) + 1
        return [token, f"{n}{_ordinal(n)}"]
    for n, word in enumerate(_ORDINAL_WORDS, start=1):
        if token == f"{n}{_ordinal(n)}":
            return [token, word]
    return [token]


def _street_variants(street: list[str]) -> list[list[str]]:
    """Every spelling of the street line, the declared one first, capped at MAX_STREET_VARIANTS."""
    suffix_at = -1
    for i in range(len(street) - 1, 0, -1):
        if street[i] in _SUFFIXES:
            suffix_at = i
            break
        if street[i] not in _DIRECTIONS:
            break
    options: list[list[str]] = []
    for i, token in enumerate(street):
        if i == suffix_at:
            group = list(_SUFFIXES[token])
        elif token in _DIRECTIONS and len(street) > 2:
            group = list(_DIRECTIONS[token])
        elif token in _PREFIXES and 0 < i < max(suffix_at, 1):
            group = list(_PREFIXES[token])
        elif token.endswith("strasse") and len(token) > 7:
            group = [token, token[:-7] + "str"]
        else:
            group = _ordinal_variants(token)
        options.append(_unique([token, *group]))
    variants = [list(v) for v in itertools.islice(itertools.product(*options), MAX_STREET_VARIANTS)]
    # The street line without its suffix, when a house number anchors it and the name is not a
    # common word ("1428 Quintana" for "1428 Quintana Ave"; not "12 Oak" for "12 Oak Rd": "12 oak
    # trees" is ordinary text).
    name = street[1:suffix_at]
    if suffix_at >= 2 and any(c.isdigit() for c in street[0]) and any(_significant(t) for t in name):
        variants.append(street[:suffix_at])
    return variants


def _address_tokens(text: str) -> list[str]:
    # Each token through _key, so that it is spelled exactly as the text's segments are.
    found = _ADDRESS_TOKENS.findall(text, timeout=REGEX_TIMEOUT)
    return [t if t == "#" else _key(t) for t in found if t == "#" or _key(t)]


def _unit_value(token: str) -> bool:
    # "Apt 4", "Suite 200", "Apt B", "#4b"; not "No Name Road".
    return token != "#" and (any(c.isdigit() for c in token) or len(token) <= 2)


def _street_line(tokens: list[str], more_parts: bool) -> list[str]:
    """The street line of the first comma-separated part: up to a unit designator, or (when the
    declaration has no comma) up to the street suffix and a direction after it."""
    for i in range(2, len(tokens)):
        if tokens[i] in _UNITS:
            j = i + 1
            while j < len(tokens) and tokens[j] == "#":
                j += 1
            if j < len(tokens) and _unit_value(tokens[j]):
                return tokens[:i]
    if not more_parts:
        for i in range(len(tokens) - 1, 0, -1):
            if tokens[i] in _SUFFIXES:
                end = i + 1
                if end < len(tokens) and tokens[end] in _DIRECTIONS:
                    end += 1
                return tokens[:end]
    return tokens


def _address_forms(value: str) -> FormList:
    # The street line is the identifier: a unit after it is taken by detect (_unit_end), the
    # city and what follows are ordinary text on their own.
    folded = _APOSTROPHES.sub("", fold(value), timeout=REGEX_TIMEOUT)
    parts = [p for p in _ADDRESS_PARTS.split(folded, timeout=REGEX_TIMEOUT) if _key(p)]
    forms = _Forms()
    forms.add(_key(folded))
    if not parts:
        return forms.result()
    street = [t for t in _street_line(_address_tokens(parts[0]), len(parts) > 1) if t != "#"]
    for variant in _street_variants(street):
        forms.add("".join(variant))
    return forms.result()


# --- literals


def _literal_forms(value: str) -> FormList:
    key = _key(fold(value))
    if not key:
        raise _Unreadable("has no letter or digit")
    return ((key, Case.ANY, False),)


_LIGATURES = {"æ": "ae", "œ": "oe", "þ": "th", "ĳ": "ij"}

GENERATORS = {
    "NAME": _name_forms,
    "EMAIL": _email_forms,
    "PHONE": _phone_forms,
    "ADDRESS": _address_forms,
    "DOB": _date_forms,
    "ID": _literal_forms,
    "HANDLE": _literal_forms,
    "OTHER": _literal_forms,
}


def forms_of(kind: str, value: str) -> FormList:
    """The forms of one declared value. Raises _Unreadable."""
    forms = GENERATORS[kind](value)
    joined = "".join(form for form, _, _ in forms)
    if any(ligature in joined for ligature in _LIGATURES):
        extra = _Forms()
        for form, case, weak in forms:
            extra.add(form, case, weak)
            spelled = form
            for ligature, letters in _LIGATURES.items():
                spelled = spelled.replace(ligature, letters)
            extra.add(spelled, case, weak)
        forms = extra.result()
    return forms


@dataclass(frozen=True, slots=True)
class _ValueForms:
    """One declared value compiled: its form keys with their requirements, and all their prefixes."""

    forms: tuple[tuple[str, frozenset[int], Case, bool], ...]  # key, required separators, case, weak
    prefixes: frozenset[str]


@lru_cache(maxsize=FORM_CACHE_SIZE)
def _value_forms(kind: str, value: str) -> _ValueForms:
    # Cached across headers: a session whose header changes one value recompiles only that value.
    forms = []
    for form, case, weak in forms_of(kind, value):
        key, required = _split_marks(form)
        forms.append((key, required, case, weak))
    return _ValueForms(tuple(forms), _prefix_closure(key for key, _, _, _ in forms))


def _prefix_closure(keys: Iterable[str]) -> frozenset[str]:
    """Every non-empty prefix of every key. Longest keys first, each stopping at the first prefix
    already present (the set is prefix-closed), so the cost is the size of the keys' trie rather
    than the sum of their lengths: the forms of one value share long prefixes."""
    prefixes: set[str] = set()
    for key in sorted(set(keys), key=len, reverse=True):
        for end in range(len(key), 0, -1):
            prefix = key[:end]
            if prefix in prefixes:
                break
            prefixes.add(prefix)
    return frozenset(prefixes)


# ---------------------------------------------------------------------------------------------
# The compiled header


@dataclass(frozen=True, slots=True)
class _Variant:
    """One way a form key counts: for which label, under which Case, with which separators."""

    label: str
    kind: str
    priority: int
    subject: int
    case: Case
    required: frozenset[int]  # offsets in the key where the text must have a separator
    weak: bool  # a partial rendering: names the match only when no full form of the key does


@dataclass(frozen=True, slots=True)
class Form:
    """A compiled form, for tests and diagnostics. Holds a declared value: never log it."""

    key: str
    required: frozenset[int]
    label: str
    case: Case


@dataclass(frozen=True, slots=True)
class _Hit:
    first: int  # index of the first segment
    last: int  # index of the last segment
    key: str
    bounds: tuple[int, ...]  # offsets in the key where one segment ended and the next began


def _split_marks(form: str) -> tuple[str, frozenset[int]]:
    if MARK not in form:
        return form, frozenset()
    key = ""
    required = set()
    for part in form.split(MARK):
        if key:
            required.add(len(key))
        key += part
    return key, frozenset(required)


def _timeout(length: int) -> float:
    return REGEX_TIMEOUT * (1 + length / TIMEOUT_CHARS)


_ESCAPES = regex.compile(r"\\(?:u([0-9a-fA-F]{4})|x([0-9a-fA-F]{2}))")
_PERCENT = regex.compile(r"%[0-9a-fA-F]{2}")


def _decodings(text: str) -> Iterator[str]:
    """Copies of `text` with encodings that insert letters or digits undone (egress only)."""
    try:
        if "%" in text and _PERCENT.search(text, timeout=_timeout(len(text))):
            yield unquote(text.replace("+", " "))
        if "&" in text and ";" in text:
            unescaped = html.unescape(text)
            if unescaped != text:
                yield unescaped
        if "\\" in text:
            unescaped = _ESCAPES.sub(
                lambda m: chr(int(m.group(1) or m.group(2), 16)), text, timeout=_timeout(len(text))
            )
            if unescaped != text:
                yield unescaped
    except TimeoutError:
        raise DetectionError("subject matcher timed out") from None


class CompiledSubjects:
    """The matchers of one header. Immutable after construction; safe to share across requests."""

    __slots__ = ("_prefixes", "_variants", "digest", "form_count", "labels")

    def __init__(
        self,
        digest: str,
        variants: dict[str, tuple[_Variant, ...]],
        prefixes: frozenset[str],
        labels: frozenset[str],
    ) -> None:
        self.digest = digest
        self._variants = variants
        self._prefixes = prefixes  # every prefix of every key: can a segment run still become one?
        self.labels = labels
        self.form_count = len(variants)

    def __repr__(self) -> str:  # never the forms: they are declared values
        labels = sorted(self.labels)
        return f"CompiledSubjects(digest={self.digest[:12]}…, labels={labels}, forms={self.form_count})"

    def forms(self) -> Iterator[Form]:
        """Every compiled form (tests and diagnostics only: these are declared values)."""
        for key, variants in self._variants.items():
            for v in variants:
                yield Form(key, v.required, v.label, v.case)

    # --- scanning

    def _scan(self, segments: list[str], shortest: int = 0) -> Iterator[_Hit]:
        """Every run of segments that spells a form's key (at least `shortest` characters)."""
        prefixes = self._prefixes
        variants = self._variants
        count = len(segments)
        budget = STEPS_PER_SEGMENT * count + STEPS_FLOOR
        for first in itertools.compress(itertools.count(), map(prefixes.__contains__, segments)):
            text = segments[first]
            bounds: tuple[int, ...] = ()
            last = first
            while True:
                if text in variants and len(text) >= shortest:
                    yield _Hit(first, last, text, bounds)
                last += 1
                if last >= count:
                    break
                longer = text + segments[last]
                if longer not in prefixes:
                    break
                bounds += (len(text),)
                text = longer
                budget -= 1
                if budget < 0:
                    raise DetectionError("subject matcher exceeded its work bound")

    @staticmethod
    def _fits(variant: _Variant, bounds: tuple[int, ...]) -> bool:
        return not variant.required or variant.required.issubset(bounds)

    # --- redaction

    def detect(self, text: str) -> list[Finding]:
        """Every occurrence of a declared identifier, as non-overlapping spans of `text`.

        Overlapping matches (a name inside a longer name form, two subjects sharing a surname)
        are merged into their union, labelled by the longest, so no character of any match is left
        out whatever the caller's overlap resolution does.
        """
        if not text:
            return []
        return list(MEMO(("subjects", self.digest), text, lambda t: tuple(self._detect(t))))

    def _detect(self, text: str) -> list[Finding]:
        reading = _read(text, offsets=True)
        inserted = reading.inserted
        pieces = reading.spaced.split(" ")
        segments = list(filter(None, pieces))
        if not segments or self._prefixes.isdisjoint(segments):
            return []
        hits = list(self._scan(segments, _shortest_key(text)))
        if not hits:
            return []
        piece_of = list(itertools.compress(itertools.count(), pieces))
        starts = list(itertools.accumulate(map(len, pieces), initial=0))

        def original(segment: int, end: bool) -> int:
            piece = piece_of[segment]
            at = starts[piece] + piece + (len(pieces[piece]) if end else 0)
            return at - bisect_left(inserted, at) if inserted else at

        def span(first: int, last: int) -> tuple[int, int]:
            """Segments first..last as a span of the caller's text."""
            start, end = original(first, False), original(last, True)
            return reading.folded.span(start, end) if reading.folded is not None else (start, end)

        spans: list[tuple[int, int, _Variant]] = []
        for hit in hits:
            start, end = span(hit.first, hit.last)
            capitalised: bool | None = None
            for variant in self._variants[hit.key]:
                if not self._fits(variant, hit.bounds):
                    continue
                if variant.case is not Case.ANY:
                    if capitalised is None:
                        written = text[start:end]
                        capitalised = written != written.lower()
                    if not capitalised:
                        continue
                if variant.kind == "ADDRESS":
                    unit = _unit_end(segments, hit.last, text, span)
                    if unit > hit.last:
                        end = span(unit, unit)[1]
                spans.append((start, end, variant))
                break
        return _merge(spans)

    # --- egress

    def first_survivor(self, text: str) -> str | None:
        """The label of the first declared identifier readable in `text` (case-folded), or None."""
        if not text:
            return None
        return MEMO(("survivor", self.digest), text, self._first_survivor)

    def _first_survivor(self, text: str) -> str | None:
        label = self._survivor(text)
        if label is None:
            for decoded in _decodings(text):
                label = self._survivor(decoded)
                if label is not None:
                    break
        return label

    def _survivor(self, text: str) -> str | None:
        segments = _read(text, offsets=False).spaced.split()
        if not segments or self._prefixes.isdisjoint(segments):
            return None
        shortest = _shortest_key(text)
        # The longest form at the first place any form starts names the hit ("mqvance77" is the
        # handle, not the name form "mqvance" inside it); hits of one start come shortest first.
        found: str | None = None
        found_at = -1
        for hit in self._scan(segments, shortest):
            if found is not None and hit.first != found_at:
                break
            for variant in self._variants[hit.key]:
                if variant.case is not Case.CAPITALISED_ONLY and self._fits(variant, hit.bounds):
                    found, found_at = variant.label, hit.first
                    break
        return found


# In a media file's base64 (a screenshot passed as a tool's input), a form's key must be this long to
# count: base64 spells a given 3-letter run about once per million characters (initials such as
# "mqv" would be found in one screenshot in a few and corrupt it), a 6-character one about once per
# 10^9; a whole name, an email or a handle written there is still found.
MEDIA_SHORTEST_KEY = 6


def _shortest_key(text: str) -> int:
    return MEDIA_SHORTEST_KEY if len(text) >= MEDIA_MIN_LENGTH and is_media_payload(text) else 0


def _unit_end(segments: list[str], last: int, text: str, span: Callable[[int, int], tuple[int, int]]) -> int:
    """The last segment of a unit written right after a street line ending at segment `last`, or
    `last`. A unit alone is not an identifier, but redaction takes it with its street line.

    Read like everything else, separator-blind: a designator of the `_UNIT_GROUPS` (spelled with
    any separators: "Apt", "A.P.T.", "Suite") or a number sign before the value, then the value:
    digit runs and single letters, up to 8 characters ("4", "200", "4b", "2 0 0"), or one or two
    letters alone ("Apt B"). So "1428 Elm St 4 others" keeps its "4" and "... Apt 4 in" its "in".
    """
    count = len(segments)
    start = last + 1
    designator = ""
    at = start
    while at < count and len(designator) <= MAX_DESIGNATOR:
        designator += segments[at]
        if designator in _UNITS:
            break
        at += 1
    if designator in _UNITS and at < count:
        first = at + 1
    elif start < count and "#" in fold(text[span(last, last)[1] : span(start, start)[0]]):
        first = start
    else:
        return last
    if first >= count:
        return last
    head = segments[first]
    if not (head[0].isdigit() or len(head) <= 2):
        return last
    end, length = first, len(head)
    while end + 1 < count:
        following = segments[end + 1]
        if not (following[0].isdigit() or len(following) == 1) or length + len(following) > 8:
            break
        end += 1
        length += len(following)
    return end if head[0].isdigit() or end == first else first


def _merge(spans: list[tuple[int, int, _Variant]]) -> list[Finding]:
    if not spans:
        return []
    spans.sort(key=lambda s: (s[0], -s[1]))
    out: list[Finding] = []
    start, end, best = spans[0]
    best_rank = (-(end - start), best.priority, best.subject)
    for s, e, variant in spans[1:]:
        if s < end:
            rank = (-(e - s), variant.priority, variant.subject)
            if rank < best_rank:
                best, best_rank = variant, rank
            end = max(end, e)
            continue
        out.append(Finding(best.kind, start, end, best.label, best.priority))
        start, end, best = s, e, variant
        best_rank = (-(end - start), best.priority, best.subject)
    out.append(Finding(best.kind, start, end, best.label, best.priority))
    return out


# ---------------------------------------------------------------------------------------------
# Compilation and its cache

_cache: OrderedDict[str, CompiledSubjects] = OrderedDict()
_cache_lock = threading.Lock()


def _variant_order(v: _Variant) -> tuple[bool, int, int, Case, int]:
    return (v.weak, v.priority, v.subject, v.case, len(v.required))


def _compile(header: SubjectHeader) -> CompiledSubjects:
    collected: dict[str, list[_Variant]] = {}
    prefix_sets: list[frozenset[str]] = []
    labels: set[str] = set()
    for subject in header.subjects:
        for kind, values in subject.values.items():
            label = f"SUBJECT{subject.index}_{kind}"
            labels.add(label)
            priority = KIND_PRIORITY[kind]
            # Most forms of a value share (case, separators, weak): one _Variant object each.
            interned: dict[tuple[Case, frozenset[int], bool], _Variant] = {}
            for position, value in enumerate(values):
                try:
                    compiled = _value_forms(kind, value)
                except _Unreadable as exc:
                    path = f"subjects[{subject.index - 1}].{FIELD_OF_KIND[kind]}[{position}]"
                    raise SubjectHeaderError(f"{path} {exc}") from None
                except TimeoutError:
                    raise DetectionError("subject compilation timed out") from None
                prefix_sets.append(compiled.prefixes)
                for key, required, case, weak in compiled.forms:
                    variant = interned.get((case, required, weak))
                    if variant is None:
                        variant = _Variant(label, kind, priority, subject.index, case, required, weak)
                        interned[(case, required, weak)] = variant
                    known = collected.get(key)
                    if known is None:
                        collected[key] = [variant]
                    elif variant not in known:
                        known.append(variant)
    variants = {
        key: tuple(vs) if len(vs) == 1 else tuple(sorted(vs, key=_variant_order))
        for key, vs in collected.items()
    }
    return CompiledSubjects(header.digest, variants, frozenset().union(*prefix_sets), frozenset(labels))


def compile_subjects(header: SubjectHeader) -> CompiledSubjects:
    """The matchers for `header`, compiled once per distinct header (LRU of CACHE_SIZE by digest).

    Raises SubjectHeaderError naming the field path (never the value) when a declared value cannot
    be understood: a phone phonenumbers cannot parse, a date python-dateutil cannot read as a full
    date, an email without `@`.
    """
    with _cache_lock:
        compiled = _cache.get(header.digest)
        if compiled is not None:
            _cache.move_to_end(header.digest)
            return compiled
    compiled = _compile(header)
    with _cache_lock:
        _cache[header.digest] = compiled
        _cache.move_to_end(header.digest)
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return compiled


def clear_caches() -> None:
    """Forget every compiled header and value (benchmarks measure compilation from cold)."""
    with _cache_lock:
        _cache.clear()
    _value_forms.cache_clear()


__all__ = [
    "CACHE_SIZE",
    "DEFAULT_REGION",
    "KIND_PRIORITY",
    "Case",
    "CompiledSubjects",
    "Form",
    "clear_caches",
    "common_words",
    "compile_subjects",
    "is_common_word",
]
