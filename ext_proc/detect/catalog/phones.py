"""The PHONE validator: which runs of digits and phone punctuation are phone numbers.

The catalog's phone pattern finds candidate runs; `validate_phone` (called by `Catalog.detect`
through `VALIDATORS`) splits each into chunks and asks phonenumbers whether a window of them is a
valid number, after ruling out the shapes that only look like one (dates, times, IPv4 and SSN
shapes, digit listings, hex dumps). The decisions are pure and cached: a conversation resends its
history every turn.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import phonenumbers
import regex

from ext_proc.detect.catalog.options import Options
from ext_proc.detect.catalog.regexes import (
    DIGIT_GROUP,
    Span,
    compile_pattern,
    digits_of,
    timed_all,
    timed_fullmatch,
    timed_search,
)

# Regions where a national number starts with a trunk `0`, tried for a number written without
# its country code.
TRUNK_REGIONS: tuple[str, ...] = (
    "GB", "DE", "FR", "IT", "NL", "BE", "CH", "AT", "IE", "SE", "IL", "IN", "JP", "KR", "CN",
    "AU", "NZ", "BR", "TR", "ZA",
)  # fmt: skip
# Regions tried for a bare digit run that follows a phone word.
CONTEXT_REGIONS: tuple[str, ...] = ("US", *TRUNK_REGIONS)


# A phone word up to CONTEXT_CHARS before a number, on its line, lets a bare digit run count.
_PHONE_WORD = compile_pattern(
    r"(?i)(?:\b(?:phone|tel|telephone|mobile|cell|call|fax|sms|whatsapp|contact|ring|dial"
    r"|t[ée]l[ée]phone|portable|tel[ée]fono|m[óo]vil|num[ée]ro"
    # German, also as compounds: Telefonnummer, Handynr, Mobilnummer, Rufnummer.
    r"|(?:telefon|handy|mobil)(?:nummer|nr)?|ruf(?:nummer|nr))\b|电话|手机|電話)"
)
CONTEXT_CHARS = 40
# Every phone word holds one of these, case-folded: most windows hold none and need no search.
_WORD_PART = compile_pattern(
    "phone|tel|mobil|cell|call|fax|sms|whatsapp|contact|ring|dial|vil|num|handy|ruf|portable|电话|手机|電話"
)
# The two Turkish i's match `i` in the words above but case-fold to something else.
_DOTTED_I = str.maketrans({"\u0130": "i", "\u0131": "i"})
_DATE_LIKE = compile_pattern(
    r"(?:[0-9]{4}[-/.][0-9]{1,2}[-/.][0-9]{1,2}|[0-9]{1,2}[-/.][0-9]{1,2}[-/.][0-9]{2,4}"
    r"|(?:19|20)[0-9]{2}\s?[-/]\s?(?:19|20)?[0-9]{2}|[0-9]{1,3}(?:\.[0-9]{1,3}){3})"
)
_DATE_INSIDE = compile_pattern(
    r"(?<![0-9])(?:(?:19|20)[0-9]{2}[-/.][0-9]{1,2}[-/.][0-9]{1,2}"
    r"|[0-9]{1,2}[-/.][0-9]{1,2}[-/.](?:19|20)[0-9]{2})(?![0-9])"
)
_SSN_SHAPE = compile_pattern(r"[0-9]{3}([- .])[0-9]{2}\1[0-9]{4}")
_NANP_SHAPE = compile_pattern(r"(?:\+?1[ .\-]?)?(?:\([0-9]{3}\)[ ]?|[0-9]{3}([ .\-]))[0-9]{3}[ .\-][0-9]{4}")
_WS_RUN = compile_pattern(r"[^ \u00a0]+")


@functools.lru_cache(maxsize=4096)
def _phone_valid(number: str, region: str | None) -> bool:
    try:
        parsed = phonenumbers.parse(number, region)
    except phonenumbers.NumberParseException:
        return False
    return phonenumbers.is_valid_number(parsed)


@functools.lru_cache(maxsize=16384)
def _phone_ok(window: str, has_context: bool) -> bool:
    """Is this window (a candidate's chunks) a phone number? Pure, so cached: a conversation
    resends its history every turn, and the same numbers come back again and again."""
    digits = digits_of(window)
    if not 7 <= len(digits) <= 15:
        return False
    if window.count("(") != window.count(")"):
        return False
    if timed_fullmatch(_DATE_LIKE, window) or timed_search(_DATE_INSIDE, window) is not None:
        return False
    if timed_fullmatch(_SSN_SHAPE, window):
        return False
    if window.startswith("+"):
        return _phone_valid(window, None)
    if window == digits:
        # A bare digit run is an id, an amount or a timestamp unless a phone word precedes it.
        return has_context and any(_phone_valid(window, r) for r in CONTEXT_REGIONS)
    if timed_fullmatch(_NANP_SHAPE, window):
        return True
    group_texts = [m.group() for m in timed_all(DIGIT_GROUP, window)]
    groups = [len(g) for g in group_texts]
    if sum(1 for g in groups if g == 1) > 1:
        return False  # "0 1 2 3 4 5 6": a row of numbers, not a phone
    if sum(1 for g in group_texts if not g.strip("0")) > 1:
        return False  # "00 01 00 00": bytes of a hex dump
    if "." in window and (digits[0] != "0" or "/" in window or max(groups) > 4):
        # Dotted digit groups are versions, addresses and CIDR blocks, except a national
        # number in dotted pairs (01.42.68.53.00) or NANP shape (handled above).
        return False
    if _phone_valid(window, "US"):
        return True
    if digits[0] == "0" and len(digits) >= 9:
        return any(_phone_valid(window, r) for r in TRUNK_REGIONS)
    return False


def validate_phone(text: str, m: regex.Match[str], span: Span, _o: Options) -> Iterable[Span]:
    """Valid numbers among the whitespace-separated chunks of a candidate, longest first."""
    start, end = span
    # The run must end a token: "555-0132x" and "12:30" (a time) are not phones.
    while end > start and text[end - 1] not in "0123456789)":
        end -= 1
    if end < len(text) and (
        text[end].isalnum() or text[end] == "_" or (text[end] == ":" and text[end + 1 : end + 2].isdigit())
    ):
        return
    candidate = text[start:end]
    if len(candidate) - len(candidate.translate(_NO_DIGITS)) < 7:
        return
    # The phone word matters only to a bare digit run (`_phone_ok`), which needs 7 digits in a row.
    has_context = _SEVEN_DIGITS.search(candidate) is not None and _after_phone_word(text, start)
    for rel_start, rel_end in _phone_spans(candidate, has_context):
        yield (start + rel_start, start + rel_end)


_NO_DIGITS = str.maketrans("", "", "0123456789")
_SEVEN_DIGITS = compile_pattern("[0-9]{7}")


def _after_phone_word(text: str, start: int) -> bool:
    """A phone word within CONTEXT_CHARS before `start`, with no line break between them."""
    low = max(0, start - CONTEXT_CHARS, text.rfind("\n", 0, start) + 1)
    folded = text[low:start].translate(_DOTTED_I).casefold()
    if timed_search(_WORD_PART, folded) is None:
        return False
    return timed_search(_PHONE_WORD, text, low, start) is not None


def _window(text: str, start: int, end: int) -> Span:
    """[start, end) narrowed to start with +, ( or a digit and end with a digit or ): "2
    -2096165693" is a number and a negative number, not a phone with a dash."""
    while start < end and text[start] not in "+(0123456789":
        start += 1
    while end > start and text[end - 1] not in "0123456789)":
        end -= 1
    return start, end


@functools.lru_cache(maxsize=16384)
def _phone_spans(text: str, has_context: bool) -> tuple[Span, ...]:
    """The phone numbers in one candidate (offsets in it). Pure, so cached: a conversation
    resends its history every turn and the same numbers come back."""
    found: list[Span] = []
    chunks = [c.span() for c in timed_all(_WS_RUN, text)]
    k = len(chunks)
    # A run of 1-2 digit groups ("05 00 01 02 03 04") is a byte or number listing, unless it is
    # exactly five pairs (01 42 68 53 00, the French way of writing a number).
    listing = k > 1 and all(c1 - c0 <= 2 for c0, c1 in chunks)
    if listing and (k != 5 or any(c1 - c0 != 2 for c0, c1 in chunks)):
        return ()
    i = 0
    while i < k:
        for j in range(min(k, i + 7), i, -1):
            start, end = _window(text, chunks[i][0], chunks[j - 1][1])
            window = text[start:end]
            # A parenthesis of the prose the number closes ("(call +1 312-555-0146)") or opens is
            # no part of it.
            while window.endswith(")") and window.count(")") > window.count("("):
                start, end = _window(text, start, end - 1)
                window = text[start:end]
            while window.startswith("(") and window.count("(") > window.count(")"):
                start, end = _window(text, start + 1, end)
                window = text[start:end]
            # Balanced parentheses around the whole window are not part of the number.
            if window.startswith("(") and window.endswith(")") and window.count("(") == 1:
                start, end, window = start + 1, end - 1, window[1:-1]
            if _phone_ok(window, has_context):
                found.append((start, end))
                i = j
                break
        else:
            i += 1
    return tuple(found)
