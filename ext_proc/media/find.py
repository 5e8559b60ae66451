"""Which recognised words to paint: the identifiers and catalog entities in a reading's words.

The words are joined into lines (their offsets kept) and the catalog and the declared-subject
matchers run over the text, and once more over the lines joined into one (a card or an email
wrapped onto the next line); every word a finding overlaps is marked. The subject matchers ignore
separators, so an identifier OCR split into several words still matches; a fuzzy pass marks any
word within a small edit distance of a declared identifier's letters and digits (OCR misreads one
character more often than it drops a word); and runs of numeric words holding 12 digits or more
are marked (a card misread past its checksum).

`ocr_can_read` says beforehand whether the reader can see a request's declared values at all.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace

import regex

from ext_proc.detect.findings import Finding
from ext_proc.detect.normalize import fold
from ext_proc.detect.subjects.header import SubjectHeader
from ext_proc.errors import DetectionError
from ext_proc.media.image import MaskError
from ext_proc.media.read import Word
from ext_proc.media.rows import canonical, same_place

Detector = Callable[[str], Sequence[Finding]]

LATIN_EXTENDED_EXTRA = frozenset(
    "ḀḁẞẠạẢảẤấẦầẨẩẪẫẬậẮắẰằẲẳẴẵẶặẸẹẺẻẼẽẾếỀềỂểỄễỆệỈỉỊịỌọỎỏỐốỒồỔổỖỗỘộỚớỜờỞởỠỡỢợỤụỦủỨứỪừỬửỮữỰựỲỳỴỵỶỷỸỹ"
)


def ocr_can_read(header: SubjectHeader) -> bool:
    """Whether every letter of every declared value is Latin (the tesseract model here is `eng`):
    a name in Cyrillic or Han would be painted over by no reading, so such requests are refused."""
    for subject in header.subjects:
        for values in subject.values.values():
            for value in values:
                if any(ch.isalpha() and ord(ch) > 0x24F and ch not in LATIN_EXTENDED_EXTRA for ch in value):
                    return False
    return True


def lines_text(words: Sequence[Word]) -> tuple[str, list[tuple[int, int, int]]]:
    """The words as text, one OCR line per text line, and each word's (start, end, index)."""
    pieces: list[str] = []
    spans: list[tuple[int, int, int]] = []
    position = 0
    previous: tuple[int, ...] | None = None
    for index, word in enumerate(words):
        if previous is not None:
            sep = " " if word.line == previous else "\n"
            pieces.append(sep)
            position += 1
        pieces.append(word.text)
        spans.append((position, position + len(word.text), index))
        position += len(word.text)
        previous = word.line
    return "".join(pieces), spans


def _core(text: str) -> str:
    return "".join(c for c in fold(text) if c.isalnum())


@dataclass(frozen=True, slots=True)
class Declared:
    """The declared identifiers as the reader looks for them: one fuzzy pattern over their
    letters-and-digits cores (None when none is long enough), and the digits of those that are
    numbers (cards, phones, ids) of NUMBER_DIGITS digits or more."""

    pattern: regex.Pattern[str] | None
    numbers: tuple[str, ...]


NUMBER_DIGITS = 8
PIECE_DIGITS = 4  # a word holding this many digits of a declared number anchors the rest of it


def fuzzy_pattern(keys: Iterable[str]) -> Declared | None:
    """The declared identifiers' cores for the reader: a fuzzy pattern over those of 6+ chars
    (one edit allowed, two from 12 characters on), and the declared numbers. Compiled once per
    set of keys (the same header comes with every turn of a conversation)."""
    unique = set(keys)
    usable = tuple(sorted((k for k in unique if len(k) >= 6), key=lambda k: (-len(k), k)))
    numbers = tuple(sorted(k for k in unique if k.isdigit() and len(k) >= NUMBER_DIGITS))
    if not usable and not numbers:
        return None
    return Declared(_fuzzy_compiled(usable) if usable else None, numbers)


@functools.lru_cache(maxsize=256)
def _fuzzy_compiled(keys: tuple[str, ...]) -> regex.Pattern[str]:
    parts = [f"(?:{regex.escape(k)}){{e<={2 if len(k) >= 12 else 1}}}" for k in keys]
    return regex.compile("(?:" + "|".join(parts) + ")")


def find_words(words: Sequence[Word], detectors: Sequence[Detector], fuzzy: Declared | None) -> set[int]:
    """Indices of the words that are (part of) an identifier or a catalog entity: in the lines
    of each reading, and in the one reading made of the best word at each place
    (media/rows.py), where an identifier read in parts by several readings comes together."""
    if not words:
        return set()
    marked = _find_in(words, detectors, fuzzy)
    placed = canonical(words)
    relined = [replace(words[index], line=line) for index, line in placed]
    found = {placed[i][0] for i in _find_in(relined, detectors, fuzzy)}
    if fuzzy is not None and fuzzy.numbers:
        found |= {placed[i][0] for i in _number_pieces(relined, fuzzy.numbers)}
    return marked | found | same_place(words, found)


def _number_pieces(row_words: Sequence[Word], numbers: Sequence[str]) -> set[int]:
    """Words of a row around a piece of a declared number: a word whose digits (PIECE_DIGITS or
    more) are part of a declared number marks itself and, on each side, the neighbours where
    the rest of the number must stand (as many characters as the number has beyond the piece
    on that side), while they hold a digit or are a fragment of two characters or fewer (a
    group misread as letters). A card whose groups were read "4539", "1466" and "6467" has no
    match, but its first and last groups are pieces of it, and the groups between are painted
    with them."""
    marked: set[int] = set()
    cores = [_core(word.text) for word in row_words]
    for index, word in enumerate(row_words):
        digits = "".join(c for c in word.text if c.isdigit())
        if len(digits) < PIECE_DIGITS or len(cores[index]) > len(digits) + 1:
            continue
        for number in numbers:
            offset = number.find(digits)
            if offset < 0:
                continue
            marked.add(index)
            for step, need in ((-1, offset), (1, len(number) - offset - len(digits))):
                other = index + step
                while need > 0 and 0 <= other < len(row_words):
                    if row_words[other].line != word.line:
                        break
                    if not any(c.isdigit() for c in cores[other]) and len(cores[other]) > 2:
                        break
                    marked.add(other)
                    need -= max(1, len(cores[other]))
                    other += step
    return marked


def _find_in(words: Sequence[Word], detectors: Sequence[Detector], fuzzy: Declared | None) -> set[int]:
    if not words:
        return set()
    text, spans = lines_text(words)
    marked: set[int] = set()
    # The lines as they are, and joined into one (same offsets): a card or an email wrapped onto
    # the next line of a screenshot is one value to a reader.
    for reading in dict.fromkeys((text, text.replace("\n", " "))):
        for detect in detectors:
            try:
                findings = detect(reading)
            except (TimeoutError, DetectionError):
                raise MaskError("detection on the recognised text did not finish") from None
            for finding in findings:
                marked.update(i for start, end, i in spans if start < finding.end and finding.start < end)
    marked.update(_long_numbers(words))
    if fuzzy is not None and fuzzy.pattern is not None:
        # Per line, on the letters and digits only, so a misread inside a split identifier is
        # still near the declared form; each hit marks every word it touches.
        by_line: dict[tuple[int, ...], list[int]] = {}
        for index, word in enumerate(words):
            by_line.setdefault(word.line, []).append(index)
        for indices in by_line.values():
            cores = [_core(words[i].text) for i in indices]
            joined = "".join(cores)
            owner: list[int] = [i for i, core in zip(indices, cores, strict=True) for _ in core]
            for match in fuzzy.pattern.finditer(joined, timeout=1.0):
                # A word counts when the match covers at least half of its letters and digits:
                # an edit at the match's edge must not take the neighbouring label with it.
                covered: dict[int, int] = {}
                for i in owner[match.start() : match.end()]:
                    covered[i] = covered.get(i, 0) + 1
                marked.update(i for i, n in covered.items() if 2 * n >= len(_core(words[i].text)))
    return marked


def _long_numbers(words: Sequence[Word]) -> set[int]:
    """Runs of adjacent words on one line made of digits and separators only, holding
    LONG_NUMBER_DIGITS digits or more: a card or account number OCR misread past its pattern
    ("41111111111 111" fails the checksum). Painting an order number too costs little."""
    marked: set[int] = set()
    run: list[int] = []
    digits = 0

    def close() -> None:
        if digits >= LONG_NUMBER_DIGITS:
            marked.update(run)

    for index, word in enumerate(words):
        numeric = bool(_NUMERIC_WORD.fullmatch(word.text))
        if run and (not numeric or words[run[-1]].line != word.line):
            close()
            run, digits = [], 0
        if numeric:
            run.append(index)
            digits += sum(c.isdigit() for c in word.text)
    close()
    return marked


LONG_NUMBER_DIGITS = 12
_NUMERIC_WORD = regex.compile(r"[\d\-.·/()+]*\d[\d\-.·/()+]*")
