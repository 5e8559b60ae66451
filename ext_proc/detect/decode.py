"""Decoded views of a text: what it says once its escapes are undone.

A value can be written so that no reader of the plain text sees it while any decoder (or a model)
does: `jane%40example.com`, `&#64;`, `\\u0040`, `\\x40`, `\\100`, `\\u{40}`, `\\U00000040`,
`\\N{COMMERCIAL AT}`, CSS `\\40 `, quoted-printable `=40`, `jane (at) example [dot] com`, or any
of these escaped once more; or spelled in invisible tag characters (`hidden_view`).
`decoded_views` undoes every family once per round, in a fixed order, and yields the text after
each round that changed something, until a round changes nothing or `MAX_ROUNDS` have run (every
decoding shortens the text, so this ends).

Only well-formed escapes are decoded, so ordinary text is left alone: exact digit counts, a
`;` after hexadecimal entities, braces closed, a code point that exists and is no control
character (`\\d` or `=10` in code, `%` in prose, `\\n` in JSON stay as they are). Byte escapes
(`%C3%A9`, `\\xc3\\xa9`, `=C3=A9`) are read as UTF-8 where they form it.

Each view keeps the maps back to the original offsets: a finding in a decoded view becomes the
whole encoded span that produced it. The egress check reads the views for declared identifiers
(a hit refuses the request); the catalog reads them for its kinds and keeps a finding only where
it covers a decoded character (anything else the plain view already found).
"""

from __future__ import annotations

import html.entities
import re
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ext_proc.detect.canonical import canonical_text, separates
from ext_proc.detect.offsets import Edit, EditMap, Span, apply_edits, chain_span

MAX_ROUNDS = 4

# Every pattern starts with a literal (a fast scan to the next candidate) and repeats only bounded
# pieces with nothing ambiguous to backtrack over, so its cost is linear in the text: `re` runs
# them, without the time budget the catalog's open-ended patterns need.
_PERCENT = re.compile(r"%[0-9A-Fa-f]{2}(?:%[0-9A-Fa-f]{2})*")
_QUOTED_PRINTABLE = re.compile(r"=[0-9A-Fa-f]{2}(?:=[0-9A-Fa-f]{2})*")
_ENTITY = re.compile(r"&(?:#([0-9]{1,7});?|#[xX]([0-9A-Fa-f]{1,6});|([A-Za-z][A-Za-z0-9]{1,31});)")
_BACKSLASH = re.compile(
    r"\\(?:u([Dd][89AaBb][0-9A-Fa-f]{2})\\u([Dd][C-Fc-f][0-9A-Fa-f]{2})|u\{([0-9A-Fa-f]{1,6})\}"
    r"|u([0-9A-Fa-f]{4})|U([0-9A-Fa-f]{8})|x([0-9A-Fa-f]{2})|N\{([A-Za-z0-9 \-]{1,88})\}|([0-3][0-7]{2}))"
)
_CSS = re.compile(r"\\([0-9A-Fa-f]{1,6})(?:\r\n|[ \t\n\r\f])?")
# `(at)`, `[ dot ]` …: the view made every run of spaces one space. Only looked for where a closing
# bracket is (a plain `in` scan).
_WORD = re.compile(r"[(\[{<] ?([aA][tT]|[dD][oO][tT]) ?[)\]}>]")
_CLOSING = (")", "]", "}", ">")


def _char(code: int) -> str | None:
    """The character of a code point an escape names, or None when that is no well-formed text
    (beyond Unicode, a surrogate, a control character other than a line break or tab)."""
    if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
        return None
    char = chr(code)
    if unicodedata.category(char) == "Cc" and char not in "\t\n\r":
        return None
    return char


def _bytes_text(raw: bytes, originals: list[str]) -> str | None:
    """Bytes of a run of byte escapes as text: UTF-8 where it is, each byte that is not (and each
    control character) kept as the escapes it was written as; None when nothing decodes."""
    out: list[str] = []
    index = 0  # the byte, and so the original escape, the next character starts at
    changed = False
    for char in raw.decode("utf-8", "surrogateescape"):
        if "\udc80" <= char <= "\udcff":  # a byte that is not UTF-8
            out.append(originals[index])
            index += 1
            continue
        width = len(char.encode("utf-8"))
        if _char(ord(char)) is None:
            out.append("".join(originals[index : index + width]))
        else:
            out.append(char)
            changed = True
        index += width
    return "".join(out) if changed else None


def _byte_runs(pattern: re.Pattern[str], text: str, width: int) -> list[Edit]:
    """Runs of `%XX` or `=XX` escapes (each `width` characters) decoded as UTF-8."""
    edits: list[Edit] = []
    for m in pattern.finditer(text):
        run = m.group()
        originals = [run[i : i + width] for i in range(0, len(run), width)]
        decoded = _bytes_text(bytes(int(o[-2:], 16) for o in originals), originals)
        if decoded is not None:
            edits.append((m.start(), m.end(), decoded))
    return edits


def _percent(text: str) -> list[Edit]:
    return _byte_runs(_PERCENT, text, 3) if "%" in text else []


def _quoted_printable(text: str) -> list[Edit]:
    return _byte_runs(_QUOTED_PRINTABLE, text, 3) if "=" in text else []


def _entities(text: str) -> list[Edit]:
    if "&" not in text:
        return []
    edits: list[Edit] = []
    for m in _ENTITY.finditer(text):
        decimal, hexadecimal, name = m.groups()
        char: str | None
        if name is not None:
            char = html.entities.html5.get(name + ";")
        else:
            char = _char(int(decimal) if decimal is not None else int(hexadecimal, 16))
        if char:
            edits.append((m.start(), m.end(), char))
    return edits


def _backslashes(text: str) -> list[Edit]:
    """`\\u{…}`, `\\uXXXX` (a surrogate pair as one character), `\\UXXXXXXXX`, `\\N{NAME}`, and
    runs of `\\xHH` and `\\NNN` read as UTF-8 bytes."""
    if "\\" not in text:
        return []
    edits: list[Edit] = []
    run: list[tuple[int, int, int, str]] = []  # consecutive byte escapes: (start, end, byte, escape)

    def end_run() -> None:
        if run:
            decoded = _bytes_text(bytes(r[2] for r in run), [r[3] for r in run])
            if decoded is not None:
                edits.append((run[0][0], run[-1][1], decoded))
            run.clear()

    for m in _BACKSLASH.finditer(text):
        high, low, braced, four, eight, byte, name, octal = m.groups()
        if run and m.start() != run[-1][1]:
            end_run()
        if byte is not None or octal is not None:
            run.append((m.start(), m.end(), int(byte, 16) if byte else int(octal, 8), m.group()))
            continue
        end_run()
        char: str | None
        if high is not None:
            char = chr(0x10000 + ((int(high, 16) - 0xD800) << 10) + (int(low, 16) - 0xDC00))
        elif name is not None:
            try:
                char = unicodedata.lookup(name)
            except KeyError:
                char = None
        else:
            char = _char(int(braced or four or eight, 16))
        if char:
            edits.append((m.start(), m.end(), char))
    end_run()
    return edits


def _css(text: str) -> list[Edit]:
    if "\\" not in text:
        return []
    edits: list[Edit] = []
    for m in _CSS.finditer(text):
        char = _char(int(m.group(1), 16))
        if char and char not in "\t\n\r":
            edits.append((m.start(), m.end(), char))
    return edits


def _words(text: str) -> list[Edit]:
    """`(at)`, `[at]`, `{dot}`, `<dot>` … (with a space either side) as `@` and `.`."""
    if not any(close in text for close in _CLOSING):
        return []
    edits: list[Edit] = []
    for m in _WORD.finditer(text):
        begin, end = m.span()
        if begin > 0 and text[begin - 1] == " " and (not edits or begin - 1 >= edits[-1][1]):
            begin -= 1
        if end < len(text) and text[end] == " ":
            end += 1
        edits.append((begin, end, "@" if m.group(1).lower() == "at" else "."))
    return edits


# The order within a round: an escape one family writes is read by a later one in the same round
# (`%26%2364%3B` → `&#64;` → `@`); a later round reads what a round made.
FAMILIES: tuple[Callable[[str], list[Edit]], ...] = (
    _percent,
    _entities,
    _backslashes,
    _css,
    _quoted_printable,
    _words,
)


@dataclass(frozen=True, slots=True)
class Decoded:
    """A decoded view: its text, and the maps back to the original (the last decoding first)."""

    text: str
    maps: tuple[EditMap, ...]

    def span(self, start: int, end: int) -> Span:
        """The original (encoded) span that view characters [start, end) were decoded from."""
        return chain_span(self.maps, start, end)

    def touches(self, start: int, end: int) -> bool:
        """Whether view span [start, end) holds a character some decoding produced."""
        for mapping in self.maps:
            if mapping.touches(start, end):
                return True
            start, end = mapping.span(start, end)
        return False


# Tag characters spell ASCII invisibly (U+E0020–U+E007E mirror U+0020–U+007E): a reader sees
# nothing, a model reads the text. The canonical view removes them; `hidden_view` reads them.
_TAG_RUN = re.compile("[\U000e0020-\U000e007e]+")
_FIRST_TAG = "\U000e0020"


def hidden_view(text: str) -> Decoded | None:
    """`text` with its tag characters read as the ASCII they mirror (each run redacted whole), or
    None when it has none."""
    if text.isascii() or max(text) < _FIRST_TAG:
        return None
    edits: list[Edit] = [
        (m.start(), m.end(), "".join(chr(ord(c) - 0xE0000) for c in m.group()))
        for m in _TAG_RUN.finditer(text)
    ]
    decoded, mapping = apply_edits(text, edits)
    return Decoded(decoded, (mapping,)) if mapping is not None else None


def may_hold_escapes(text: str) -> bool:
    """Whether `text` holds a character some family starts or ends with (C-speed scans)."""
    return (
        "%" in text
        or "&" in text
        or "\\" in text
        or "=" in text
        or ")" in text
        or "]" in text
        or "}" in text
        or ">" in text
    )


@dataclass(frozen=True, slots=True)
class WordEscapes:
    """Where `text` writes a character of a word beyond ASCII (a letter, digit or mark of any script,
    or an invisible character that joins, such as a soft hyphen) as an escape: `\\u00f1` of JSON written
    ASCII-only, `&ntilde;`, `%C3%B1`. That is how serialisers write ordinary words, and the plain view
    reads the escape's notation as letters and digits of its own, so it cuts the word the escape is
    in (`ma\\u00f1ana` reads `ma u 00 f 1 ana`): a form found right against one is a piece of a
    longer word, read whole (and judged) in the decoded views. An escape of an ASCII letter or digit
    is no serialiser's (a disguise), and one of a space, punctuation or an invisible character that
    sets words apart (a zero-width space, a filler) separates: neither counts."""

    starts: frozenset[int]
    ends: frozenset[int]

    def cut(self, start: int, end: int) -> bool:
        """Whether [start, end) of the text begins right after such an escape or ends right before one."""
        return start in self.ends or end in self.starts


NO_WORD_ESCAPES = WordEscapes(frozenset(), frozenset())


def word_escapes(text: str) -> WordEscapes:
    """The escapes of word characters beyond ASCII in `text`, however deeply encoded
    (`ma%25C3%25B1ana` decodes to `mañana` in two rounds): each character of the last decoded
    view that decoding produced, read back to the span of `text` it came from."""
    last = deepest_view(text)
    if last is None:
        return NO_WORD_ESCAPES
    starts: set[int] = set()
    ends: set[int] = set()
    for at, char in enumerate(last.text):
        if char.isascii() or not _in_word(char) or not last.touches(at, at + 1):
            continue
        start, end = last.span(at, at + 1)
        starts.add(start)
        # A CSS escape takes the space after it; to a reader of the text that space separates.
        ends.add(start + len(text[start:end].rstrip()))
    return WordEscapes(frozenset(starts), frozenset(ends)) if starts else NO_WORD_ESCAPES


def _in_word(char: str) -> bool:
    """Whether a decoded character is part of the word around it: it reads as letters, digits and
    marks, or as nothing (an invisible character that does not set words apart)."""
    if separates(char):
        return False
    return all(c.isalnum() or unicodedata.category(c)[0] == "M" for c in canonical_text(char))


def decoded_views(text: str) -> Iterator[Decoded]:
    """Each view of `text` (a canonical view's text: runs of spaces are one space) that a round of
    decoding changed, shallowest first.

    Most text holds no escape, and costs a few `in` scans."""
    if not may_hold_escapes(text):
        return
    current = text
    maps: list[EditMap] = []
    for _round in range(MAX_ROUNDS):
        changed = False
        for family in FAMILIES:
            current, mapping = apply_edits(current, family(current))
            if mapping is not None:
                maps.insert(0, mapping)
                changed = True
        if not changed:
            return
        yield Decoded(current, tuple(maps))


def deepest_view(text: str) -> Decoded | None:
    """The last of `decoded_views(text)`: every escape undone (None when it holds none)."""
    last: Decoded | None = None
    for view in decoded_views(text):
        last = view
    return last
