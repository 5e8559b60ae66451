"""How the matcher's scan reads past a segment that is not literally part of a form's key.

Called by `CompiledSubjects._scan` (ext_proc.detect.subjects.matcher) only where the next segment
does not continue a candidate as written. Two readings, both deterministic and bounded:

* a written date's words (ext_proc.detect.subjects.dates.DATE_WORDS): a month in another language
  or in Roman numerals reads as its English name, an English ordinal word as its number, and up to
  MAX_DATE_SKIPS connecting words and ordinal endings are passed over, but only next to a month
  word, so that "7 of 14 in 1986" stays ordinary text;
* a gap between two digit groups of a number (a phone, an id): one word of up to
  MAX_LOOSE_LETTERS letters, or up to MAX_GAP_WORDS words that are each a single letter or a
  connector (ext_proc.detect.subjects.words.GAP_CONNECTORS). "404 then 555 and 0187" and
  "404a555b0187" read as 4045550187; "404 apples and 555 pears" does not.

Each returns the candidate's key continued and the index of the segment it ends on, or None. A
candidate read either way counts only as a form of the kinds the reading is for (`READ_KINDS`): a
date's words make no phone, a gap makes no date.
"""

from __future__ import annotations

from ext_proc.detect.subjects.dates import DATE_WORDS, MONTH, MONTH_WORDS, SKIP, TENS, UNIT_ORDINALS
from ext_proc.detect.subjects.values import GAP_KINDS
from ext_proc.detect.subjects.words import GAP_CONNECTORS

AS_WRITTEN, AS_DATE, ACROSS_GAP = 0, 1, 2  # how a candidate was read (bits)
READ_KINDS: dict[int, frozenset[str]] = {
    AS_DATE: frozenset({"DOB"}),
    ACROSS_GAP: GAP_KINDS,
    AS_DATE | ACROSS_GAP: frozenset(),
}

MAX_DATE_SKIPS = 4  # "March the 3rd, in the year 1986": three words between the day and the year
MAX_GAP_WORDS = 3  # "404, area code, then 555": connectors or single letters
MAX_LOOSE_LETTERS = 5  # a single word of any kind between two digit groups: "then", "plus", "x"
MONTH_LOOKAROUND = 4  # a date word counts within this many segments of a month word

Continued = tuple[str, int] | None


def _month_near(segments: list[str], first: int, at: int) -> bool:
    """A month word among the candidate's segments before `at`, or just after it."""
    before = segments[max(first, at - 2 * MONTH_LOOKAROUND) : at]
    after = segments[at + 1 : at + 1 + MONTH_LOOKAROUND]
    return not (MONTH_WORDS.isdisjoint(before) and MONTH_WORDS.isdisjoint(after))


def _day_reading(segments: list[str], first: int, at: int, kind: int, reading: str) -> str | None:
    """An ordinal word read as its number, in a written date only ("the third of March")."""
    if not _month_near(segments, first, at):
        return None
    if kind == TENS and (at + 1 >= len(segments) or segments[at + 1] not in UNIT_ORDINALS):
        return None
    return reading


def is_skipped(segment: str) -> bool:
    """A word passed over inside a written date (a connecting word or an ordinal ending)."""
    word = DATE_WORDS.get(segment)
    return word is not None and word[0] == SKIP


def date_start(segments: list[str], first: int, prefixes: frozenset[str]) -> str | None:
    """The reading of a date word that begins a candidate ("julio 14 de 1986"), or None."""
    word = DATE_WORDS.get(segments[first])
    if word is None or word[0] == SKIP:
        return None
    kind, reading = word
    found = reading if kind == MONTH else _day_reading(segments, first, first, kind, reading)
    return found if found is not None and found in prefixes else None


def date_continuation(
    segments: list[str], first: int, at: int, text: str, prefixes: frozenset[str]
) -> Continued:
    """`text` continued from segment `at` by the words of a written date."""
    for j, segment in enumerate(segments[at : at + MAX_DATE_SKIPS + 1], start=at):
        word = DATE_WORDS.get(segment)
        if word is None:
            # After passed-over words, the segment as written (the day or the year).
            longer = text + segment
            return (longer, j) if j > at and longer in prefixes else None
        kind, reading = word
        if kind == MONTH:
            longer = text + reading
            return (longer, j) if longer in prefixes else None
        if kind == SKIP:
            if not _month_near(segments, first, j):
                return None
            continue
        found = _day_reading(segments, first, j, kind, reading)
        if found is None:
            return None
        longer = text + found
        return (longer, j) if longer in prefixes else None
    return None


def gap_continuation(segments: list[str], at: int, text: str, prefixes: frozenset[str]) -> Continued:
    """`text`, a number's key up to a digit, continued across the words from segment `at` by the
    next digit group."""
    strict = True  # every word so far a single letter or a connector
    for j, segment in enumerate(segments[at : at + MAX_GAP_WORDS + 1], start=at):
        if segment[0].isdigit():
            longer = text + segment
            return (longer, j) if j > at and longer in prefixes else None
        strict = strict and (len(segment) == 1 or segment in GAP_CONNECTORS)
        if not strict and (j > at or len(segment) > MAX_LOOSE_LETTERS):
            return None
    return None
