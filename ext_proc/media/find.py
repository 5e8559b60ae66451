"""Which recognised words to paint: the identifiers and catalog entities in a reading's words.

The words are joined into lines (their offsets kept) and the catalog and the declared-subject
matchers run over the text, and again over the lines joined into one with a space and with
nothing (a card, an email or an id wrapped onto the next line, cut anywhere), and with nothing
where OCR read a space next to a dot, an `@` or a dash (`acme. internal`); every word a finding
overlaps is marked. The subject matchers ignore
separators, so an identifier OCR split into several words still matches; a fuzzy pass marks any
word within a small edit distance of a declared identifier's letters and digits (OCR misreads one
character more often than it drops a word); and runs of numeric words holding 12 digits or more
are marked (a card misread past its checksum).

Each finding is also kept as a `Hit` (its label and the quads of its words), and `Tally` counts
an image's hits as values by label: the same value read in several readings or passes is at the
same place, and counts once.

`ocr_can_read` says beforehand whether the reader can see a request's declared values at all.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

import regex

from ext_proc.detect.catalog.engine import PRIORITY_BASE
from ext_proc.detect.findings import Finding
from ext_proc.detect.normalize import fold
from ext_proc.detect.subjects.header import SubjectHeader
from ext_proc.errors import DetectionError
from ext_proc.media.image import MaskError
from ext_proc.media.read import Word
from ext_proc.media.rows import GRID, canonical, same_place
from ext_proc.media.textlike import Quad, meet

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


# OCR often reads a space after one of these inside a value (`acme. internal`, `jane .roe`).
_GLUE = frozenset(".@-_/:")


def lines_text(
    words: Sequence[Word], *, wrap: str = "\n", glue: bool = False
) -> tuple[str, list[tuple[int, int, int]]]:
    """The words as text, and each word's (start, end, index): the words of an OCR line apart by
    a space (none next to a `_GLUE` character with `glue`), the lines by `wrap`."""
    pieces: list[str] = []
    spans: list[tuple[int, int, int]] = []
    position = 0
    previous: Word | None = None
    for index, word in enumerate(words):
        if previous is not None:
            if word.line != previous.line:
                sep = wrap
            elif glue and (previous.text[-1:] in _GLUE or word.text[:1] in _GLUE):
                sep = ""
            else:
                sep = " "
            pieces.append(sep)
            position += len(sep)
        pieces.append(word.text)
        spans.append((position, position + len(word.text), index))
        position += len(word.text)
        previous = word
    return "".join(pieces), spans


# The readings of a set of words: the lines as they are; joined into one with a space or with
# nothing (a card, an email or an id wrapped onto the next line of a screenshot is one value to a
# reader, cut anywhere); and joined with nothing where OCR put a space next to a dot, an `@` or a
# dash.
_READINGS = (("\n", False), (" ", False), ("", False), ("", True))


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


@dataclass(frozen=True, slots=True)
class Hit:
    """A detector's finding among the words: its label (`EMAIL`, `SUBJECT1_NAME`), its rank
    (`Finding.priority`) and the quads of the words it covers. Never its text."""

    label: str
    priority: int
    quads: tuple[Quad, ...]


def find_words(words: Sequence[Word], detectors: Sequence[Detector], fuzzy: Declared | None) -> set[int]:
    """Indices of the words that are (part of) an identifier or a catalog entity (`find_values`)."""
    return find_values(words, detectors, fuzzy)[0]


def find_values(
    words: Sequence[Word], detectors: Sequence[Detector], fuzzy: Declared | None
) -> tuple[set[int], list[Hit]]:
    """Indices of the words that are (part of) an identifier or a catalog entity: in the lines
    of each reading, and in the one reading made of the best word at each place
    (media/rows.py), where an identifier read in parts by several readings comes together; and
    the detectors' findings among them as hits (the fuzzy and long-number rules mark words
    without a label, and make none)."""
    if not words:
        return set(), []
    marked, hits = _find_in(words, detectors, fuzzy)
    placed = canonical(words)
    relined = [replace(words[index], line=line) for index, line in placed]
    in_rows, row_hits = _find_in(relined, detectors, fuzzy)
    found = {placed[i][0] for i in in_rows}
    if fuzzy is not None and fuzzy.numbers:
        found |= {placed[i][0] for i in _number_pieces(relined, fuzzy.numbers)}
    return marked | found | same_place(words, found), hits + row_hits


class Tally:
    """One image's hits as values, by label: hits whose words overlap (the same value read again,
    at another scale, in another reading or after a round of paint) are one value, labelled by
    its best-ranked hit (`_rank`: a declared subject over a catalog kind, a card over a phone
    inside it)."""

    def __init__(self) -> None:
        self._hits: list[Hit] = []
        self._seen: set[Hit] = set()  # a hit found again (the lines joined, another pass) adds nothing
        self._parent: list[int] = []  # union-find over the hits: one root per value
        # Grid cell → (hit, its quad, the quad's bounding box) of every quad there.
        self._cells: dict[tuple[int, int], list[tuple[int, Quad, _Box]]] = {}

    def add(self, hits: Iterable[Hit]) -> None:
        for hit in hits:
            if hit in self._seen:
                continue
            self._seen.add(hit)
            index = len(self._hits)
            self._hits.append(hit)
            self._parent.append(index)
            for quad in hit.quads:
                box = _bounds(quad)
                cells = list(_box_cells(box))
                for cell in cells:
                    for other, other_quad, other_box in self._cells.get(cell, ()):
                        if (
                            _touch(box, other_box)
                            and self._root(other) != self._root(index)
                            and meet(quad, other_quad)
                        ):
                            self._parent[self._root(other)] = self._root(index)
                for cell in cells:
                    self._cells.setdefault(cell, []).append((index, quad, box))

    def _root(self, index: int) -> int:
        while self._parent[index] != index:
            self._parent[index] = self._parent[self._parent[index]]
            index = self._parent[index]
        return index

    def counts(self) -> dict[str, int]:
        """Values by label."""
        values: dict[int, list[Hit]] = {}
        for index, hit in enumerate(self._hits):
            values.setdefault(self._root(index), []).append(hit)
        out: dict[str, int] = {}
        for hits in values.values():
            label = min(hits, key=_rank).label
            out[label] = out.get(label, 0) + 1
        return out


def _rank(hit: Hit) -> tuple[int, int, int, str]:
    """As redaction ranks overlapping findings in text: a declared subject first, then the longer
    (here: in words), then the catalog's priority."""
    return (0 if hit.priority < PRIORITY_BASE else 1, -len(hit.quads), hit.priority, hit.label)


_Box = tuple[float, float, float, float]


def _bounds(quad: Quad) -> _Box:
    xs = [x for x, _ in quad]
    ys = [y for _, y in quad]
    return min(xs), min(ys), max(xs), max(ys)


def _touch(a: _Box, b: _Box) -> bool:
    """Whether two boxes overlap (a cheap test before `meet`: quads whose boxes do not, do not)."""
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _box_cells(box: _Box) -> Iterator[tuple[int, int]]:
    for gy in range(int(box[1]) // GRID, int(box[3]) // GRID + 1):
        for gx in range(int(box[0]) // GRID, int(box[2]) // GRID + 1):
            yield gx, gy


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


def _find_in(
    words: Sequence[Word], detectors: Sequence[Detector], fuzzy: Declared | None
) -> tuple[set[int], list[Hit]]:
    if not words:
        return set(), []
    marked: set[int] = set()
    hits: list[Hit] = []
    readings = dict(lines_text(words, wrap=wrap, glue=glue) for wrap, glue in _READINGS)
    for reading, spans in readings.items():
        for detect in detectors:
            try:
                findings = detect(reading)
            except (TimeoutError, DetectionError):
                raise MaskError("detection on the recognised text did not finish") from None
            for finding in findings:
                under = [
                    (i, min(end, finding.end) - max(start, finding.start), end - start)
                    for start, end, i in spans
                    if start < finding.end and finding.start < end
                ]
                marked.update(i for i, _, _ in under)  # every word it touches is painted
                # The value is where most of its words are: a finding that touches the edge of a
                # neighbouring word (a card match starting in the phone before it) must not make
                # the two one value when they are counted.
                mostly = [i for i, covered, length in under if 2 * covered >= length]
                if under:
                    where = mostly or [i for i, _, _ in under]
                    hits.append(Hit(finding.label, finding.priority, tuple(words[i].quad for i in where)))
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
    return marked, hits


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
